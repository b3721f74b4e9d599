"""The steer methods' formulas on random residuals, without a model."""

from __future__ import annotations

import pytest
import torch

import steer_widgets as sw
from steer_widgets.steering.requests import Direction, PromptPositions, row_op, unit

GEN = torch.Generator().manual_seed(0)
H = torch.randn(1, 9, 16, generator=GEN) * 5
V = torch.randn(16, generator=GEN)
U = V / V.norm()


def apply(method, directions, mult=1.0, prompt=None, start=0, h=H):
    return row_op(method, directions, mult, prompt)(h, start)


def prompt_of(n: int, multiplier: float = 1.0, unsteered=()):
    """An ``n``-token prompt: positions in ``unsteered`` are left alone."""
    mask = torch.tensor([i in unsteered for i in range(n)])
    return PromptPositions(multiplier, mask)


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
    op = row_op("SIMPLE_ADDITIVE", [Direction("h", V, 1.0)], 1.0, PromptPositions(1.0, mask))
    changed = (op(H, 0) != H).any(-1)[0]
    assert changed.tolist() == (~mask).tolist() + [True, True]  # positions 7, 8 are generated
    tail = op(H[:, 3:6], 3)
    assert (tail != H[:, 3:6]).any(-1)[0].tolist() == [True, False, True]
    assert (op(H[:, -1:], 9) != H[:, -1:]).all()


@pytest.mark.parametrize("method", ["SIMPLE_ADDITIVE", "ORTHOGONAL_DECOMP", "PROJECTION_CAP"])
def test_prompt_multiplier_scales_c_at_prompt_positions_only(method):
    d = Direction("h", V, 1.5)
    prompt = prompt_of(6, multiplier=2.5, unsteered=(0,))  # 6 prompt positions, 3 generated
    got = apply(method, [d], mult=2.0, prompt=prompt)
    at_prompt = apply(method, [Direction("h", V, 1.5 * 2.5)], mult=2.0)  # c = 2 x 1.5 x 2.5
    plain = apply(method, [d], mult=2.0)  # c = 2 x 1.5
    assert torch.equal(got[:, 0], H[:, 0])  # unsteered stays untouched, whatever the multiplier
    torch.testing.assert_close(got[:, 1:6], at_prompt[:, 1:6], atol=1e-5, rtol=1e-6)
    assert torch.equal(got[:, 6:], plain[:, 6:])
    # a decode step past the prompt and a chunk straddling its end read absolute positions
    assert torch.equal(row_op(method, [d], 2.0, prompt)(H[:, 8:], 8), plain[:, 8:])
    chunk = row_op(method, [d], 2.0, prompt)(H[:, 4:8], 4)
    torch.testing.assert_close(chunk, got[:, 4:8], atol=1e-5, rtol=1e-6)


def test_masks_and_prompt_multiplier_reach_per_head_hooks():
    """attn.hook_z is [B, T, heads, d_head]: a per-position mask and scale must still line
    up with positions, not with heads."""
    z = torch.randn(1, 7, 4, 4, generator=GEN)  # 7 positions, 4 heads of width 4
    d = Direction("h", V, 2.0)
    prompt = prompt_of(5, multiplier=3.0, unsteered=(0, 1))
    got = row_op("SIMPLE_ADDITIVE", [d], 1.0, prompt)(z, 0)
    added = (got - z).reshape(1, 7, 16)
    assert torch.equal(added[:, :2], torch.zeros(1, 2, 16))
    torch.testing.assert_close(added[:, 2:5], (6.0 * V).expand(1, 3, 16))
    torch.testing.assert_close(added[:, 5:], (2.0 * V).expand(1, 2, 16))


def test_prompt_multiplier_zero_steers_only_generated_tokens():
    got = apply("SIMPLE_ADDITIVE", [Direction("h", V, 3.0)], prompt=prompt_of(5, multiplier=0.0))
    assert torch.equal(got[:, :5], H[:, :5])
    torch.testing.assert_close(got[:, 5:], H[:, 5:] + 3.0 * V)


def test_zero_direction_names_its_field():
    zero = Direction("h", torch.zeros(16), 1.0, "features[3]")
    with pytest.raises(sw.RequestError) as info:
        row_op("PROJECTION_CAP", [zero], 1.0, None)
    assert info.value.field == "features[3]"
    with pytest.raises(sw.RequestError) as info:
        unit(torch.full((4,), float("nan")), "vectors[0].vector")
    assert info.value.field == "vectors[0].vector"


def test_an_earlier_replys_tokens_take_the_plain_coefficient_and_are_never_masked():
    """In a chat's history, an earlier reply's own tokens were completion positions: the
    plain coefficient and no special-token mask, while the template and the user's words
    around them take ``prompt_multiplier`` (and the mask). Positions 2-4 are a reply here,
    position 3 a special token inside it."""
    special = torch.tensor([True, False, False, True, False, True, False])
    generated = torch.tensor([False, False, True, True, True, False, False])
    prompt = PromptPositions(3.0, special & ~generated, generated)
    got = apply("SIMPLE_ADDITIVE", [Direction("h", V, 2.0)], prompt=prompt)
    coef = torch.tensor([0.0, 6.0, 2.0, 2.0, 2.0, 0.0, 6.0, 2.0, 2.0])  # 7, 8: generated now
    torch.testing.assert_close(got, H + coef[None, :, None] * V)
