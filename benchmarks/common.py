"""Helpers shared by benchmarks: timing and the machine's memory bandwidth."""

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


class PrefillClock:
    """Seconds a runtime spends in prefills while a run goes on, so a figure can be given for
    decode steps alone (the run's wall time less its prefills: the steps' forwards, sampling
    and bookkeeping). A prefill is a forward of more than one position per row; a decode step
    feeds one. Prefills cost the same batched or alone (each row's prompt is its own pass), so
    a ratio over whole requests has a floor they set whatever the decode kernel does."""

    def __init__(self, runtime) -> None:
        self.runtime, self.prefill_s, self.prefills = runtime, 0.0, 0

    def __enter__(self) -> PrefillClock:
        inner = self.runtime.forward

        def timed(tokens, *args, **kwargs):
            start = time.perf_counter()
            out = inner(tokens, *args, **kwargs)
            if tokens.shape[1] > 1:
                self.prefill_s += time.perf_counter() - start
                self.prefills += 1
            return out

        self.runtime.forward = timed  # the instance's attribute, over the class's method
        return self

    def __exit__(self, *exc) -> None:
        del self.runtime.forward


def timed_run(fn: Callable[[], object], runtime) -> tuple[float, float]:
    """(wall seconds, seconds outside prefills) of one ``fn()`` on ``runtime``."""
    with PrefillClock(runtime) as clock:
        start = time.perf_counter()
        fn()
        wall = time.perf_counter() - start
    return wall, wall - clock.prefill_s
