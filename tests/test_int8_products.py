"""The int8 kernel (csrc/int8_linear.cpp): GGUF blocks times each row's int8 codes.

Its contract, checked here on this machine's build (the other instruction sets' builds give
the same bits: ``test_quantized.py``'s variants): the documented arithmetic (each row's codes
per 32 k, integer block sums, one fixed order of float operations), each row exactly its solo
result at any row count and thread count, and no integer sum that overflows."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_quantized import random_blocks

from steer_widgets.runtime import native, quant
from steer_widgets.runtime.quant import pack_int8

pytestmark = pytest.mark.skipif(native.extension() is None, reason="needs the native kernel")
TYPES = quant.SUPPORTED  # every type the float32 path reads (Q5_0 as Q8_0)


def product(x: torch.Tensor, raw: np.ndarray, name: str, bias=None) -> torch.Tensor:
    read = quant.kernel_type(name)  # Q5_0 is read as the Q8_0 of its weights
    op = native.op("int8_linear")
    return op(x, pack_int8(raw, name), raw.shape[0], quant.TYPES[read][0], bias)


def formula(x: torch.Tensor, raw: np.ndarray, name: str) -> np.ndarray:
    """The int8 arithmetic in float64, from gguf's own decoding of the blocks."""
    m, k = x.shape
    xs = x.numpy().reshape(m, k // 32, 32)
    amax = np.abs(xs).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    qx = np.clip(np.rint(xs * inv), -127, 127)  # rint: half to even, as the kernel
    dx = (amax / np.float32(127)).astype(np.float32).astype(np.float64)
    weights = quant.dequantize(raw, name).astype(np.float64)  # gguf's d * q (+ m)
    return ((qx * dx).reshape(m, k)) @ weights.T


@pytest.mark.parametrize("name", TYPES)
def test_the_products_follow_their_formula(name):
    k = 96 * quant.WEIGHTS[name] // quant.QK
    raw = random_blocks(name, 40, k, seed=3)
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(1))
    x[2, :32] = 0.0  # a block of zeros: scale 0, codes 0
    got = product(x, raw, name).double().numpy()
    want = formula(x, raw, name)
    scale = np.abs(quant.dequantize(raw, name)).max() * np.abs(x.numpy()).max() * k
    assert np.abs(got - want).max() <= 1e-6 * scale
    assert np.isfinite(got).all()
    bias = torch.randn(40)
    assert torch.equal(product(x, raw, name, bias), product(x, raw, name) + bias)


@pytest.mark.parametrize("name", TYPES)
def test_every_row_count_gives_each_row_its_solo_bits(name):
    """Rows tile in even groups of up to 6 (5 rows one tile, 17 rows 6 + 6 + 5): 1-64 rows,
    each row alone, in another order, at any position."""
    k = 128 * quant.WEIGHTS[name] // quant.QK
    raw = random_blocks(name, 50, k, seed=4)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(2))
    solo = torch.cat([product(x[i : i + 1], raw, name) for i in range(64)])
    for rows in (2, 3, 4, 5, 6, 7, 11, 12, 13, 17, 64):
        assert torch.equal(product(x[:rows], raw, name), solo[:rows]), rows
    order = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(product(x[order], raw, name), solo[order])


def test_thread_counts_do_not_change_a_bit():
    """Oversubscribed on purpose: the pool at 1 to 16 threads on this machine's cores. 300
    rows make 2,400 blocks of codes, enough for the activations' quantization to split over
    the pool too (13 rows' 104 stay on one thread)."""
    raw = random_blocks("Q4_1", 700, 256, seed=5)
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(13, 256, generator=gen), torch.randn(300, 256, generator=gen)]
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 2, 3, 8, 16):
            torch.set_num_threads(n)
            results.append([product(x, raw, "Q4_1") for x in xs])
    finally:
        torch.set_num_threads(threads)
    for r in results[1:]:
        assert all(torch.equal(a, b) for a, b in zip(r, results[0], strict=True))


@pytest.mark.parametrize("name", TYPES)
def test_integer_sums_cannot_overflow_at_the_limits(name):
    """Codes at their largest magnitude against activations at +-127: sums that would wrap
    an int16 lane (or saturate a pair) give wrong signs and sizes, not a small error. Every
    byte 0xFF makes every code its largest (Q6_K: 31 of -32..31; Q8_0: -1, so Q8_0 alternates
    -128 and 127 instead), under f16 factors of 1."""
    size, k, n = quant.TYPES[name][1], 2 * quant.WEIGHTS[name], 16
    blocks = np.full((n, k // quant.WEIGHTS[name], size), 0xFF, dtype=np.uint8)
    if name == "Q8_0":
        blocks[..., 2:] = np.where(np.arange(n)[:, None, None] % 2, 0x80, 0x7F)
    for off in quant.HALVES[name]:
        blocks[..., off : off + 2] = np.frombuffer(np.float16(1.0).tobytes(), np.uint8)
    raw = blocks.reshape(n, -1)
    x = torch.full((3, k), 1.0)
    x[1] = -1.0
    x[2, ::2] = -1.0
    got = product(x, raw, name).double().numpy()
    want = formula(x, raw, name)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(want[:2]).min() > 100  # large sums, none cancelled


def test_only_the_types_it_reads_are_packed():
    with pytest.raises(quant.QuantizationUnsupported, match="IQ2_XXS"):
        pack_int8(np.zeros((16, 66), np.uint8), "IQ2_XXS")
