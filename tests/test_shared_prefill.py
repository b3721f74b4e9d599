"""A row's prefill shares the blocks below its first intervention with an earlier row: the
logits and every key and value equal that row's prefill computed whole, bit for bit."""

from __future__ import annotations

import pytest
import torch

from steer_widgets.runtime.transformer import Transformer
from steer_widgets.steering import generation
from steer_widgets.steering.generation import Row


def _add(vector: torch.Tensor):
    return lambda x, start: x + vector.to(x.dtype)


def _hook(name: str, scale: float):
    width = 576 if not name.endswith("hook_z") else 9 * 64
    vector = torch.randn(width, generator=torch.Generator().manual_seed(len(name))) * scale
    if name.endswith("hook_z"):
        vector = vector.view(9, 64)
    return {name: _add(vector)}


PLAIN: dict = {}
ROWS = {  # each row's interventions, and the blocks each prefill computes (a second row
    # without interventions copies the first one's whole prefill and computes none)
    "resid_post_12": ([PLAIN, _hook("blocks.12.hook_resid_post", 4.0)], [30, 17]),
    "resid_pre_12": ([PLAIN, _hook("blocks.12.hook_resid_pre", 4.0)], [30, 18]),
    "z_5_and_post_20": (
        [PLAIN, {**_hook("blocks.5.attn.hook_z", 1.0), **_hook("blocks.20.hook_resid_post", 2.0)}],
        [30, 25],
    ),
    "last_block_output": ([PLAIN, _hook("blocks.29.hook_resid_post", 4.0)], [30, 1]),
    "sweep_same_layer": (
        [PLAIN, *(_hook("blocks.12.hook_resid_post", s) for s in (1.0, 2.0, 4.0))],
        [30, 17, 17, 17],
    ),
    "two_plain_rows": ([PLAIN, _hook("blocks.12.hook_resid_post", 4.0), PLAIN], [30, 17]),
    "no_plain_row": (  # the second row starts from what the first had before its own hook
        [_hook("blocks.12.hook_resid_post", s) for s in (2.0, -3.0)] + [PLAIN],
        [30, 17, 17],
    ),
    "deeper_then_shallower": (
        [PLAIN, _hook("blocks.20.hook_resid_post", 4.0), _hook("blocks.3.hook_mlp_out", 4.0)],
        [30, 9, 27],
    ),
}


def _prefill(runtime, ids, rows, shared: bool, monkeypatch):
    """The rows' last prompt logits and cache, and the blocks each prefill computed."""
    runtime_cls = type(runtime)
    visited: list[int] = []  # block indices, in the order the forward passes ran them
    real = runtime_cls._block

    def counted(self, i, *args):
        visited.append(i)
        return real(self, i, *args)

    with monkeypatch.context() as m:
        m.setattr(runtime_cls, "_block", counted)
        if not shared:
            m.setattr(runtime_cls, "resumes", False)
        cache = runtime.new_cache(len(rows), len(ids) + 1)
        last: dict = {}
        for _ in generation._prefill(runtime, ids, rows, range(len(rows)), cache, last):
            pass
    starts = [n for n, i in enumerate(visited) if i == 0 or (n and visited[n - 1] >= i)]
    ends = [*starts[1:], len(visited)]
    return (
        torch.stack([last[r] for r in range(len(rows))]),
        cache,
        [b - a for a, b in zip(starts, ends, strict=True)],
    )


@pytest.mark.parametrize("case", list(ROWS))
def test_shared_prefill_equals_each_row_computed_whole(engine, case, monkeypatch):
    runtime = engine.model.runtime
    assert isinstance(runtime, Transformer) and runtime.resumes
    ops, computed = ROWS[case]
    rows = [Row(ops=o) for o in ops]
    ids = engine.tokenizer.encode("The lighthouse keeper counted the ships").ids
    shared, cache, blocks = _prefill(runtime, ids, rows, True, monkeypatch)
    whole, cache_whole, blocks_whole = _prefill(runtime, ids, rows, False, monkeypatch)
    assert blocks_whole == [30] * (len(rows) - max(0, sum(not o for o in ops) - 1))
    assert blocks == computed
    assert torch.equal(shared, whole)
    assert cache.lengths == cache_whole.lengths == [len(ids)] * len(rows)
    n = len(ids)  # the positions written; the cache's last one is allocated, never filled
    for layer in range(runtime.cfg.n_layers):
        assert torch.equal(cache.k[layer][:, :, :n], cache_whole.k[layer][:, :, :n]), layer
        assert torch.equal(cache.v[layer][:, :, :n], cache_whole.v[layer][:, :, :n]), layer
    assert not torch.equal(shared[0], shared[1])  # the interventions changed the logits


def test_resuming_needs_the_residual(engine):
    runtime = engine.model.runtime
    with pytest.raises(ValueError, match="resid"):
        runtime.forward(torch.tensor([[1, 2, 3]]), start_at_layer=4)


def test_a_shared_prefill_copies_the_positions_written_only(engine):
    """The rest of a row is unwritten (it is read only after a step writes it): copying it
    was most of a copy where the cache holds room for long answers."""
    cache = engine.model.runtime.new_cache(2, 40)
    for kv in (*cache.k, *cache.v):
        kv[0].normal_(generator=torch.Generator().manual_seed(0))
        kv[1].fill_(7.0)
    cache.copy_row(0, 1, layers=3, positions=5)
    for i, kv in enumerate((*cache.k, *cache.v)):
        copied = i % len(cache.k) < 3
        assert torch.equal(kv[1, :, :5], kv[0, :, :5]) == copied, i
        assert bool((kv[1, :, 5:] == 7.0).all()), i
