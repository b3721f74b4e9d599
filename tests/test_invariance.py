"""The kernels the decoder uses are batch-invariant at the row counts it uses."""

from __future__ import annotations

import pytest
import torch

from steer_widgets.runtime.config import TransformerConfig
from steer_widgets.runtime.invariance import ANY_ROWS, MAX_GROUP, rows_match_solo
from steer_widgets.runtime.linear import KERNELS
from steer_widgets.runtime.transformer import Transformer


def test_calibrated_groups_are_invariant_for_every_linear_and_largest(engine):
    """A group of ``ANY_ROWS`` (the native kernels) is checked at 1-16 rows and beyond."""
    runtime = engine.model.runtime
    group = runtime.row_groups["matmul"]
    counts = [*range(1, min(group, MAX_GROUP) + 1), *((17, 40, 64) if group == ANY_ROWS else ())]
    gen = torch.Generator().manual_seed(1)
    layer = runtime.layers[len(runtime.layers) // 2]
    linears = (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, runtime.unembed)
    for lin in linears:
        for rows in counts:
            x = torch.randn(rows, 1, lin.in_features, generator=gen)
            assert rows_match_solo(lin, x), (lin.out_features, lin.in_features, rows)
    if group < MAX_GROUP:  # the group is the largest: one more row breaks some kernel
        one_more = [torch.randn(group + 1, 1, lin.in_features, generator=gen) for lin in linears]
        assert not all(rows_match_solo(lin, x) for lin, x in zip(linears, one_more, strict=True))


def _assert_decode_step_rows_equal_rows_alone(runtime, ids: torch.Tensor, rows: int = 6) -> None:
    """A whole decode step: ``rows`` different rows together vs each alone, bit for bit."""
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


def assert_ragged_step_rows_equal_rows_alone(runtime, rows: int = 40) -> None:
    """One ragged decode step of ``rows`` rows, each after a prompt of its own length, against
    each row's step alone: logits and the key each wrote, bit for bit."""
    prompts = [list(range(7 * r, 7 * r + 3 + r % 9)) for r in range(rows)]
    cache = runtime.new_cache(rows, 16)
    for r, prompt in enumerate(prompts):
        runtime.forward(torch.tensor([prompt]), cache.view(r))
    cache.lengths = [len(p) for p in prompts]
    step = torch.tensor([[300 + r] for r in range(rows)])
    together = runtime.forward(step, cache, rows=list(range(rows)))
    for r, prompt in enumerate(prompts):
        alone = runtime.new_cache(1, 16)
        runtime.forward(torch.tensor([prompt]), alone)
        assert torch.equal(runtime.forward(step[r : r + 1], alone)[0], together[r]), r
        at = len(prompt)
        assert torch.equal(alone.k[-1][0, :, at], cache.k[-1][r, :, at]), r


def test_native_kernels_batch_any_number_of_rows(engine):
    """The native kernels compute each row alone: no group limit, and a step of more rows
    than the calibration measures (one fused call a block) keeps every row exact."""
    runtime = engine.model.runtime
    assert runtime.row_groups == {"matmul": ANY_ROWS, "attention": ANY_ROWS}
    assert_ragged_step_rows_equal_rows_alone(runtime, rows=40)


def test_decode_rows_in_one_batch_equal_rows_alone(engine):
    ids = torch.tensor([engine.tokenizer.encode("Rows never change each other").ids])
    _assert_decode_step_rows_equal_rows_alone(engine.model.runtime, ids)


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_matmul_kernel_keeps_batched_rows_exact(kernel):
    """A tiny random Llama on each matmul kernel (``linear.KERNELS``)."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300,
    )  # fmt: skip
    state = tf.LlamaForCausalLM(config).state_dict()
    runtime = Transformer(TransformerConfig.from_hf_config(config), state, kernel=kernel)
    assert runtime.unembed.kernel == kernel  # the native kernel builds on the test machines
    _assert_decode_step_rows_equal_rows_alone(runtime, torch.tensor([[1, 5, 9, 200, 7]]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rows_equal_rows_alone(dtype):
    """The "rows" kernel in half precision on a CPU: torch's batched product rounded a bf16
    row apart from the single-row product about once in 300 rows (AVX-512 BF16), too rarely
    for the load-time calibration; here a row of any batch is its solo product, every time."""
    from steer_widgets.runtime.linear import Linear

    gen = torch.Generator().manual_seed(0)
    lin = Linear((0.02 * torch.randn(64, 64, generator=gen)).to(dtype), kernel="rows")
    for trial in range(400):
        rows = 2 + trial % 15
        x = torch.randn(rows, 1, 64, generator=gen).to(dtype) * 10.0 ** (trial % 5 - 2)
        assert rows_match_solo(lin, x), (trial, rows)
