"""products="int8" keeps keys and values as halves: what the cache holds, what attention reads.

The native kernels write a half cache with torch's float16 rounding (nearest, ties to even)
and widen it exactly as they load it, so attending over a half cache is the float32
attention over the same values, bit for bit, in every build. A pass without a cache rounds
its keys and values as a cache would, so every route gives a token the same probability.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from half_cases import half_case
from kernel_variants import AVX2, AVX2_NO_F16C, SCALAR, runs_here

import steer_widgets as sw
from steer_widgets.runtime import native

needs_native = pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")

VARIANT = """
import sys
from steer_widgets.runtime import native
native.FLAGS[:] = sys.argv[1].split()
assert native.extension() is not None, "the variant did not build"
from half_cases import half_case
print(half_case()[-1])
"""


@needs_native
def test_a_half_cache_holds_torchs_halves_and_attends_as_float32_would():
    new, cache16, order, starts, y16, y32, _ = half_case()
    for written, cache in zip(new, cache16, strict=True):
        for b, (row, pos) in enumerate(zip(order.tolist(), starts.tolist(), strict=True)):
            held = cache[row, :, pos].view(torch.int16)
            assert torch.equal(held, written[b, :, 0].half().view(torch.int16))
    assert torch.equal(y16, y32)
    assert cache16[0].dtype == torch.float16


@needs_native
@pytest.mark.slow
@pytest.mark.parametrize(
    "variant", [AVX2, AVX2_NO_F16C, SCALAR], ids=["avx2-f16c", "avx2", "scalar"]
)
def test_every_build_writes_and_reads_the_same_halves(variant, kernel_variants):
    """The AVX2 build with F16C's conversions, without them, and the portable code: the same
    cache bytes and the same outputs as this machine's build (each build compiled once per
    session: ``kernel_variants.py``)."""
    if not runs_here("avx2", "fma", "f16c"):
        pytest.skip("needs an x86-64 CPU with AVX2, FMA and F16C to run the builds")
    out = subprocess.run(
        [sys.executable, "-c", VARIANT, kernel_variants.flags(variant)],
        capture_output=True, text=True, env=kernel_variants.env(variant),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == half_case()[-1]


@needs_native
def test_int8_keeps_half_keys_and_a_pass_without_a_cache_reads_the_same_values(engine):
    """float32 products keep a float32 cache; int8 products a half one. A forward without a
    cache (attribution's, a prompt scored whole) rounds its keys and values as the cache
    would: the same logits as the cached prefill, bit for bit."""
    assert engine.model.runtime.cache_dtype == torch.float32
    runtime = sw.load_model(products="int8").runtime
    assert runtime.cache_dtype == torch.float16
    tokens = torch.tensor([[1, 504, 3101, 28, 260, 5248, 30, 940, 314, 43]])
    cache = runtime.new_cache(1, tokens.shape[1])
    assert cache.k[0].dtype == cache.v[-1].dtype == torch.float16
    assert torch.equal(runtime.forward(tokens), runtime.forward(tokens, cache))
