"""Models read from a GGUF file as it ships: quantized matrices stay blocks (``quant.py``).

transformers reads a GGUF by dequantizing every tensor to float32 (538 MB for the 97 MB
default model) after about 50 s of metadata parsing and name mapping. Here the tensors come
straight from ``gguf.GGUFReader`` (a memory map), under the transformers names our runtime
reads, with the row reordering transformers applies to Llama's q and k; only the config,
tokenizer and chat template go through transformers, once, into a small folder in the user
cache (``metadata_dir``), with our runtime's own config (``FAST_CONFIG``), so that later
loads read them in a second without importing transformers' configs (60 MB and a second
or two).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from .paths import cache_dir
from .quant import Packs, QuantWeight, type_name

# llama.cpp tensor names (per block after ``blk.N.``) -> transformers names, llama layout
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
INDEX = "gguf_tensors.json"  # tensor_index(), in metadata_dir
FAST_CONFIG = "fast_config.json"  # TransformerConfig.to_dict(), in metadata_dir
ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")  # GGUF general.architecture we map


def hf_name(name: str) -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (None: unused)."""
    stem, _, suffix = name.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _BLOCK:
        return f"model.layers.{parts[1]}.{_BLOCK[parts[2]]}.{suffix}"
    return None


def _unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """transformers' reverse of llama.cpp's q/k row permutation (rows only, so it applies
    to quantized rows as to float ones)."""
    dim = rows.shape[0] // n_head // 2
    return rows.reshape(n_head, dim, 2, *rows.shape[1:]).swapaxes(2, 1).reshape(rows.shape)


def _unpermuted(read, n_head: int):
    return lambda: _unpermute(read(), n_head)


def tensor_index(path: Path) -> dict:
    """The GGUF's architecture and, per tensor, its type, dims and byte range: what
    ``GGUFReader`` finds after parsing every metadata field (seconds: the tokenizer's
    vocabulary), kept beside the metadata so later loads only map the file."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    tensors = [
        [t.name, int(t.tensor_type), [int(d) for d in t.shape], int(t.data_offset), int(t.n_bytes)]
        for t in reader.tensors
    ]
    return {"architecture": _field(reader, "general.architecture"), "tensors": tensors}


def _tensors(path: Path, index: dict):
    """(name, ggml type, dims with the contiguous one first, a function reading the tensor
    from the file: float ones shaped, quantized ones as rows of blocks). Read, not mapped:
    mapped pages of the file would count in the process's memory beside the packed copy."""
    from gguf import GGMLQuantizationType

    for name, ttype, dims, offset, n_bytes in index["tensors"]:
        qtype = GGMLQuantizationType(ttype)

        def read(qtype=qtype, dims=dims, offset=offset, n_bytes=n_bytes) -> np.ndarray:
            raw = np.fromfile(path, dtype=np.uint8, count=n_bytes, offset=offset)
            if qtype == GGMLQuantizationType.F32:
                return raw.view(np.float32).reshape(dims[::-1])
            if qtype == GGMLQuantizationType.F16:
                return raw.view(np.float16).reshape(dims[::-1])
            return raw.reshape(int(np.prod(dims[1:])), -1)

        yield name, qtype, dims, read


def read_tensors(
    path: Path, heads: tuple[int, int], index: dict, blocks: bool = True, packs: Packs | None = None
) -> dict[str, torch.Tensor | QuantWeight]:
    """Every tensor of the GGUF under its transformers name: float tensors as float32
    (F16 converted exactly), quantized ones as ``QuantWeight`` blocks (read when packed,
    or their packing read from ``packs``), or with ``blocks`` False dequantized by gguf (any
    type it knows, as transformers' loader does). ``heads``: (query heads, key-value heads),
    for undoing llama.cpp's q/k row order."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    arch = index["architecture"]
    if arch not in ARCHITECTURES:
        from .config import UnsupportedModel

        raise UnsupportedModel(
            f"GGUF architecture {arch!r}: the quantized path reads {', '.join(ARCHITECTURES)}"
        )
    state: dict[str, torch.Tensor | QuantWeight] = {}
    for gguf_name, qtype, dims, read in _tensors(path, index):
        name = hf_name(gguf_name)
        if name is None:
            continue
        if arch == "llama" and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
            read = _unpermuted(read, heads[0] if ".attn_q." in gguf_name else heads[1])
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            state[name] = torch.from_numpy(read().astype(np.float32))
        elif not blocks:
            state[name] = torch.from_numpy(np.ascontiguousarray(dequantize(read(), qtype)))
        else:  # a named error for types the kernel does not read, listing those it does
            k, n = dims[0], int(np.prod(dims[1:]))  # GGUF dims list the contiguous one first
            state[name] = QuantWeight(read, type_name(qtype.name), k, n, gguf_name, packs)
    return state


def _block_bytes(index: dict) -> int:
    """Bytes of the file's quantized tensors (what a first load packs)."""
    floats = {0, 1}  # GGMLQuantizationType F32, F16
    return sum(n_bytes for _, ttype, _, _, n_bytes in index["tensors"] if ttype not in floats)


def _field(reader, key: str):
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.parts[field.data[0]]
    return bytes(value).decode() if value.dtype == np.uint8 else value.tolist()[0]


def metadata_folder(path: Path) -> Path:
    """Where ``metadata_dir`` keeps the file's conversion: the user cache, keyed by the file's
    path, size and modification time (a file changed in place is converted again)."""
    stat = path.stat()
    key = hashlib.sha1(f"{path.resolve()} {stat.st_size} {stat.st_mtime_ns}".encode()).hexdigest()
    return cache_dir() / "gguf" / f"{path.stem}-{key[:12]}"


def metadata_dir(path: Path) -> Path:
    """A folder with the GGUF's config, generation config, tokenizer and chat template as
    transformers reads them (converted once; a few MB)."""
    folder = metadata_folder(path)
    if not (folder / INDEX).exists():
        _convert_metadata(path, folder)
    return folder


def _convert_metadata(path: Path, folder: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    cfg = config.to_dict()
    cfg.pop("quantization_config", None)  # the weights we hand out are not transformers'
    cfg.pop("_name_or_path", None)
    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    cfg["architectures"] = [arch] if arch else None
    clean = AutoConfig.for_model(**cfg)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # a name of this conversion's own: another process converting the same file writes its
    # own, and the first rename wins
    tmp = Path(tempfile.mkdtemp(prefix=f"{folder.name}.", suffix=".tmp", dir=folder.parent))
    clean.save_pretrained(tmp)
    GenerationConfig.from_model_config(clean).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / INDEX).write_text(json.dumps(tensor_index(path)))
    _write_fast_config(tmp, path)
    try:
        tmp.rename(folder)
    except OSError:  # another process converted it first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _fast_config(folder: Path, path: Path):
    """The runtime's config from ``FAST_CONFIG`` (written at conversion; a folder converted
    before it existed gets it now, once)."""
    from .config import TransformerConfig

    if not (folder / FAST_CONFIG).exists():
        _write_fast_config(folder, path)
    return TransformerConfig.from_dict(json.loads((folder / FAST_CONFIG).read_text()))


def _write_fast_config(folder: Path, path: Path) -> None:
    from transformers import AutoConfig

    from .config import ARCHITECTURES as FAST
    from .config import UnsupportedModel, fast_config

    cfg = fast_config(AutoConfig.from_pretrained(folder))
    if cfg is None:
        raise UnsupportedModel(f"GGUF {path.name}: not one of {', '.join(FAST)}")
    fd, tmp = tempfile.mkstemp(prefix=f"{FAST_CONFIG}.", suffix=".tmp", dir=folder)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(cfg.to_dict()))
    os.replace(tmp, folder / FAST_CONFIG)


def load_gguf(
    path: Path,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    kernel: str = "native",
    quantized: bool = True,
    products: str = "float32",
):
    """The fast runtime, tokenizer and stop ids of a GGUF file (``model.load_model`` wraps
    them as a ``LoadedModel``; this module does not import ``model``). ``quantized``: matrices stay
    GGUF blocks read by the native kernel (float32 on a CPU with a built kernel; elsewhere,
    or with ``quantized=False``, they are dequantized as transformers does it, the same
    values in float32). Blocks packed for the kernel and the row groups measured are kept
    beside the metadata for the next load (``load_cache.py``)."""
    from . import native
    from .load_cache import LoadCache
    from .tokens import Tokenizer, generation_stop_ids
    from .transformer import Transformer

    path = Path(path)
    folder = metadata_dir(path)
    cfg = _fast_config(folder, path)
    blocks = (
        quantized
        and str(device) == "cpu"
        and dtype == torch.float32
        and kernel == "native"
        and native.extension() is not None
    )
    heads, index = (cfg.n_heads, cfg.n_kv_heads), json.loads((folder / INDEX).read_text())
    cache = LoadCache(folder, path, products, _block_bytes(index)) if blocks else None
    try:
        state = read_tensors(path, heads, index, blocks, cache)
        remember = None if cache is None else cache.remember
        runtime = Transformer(
            cfg,
            state,
            device=device,
            dtype=dtype,
            kernel=kernel,
            products=products,
            remember=remember,
        )
    except BaseException:
        if cache is not None:
            cache.close(keep=False)
        raise
    if cache is not None:
        cache.close()
    tokenizer = Tokenizer.from_folder(folder, prepend_bos=cfg.layout in ("gpt2", "neox"))
    stops = generation_stop_ids(folder)
    return runtime, tokenizer, stops
