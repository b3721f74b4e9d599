"""Measure how many decode rows this machine's kernels can batch without changing any row.

BLAS libraries pick kernels by shape: on the project's CPUs an fp32 ``x @ W`` with 1-3 rows
gives each row bit-for-bit what it gives alone, while 4 or more rows take another kernel whose
sums round differently. That is the whole reason batched DEFAULT and STEERED text used to
differ from solo text. Rather than trust one machine's observation, the runtime measures the
largest invariant row group for its own weights at load time and decodes in groups of that
size (a group of 1 is always exact, just slower).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

MAX_GROUP = 16
# The group of kernels built to compute each row alone (the native ones: each output from
# its own row in a fixed order, at any row count, tests/test_invariance.py): no limit, once
# the measurement up to MAX_GROUP agrees.
ANY_ROWS = 1 << 30


def rows_match_solo(fn, *xs: Tensor) -> bool:
    """True when every row of ``fn(*xs)`` equals ``fn`` applied to that row alone."""
    batched = fn(*xs)
    return all(
        torch.equal(batched[i], fn(*(x[i : i + 1] for x in xs))[0]) for i in range(xs[0].shape[0])
    )


def invariant_group_sizes(
    linears: list, n_heads: int, n_kv_heads: int, d_head: int, device, dtype, attend=None
) -> dict[str, int]:
    """Largest m such that every row count 1..m is batch-invariant, per kernel family:
    ``"matmul"`` for each of ``linears`` (callables on [rows, 1, in]) and ``"attention"`` for
    one decode position attending to caches of several lengths, through ``attend(q, k, v)``
    (the runtime's own attention; plain SDPA when not given).

    Each input is drawn once at ``MAX_GROUP`` rows: m rows are its first m, and each row's
    solo result is computed once and compared with every batch that holds the row (a load
    ran 150 products a matrix and drew 15 caches per length before, most of its time)."""
    attend = attend or _attend
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int) -> Tensor:
        return torch.randn(MAX_GROUP, *shape, generator=gen).to(device=device, dtype=dtype)

    matmuls = [_Solos(lin, rand(1, lin.in_features)) for lin in linears]
    shapes = [((n_heads, 1), (n_kv_heads, n), (n_kv_heads, n)) for n in (7, 64, 333, 1500)]
    attentions = [_Solos(attend, *(rand(h, n, d_head) for h, n in s)) for s in shapes]
    return {
        "matmul": _largest(lambda m: all(s.match(m) for s in matmuls)),
        "attention": _largest(lambda m: all(s.match(m) for s in attentions)),
    }


class _Solos:
    """``fn`` on inputs of ``MAX_GROUP`` rows: whether its first m rows together give each
    row's solo result (``rows_match_solo`` on ``x[:m]``), each row's solo run made once."""

    def __init__(self, fn, *xs: Tensor) -> None:
        self.fn, self.xs, self.solo = fn, xs, {}

    def match(self, m: int) -> bool:
        batched = self.fn(*(x[:m] for x in self.xs))
        return all(torch.equal(batched[i], self._solo(i)) for i in range(m))

    def _solo(self, i: int) -> Tensor:
        if i not in self.solo:
            self.solo[i] = self.fn(*(x[i : i + 1] for x in self.xs))[0]
        return self.solo[i]


def _attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def _largest(ok) -> int:
    for m in range(2, MAX_GROUP + 1):
        if not ok(m):
            return m - 1
    return MAX_GROUP
