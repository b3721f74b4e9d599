"""``decoder_block``: a block no hook reads inside runs as one native call (hooks at its ends
around it), with the bits of the same block's ops run one by one (what a hook inside it
makes it do), for float32 blocks, int8 products and dense float32 weights, in prefill,
decode steps of one and several rows, and ragged steps."""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

import steer_widgets as sw
from steer_widgets.runtime import native
from steer_widgets.runtime.config import TransformerConfig
from steer_widgets.runtime.transformer import Transformer

pytestmark = pytest.mark.skipif(native.extension() is None, reason="needs the native kernel")


def _every_block_hooked(runtime, ends: dict | None = None) -> dict:
    """A hook inside every block that changes nothing: each block then runs op by op (with
    ``ends``, hooks at blocks' ends, as they are)."""
    inner = {f"blocks.{i}.hook_attn_out": lambda x, start: None for i in range(len(runtime.layers))}
    return {**inner, **(ends or {})}


def _calls(fn) -> int:
    """How many ``decoder_block`` calls ``fn()`` made."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "steer_widgets::decoder_block")


def _run(runtime, hooks: dict, rows: int = 3) -> tuple[list[torch.Tensor], object]:
    """A 40-token prefill into row 0, copied to every row, then three decode steps of every
    row together and one of row 0 alone: every logit, and the cache."""
    ids = torch.arange(3, 43).view(1, 40) * 7 % 300
    cache = runtime.new_cache(rows, 48)
    out = [runtime.forward(ids, cache.view(0), hooks=hooks)]
    for r in range(1, rows):
        cache.copy_row(0, r)
    cache.length = 40
    for step in range(3):
        out.append(runtime.forward(torch.full((rows, 1), 11 + step) + torch.arange(rows)[:, None],
                                   cache, hooks=hooks))  # fmt: skip
    return out, cache


def _assert_fused_equals_op_by_op(runtime, run=_run, passes: int = 4, written: int = 43) -> None:
    """``run``'s ``passes`` forward passes fuse every block, and give the op-by-op logits and
    cache (the first ``written`` positions) bit for bit."""
    n = len(runtime.layers)
    assert _calls(lambda: run(runtime, {})) == passes * n  # every block fused, in every pass
    assert _calls(lambda: run(runtime, _every_block_hooked(runtime))) == 0
    fused, fused_cache = run(runtime, {})
    plain, plain_cache = run(runtime, _every_block_hooked(runtime))
    for a, b in zip(fused, plain, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(fused_cache.k + fused_cache.v, plain_cache.k + plain_cache.v, strict=True):
        assert torch.equal(a[:, :, :written], b[:, :, :written])


def test_float32_blocks_fused_equal_their_ops(engine):
    _assert_fused_equals_op_by_op(engine.model.runtime)


def test_int8_products_fused_equal_their_ops():
    model = sw.load_model(sw.DEFAULT_MODEL, products="int8")
    _assert_fused_equals_op_by_op(model.runtime)


def test_dense_float32_weights_fused_equal_their_ops():
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, attention_bias=True,
    )  # fmt: skip
    state = tf.LlamaForCausalLM(config).state_dict()
    _assert_fused_equals_op_by_op(Transformer(TransformerConfig.from_hf_config(config), state))


def test_a_hook_on_one_block_leaves_the_others_fused(engine):
    runtime = engine.model.runtime
    hooks = {"blocks.5.hook_mlp_out": lambda x, start: x * 1.5}
    assert _calls(lambda: _run(runtime, hooks, rows=1)) == 4 * (len(runtime.layers) - 1)


def _ragged(runtime, hooks: dict) -> tuple[list[torch.Tensor], object]:
    """Rows at four lengths, then steps of all of them and of two in another order."""
    cache = runtime.new_cache(4, 70)
    runtime.forward(torch.arange(64).view(1, 64) * 5 % 300, cache.view(0), hooks=hooks)
    for r in range(1, 4):
        cache.copy_row(0, r)
    cache.lengths = [40, 47, 54, 61]
    out = [runtime.forward(torch.tensor([[7], [8], [9], [10]]), cache, rows=[0, 1, 2, 3],
                           hooks=hooks)]  # fmt: skip
    out.append(runtime.forward(torch.tensor([[11], [12]]), cache, rows=[2, 0], hooks=hooks))
    return out, cache


def test_a_ragged_step_fused_equals_its_ops(engine):
    _assert_fused_equals_op_by_op(engine.model.runtime, _ragged, passes=3, written=63)


def test_hooks_at_a_blocks_ends_keep_it_fused_with_the_same_bits(engine):
    """Steering and SAE reads sit at resid_post (or resid_pre): they run around the call."""
    runtime = engine.model.runtime
    direction = torch.randn(576, generator=torch.Generator().manual_seed(3))
    ends = {
        "blocks.4.hook_resid_pre": lambda x, start: x - 0.5 * direction,
        "blocks.12.hook_resid_post": lambda x, start: x + 2.0 * direction,
    }
    assert _calls(lambda: _run(runtime, ends)) == 4 * len(runtime.layers)
    fused, _ = _run(runtime, ends)
    plain, _ = _run(runtime, _every_block_hooked(runtime, ends))
    unsteered, _ = _run(runtime, {})
    for a, b, c in zip(fused, plain, unsteered, strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)


def test_a_bad_block_call_is_refused_before_the_cache_changes(engine):
    """The call's checks come before any write: a ragged step naming one cache row twice or a
    position past the cache, or a product that does not fit the block, raises a message
    naming it and leaves the cache as it was."""
    runtime = engine.model.runtime
    captured = []
    block = runtime._decoder_block

    def capture(*args):
        captured.append((args, block(*args)))
        return captured[-1][1]

    _, cache = _ragged(runtime, {})  # fills every row to its length
    cache.lengths = [40, 47, 54, 61]
    runtime._decoder_block = capture
    try:
        runtime.forward(torch.tensor([[7], [8], [9], [10]]), cache, rows=[0, 1, 2, 3])
    finally:
        runtime._decoder_block = block
    args, out = list(captured[3][0]), captured[3][1]
    k, v = args[10].clone(), args[11].clone()
    starts = args[-1]
    bad = {
        "appears twice": (-2, torch.tensor([0, 1, 0, 3])),
        "outside k": (-1, starts.clone().fill_(70)),
        "product 1 has": (6, [args[6][0], args[6][1] + 16, *args[6][2:]]),
    }
    for message, (at, value) in bad.items():
        call = list(args)
        call[at] = value
        with pytest.raises(RuntimeError, match=message):
            block(*call)
        # bit for bit: the cache past the written positions is uninitialized, NaNs included
        assert torch.equal(args[10].view(torch.int32), k.view(torch.int32)), message
        assert torch.equal(args[11].view(torch.int32), v.view(torch.int32)), message
    assert torch.equal(block(*args), out)  # the same call again: the same step, still usable


def _resident_mb() -> float:
    """Resident memory after the allocator hands its free pages back (``malloc_trim``):
    what a computation keeps, not what glibc holds for reuse. Without it the figure
    depended on what the process freed before (glibc raises its mmap threshold after a
    large free, and later blocks of that size stay in its heap once freed)."""
    import os

    from steer_widgets.runtime.memory import release_freed_memory

    release_freed_memory()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="Linux only")
def test_a_long_prefill_leaves_no_workspace_behind(engine):
    """A block keeps a small workspace on its calling thread for the next decode step; a long
    prompt's (here 1,500 positions, about 52 MB) is the call's own and freed after it, with
    the op-by-op logits bit for bit."""
    runtime = engine.model.runtime
    cache = runtime.new_cache(1, 1600)
    for t in cache.k + cache.v:
        t.fill_(0.0)  # the cache's pages resident before the first reading
    ids = torch.arange(1500).view(1, 1500) * 37 % 40000 + 100
    runtime.forward(ids[:, :8], cache.view(0), last_only=True)  # a short call first
    before = _resident_mb()
    fused = runtime.forward(ids, cache.view(0), last_only=True)
    assert _resident_mb() - before < 20
    plain = runtime.forward(ids, cache.view(0), hooks=_every_block_hooked(runtime), last_only=True)
    assert torch.equal(fused, plain)
