"""The native kernels at every thread count users have: the stress (``kernel_stress.py``)
bit for bit against one thread, each count in its own process so a crash is a failure, and
the pool, noise queue and kernels under ThreadSanitizer with no report.

This machine has 2 cores; 3-16 threads here are oversubscribed, which only widens the
windows a race needs. ``SW_STRESS_ROUNDS`` sets the stress per thread count in rounds of 64
calls after one of every call (default 100; ``make sanitize`` runs 4000 and a longer sanitizer
run): counted work, so a slower machine takes longer instead of checking less."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from steer_widgets.runtime import native

ROOT = Path(__file__).resolve().parents[1]
STRESS = Path(__file__).parent / "kernel_stress.py"
HARNESS = Path(__file__).parent / "native" / "tsan_harness.cpp"
ROUNDS = int(os.environ.get("SW_STRESS_ROUNDS", "100"))
HANG_S = 600 + ROUNDS  # a hang guard only: 100 rounds took 2-12 s here (2 busy cores)
TSAN_ROUNDS = int(os.environ.get("SW_TSAN_ROUNDS", "2"))

pytestmark = pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")


@pytest.mark.parametrize("threads", [1, 2, 3, 4, 8, 16])
def test_stress_at_every_thread_count_equals_one_thread(threads):
    proc = subprocess.run(
        [sys.executable, str(STRESS), "--threads", str(threads), "--rounds", str(ROUNDS)],
        capture_output=True, text=True, timeout=HANG_S, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, f"the stress died (rc {proc.returncode}): {proc.stderr[-2000:]}"
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"stress {threads} threads: {report['calls']} calls in {report['seconds']} s, {report['wrong']} wrong"
    )
    assert report["kernel_threads"] == threads
    ops = {"linear", "Q4_0", "Q4_1", "Q8_0", "attention", "ragged_attention", "rms_norm", "rotary"}
    ops |= {"Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "noise", "dense", "int8", "vocab_pass"}
    assert ops | {"queued noise"} <= set(report["calls_by_op"]), report["calls_by_op"]
    assert report["wrong"] == 0, report


def tsan_build(out: Path) -> Path:
    """The harness and csrc's torch-free sources, built with -fsanitize=thread."""
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        pytest.skip(f"no C++ compiler ({cxx})")
    torch_free = [native.CSRC / n for n in ("pool.cpp", "noise_queue.cpp")]
    torch_free += [
        p
        for p in native.SOURCES
        if p.name not in ("ops.cpp", "vocab_pass.cpp") and p not in torch_free
    ]
    binary = out / "tsan_harness"
    cmd = [cxx, "-std=c++17", "-O1", "-g", "-fsanitize=thread", "-march=native",
           "-ffp-contract=off", "-pthread", f"-I{native.CSRC}", *map(str, torch_free),
           str(HARNESS), "-o", str(binary)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return binary


def test_thread_sanitizer_reports_nothing(tmp_path):
    """The harness, in its own process: every call bit for bit at 2-16 threads, and first
    chunks that throw on the caller's thread and on a worker, which must reach the caller
    once no chunk runs (before: the call returned while a worker still ran a chunk on its
    stack, and a worker's exception ended the process)."""
    binary = tsan_build(tmp_path)
    env = dict(os.environ, TSAN_OPTIONS="exitcode=66 halt_on_error=0 second_deadlock_stack=1")
    proc = subprocess.run(
        [str(binary), str(TSAN_ROUNDS)], capture_output=True, text=True, timeout=900, env=env
    )
    print(f"ThreadSanitizer: {proc.stdout.strip()} calls, stderr {proc.stderr.strip()!r}")
    assert "ThreadSanitizer" not in proc.stderr, proc.stderr[-6000:]
    assert proc.returncode == 0 and proc.stdout.startswith("ok "), (proc.stdout, proc.stderr)


def test_the_pool_starts_one_worker_fewer_than_the_largest_count(tmp_path):
    """A fresh process: 1 thread starts no worker, 8 threads start 7, and 3 afterwards
    reuses them (a smaller count never shrinks the pool; any worker may claim a chunk)."""
    script = """
import torch
from steer_widgets.runtime import native
x, packed = torch.randn(4, 576), native.pack(torch.randn(4096, 576))
seen = []
for n in (1, 8, 3):
    torch.set_num_threads(n)
    native.op("rowwise_linear")(x, packed, 4096)
    seen.append(native.pool_workers())
print(seen)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[0, 7, 7]"
