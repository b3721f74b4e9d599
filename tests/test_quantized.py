"""GGUF blocks read by the native kernel: the same bits as transformers' float32 copy.

Every weight is dequantized with gguf's own float32 operations and then enters the float32
kernel's fused multiply-add chain, so the claims here are equalities, not tolerances."""

from __future__ import annotations

import native_ops
import numpy as np
import pytest
import torch
from kernel_variants import AVX2, AVX2_VNNI, AVX512_NO_VNNI, ROOT, SCALAR, runs_here

import steer_widgets as sw
from steer_widgets.errors import QuantizationUnsupported
from steer_widgets.runtime import native, quant
from steer_widgets.runtime.model import load_model

pytestmark = pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")

CHAT = [{"role": "user", "content": "Tell me about the ocean."}]


def random_blocks(name: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """GGUF rows of random codes whose f16 factors (scales d, mins or dmin) mix normal,
    zero, subnormal, negative and the largest finite halves, every exponent but the inf/NaN
    one; K-quants' 6-bit and int8 sub-block scales are random bytes (0 to 63, -128 to 127)."""
    rng = np.random.default_rng(seed)
    _, size = quant.TYPES[name]
    blocks = rng.integers(0, 256, (n, k // quant.WEIGHTS[name], size), dtype=np.uint8)
    for off in quant.HALVES[name]:
        h = rng.integers(0, 1 << 16, blocks.shape[:2], dtype=np.uint16)
        h = np.where(((h >> 10) & 0x1F) == 0x1F, h & 0x83FF, h)  # exponent 31 -> subnormal
        h.flat[::7] = 0  # zero scales
        h.flat[1::7] = 0x8000 | (h.flat[1::7] & 0x3FF)  # negative subnormals
        h.flat[2::11] = 0x7BFF | (h.flat[2::11] & 0x8000)  # +-65504, the largest finite
        blocks[..., off : off + 2] = h.astype("<u2")[..., None].view(np.uint8)
    return blocks.reshape(n, -1)


def k_of(name: str, k: int) -> int:
    """``k`` for the 32-weight types, 8k for the K-quants (their 256-weight super-blocks)."""
    return k * quant.WEIGHTS[name] // quant.QK


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("name", quant.SUPPORTED)
@pytest.mark.parametrize("shape", [(48, 64), (37, 96), (16, 32)])
def test_blocks_dequantize_as_gguf_bit_for_bit(name, shape):
    shape = shape[0], k_of(name, shape[1])
    raw = random_blocks(name, *shape)
    ref = quant.dequantize(raw, name)
    lin = quant.QuantLinear(raw, name, shape[1])
    assert np.array_equal(bits(lin.dense()), bits(ref))
    ids = torch.tensor([[3, 0], [shape[0] - 1, 3]])
    assert np.array_equal(bits(lin.rows(ids)), bits(ref[ids.numpy()]))


@pytest.mark.parametrize("name", quant.SUPPORTED)
def test_products_equal_the_float32_kernel_on_the_dequantized_matrix(name):
    n, k = 70, k_of(name, 128)
    raw = random_blocks(name, n, k, seed=1)
    dense = torch.from_numpy(quant.dequantize(raw, name))
    bias = torch.randn(n)
    lin, ref = quant.QuantLinear(raw, name, k, bias=bias), native.pack(dense)
    gen = torch.Generator().manual_seed(0)
    for rows in (*range(1, 17), 24, 25, 40):  # tiles, and the panel (AVX-512: past 24 rows)
        x = torch.randn(rows, 1, k, generator=gen)
        y = lin(x)
        assert torch.equal(y, native_ops.linear(x, ref, n, bias))
        for r in range(rows):  # each row alone: the same bits
            assert torch.equal(lin(x[r : r + 1]), y[r : r + 1])


@pytest.mark.parametrize("name", quant.SUPPORTED)
def test_dense_slices_equal_the_rows_at_any_thread_count(name):
    """``dense(start, stop)``, a backward's weight made a slice at a time (``quant_dense``:
    the forward's vector dequantization over the pool), has ``rows``' bits for slices
    across and inside the blocks of 16, at 1 and at 5 threads (oversubscribed here)."""
    n, k = 53, k_of(name, 64)
    lin = quant.QuantLinear(random_blocks(name, n, k, seed=3), name, k)
    want = lin.rows(torch.arange(n))
    threads = torch.get_num_threads()
    try:
        for t in (1, 5):
            torch.set_num_threads(t)
            for a, b in ((0, n), (0, 16), (5, 11), (13, 40), (48, 53), (7, 7)):
                assert torch.equal(lin.dense(a, b), want[a:b]), (t, a, b)
    finally:
        torch.set_num_threads(threads)
    for a, b in ((-1, 3), (4, 3), (0, 54)):
        with pytest.raises(IndexError, match="out of range for 53 rows"):
            lin.dense(a, b)


def test_dense_slices_of_fused_parts_join_their_parts():
    k = 64
    raws = [(random_blocks("Q8_0", 20, k), "Q8_0"), (random_blocks("Q4_0", 16, k), "Q4_0")]
    parts = [quant.QuantWeight(lambda r=r: r, t, k, r.shape[0]) for r, t in raws]
    fused = quant.QuantParts(parts)
    want = torch.cat([torch.from_numpy(quant.dequantize(r, t)) for r, t in raws])
    for a, b in ((0, 36), (3, 20), (18, 25), (20, 36), (25, 25)):
        assert torch.equal(fused.dense(a, b), want[a:b]), (a, b)
    with pytest.raises(IndexError, match="out of range for 36 rows"):
        fused.dense(0, 37)


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
    with pytest.raises(QuantizationUnsupported, match="Q4_1, .*Q6_K") as err:
        quant.type_name("Q3_K")
    assert err.value.qtype == "Q3_K" and isinstance(err.value, sw.SteerWidgetsError)
    assert "load_model(path, quantized=False)" in str(err.value)
    with pytest.raises(QuantizationUnsupported):
        quant.QuantLinear(np.zeros((16, 20), np.uint8), "Q4_1", 48)  # rows too short


@pytest.mark.parametrize("name", ["Q8_0", "Q4_K"])
def test_a_row_id_past_the_last_row_is_an_index_error(name):
    """37 rows are packed as 48 (blocks of 16 columns): ids 37 to 47 are the padding's
    zeros, no row, and are refused as the float path refuses them (before: zero rows)."""
    k = k_of(name, 64)
    raw = random_blocks(name, 37, k)
    lin, dense = quant.QuantLinear(raw, name, k), torch.from_numpy(quant.dequantize(raw, name))
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(torch.tensor([37]), dense)  # the float path
    for bad in (37, 47, 48, -1):
        with pytest.raises(IndexError, match=f"row id {bad} out of range for 37 rows"):
            lin.rows(torch.tensor([[0, 5], [bad, 36]]))
    assert torch.equal(lin.rows(torch.tensor([36, 0])), dense[[36, 0]])


def test_a_row_id_outside_every_part_is_an_index_error():
    """A ``QuantParts`` fills each id from its part: an id in none of them (before: the
    unfilled output's memory came back) is refused before any row is read."""
    k, rng = 64, np.random.default_rng(4)
    raws = [(random_blocks("Q8_0", 20, k), "Q8_0"), (random_blocks("Q4_0", 16, k), "Q4_0")]
    parts = [quant.QuantWeight(lambda r=r: r, t, k, r.shape[0]) for r, t in raws]
    fused = quant.QuantParts(parts)
    assert len(fused.parts) == 2 and fused.out_features == 36
    dense = torch.cat([torch.from_numpy(quant.dequantize(r, t)) for r, t in raws])
    for bad in (36, 47, -1):
        ids = torch.from_numpy(rng.permutation(np.r_[0:36, bad]))
        with pytest.raises(IndexError, match=f"row id {bad} out of range for 36 rows"):
            fused.rows(ids)
    ids = torch.tensor([[35, 0], [20, 19]])
    assert torch.equal(fused.rows(ids), dense[ids])


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

    from steer_widgets.runtime.model import default_model_dir

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
from steer_widgets.runtime import native, quant
native.FLAGS[:] = sys.argv[1].split()
from tests.test_quantized import random_blocks
assert native.extension() is not None
for name in quant.SUPPORTED:
    k = 96 * quant.WEIGHTS[name] // quant.QK
    raw = random_blocks(name, 40, k, seed=2)
    ref = torch.from_numpy(quant.dequantize(raw, name))
    lin, packed = quant.QuantLinear(raw, name, k), native.pack(ref)
    assert torch.equal(lin.dense().view(torch.int32), ref.view(torch.int32)), name
    for rows in (1, 2, 3, 7, 13):  # the wide, tile and panel paths
        x = torch.randn(rows, k)
        assert torch.equal(lin(x), torch.ops.steer_widgets.rowwise_linear(x, packed, 40)), (name, rows)
from tests.test_quantized import int8_digest
print("OK", int8_digest())
"""


def int8_digest() -> str:
    """A hash of the int8 kernel's outputs for each type it reads and row counts on its
    tile and tail paths: every build must give these bits."""
    import hashlib

    digest = hashlib.sha256()
    for name in quant.SUPPORTED:
        k = 96 * quant.WEIGHTS[name] // quant.QK
        raw = random_blocks(name, 40, k, seed=6)
        packed, qtype = quant.pack_int8(raw, name), quant.TYPES[quant.kernel_type(name)][0]
        for rows in (1, 3, 4, 9):
            x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
            y = native.op("int8_linear")(x, packed, 40, qtype, None)
            digest.update(y.numpy().tobytes())
    return digest.hexdigest()


NEEDS = {  # the CPU features each variant's build runs on
    AVX2: ("avx2", "fma", "f16c"),
    AVX2_VNNI: ("avx2", "fma", "f16c", "avx_vnni"),
    AVX512_NO_VNNI: ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"),
    SCALAR: (),
}


@pytest.mark.parametrize(
    "variant", list(NEEDS), ids=["avx2", "avx2-vnni", "avx512-no-vnni", "scalar"]
)
def test_every_instruction_set_path_gives_the_same_bits(variant, kernel_variants):
    """This CPU's build takes one path; the others are built for it, each once per session
    (shared with test_build_paths and test_native_linear: ``kernel_variants.py``), where
    this CPU can run them: AVX-512 VNNI, AVX-VNNI, AVX2 and portable int8 sums all give one
    integer, so one set of bits."""
    import subprocess
    import sys

    if not runs_here(*NEEDS[variant]):
        pytest.skip(f"this CPU lacks one of {NEEDS[variant]}")
    proc = subprocess.run(
        [sys.executable, "-c", VARIANT, kernel_variants.flags(variant)],
        env=kernel_variants.env(variant), capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == int8_digest()  # the int8 kernel's bits are this build's


# ------------------------------------------------------------------ any GGUF


def tokenizer_fields() -> dict:
    """The default GGUF's tokenizer (a tiny model needs a real one for transformers)."""
    import gguf

    from steer_widgets.runtime.model import gguf_path

    fields = gguf.GGUFReader(gguf_path()).fields

    def strings(key: str) -> list[str]:
        return [bytes(fields[key].parts[i]).decode() for i in fields[key].data]

    kinds = fields["tokenizer.ggml.token_type"]
    return {
        "tokens": strings("tokenizer.ggml.tokens"),
        "types": [int(kinds.parts[i][0]) for i in kinds.data],
        "merges": strings("tokenizer.ggml.merges"),
    }


def write_tiny_qwen2(out, tok: dict, down: str = "Q4_1", ff: int = 128) -> None:
    """A 2-layer Qwen 2 GGUF written by the gguf package: q/k/v biases, q, k and v in
    different types (fused as float32), an untied Q8_0 unembedding."""
    import gguf
    from gguf import GGMLQuantizationType as T

    rng = np.random.default_rng(0)
    d, layers, nh, nkv, vocab = 64, 2, 4, 2, len(tok["tokens"])
    hd = d // nh
    w = gguf.GGUFWriter(str(out), "qwen2")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(nh)
    w.add_head_count_kv(nkv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def blocks(name: str, shape: tuple[int, int], qtype, scale: float = 0.2) -> None:
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype in (T.Q4_0, T.Q4_1, T.Q8_0):
            w.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
        else:  # Q3_K, a type we do not read: random codes, each block's scale d (its last
            # two bytes) a small half so that the values stay finite
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
            raw[..., -2:] = np.array([0.001], dtype="<f2").view(np.uint8)
            w.add_tensor(name, raw.reshape(shape[0], -1), raw_dtype=qtype)

    def floats(name: str, n: int, base: float = 0.0) -> None:
        w.add_tensor(name, (base + rng.standard_normal(n) * 0.1).astype(np.float32))

    blocks("token_embd.weight", (vocab, d), T.Q8_0, 0.5)
    blocks("output.weight", (vocab, d), T.Q8_0, 0.5)
    floats("output_norm.weight", d, 1.0)
    for i in range(layers):
        p = f"blk.{i}."
        floats(p + "attn_norm.weight", d, 1.0)
        floats(p + "ffn_norm.weight", d, 1.0)
        for part, rows, qtype in (("q", nh * hd, T.Q4_1), ("k", nkv * hd, T.Q4_0),
                                  ("v", nkv * hd, T.Q8_0)):  # fmt: skip
            blocks(p + f"attn_{part}.weight", (rows, d), qtype)
            floats(p + f"attn_{part}.bias", rows)
        blocks(p + "attn_output.weight", (d, nh * hd), T.Q4_1)
        blocks(p + "ffn_gate.weight", (ff, d), T.Q4_1)
        blocks(p + "ffn_up.weight", (ff, d), T.Q4_1)
        blocks(p + "ffn_down.weight", (d, ff), T[down])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tokenizer():
    return tokenizer_fields()


@pytest.fixture
def gguf_cache(tmp_path, monkeypatch):
    from steer_widgets.runtime import gguf_model

    monkeypatch.setattr(gguf_model, "cache_dir", lambda: tmp_path / "cache")
    return tmp_path


def test_a_gguf_of_another_architecture_matches_transformers_loader(tokenizer, gguf_cache):
    from transformers import AutoModelForCausalLM

    from steer_widgets.analysis.gradients import dense_weight

    path = gguf_cache / "tiny-qwen2.gguf"
    write_tiny_qwen2(path, tokenizer)
    hf = AutoModelForCausalLM.from_pretrained(gguf_cache, gguf_file=path.name, dtype=torch.float32)
    engine = sw.Engine(model=str(path), saes=[])
    runtime, ref = engine.model.runtime, hf.eval().state_dict()
    assert isinstance(runtime.unembed, quant.QuantLinear) and runtime.unembed is not runtime.embed
    layer, p = runtime.layers[1], "model.layers.1."
    fused = {
        "wqkv": [p + f"self_attn.{x}_proj.weight" for x in "qkv"],
        "wo": [p + "self_attn.o_proj.weight"],
        "w_gate_up": [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"],
        "w_down": [p + "mlp.down_proj.weight"],
    }
    for attr, names in fused.items():  # every weight: transformers' float32 bits
        assert torch.equal(dense_weight(getattr(layer, attr)), torch.cat([ref[n] for n in names]))
    assert torch.equal(runtime.unembed_weight, ref["lm_head.weight"])
    text = "The ocean is deep"
    ids = torch.tensor([engine.tokenizer.encode(text).ids])
    with torch.no_grad():
        logits = hf(ids).logits
    assert (runtime.forward(ids) - logits).abs().max() < 1e-4
    n = 8
    want = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.shape[1] :]
    got = engine.generate(text, n_completion_tokens=n, temperature=0).token_ids
    assert list(got) == want.tolist()


def test_a_converted_gguf_loads_its_config_without_transformers(tokenizer, gguf_cache):
    """The runtime's config is written at conversion (and into folders converted before it
    existed): it equals what transformers' config gives, and loading the default model in a
    fresh process imports no transformers config or model module (its tokenizer is a plain
    tokenizer.json one)."""
    import json
    import subprocess
    import sys

    from transformers import AutoConfig

    from steer_widgets.runtime import gguf_model
    from steer_widgets.runtime.config import TransformerConfig, fast_config

    path = gguf_cache / "tiny-qwen2.gguf"
    write_tiny_qwen2(path, tokenizer)
    folder = gguf_model.metadata_dir(path)
    written = json.loads((folder / gguf_model.FAST_CONFIG).read_text())
    want = fast_config(AutoConfig.from_pretrained(folder))
    assert TransformerConfig.from_dict(written) == want and want.n_kv_heads == 2
    (folder / gguf_model.FAST_CONFIG).unlink()  # a folder from before: rewritten on load
    assert gguf_model._fast_config(folder, path) == want
    code = (  # the default model (its metadata converted into the user cache once)
        "import sys\n"
        "import steer_widgets as sw\n"
        "sw.load_model()\n"
        "print([m for m in sys.modules if m.startswith(('transformers.models', "
        "'transformers.modeling_utils', 'transformers.configuration_utils'))])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def test_a_conversion_leaves_another_process_conversion_alone(tokenizer, gguf_cache, monkeypatch):
    """Two processes converting the same file each write a temporary folder of their own.
    Temporary names once came from ``id()``, which another process can share: here the other
    process's half-written folder sits at the name this process would have taken."""
    from steer_widgets.runtime import gguf_model

    monkeypatch.setattr(gguf_model, "id", lambda _: 7, raising=False)  # ids that collide
    path = gguf_cache / "tiny-qwen2.gguf"
    write_tiny_qwen2(path, tokenizer)
    folder = gguf_model.metadata_folder(path)
    theirs = folder.with_name(folder.name + ".tmp7")
    theirs.mkdir(parents=True)
    (theirs / "half-written").write_text("another process")
    assert gguf_model.metadata_dir(path) == folder and (folder / gguf_model.INDEX).exists()
    assert sorted(p.name for p in theirs.iterdir()) == ["half-written"]
    assert not (folder / "half-written").exists()
    assert [p.name for p in folder.parent.iterdir() if p.name.endswith("tmp")] == []


def test_a_gguf_with_an_unsupported_type_is_refused_by_name(tokenizer, gguf_cache):
    path = gguf_cache / "tiny-q3k.gguf"
    write_tiny_qwen2(path, tokenizer, down="Q3_K", ff=256)
    with pytest.raises(QuantizationUnsupported, match="Q4_1") as err:
        load_model(str(path))
    assert err.value.qtype == "Q3_K" and "quantized=False" in str(err.value)
    loaded = load_model(str(path), quantized=False)  # gguf dequantizes it, as transformers does
    assert loaded.runtime.forward(torch.tensor([[1, 2, 3]])).isfinite().all()
