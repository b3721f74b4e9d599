"""One SAE in SAE Lens' on-disk format: its config, its weights, encode and decode.

We read the format ourselves (``cfg.json`` + ``sae_weights.safetensors``) instead of building
SAE Lens objects: importing SAE Lens costs about 20 s, and reading safetensors directly lets
us fetch one decoder row or one encoder column without loading the rest. Tests check every
architecture against SAE Lens' own ``encode``/``decode``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from .errors import SourceError
from .runtime import hook_layer

ARCHITECTURES = ("standard", "topk", "jumprelu")
WEIGHTS_FILE, CONFIG_FILE = "sae_weights.safetensors", "cfg.json"


@dataclass(frozen=True)
class SAEConfig:
    """What we need to know about an SAE before loading its weights."""

    source: str
    folder: Path
    hook_name: str
    architecture: str
    d_in: int
    d_sae: int
    k: int | None = None
    apply_b_dec_to_input: bool = True

    @property
    def layer(self) -> int | None:
        return hook_layer(self.hook_name)

    def nbytes(self) -> int:
        """Resident float32 bytes once fully loaded."""
        return 4 * (2 * self.d_in * self.d_sae + self.d_sae * 2 + self.d_in)

    @classmethod
    def read(cls, source: str, folder: Path) -> SAEConfig:
        path = folder / CONFIG_FILE
        if not path.is_file():
            raise SourceError(source, f"{folder} is not an SAE folder: no {CONFIG_FILE}")
        if not (folder / WEIGHTS_FILE).is_file():
            raise SourceError(source, f"{folder} has no {WEIGHTS_FILE}")
        try:
            cfg = json.loads(path.read_text())
            meta = cfg.get("metadata") or {}
            hook = meta.get("hook_name") or cfg.get("hook_name")
            arch = cfg.get("architecture", "standard")
            out = cls(
                source=source,
                folder=folder,
                hook_name=str(hook),
                architecture=arch,
                d_in=int(cfg["d_in"]),
                d_sae=int(cfg["d_sae"]),
                k=int(cfg["k"]) if arch == "topk" else None,
                apply_b_dec_to_input=bool(cfg.get("apply_b_dec_to_input", True)),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise SourceError(source, f"unreadable {path}: {type(err).__name__}: {err}") from err
        if hook is None:
            raise SourceError(source, f"{path} names no hook (metadata.hook_name)")
        if arch not in ARCHITECTURES:
            raise SourceError(source, f"architecture {arch!r} is not one of {ARCHITECTURES}")
        if cfg.get("normalize_activations", "none") not in ("none", None):
            raise SourceError(source, "normalize_activations other than 'none' is not supported")
        if arch == "topk" and cfg.get("rescale_acts_by_decoder_norm"):
            raise SourceError(source, "rescale_acts_by_decoder_norm=True: fold decoder norms first")
        return out


class SAE:
    """Fully loaded float32 weights (``W_enc`` [d_in, d_sae], ``W_dec`` [d_sae, d_in])."""

    def __init__(self, cfg: SAEConfig, device="cpu") -> None:
        self.cfg = cfg
        tensors = read_tensors(cfg, ["W_enc", "b_enc", "W_dec", "b_dec"], device)
        if cfg.architecture == "jumprelu":
            tensors |= read_tensors(cfg, ["threshold"], device)
        self.W_enc, self.b_enc = tensors["W_enc"], tensors["b_enc"]
        self.W_dec, self.b_dec = tensors["W_dec"], tensors["b_dec"]
        self.threshold = tensors.get("threshold")
        _check_shapes(cfg, self)

    def nbytes(self) -> int:
        ts = [self.W_enc, self.b_enc, self.W_dec, self.b_dec, self.threshold]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def pre_acts(self, x: Tensor) -> Tensor:
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: Tensor) -> Tensor:
        """Feature activations [..., d_sae], the same as SAE Lens' ``encode``."""
        pre = self.pre_acts(x)
        if self.cfg.architecture == "topk":
            top = pre.topk(self.cfg.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        if self.cfg.architecture == "jumprelu":
            return pre.relu() * (pre > self.threshold)
        return pre.relu()

    def encode_one(self, x: Tensor, index: int) -> Tensor:
        """One feature's activations from one encoder column (not valid for TopK)."""
        if self.cfg.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc[:, index] + self.b_enc[index]
        if self.cfg.architecture == "jumprelu":
            return pre.relu() * (pre > self.threshold[index])
        return pre.relu()

    def decode(self, acts: Tensor) -> Tensor:
        return acts @ self.W_dec + self.b_dec


def read_tensors(cfg: SAEConfig, names: list[str], device="cpu", rows=None) -> dict[str, Tensor]:
    """Read named tensors as float32; ``rows`` selects rows of each (lazy partial read)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(cfg.folder / WEIGHTS_FILE, framework="pt", device="cpu") as f:
            missing = [n for n in names if n not in f.keys()]
            if missing:
                raise SourceError(cfg.source, f"{WEIGHTS_FILE} lacks tensors {missing}")
            out = {}
            for n in names:
                t = f.get_tensor(n) if rows is None else f.get_slice(n)[rows]
                out[n] = t.to(device=device, dtype=torch.float32)
            return out
    except (SafetensorError, OSError, RuntimeError) as err:
        raise SourceError(cfg.source, f"corrupt or unreadable {WEIGHTS_FILE}: {err}") from err


def check_weights_header(cfg: SAEConfig) -> None:
    """Validate tensor names and shapes from the safetensors header alone (no weight reads)."""
    from safetensors import SafetensorError, safe_open

    want = {
        "W_enc": [cfg.d_in, cfg.d_sae],
        "b_enc": [cfg.d_sae],
        "W_dec": [cfg.d_sae, cfg.d_in],
        "b_dec": [cfg.d_in],
    }
    try:
        with safe_open(cfg.folder / WEIGHTS_FILE, framework="pt", device="cpu") as f:
            for name, shape in want.items():
                if name not in f.keys():
                    raise SourceError(cfg.source, f"{WEIGHTS_FILE} has no tensor {name}")
                got = list(f.get_slice(name).get_shape())
                if got != shape:
                    raise SourceError(cfg.source, f"{name} has shape {got}, cfg says {shape}")
    except (SafetensorError, OSError) as err:
        raise SourceError(cfg.source, f"corrupt or unreadable {WEIGHTS_FILE}: {err}") from err


def _check_shapes(cfg: SAEConfig, sae: SAE) -> None:
    if tuple(sae.W_dec.shape) != (cfg.d_sae, cfg.d_in) or tuple(sae.W_enc.shape) != (
        cfg.d_in,
        cfg.d_sae,
    ):
        raise SourceError(cfg.source, "weight shapes do not match cfg.json")
