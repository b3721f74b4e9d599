"""K-quant files: Q5_0, Q5_1, Q4_K, Q5_K and Q6_K read by the native kernel, exactly.

What llama.cpp's Q4_K_M, Q5_K_M and Q6_K files hold (with Q8_0, and Q5_0 where a row is not a
multiple of 256). The dequantization equalities on random blocks, every type and every
instruction-set path, are ``test_quantized.py``'s (its parametrisations cover every supported
type); here a tiny Llama GGUF written with those types loads in the engine with the float32
native path's logits on gguf's dequantized weights, transformers' greedy tokens, and batched
rows equal to solo rows at 1 to 16 threads; any other type is refused by name and still reads
dequantized."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_quantized import random_blocks, tokenizer_fields

import steer_widgets as sw
from steer_widgets.errors import QuantizationUnsupported
from steer_widgets.runtime import gguf_model, native, quant
from steer_widgets.runtime.linear import Linear
from steer_widgets.runtime.model import load_model

pytestmark = pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")

ROOT = Path(__file__).resolve().parents[1]
NEW = ("Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
# per layer: (q/k/v, o, gate/up, down): every new type in both a square and a wide matrix
# (layer 1's v of another type than its q and k, as llama.cpp's Q4_K_M gives attn_v more bits)
LAYERS = [("Q5_0", "Q4_K", "Q5_K", "Q6_K"), (("Q5_1", "Q5_1", "Q6_K"), "Q6_K", "Q4_K", "Q5_K")]


def k_blocks(rng: np.random.Generator, shape: tuple[int, int], name: str, d: float) -> np.ndarray:
    """Valid random GGUF rows of any read type (gguf cannot quantize the K-quants): random
    codes and sub-block scales, f16 factors about ``d`` (0.1-sized weights here; a random
    model of many layers, ``benchmarks/cores_check.py``, picks smaller ones)."""
    _, size = quant.TYPES[name]
    raw = rng.integers(0, 256, (shape[0], shape[1] // quant.WEIGHTS[name], size), dtype=np.uint8)
    for off in quant.HALVES[name]:
        half = (np.abs(rng.standard_normal(raw.shape[:2])) * d).astype("<f2")
        raw[..., off : off + 2] = half[..., None].view(np.uint8)
    return raw.reshape(shape[0], -1)


def llama_writer(out: Path, tok: dict, layers: int, d: int, ff: int, nh: int, nkv: int):
    """A ``gguf.GGUFWriter`` holding a Llama's settings and ``tok``'s tokenizer fields."""
    import gguf

    w = gguf.GGUFWriter(str(out), "llama")
    for add, value in ((w.add_block_count, layers), (w.add_context_length, 2048),
                       (w.add_embedding_length, d), (w.add_feed_forward_length, ff),
                       (w.add_head_count, nh), (w.add_head_count_kv, nkv),
                       (w.add_rope_dimension_count, d // nh), (w.add_rope_freq_base, 10000.0),
                       (w.add_layer_norm_rms_eps, 1e-5), (w.add_tokenizer_model, "gpt2"),
                       (w.add_tokenizer_pre, "smollm"), (w.add_token_list, tok["tokens"]),
                       (w.add_token_types, tok["types"]), (w.add_token_merges, tok["merges"]),
                       (w.add_bos_token_id, 1), (w.add_eos_token_id, 2)):  # fmt: skip
        add(value)
    return w


def write_tiny_llama(out: Path, tok: dict, d: int = 256, ff: int = 512) -> None:
    """A 2-layer Llama GGUF whose matrices are Q5_0, Q5_1 (quantized by gguf), Q4_K, Q5_K and
    Q6_K (blocks written as bytes), the embedding Q4_K and an untied Q6_K unembedding."""
    import gguf
    from gguf import GGMLQuantizationType as T

    rng = np.random.default_rng(5)
    nh, nkv, vocab = 4, 2, len(tok["tokens"])
    hd = d // nh
    w = llama_writer(out, tok, len(LAYERS), d, ff, nh, nkv)

    def blocks(name: str, shape: tuple[int, int], qtype: str, scale: float = 0.1) -> None:
        if qtype in ("Q5_0", "Q5_1"):
            x = (rng.standard_normal(shape) * scale).astype(np.float32)
            w.add_tensor(name, gguf.quants.quantize(x, T[qtype]), raw_dtype=T[qtype])
        else:
            d_of = {"Q4_K": 2e-4, "Q5_K": 1e-4, "Q6_K": 1e-4}[qtype] * scale / 0.1
            w.add_tensor(name, k_blocks(rng, shape, qtype, d_of), raw_dtype=T[qtype])

    def floats(name: str, n: int) -> None:
        w.add_tensor(name, (1.0 + rng.standard_normal(n) * 0.1).astype(np.float32))

    blocks("token_embd.weight", (vocab, d), "Q4_K", 0.5)
    blocks("output.weight", (vocab, d), "Q6_K", 0.3)
    floats("output_norm.weight", d)
    for i, (qkv, o, gate_up, down) in enumerate(LAYERS):
        p = f"blk.{i}."
        floats(p + "attn_norm.weight", d)
        floats(p + "ffn_norm.weight", d)
        types = (qkv,) * 3 if isinstance(qkv, str) else qkv
        for part, rows, qtype in zip("qkv", (nh * hd, nkv * hd, nkv * hd), types, strict=True):
            blocks(p + f"attn_{part}.weight", (rows, d), qtype)
        blocks(p + "attn_output.weight", (d, nh * hd), o)
        blocks(p + "ffn_gate.weight", (ff, d), gate_up)
        blocks(p + "ffn_up.weight", (ff, d), gate_up)
        blocks(p + "ffn_down.weight", (d, ff), down)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny K-quant Llama, with its metadata converted into a cache of its own."""
    folder = tmp_path_factory.mktemp("kquants")
    path = folder / "tiny-kquants.gguf"
    write_tiny_llama(path, tokenizer_fields())
    return path


@pytest.fixture
def cache(tiny, monkeypatch) -> Path:
    """The tiny model's own cache (its converted metadata), sharing this machine's compiled
    kernel: a process started on it loads that build rather than compiling one of its own."""
    folder = tiny.parent / "cache"
    built = native.build_dir().parent  # <the user cache>/ext, before the cache moves
    if built.is_dir() and not (folder / "ext").exists():
        folder.mkdir(exist_ok=True)
        (folder / "ext").symlink_to(built)
    monkeypatch.setenv("STEER_WIDGETS_CACHE", str(folder))
    return folder


PROMPT = "The ocean is deep and"


def test_every_new_type_is_read_as_blocks(tiny, cache):
    runtime = load_model(str(tiny)).runtime
    seen = {runtime.embed.qtype_name, runtime.unembed.qtype_name}
    for layer in runtime.layers:
        for attr in ("wqkv", "wo", "w_gate_up", "w_down"):
            lin = getattr(layer, attr)
            parts = lin.parts if isinstance(lin, quant.QuantParts) else [lin]
            for part in parts:
                assert isinstance(part, quant.QuantLinear), attr  # none fell back to float32
                seen.add(part.qtype_name)
    assert seen == set(NEW)
    mixed = runtime.layers[1].wqkv  # q and k Q5_1, v Q6_K: two products, joined
    assert [p.qtype_name for p in mixed.parts] == ["Q5_1", "Q6_K"]
    assert (
        mixed.out_features == runtime.cfg.d_model + 2 * runtime.cfg.n_kv_heads * runtime.cfg.d_head
    )


def test_a_fused_matrix_of_two_types_equals_its_dequantized_rows(tiny, cache):
    """``QuantParts``: the product, its rows (a backward's dense weight) and ``dense``."""
    runtime = load_model(str(tiny)).runtime
    f = load_model(str(tiny), quantized=False).runtime
    mixed, dense = runtime.layers[1].wqkv, f.layers[1].wqkv
    x = torch.randn(3, runtime.cfg.d_model, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mixed(x), dense(x))
    ids = torch.tensor([0, 5, mixed.parts[0].out_features, mixed.out_features - 1, 3])
    assert torch.equal(mixed.rows(ids), mixed.dense()[ids])
    assert mixed.nbytes() == sum(p.nbytes() for p in mixed.parts)


def test_q5_0_is_read_as_q8_0_and_fuses_with_a_q8_0_v():
    """A Q5_0 weight d * (q - 16) is the Q8_0 weight of code q - 16 under the same d, so the
    kernel reads Q5_0 as whole bytes; a Q5_0 q and k then fuse with a Q8_0 v (llama.cpp's
    Q4_K_M of a 576-wide model) into one product, with the float32 kernel's bits."""
    import gguf

    rng = np.random.default_rng(3)
    k = 64
    raws = []
    for rows, qtype in ((48, "Q5_0"), (16, "Q5_0"), (16, "Q8_0")):
        x = rng.standard_normal((rows, k)).astype(np.float32)
        raws.append((gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype]), qtype))
    parts = [quant.QuantWeight(lambda r=r: r, t, k, r.shape[0]) for r, t in raws]
    fused = quant.QuantParts(parts)
    assert [p.qtype for p in fused.parts] == [quant.TYPES["Q8_0"][0]]  # one product
    assert fused.parts[0].packed.shape[-1] == 32 + 16 * quant.QK  # Q8_0's group
    dense = torch.cat([torch.from_numpy(quant.dequantize(r, t)) for r, t in raws])
    assert torch.equal(fused.dense(), dense)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(1))
    assert torch.equal(fused(x), Linear(dense, kernel="native")(x))
    alone = quant.QuantLinear(raws[0][0], "Q5_0", k)
    assert alone.qtype_name == "Q5_0" and torch.equal(alone(x), fused(x)[:, :48])


def test_logits_equal_the_float32_native_path(tiny, cache):
    """``quantized=False``: gguf's dequantized weights through the float32 native kernel."""
    q = sw.Engine(model=str(tiny), saes=[])
    f = load_model(str(tiny), quantized=False).runtime
    assert not isinstance(f.layers[0].wqkv, quant.QuantLinear)
    ids = torch.tensor([q.tokenizer.encode(PROMPT).ids])
    runtime = q.model.runtime
    assert torch.equal(runtime.forward(ids), f.forward(ids))
    caches = runtime.new_cache(1, ids.shape[1] + 8), f.new_cache(1, ids.shape[1] + 8)
    step = ids
    for _ in range(5):  # prefill, then decode steps
        a, b = (
            r.forward(step, c, last_only=True) for r, c in zip((runtime, f), caches, strict=True)
        )
        assert torch.equal(a, b)
        step = a[:, -1].argmax(-1, keepdim=True)


def test_greedy_tokens_equal_transformers_gguf_load(tiny, cache):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny.parent, gguf_file=tiny.name, dtype=torch.float32)
    engine = sw.Engine(model=str(tiny), saes=[])
    ids = torch.tensor([engine.tokenizer.encode(PROMPT).ids])
    with torch.no_grad():
        logits = hf.eval()(ids).logits
    assert (engine.model.runtime.forward(ids) - logits).abs().max() < 1e-3
    n = 8
    want = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.shape[1] :]
    got = engine.generate(PROMPT, n_completion_tokens=n, temperature=0).token_ids
    assert list(got) == want.tolist()


ROWS = """
import hashlib, json, sys, torch
from steer_widgets.runtime.model import load_model
torch.set_num_threads(int(sys.argv[2]))
tokens = torch.randint(0, 49152, (13, 9), generator=torch.Generator().manual_seed(4))
def run(runtime, rows):
    cache = runtime.new_cache(rows.shape[0], 12)
    out = [runtime.forward(rows[:, :6], cache)]
    out += [runtime.forward(rows[:, t : t + 1], cache) for t in range(6, 9)]
    return out
exact, digests = True, {}
for products in ("float32", "int8"):
    runtime, digest = load_model(sys.argv[1], products=products).runtime, hashlib.sha1()
    for n in (2, 5, 13):  # the wide, tile and panel paths of the products
        together = run(runtime, tokens[:n])
        for r in (0, n - 1):
            alone = run(runtime, tokens[r : r + 1])
            exact &= all(torch.equal(a[r : r + 1], b) for a, b in zip(together, alone))
        for a in together:
            digest.update(a.numpy().tobytes())
    digests[products] = digest.hexdigest()
print(json.dumps({"exact": bool(exact), "digest": digests}))
"""


def test_rows_equal_solo_rows_at_every_thread_count(tiny, cache):
    """Each count in a fresh process (a crash is a failure), float32 and int8 products; 4-16
    threads oversubscribe a small machine, which only widens the windows a race needs."""
    load_model(str(tiny))  # the metadata, converted once for the processes below
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    digests = {}
    for threads in (1, 4, 16):
        proc = subprocess.run(
            [sys.executable, "-c", ROWS, str(tiny), str(threads)],
            env=env, capture_output=True, text=True, timeout=600, cwd=ROOT,
        )  # fmt: skip
        assert proc.returncode == 0, f"{threads} threads: {proc.stderr[-2000:]}"
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert report["exact"], threads
        digests[threads] = json.dumps(report["digest"], sort_keys=True)
    assert len(set(digests.values())) == 1, digests  # the same bits at every count
    assert len(set(json.loads(digests[1]).values())) == 2  # int8 is not float32's arithmetic


@pytest.mark.parametrize("name", NEW)
@pytest.mark.parametrize("which", ["scale", "min"])
def test_inf_and_nan_factors_are_refused_by_name(name, which):
    offsets = quant.HALVES[name]
    if which == "min" and len(offsets) == 1:
        pytest.skip(f"{name} has no min")
    k = quant.WEIGHTS[name] * 2
    raw = random_blocks(name, 16, k).reshape(16, 2, -1)
    off = offsets[0 if which == "scale" else 1]
    raw[5, 1, off : off + 2] = np.array([0x7E00], dtype="<u2").view(np.uint8)  # NaN
    with pytest.raises(QuantizationUnsupported, match=which) as err:
        quant.QuantLinear(raw.reshape(16, -1), name, k)
    assert err.value.qtype == name


def other_types() -> list[str]:
    """Every block type gguf dequantizes that the kernel does not read."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import _type_traits

    return [
        t.name
        for t in GGMLQuantizationType
        if t in _type_traits and t in GGML_QUANT_SIZES and t.name not in quant.TYPES
    ]


def test_other_types_are_refused_and_read_dequantized(tmp_path):
    """Each type gguf knows but the kernel does not: refused by name with the way out, and
    that way (``read_tensors`` with ``blocks=False``, what ``quantized=False`` calls) gives
    gguf's own float32 values."""
    import gguf

    names = other_types()
    assert {"Q2_K", "Q3_K", "IQ4_XS", "BF16"} <= set(names)
    rng = np.random.default_rng(0)
    path = tmp_path / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    raws = {}
    for i, name in enumerate(names):
        qtype = gguf.GGMLQuantizationType[name]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raws[name] = rng.integers(0, 256, (4, 2 * size), dtype=np.uint8)
        w.add_tensor(f"blk.{i}.ffn_down.weight", raws[name], raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    index = gguf_model.tensor_index(path)
    with np.errstate(invalid="ignore", over="ignore"):  # random bytes: some NaN factors
        state = gguf_model.read_tensors(path, (1, 1), index, blocks=False)
    for i, name in enumerate(names):
        with pytest.raises(QuantizationUnsupported, match="quantized=False") as err:
            quant.type_name(name)
        assert err.value.qtype == name
        with np.errstate(invalid="ignore", over="ignore"):
            want = gguf.quants.dequantize(raws[name], gguf.GGMLQuantizationType[name])
        got = state[f"model.layers.{i}.mlp.down_proj.weight"].numpy()
        assert np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32)), name
    with pytest.raises(QuantizationUnsupported, match=names[0]):
        gguf_model.read_tensors(path, (1, 1), index, blocks=True)
