"""GGUF blocks read by the native kernel: the same bits as transformers' float32 copy.

Every weight is dequantized with gguf's own float32 operations and then enters the float32
kernel's fused multiply-add chain, so the claims here are equalities, not tolerances."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import steer_widgets as sw
from steer_widgets import native, quant
from steer_widgets.errors import QuantizationUnsupported
from steer_widgets.model import load_model

pytestmark = pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")

CHAT = [{"role": "user", "content": "Tell me about the ocean."}]


def random_blocks(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF rows of random codes whose scales (and mins) mix normal, zero, subnormal and
    negative halves, every exponent but the inf/NaN one."""
    rng = np.random.default_rng(seed)
    _, size = quant.TYPES[name]
    blocks = rng.integers(0, 256, (n, k // 32, size), dtype=np.uint8)
    for off in (0, 2) if name == "Q4_1" else (0,):
        h = rng.integers(0, 1 << 16, blocks.shape[:2], dtype=np.uint16)
        h = np.where(((h >> 10) & 0x1F) == 0x1F, h & 0x83FF, h)  # exponent 31 -> subnormal
        h.flat[::7] = 0  # zero scales
        h.flat[1::7] = 0x8000 | (h.flat[1::7] & 0x3FF)  # negative subnormals
        blocks[..., off : off + 2] = h.astype("<u2")[..., None].view(np.uint8)
    return blocks.reshape(n, -1)


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", quant.SUPPORTED)
@pytest.mark.parametrize("shape", [(48, 64), (37, 96), (16, 32)])
def test_blocks_dequantize_as_gguf_bit_for_bit(name, shape):
    raw = random_blocks(name, *shape)
    ref = quant.dequantize(raw, name)
    lin = quant.QuantLinear(raw, name, shape[1])
    assert np.array_equal(bits(lin.dense()), bits(ref))
    ids = torch.tensor([[3, 0], [shape[0] - 1, 3]])
    assert np.array_equal(bits(lin.rows(ids)), bits(ref[ids.numpy()]))


@pytest.mark.parametrize("name", quant.SUPPORTED)
def test_products_equal_the_float32_kernel_on_the_dequantized_matrix(name):
    n, k = 70, 128
    raw = random_blocks(name, n, k, seed=1)
    dense = torch.from_numpy(quant.dequantize(raw, name))
    bias = torch.randn(n)
    lin, ref = quant.QuantLinear(raw, name, k, bias=bias), native.pack(dense)
    gen = torch.Generator().manual_seed(0)
    for rows in range(1, 17):
        x = torch.randn(rows, 1, k, generator=gen)
        y = lin(x)
        assert torch.equal(y, native.linear(x, ref, n, bias))
        for r in range(rows):  # each row alone: the same bits
            assert torch.equal(lin(x[r : r + 1]), y[r : r + 1])


@pytest.mark.parametrize("which", ["scale", "min"])
@pytest.mark.parametrize("half", [0x7C00, 0xFC00, 0x7E00])  # inf, -inf, NaN
def test_inf_and_nan_scales_are_refused_by_name(which, half):
    name = "Q4_1"
    raw = random_blocks(name, 16, 64).reshape(16, 2, 20)
    raw[5, 1, (0 if which == "scale" else 2) : (2 if which == "scale" else 4)] = np.array(
        [half], dtype="<u2"
    ).view(np.uint8)
    with pytest.raises(QuantizationUnsupported, match=which) as err:
        quant.QuantLinear(raw.reshape(16, -1), name, 64)
    assert err.value.qtype == name


def test_unsupported_types_are_named_with_the_supported_ones():
    with pytest.raises(QuantizationUnsupported, match="Q4_1") as err:
        quant.type_name("Q6_K")
    assert err.value.qtype == "Q6_K" and isinstance(err.value, sw.SteerWidgetsError)
    with pytest.raises(QuantizationUnsupported):
        quant.QuantLinear(np.zeros((16, 20), np.uint8), "Q4_1", 48)  # rows too short


# ------------------------------------------------------------------ the default model


@pytest.fixture(scope="module")
def quantized(engine):
    assert isinstance(engine.model.runtime.embed, quant.QuantLinear)  # the default reads blocks
    return engine.model


@pytest.fixture(scope="module")
def qengine(engine):
    return engine


@pytest.fixture(scope="module")
def fengine(sources):
    """The same model through its float32 copy (``quantized=False``)."""
    return sw.Engine(load_model(quantized=False))


def test_quantized_takes_a_bool_or_none():
    with pytest.raises(sw.errors.RequestError, match="quantized"):
        load_model(quantized="yes")


def test_default_model_reads_a_fifth_of_the_bytes(quantized, fengine):
    q, f = quantized.runtime, fengine.model.runtime
    assert isinstance(q.layers[0].wqkv, quant.QuantLinear) and q.unembed is q.embed
    assert q.weight_bytes() * 5 < f.weight_bytes()
    assert torch.equal(q.unembed_weight, f.unembed_weight)


def test_logits_equal_the_float32_native_path(quantized, fengine):
    q, f = quantized.runtime, fengine.model.runtime
    assert not isinstance(f.embed, quant.QuantLinear)
    ids = torch.tensor([fengine.tokenizer.encode(CHAT).ids])
    assert torch.equal(q.forward(ids), f.forward(ids))
    caches = q.new_cache(1, ids.shape[1] + 8), f.new_cache(1, ids.shape[1] + 8)
    step = ids
    for _ in range(6):  # prefill, then decode steps
        a, b = (r.forward(step, c, last_only=True) for r, c in zip((q, f), caches, strict=True))
        assert torch.equal(a, b)
        step = a[:, -1].argmax(-1, keepdim=True)


def test_rows_in_a_batch_equal_rows_alone(quantized):
    runtime = quantized.runtime
    gen = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, 49152, (16, 9), generator=gen)
    for rows in (1, 2, 3, 5, 16):
        cache = runtime.new_cache(rows, 12)
        together = [runtime.forward(tokens[:rows, :6], cache)]
        for t in range(6, 9):
            together.append(runtime.forward(tokens[:rows, t : t + 1], cache))
        for r in (0, rows - 1):
            solo = runtime.new_cache(1, 12)
            alone = [runtime.forward(tokens[r : r + 1, :6], solo)]
            for t in range(6, 9):
                alone.append(runtime.forward(tokens[r : r + 1, t : t + 1], solo))
            for a, b in zip(together, alone, strict=True):
                assert torch.equal(a[r : r + 1], b), (rows, r)


def test_greedy_tokens_equal_transformers(qengine):
    from transformers import AutoModelForCausalLM

    from steer_widgets.model import default_model_dir

    hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    ids = list(qengine.tokenizer.encode(CHAT).ids)
    n = 16
    ref = hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=2)[
        0, len(ids) :
    ].tolist()
    out = qengine.generate(CHAT, n_completion_tokens=n, temperature=0)
    assert list(out.token_ids) == ref


def test_steering_and_sae_reads_equal_the_float32_engine(qengine, fengine, sources):
    vector = sw.Vector(torch.randn(576, generator=torch.Generator().manual_seed(0)),
                       "blocks.7.hook_resid_post", 6.0)  # fmt: skip
    request = sw.SteerRequest(
        prompt=CHAT,
        features=[sw.Feature(sources[-1], 5, 50.0)],
        vectors=[vector],
        sweep=(-1.0, 2.0),
        temperature=0.7,
        seed=7,
        n_completion_tokens=8,
    )
    for e in (qengine, fengine):
        e.clear_caches()
    a, b = qengine.steer(request), fengine.steer(request)
    assert {k: v.token_ids for k, v in a.outputs.items()} == {
        k: v.token_ids for k, v in b.outputs.items()
    }
    text = "The ocean is deep and blue"
    acts = [e.activations(text, sources[0], 3) for e in (qengine, fengine)]
    assert acts[0].values == acts[1].values


VARIANT = """
import sys, numpy as np, torch
from steer_widgets import native, quant
native.FLAGS[:] = sys.argv[1].split()
from tests.test_quantized import random_blocks
assert native.extension() is not None
for name in quant.SUPPORTED:
    raw = random_blocks(name, 40, 96, seed=2)
    ref = torch.from_numpy(quant.dequantize(raw, name))
    lin, packed = quant.QuantLinear(raw, name, 96), native.pack(ref)
    assert torch.equal(lin.dense().view(torch.int32), ref.view(torch.int32)), name
    for rows in (1, 2, 3, 7):
        x = torch.randn(rows, 96)
        assert torch.equal(lin(x), native.linear(x, packed, 40)), (name, rows)
print("OK")
"""


@pytest.mark.parametrize(
    "flags",
    ["-march=native -mno-avx512f", "-march=x86-64"],  # the AVX2 path, the portable one
    ids=["avx2", "scalar"],
)
def test_every_instruction_set_path_gives_the_same_bits(flags, tmp_path):
    """This CPU's build takes one path; the others are built for it in a scratch cache."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if "avx2" not in Path("/proc/cpuinfo").read_text() and "avx2" in flags:
        pytest.skip("no AVX2 here")
    base = [f for f in native.FLAGS if not f.startswith("-march")]
    root = Path(__file__).parent.parent
    env = dict(os.environ, STEER_WIDGETS_CACHE=str(tmp_path), PYTHONPATH=str(root))
    proc = subprocess.run(
        [sys.executable, "-c", VARIANT, " ".join([*flags.split(), *base])],
        env=env, capture_output=True, text=True, timeout=900, cwd=root,
    )  # fmt: skip
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
