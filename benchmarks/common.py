"""Helpers shared by benchmarks: timing, the machine's memory bandwidth and its matrix-product
rates."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

CHAT = [{"role": "user", "content": "Write a long story about a dragon who learns to paint."}]


def best_of(fn: Callable[[], object], repeats: int = 3) -> float:
    """Fastest wall time of ``repeats`` runs (the least disturbed by a noisy machine)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def read_bandwidth(megabytes: int = 512) -> float:
    """Bytes/s this machine streams through a reduction (a lower bound on what a decode
    step's weight reads can achieve)."""
    x = torch.ones(megabytes * 2**20 // 4)
    x.sum()
    seconds = best_of(lambda: x.sum(), repeats=5)
    return x.numel() * 4 / seconds


def int8_gemm_macs_per_s(size: int = 2048) -> float:
    """Multiply-adds per second of one large square int8 product on torch's threads
    (``torch._int_mm``: oneDNN's int8 GEMM, exact int32 sums): what a well-tuned library
    reaches on this machine's integer dot-product units with nothing but the products, so a
    lower bound on what a row of an int8 product costs (per-block scales come on top). No
    float32 counterpart: MKL's sgemm, torch's, takes a slower path on AMD CPUs (55 GMAC/s a
    core on this Zen 5, 2026-12-05), which bounds nothing."""
    a = torch.randint(-127, 128, (size, size), dtype=torch.int8)
    torch._int_mm(a, a)
    return size**3 / best_of(lambda: torch._int_mm(a, a), repeats=5)


def macs_per_row(cfg) -> int:
    """Multiply-adds of one row's matrix products in a decode step (a gated or plain MLP, the
    fused q, k, v, the attention's output, the unembedding), from the model's config."""
    attention = cfg.d_model * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.d_head
    attention += cfg.n_heads * cfg.d_head * cfg.d_model
    mlp = (3 if cfg.gated_mlp else 2) * cfg.d_model * cfg.d_mlp
    return cfg.n_layers * (attention + mlp) + cfg.vocab_size * cfg.d_model


class PrefillClock:
    """Seconds a runtime spends in prefills while a run goes on, so a figure can be given for
    decode steps alone (the run's wall time less its prefills: the steps' forwards, sampling
    and bookkeeping). A prefill is a forward of more than one position per row; a decode step
    feeds one. Prefills cost the same batched or alone (each row's prompt is its own pass), so
    a ratio over whole requests has a floor they set whatever the decode kernel does."""

    def __init__(self, runtime) -> None:
        self.runtime, self.prefill_s, self.prefills = runtime, 0.0, 0
        self.step_rows: list[int] = []  # rows of each decode step, in order

    def __enter__(self) -> PrefillClock:
        inner = self.runtime.forward

        def timed(tokens, *args, **kwargs):
            start = time.perf_counter()
            out = inner(tokens, *args, **kwargs)
            if tokens.shape[1] > 1:
                self.prefill_s += time.perf_counter() - start
                self.prefills += 1
            else:
                self.step_rows.append(tokens.shape[0])
            return out

        self.runtime.forward = timed  # the instance's attribute, over the class's method
        return self

    def __exit__(self, *exc) -> None:
        del self.runtime.forward


def timed_run(fn: Callable[[], object], runtime) -> tuple[float, float]:
    """(wall seconds, seconds outside prefills) of one ``fn()`` on ``runtime``."""
    wall, decode, _ = clocked_run(fn, runtime)
    return wall, decode


def clocked_run(fn: Callable[[], object], runtime) -> tuple[float, float, list[int]]:
    """``timed_run``'s two figures and the rows of each decode step."""
    with PrefillClock(runtime) as clock:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    return wall, wall - clock.prefill_s, clock.step_rows
