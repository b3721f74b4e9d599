"""The calibration that picks decode row groups finds the largest invariant group."""

from __future__ import annotations

import torch

from steer_widgets.runtime.invariance import (
    MAX_GROUP,
    invariant_group_sizes,
    rows_match_solo,
)


class ShapeDependent(torch.nn.Module):
    """A linear whose result changes in the last bits from ``breaks_at`` rows on, as a BLAS
    that switches kernels by shape does."""

    def __init__(self, breaks_at: int, d: int = 8) -> None:
        super().__init__()
        self.in_features, self.breaks_at = d, breaks_at
        self.w = torch.randn(d, d, generator=torch.Generator().manual_seed(0))

    def forward(self, x):
        out = x @ self.w
        return out * (1 + 1e-6) if x.shape[0] >= self.breaks_at else out


def test_largest_invariant_group_is_found():
    sizes = invariant_group_sizes(
        [ShapeDependent(99), ShapeDependent(4)], 2, 1, 4, "cpu", torch.float32
    )
    assert sizes["matmul"] == 3
    assert invariant_group_sizes([ShapeDependent(2)], 2, 1, 4, "cpu", torch.float32)["matmul"] == 1
    assert 1 <= sizes["attention"] <= MAX_GROUP  # this CPU's SDPA: whatever it is


def test_largest_invariant_attention_group_is_found():
    """An attention that changes in the last bits from 3 rows on gives a group of 2."""

    def attend(q, k, v):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return out * (1 + 1e-6) if q.shape[0] >= 3 else out

    sizes = invariant_group_sizes([ShapeDependent(99)], 2, 1, 4, "cpu", torch.float32, attend)
    assert sizes == {"matmul": MAX_GROUP, "attention": 2}


def test_rows_match_solo_detects_a_difference():
    x = torch.randn(5, 1, 8, generator=torch.Generator().manual_seed(1))
    assert rows_match_solo(ShapeDependent(99), x)
    assert not rows_match_solo(ShapeDependent(3), x)
