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
