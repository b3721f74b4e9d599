"""The steer methods' formulas on random residuals, without a model."""

from __future__ import annotations

import pytest
import torch

import steer_widgets as sw
from steer_widgets.steering import Direction, row_op, unit

GEN = torch.Generator().manual_seed(0)
H = torch.randn(1, 9, 16, generator=GEN) * 5
V = torch.randn(16, generator=GEN)
U = V / V.norm()


def apply(method, directions, mult=1.0, mask=None, start=0, h=H):
    return row_op(method, directions, mult, mask)(h, start)


def test_simple_additive_adds_c_v_at_every_position():
    got = apply("SIMPLE_ADDITIVE", [Direction("h", V, 3.0)], mult=2.0)
    torch.testing.assert_close(got, H + 6.0 * V)


def test_orthogonal_decomp_formula_and_identity_at_one():
    got = apply("ORTHOGONAL_DECOMP", [Direction("h", V, 3.0)], mult=2.0)
    p = torch.outer(U, U)
    want = H @ (torch.eye(16) - p) + 6.0 * (H @ p)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
    assert torch.equal(apply("ORTHOGONAL_DECOMP", [Direction("h", V, 1.0)]), H)  # exact


@pytest.mark.parametrize("cap", [-2.0, 0.0, 3.0])
def test_projection_cap_clamps_the_component(cap):
    got = apply("PROJECTION_CAP", [Direction("h", V, cap)])
    comp_before, comp_after = H @ U, got @ U
    torch.testing.assert_close(comp_after, comp_before.clamp(max=cap), atol=1e-4, rtol=1e-5)
    rest = got - comp_after[..., None] * U
    torch.testing.assert_close(rest, H - comp_before[..., None] * U, atol=1e-4, rtol=1e-5)


def test_two_directions_at_one_hook_add_once_each():
    w = torch.randn(16, generator=GEN)
    got = apply("SIMPLE_ADDITIVE", [Direction("h", V, 2.0), Direction("h", w, -1.0)])
    torch.testing.assert_close(got, H + 2.0 * V - w)


def test_mask_leaves_flagged_prompt_positions_and_steers_past_the_prompt():
    mask = torch.tensor([True, True, False, False, True, False, False])  # a 7-token prompt
    op = row_op("SIMPLE_ADDITIVE", [Direction("h", V, 1.0)], 1.0, mask)
    changed = (op(H, 0) != H).any(-1)[0]
    assert changed.tolist() == (~mask).tolist() + [True, True]  # positions 7, 8 are generated
    tail = op(H[:, 3:6], 3)
    assert (tail != H[:, 3:6]).any(-1)[0].tolist() == [True, False, True]
    assert (op(H[:, -1:], 9) != H[:, -1:]).all()


def test_zero_direction_names_its_field():
    zero = Direction("h", torch.zeros(16), 1.0, "features[3]")
    with pytest.raises(sw.RequestError) as info:
        row_op("PROJECTION_CAP", [zero], 1.0, None)
    assert info.value.field == "features[3]"
    with pytest.raises(sw.RequestError) as info:
        unit(torch.full((4,), float("nan")), "vectors[0].vector")
    assert info.value.field == "vectors[0].vector"
