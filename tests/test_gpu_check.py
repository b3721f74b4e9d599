"""The prepared device checks run here on the CPU, tiny, so they cannot rot while no GPU is
around: ``benchmarks/gpu_check.py`` over every architecture in float32, the half-precision
path a GPU takes (bf16 weights, activations and KV cache) on two of them, and the engine end
to end (``gpu_engine.py``); ``benchmarks/cores_check.py`` at two thread counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu_check.py"
ARCHS = {"gpt2", "gemma2", "gemma3", "qwen2", "qwen3", "mistral", "llama3", "gpt_neox"}


def _run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out), "--device", "cpu", "--tiny", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return proc, json.loads(out.read_text()) if out.exists() else {}


def test_every_architecture_exact_in_float32(tmp_path):
    proc, report = _run(tmp_path, "--no-engine")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = report["cases"]
    assert {name.split("/")[0] for name in cases} == ARCHS
    for name, figures in cases.items():
        assert figures["greedy_equal_hf"] and figures["rows_identical"], name
        assert figures["logits_max_abs_diff"] < 1e-4, name
        assert figures["ours_tokens_per_s"] > 0 and figures["hf_tokens_per_s"] > 0
        assert set(figures["row_groups"]) == {"matmul", "attention"}
    assert report["failures"] == [] and "ok   gemma2" in proc.stdout


def test_half_precision_path_keeps_rows_exact(tmp_path):
    proc, report = _run(tmp_path, "--dtypes", "bfloat16", "--archs", "gemma2", "qwen3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert set(report["cases"]) == {"gemma2/bfloat16", "qwen3/bfloat16", "engine/bfloat16"}
    engine = report["cases"].pop("engine/bfloat16")
    for figures in report["cases"].values():
        assert figures["rows_identical"]
        assert figures["logits_max_abs_diff"] < 0.1  # bf16 rounding, not a wrong model
    assert engine["exact"] and engine["steered_differs"], engine
    assert set(engine["analysis"].values()) == {"ok"} and len(engine["analysis"]) == 13
    assert (engine["steer_outputs"], engine["batch_requests"], engine["evaluate_rows"]) == (
        6,
        8,
        24,
    )
    assert engine["batch_s"] > 0 and engine["solo_s"] > 0


def test_engine_case_keeps_its_figures_when_a_part_fails(monkeypatch):
    """A device run is scarce: a failure in ``evaluate`` keeps the steer and batch figures."""
    import torch

    sys.path.insert(0, str(SCRIPT.parent))
    import gpu_check
    import gpu_engine

    def broken(*args):
        raise RuntimeError("evaluate broke")

    monkeypatch.setattr(gpu_engine, "_evaluate", broken)
    monkeypatch.setattr(gpu_check, "engine_case", gpu_engine.engine_case)
    figures = gpu_check._engine("cpu", "float32", tiny=True)
    assert figures["steer_exact"] and figures["batch_exact"], figures
    assert not figures["exact"] and "evaluate broke" in figures["error"]
    assert torch.get_default_dtype() == torch.float32


def test_refuses_cuda_where_there_is_none(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the refusal does not apply")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "x.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_cores_check_runs_tiny(tmp_path):
    """Stress, rows == solo and decode speed at 3 threads (oversubscribed here), every call
    once (the thread counts themselves are ``test_kernel_threads``' and ``test_kquants``')."""
    from steer_widgets.runtime import native

    if native.extension() is None:
        pytest.skip("no C++ compiler here")
    out = tmp_path / "cores.json"
    script = SCRIPT.parent / "cores_check.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(out), "--tiny", "--threads", "3", "--rounds", "0"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["failures"] == []
    assert [r["kernel_threads"] for r in report["stress"].values()] == [3]
    assert all(r["calls"] > 0 and r["wrong"] == 0 for r in report["stress"].values())
    assert set(report["rows"]) == {"mix"} and report["rows"]["mix"]["exact"]
    assert set(report["decode"]) == {"mix"} and set(report["decode"]["mix"]) == {"3"}
    mix = report["decode"]["mix"]["3"]
    assert mix["tokens_per_s"] > 0 and mix["read_gb_s"] > 0
    assert 30 < mix["mb_per_step"] < 45  # 2 layers' blocks and the Q8_0 embedding
