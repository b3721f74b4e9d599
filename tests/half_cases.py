"""A ragged step over a half cache, shared by ``test_half_cache.py`` and the builds it runs in
fresh processes."""

from __future__ import annotations

import hashlib

import torch


def hard_values(n: int, gen: torch.Generator) -> torch.Tensor:
    """Random values and the ones rounding gets wrong first: ties between two halves,
    subnormal halves, the largest finite half and the float just below what rounds to
    infinity (an infinite key would make the attention NaN), signed zeros."""
    ties = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 2**-24 * 1.5, 2**-24 * 2.5, -(2**-25)])
    edges = torch.tensor([65504.0, 65519.99, -65519.99, 2**-14, 2**-14 * (1 - 2**-11)])
    special = torch.cat([ties, edges, torch.tensor([0.0, -0.0, 1e-30, -3e-8])])
    x = torch.randn(n, generator=gen) * 4
    x[: len(special)] = special
    return x


def half_case() -> tuple:
    """A ragged step over a half cache and over the same values as float32: the new keys
    and values, the cache bytes, and both outputs."""
    gen = torch.Generator().manual_seed(7)
    rows, heads, kv_heads, length, d = 4, 6, 2, 70, 64
    cache16 = [
        hard_values(rows * kv_heads * length * d, gen).view(rows, kv_heads, length, d).half()
        for _ in range(2)
    ]
    cache32 = [c.float() for c in cache16]
    new = [hard_values(rows * kv_heads * d, gen).view(rows, kv_heads, 1, d) for _ in range(2)]
    q = torch.randn(rows, heads, 1, d, generator=gen)
    order, starts = torch.tensor([2, 0, 3, 1]), torch.tensor([5, 69, 0, 33])
    op = torch.ops.steer_widgets.ragged_attention
    y16 = op(q, *cache16, *new, 0.125, order, starts, 0)
    y32 = op(q, *cache32, *(n.half().float() for n in new), 0.125, order, starts, 0)
    digest = hashlib.sha256()
    for t in (*cache16, y16):
        digest.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return new, cache16, order, starts, y16, y32, digest.hexdigest()
