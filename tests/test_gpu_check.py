"""The prepared GPU check (``benchmarks/gpu_check.py``) runs here on the CPU, tiny, so it
cannot rot while no GPU is around: every architecture in float32, and the half-precision
path a GPU takes (bf16 weights, activations and KV cache) on two of them."""

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
    proc, report = _run(tmp_path)
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
    assert set(report["cases"]) == {"gemma2/bfloat16", "qwen3/bfloat16"}
    for figures in report["cases"].values():
        assert figures["rows_identical"]
        assert figures["logits_max_abs_diff"] < 0.1  # bf16 rounding, not a wrong model


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
