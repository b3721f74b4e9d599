"""The kernels the decoder uses are batch-invariant at the row counts it uses."""

from __future__ import annotations

import torch

from steer_widgets.invariance import MAX_GROUP, rows_match_solo


def test_calibrated_groups_are_invariant_for_every_linear_and_largest(engine):
    runtime = engine.model.runtime
    group = runtime.row_groups["matmul"]
    gen = torch.Generator().manual_seed(1)
    layer = runtime.layers[len(runtime.layers) // 2]
    linears = (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, runtime.unembed)
    for lin in linears:
        for rows in range(1, group + 1):
            x = torch.randn(rows, 1, lin.in_features, generator=gen)
            assert rows_match_solo(lin, x), (lin.out_features, lin.in_features, rows)
    if group < MAX_GROUP:  # the group is the largest: one more row breaks some kernel
        one_more = [torch.randn(group + 1, 1, lin.in_features, generator=gen) for lin in linears]
        assert not all(rows_match_solo(lin, x) for lin, x in zip(linears, one_more, strict=True))


def test_decode_rows_in_one_batch_equal_rows_alone(engine):
    """A whole decode step: six different rows together vs each alone, bit for bit."""
    runtime = engine.model.runtime
    ids = torch.tensor([engine.tokenizer.encode("Rows never change each other").ids])
    rows = 6
    cache = runtime.new_cache(rows, ids.shape[1] + 1)
    for r in range(rows):
        runtime.forward(ids, cache.view(r))
    cache.length = ids.shape[1]
    step = torch.tensor([[100 + r] for r in range(rows)])
    together = runtime.forward(step, cache)
    for r in range(rows):
        alone = runtime.new_cache(1, ids.shape[1] + 1)
        runtime.forward(ids, alone)
        assert torch.equal(runtime.forward(step[r : r + 1], alone)[0], together[r])
