"""Load time of a GGUF at the sizes users study (issue 69): SmolLM2-1.7B's shape.

The file is written here with gguf's writer and random blocks, never committed: d 2048, 24
blocks, 32 heads and 32 key heads, ffn 8192, the default model's tokenizer and chat template,
tied embeddings, in ``Q4_K_M``'s type layout (every matrix ``Q4_K``; the embedding, and
``attn_v`` and ``ffn_down`` in llama.cpp's "more bits" layers, ``Q6_K``): 1.06 GB. The codes
are random bytes and each super-block's f16 scales small finite halves, so the file has
llama.cpp's types and sizes without running a quantizer (the values do not matter to a load).
Loads run in fresh processes (``sizes_load.py``), the user cache pointed at a scratch folder:

* ``first``: nothing cached (the blocks packed for the kernel and the row groups measured,
  then both kept in the cache);
* ``warm``: the cache and the file in the page cache;
* ``cold``: the cache and the file dropped from the page cache first
  (``posix_fadvise(DONTNEED)`` on those files alone).

Each figure is the best of ``SW_BENCH_ROUNDS`` (3) processes, for float32 and int8
products; ``warm_vs_first`` is the ratio in the same run. ``SW_SIZES_GGUF`` names a file to
time instead (llama.cpp's own ``Q4_K_M``, say).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROUNDS = int(os.environ.get("SW_BENCH_ROUNDS", "3"))
SHAPE = {"d": 2048, "blocks": 24, "heads": 32, "kv_heads": 32, "ffn": 8192}
LOAD = Path(__file__).with_name("sizes_load.py")


def more_bits(i: int, n: int) -> bool:
    """llama.cpp's ``use_more_bits``: the layers whose ``attn_v`` and ``ffn_down`` ``Q4_K_M``
    keeps in ``Q6_K``."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _random_blocks(rng: np.random.Generator, rows: int, k: int, qtype) -> np.ndarray:
    """[rows, K] as random GGUF blocks of ``qtype`` whose f16 factors are small finite
    halves."""
    import gguf

    from steer_widgets.runtime import quant

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.frombuffer(rng.bytes(rows * k // block * size), np.uint8).reshape(-1, size).copy()
    for off in quant.HALVES[qtype.name]:
        halves = rng.uniform(1e-4, 1e-3, raw.shape[0]).astype("<f2")
        raw[:, off : off + 2] = halves.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


def _tensors(shape: dict) -> list[tuple[str, tuple[int, int], object]]:
    """(name, [rows, K] or [K], type) of every tensor, in file order."""
    from gguf import GGMLQuantizationType as T

    d, n, ffn = shape["d"], shape["blocks"], shape["ffn"]
    kv = d // shape["heads"] * shape["kv_heads"]
    out = [("token_embd.weight", (49152, d), T.Q6_K), ("output_norm.weight", (d,), T.F32)]
    for i in range(n):
        wide = T.Q6_K if more_bits(i, n) else T.Q4_K
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (d,), T.F32),
            (p + "attn_q.weight", (d, d), T.Q4_K),
            (p + "attn_k.weight", (kv, d), T.Q4_K),
            (p + "attn_v.weight", (kv, d), wide),
            (p + "attn_output.weight", (d, d), T.Q4_K),
            (p + "ffn_norm.weight", (d,), T.F32),
            (p + "ffn_gate.weight", (ffn, d), T.Q4_K),
            (p + "ffn_up.weight", (ffn, d), T.Q4_K),
            (p + "ffn_down.weight", (d, ffn), wide),
        ]
    return out


def write_model(out: Path, shape: dict = SHAPE, seed: int = 0) -> dict[str, int]:
    """A random-weight GGUF of ``shape`` with the default model's tokenizer, written a tensor
    at a time; the count of tensors per type."""
    import gguf
    from gguf import GGMLQuantizationType as T

    from steer_widgets.runtime.model import gguf_path

    reader = gguf.GGUFReader(gguf_path())
    w = gguf.GGUFWriter(str(out), "llama")
    for field in reader.fields.values():
        if field.name.startswith(("GGUF.", "llama.")) or field.name == "general.architecture":
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    w.add_block_count(shape["blocks"])
    w.add_context_length(8192)
    w.add_embedding_length(shape["d"])
    w.add_feed_forward_length(shape["ffn"])
    w.add_head_count(shape["heads"])
    w.add_head_count_kv(shape["kv_heads"])
    w.add_rope_freq_base(130000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(49152)
    w.add_rope_dimension_count(shape["d"] // shape["heads"])
    tensors, counts = _tensors(shape), {}
    for name, dims, qtype in tensors:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(dims)) // block * size
        byte_shape = dims if qtype == T.F32 else (dims[0], dims[1] // block * size)
        dtype = np.float32 if qtype == T.F32 else np.uint8
        w.add_tensor_info(name, byte_shape, np.dtype(dtype), nbytes, raw_dtype=qtype)
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for _, dims, qtype in tensors:
        if qtype == T.F32:
            w.write_tensor_data((1 + rng.standard_normal(dims) * 0.1).astype(np.float32))
        else:
            w.write_tensor_data(_random_blocks(rng, dims[0], dims[1], qtype))
    w.close()
    return counts


def _env(cache: Path) -> dict:
    env = {**os.environ, "STEER_WIDGETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    return env


def _load(path: Path, cache: Path, products: str, cold: bool) -> dict:
    """One load in a fresh process: its figures (``sizes_load.py``)."""
    settings = json.dumps({"products": products, "cold": cold})
    out = subprocess.run(
        [sys.executable, str(LOAD), str(path), settings],
        capture_output=True, text=True, check=True, env=_env(cache),
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _figures(path: Path, scratch: Path, products: str) -> dict:
    from steer_widgets.runtime import native

    cache = scratch / f"cache-{products}"
    built = native.build_dir()
    if built.exists():  # this machine's kernel build, a copy of its own: no compile, and no
        # wait on the lock of a build folder that other processes are loading from
        shutil.copytree(built, cache / "ext" / built.name, ignore=shutil.ignore_patterns("lock"))
    cache.mkdir(exist_ok=True)
    # the kernel loaded once from there (a build folder copied from another checkout is
    # rebuilt for this one's source paths), so no load below pays for it
    warm_up = "from steer_widgets.runtime import native; assert native.extension()"
    subprocess.run([sys.executable, "-c", warm_up], check=True, env=_env(cache))
    first = _load(path, cache, products, cold=False)
    warm = [_load(path, cache, products, cold=False) for _ in range(ROUNDS)]
    cold = [_load(path, cache, products, cold=True) for _ in range(ROUNDS)]
    best = min(r["load_s"] for r in warm)
    return {
        "first_load_s": first["load_s"],
        "first_load_parts_s": first["parts_s"],
        "warm_load_s": best,
        "warm_load_parts_s": min(warm, key=lambda r: r["load_s"])["parts_s"],
        "cold_load_s": min(r["load_s"] for r in cold),
        "warm_first_forward_s": min(r["first_forward_s"] for r in warm),
        "warm_vs_first": first["load_s"] / best,
        "same_logits_as_first": all(r["digest"] == first["digest"] for r in warm + cold),
        "row_groups": first["row_groups"],
    }


def run() -> dict:
    import torch

    given = os.environ.get("SW_SIZES_GGUF")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        path = Path(given) if given else scratch / "SmolLM2-1.7B-shape.Q4_K_M.gguf"
        counts = None if given else write_model(path)
        figures = {
            "file": "given" if given else "random blocks, gguf's writer",
            "tensors_by_type": counts,
            "file_gb": path.stat().st_size / 1e9,
            "threads": torch.get_num_threads(),
            "rounds": ROUNDS,
        }
        for products in ("float32", "int8"):
            figures[products] = _figures(path, scratch, products)
        return figures
