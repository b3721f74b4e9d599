"""One SAE in SAE Lens' on-disk format: its config, its weights, encode and decode.

We read the format ourselves (``cfg.json`` + ``sae_weights.safetensors``) instead of building
SAE Lens objects: importing SAE Lens costs about 20 s, and reading safetensors directly lets
us fetch one decoder row or one encoder column without loading the rest. Both layouts of
``cfg.json`` are read: SAE Lens 6 (model settings nested under ``metadata``) and the older
flat one (``hook_point``, ``activation_fn_kwargs``, boolean ``normalize_activations``), with
the defaults SAE Lens fills in for it. Tests check every architecture and option against
SAE Lens' own ``encode``/``decode``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..errors import SourceError
from ..runtime.protocol import hook_layer
from .hook_view import HookView

WEIGHTS_FILE, CONFIG_FILE = "sae_weights.safetensors", "cfg.json"
# Tensors each architecture reads, besides W_enc [d_in, d_sae], W_dec [d_sae, d_in], b_dec.
PER_FEATURE = {
    "standard": ("b_enc",),
    "topk": ("b_enc",),
    "jumprelu": ("b_enc", "threshold"),
    "gated": ("b_gate", "b_mag", "r_mag"),
}
ARCHITECTURES = tuple(PER_FEATURE)
# SAE Lens' inference modes. At inference SAE Lens computes nothing for the last two: their
# statistics are folded into the weights when the SAE is saved or loaded from a release.
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm", "expected_average_only_in")
NORMALIZATIONS_FOLDED = ("expected_average_only_in", "covariance_whitening")
_RENAMED = {"hook_point": "hook_name", "hook_point_head_index": "hook_head_index"}


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
    rescale_acts_by_decoder_norm: bool = False
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    hook_head_index: int | None = None
    prepend_bos: bool = True
    model_name: str | None = None
    model_kwargs: Mapping = field(default_factory=dict, hash=False)
    neuronpedia_id: str | None = None  # "model/source" of its Neuronpedia pages
    view: HookView = HookView()  # set by the store once it knows the model

    @property
    def layer(self) -> int | None:
        return hook_layer(self.hook_name)

    def nbytes(self) -> int:
        """Resident float32 bytes once fully loaded."""
        per_feature = len(PER_FEATURE[self.architecture])
        return 4 * (2 * self.d_in * self.d_sae + per_feature * self.d_sae + self.d_in)

    @classmethod
    def read(cls, source: str, folder: Path) -> SAEConfig:
        path = folder / CONFIG_FILE
        if not path.is_file():
            raise SourceError(source, f"{folder} is not an SAE folder: no {CONFIG_FILE}")
        if not (folder / WEIGHTS_FILE).is_file():
            raise SourceError(source, f"{folder} has no {WEIGHTS_FILE}")
        try:
            raw = json.loads(path.read_text())
            return cls.from_dict(source, folder, raw)
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise SourceError(source, f"unreadable {path}: {type(err).__name__}: {err}") from err

    @classmethod
    def from_dict(cls, source: str, folder: Path, raw: dict) -> SAEConfig:
        """Parse either ``cfg.json`` layout; unsupported settings are a ``SourceError``."""
        flat = _is_pre_6(raw)
        top = {_RENAMED.get(k, k): v for k, v in raw.items()} if flat else raw
        meta = top if flat else {**top, **(raw.get("metadata") or {})}
        arch = top.get("architecture", "standard")
        kwargs = top.get("activation_fn_kwargs") or {}
        if flat and top.get("activation_fn") == "topk" and kwargs.get("k") is not None:
            arch = "topk"
        _check_supported(source, arch, top)
        hook, head = meta.get("hook_name"), meta.get("hook_head_index")
        if not hook:
            raise SourceError(source, f"{folder / CONFIG_FILE} names no hook (metadata.hook_name)")
        return cls(
            source=source,
            folder=folder,
            hook_name=str(hook),
            architecture=arch,
            d_in=int(top["d_in"]),
            d_sae=int(top["d_sae"]),
            k=_top_k(top, flat) if arch == "topk" else None,
            rescale_acts_by_decoder_norm=arch == "topk"
            and bool(top.get("rescale_acts_by_decoder_norm", False)),
            apply_b_dec_to_input=bool(top.get("apply_b_dec_to_input", True)),
            normalize_activations=_normalization(top.get("normalize_activations")),
            hook_head_index=None if head is None else int(head),
            prepend_bos=meta.get("prepend_bos") is not False,
            model_name=meta.get("model_name"),
            model_kwargs=dict(meta.get("model_from_pretrained_kwargs") or {}),
            neuronpedia_id=meta.get("neuronpedia_id") or None,
        )


def _top_k(top: dict, flat: bool) -> int:
    """The old layout keeps k in ``activation_fn_kwargs`` (and SAE Lens reads it there)."""
    if flat and "activation_fn_kwargs" in top:
        return int(top["activation_fn_kwargs"]["k"])
    return int(top.get("k", 100))


def _is_pre_6(raw: dict) -> bool:
    """SAE Lens' rule: no version, or one before 6.0, means the old flat layout; but a nested
    ``metadata`` (a folder written by hand in the new layout) is read as the new one."""
    if isinstance(raw.get("metadata"), dict):
        return False
    version = raw.get("sae_lens_version") or (raw.get("metadata") or {}).get("sae_lens_version")
    try:
        return not version or int(str(version).split(".")[0]) < 6
    except ValueError:
        return True


def _normalization(mode) -> str:
    if mode is None or mode is False:
        return "none"
    if mode is True:  # old layout: True meant the April 2024 update's scaling
        return "expected_average_only_in"
    return str(mode)


def _check_supported(source: str, arch: str, top: dict) -> None:
    if "transcoder" in arch:
        raise SourceError(
            source, f"architecture {arch!r}: transcoders read one hook and write another, "
            "which steering at one hook does not fit",
        )  # fmt: skip
    if arch not in ARCHITECTURES:
        raise SourceError(source, f"architecture {arch!r} is not one of {ARCHITECTURES}")
    mode = _normalization(top.get("normalize_activations"))
    if mode not in NORMALIZATIONS + NORMALIZATIONS_FOLDED:
        raise SourceError(source, f"normalize_activations {mode!r} is not an SAE Lens mode")
    if top.get("reshape_activations", "none") not in ("none", "hook_z"):
        raise SourceError(source, f"reshape_activations {top['reshape_activations']!r}")


class SAE:
    """Fully loaded float32 weights (``W_enc`` [d_in, d_sae], ``W_dec`` [d_sae, d_in]).

    ``encode`` takes raw values at the SAE's hook and applies its ``HookView`` first;
    everything after that follows SAE Lens step by step (input normalization, ``b_dec``
    subtraction, the architecture's activation), so results equal SAE Lens' own.
    """

    def __init__(self, cfg: SAEConfig, device="cpu") -> None:
        self.cfg = cfg
        names = ["W_enc", "W_dec", "b_dec", *PER_FEATURE[cfg.architecture]]
        tensors = read_tensors(cfg, names, device)
        self.W_enc, self.W_dec, self.b_dec = tensors["W_enc"], tensors["W_dec"], tensors["b_dec"]
        self.b_enc = tensors.get("b_enc")
        self.threshold = tensors.get("threshold")
        self.b_gate, self.b_mag = tensors.get("b_gate"), tensors.get("b_mag")
        self.r_mag = tensors.get("r_mag")
        _check_shapes(cfg, self)
        # TopK SAEs trained with unit-norm-equivalent rows rank features by act * |row|.
        self.row_norms = self.W_dec.norm(dim=-1) if cfg.rescale_acts_by_decoder_norm else None

    def nbytes(self) -> int:
        ts = [self.W_enc, self.W_dec, self.b_dec, self.b_enc, self.threshold]
        ts += [self.b_gate, self.b_mag, self.r_mag, self.row_norms]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def sae_input(self, x: Tensor) -> Tensor:
        """Raw hook values to the encoder's input (view, normalization, ``b_dec``)."""
        x = _normalize_in(self.cfg, self.cfg.view.to_sae(x))
        return x - self.b_dec if self.cfg.apply_b_dec_to_input else x

    def encode(self, x: Tensor) -> Tensor:
        """Feature activations [..., d_sae] of raw hook values [..., width]."""
        sae_in = self.sae_input(x)
        arch = self.cfg.architecture
        if arch == "gated":
            return _gated(sae_in @ self.W_enc, self.b_gate, self.b_mag, self.r_mag)
        pre = sae_in @ self.W_enc + self.b_enc
        if arch == "topk":
            if self.row_norms is not None:
                pre = pre * self.row_norms
            top = pre.topk(self.cfg.k, dim=-1, sorted=False)
            return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        if arch == "jumprelu":
            return pre.relu() * (pre > self.threshold).to(pre.dtype)
        return pre.relu()

    def encode_one(self, x: Tensor, index: int) -> Tensor:
        """One feature's activations from one encoder column (not valid for TopK)."""
        sae_in = self.sae_input(x)
        pre = sae_in @ self.W_enc[:, index]
        if self.cfg.architecture == "gated":
            i = slice(index, index + 1)
            return _gated(pre[..., None], self.b_gate[i], self.b_mag[i], self.r_mag[i])[..., 0]
        pre = pre + self.b_enc[index]
        if self.cfg.architecture == "jumprelu":
            return pre.relu() * (pre > self.threshold[index]).to(pre.dtype)
        return pre.relu()

    def decode(self, acts: Tensor, x: Tensor | None = None) -> Tensor:
        """The reconstruction (in the SAE's view of the hook). ``constant_norm_rescale`` and
        ``layer_norm`` SAEs undo the input's own scale: pass the encoded input as ``x``."""
        if self.row_norms is not None:
            acts = acts * (1 / self.row_norms)
        out = acts @ self.W_dec + self.b_dec
        return _normalize_out(self.cfg, out, None if x is None else self.cfg.view.to_sae(x))


def _gated(pre: Tensor, b_gate: Tensor, b_mag: Tensor, r_mag: Tensor) -> Tensor:
    """SAE Lens' gated encoder, given ``sae_in @ W_enc`` (the two paths share ``W_enc``)."""
    active = (pre + b_gate > 0).to(pre.dtype)
    return active * (pre * r_mag.exp() + b_mag).relu()


def _normalize_in(cfg: SAEConfig, x: Tensor) -> Tensor:
    if cfg.normalize_activations == "constant_norm_rescale":
        return x * ((cfg.d_in**0.5) / x.norm(dim=-1, keepdim=True))
    if cfg.normalize_activations == "layer_norm":
        x = x - x.mean(dim=-1, keepdim=True)
        return x / (x.std(dim=-1, keepdim=True) + 1e-5)
    return x


def _normalize_out(cfg: SAEConfig, out: Tensor, x: Tensor | None) -> Tensor:
    mode = cfg.normalize_activations
    if mode not in ("constant_norm_rescale", "layer_norm"):
        return out
    if x is None:
        raise ValueError(f"decode of a {mode} SAE needs the encoded input x")
    if mode == "constant_norm_rescale":
        return out / ((cfg.d_in**0.5) / x.norm(dim=-1, keepdim=True))
    mu = x.mean(dim=-1, keepdim=True)
    return out * (x - mu).std(dim=-1, keepdim=True) + mu


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


def expected_shapes(cfg: SAEConfig) -> dict[str, list[int]]:
    shapes = {"W_enc": [cfg.d_in, cfg.d_sae], "W_dec": [cfg.d_sae, cfg.d_in], "b_dec": [cfg.d_in]}
    return shapes | {name: [cfg.d_sae] for name in PER_FEATURE[cfg.architecture]}


def check_weights_header(cfg: SAEConfig) -> None:
    """Validate tensor names and shapes from the safetensors header alone (no weight reads)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(cfg.folder / WEIGHTS_FILE, framework="pt", device="cpu") as f:
            for name, shape in expected_shapes(cfg).items():
                if name not in f.keys():
                    raise SourceError(cfg.source, f"{WEIGHTS_FILE} has no tensor {name}")
                got = list(f.get_slice(name).get_shape())
                if got != shape:
                    raise SourceError(cfg.source, f"{name} has shape {got}, cfg says {shape}")
    except (SafetensorError, OSError) as err:
        raise SourceError(cfg.source, f"corrupt or unreadable {WEIGHTS_FILE}: {err}") from err


def _check_shapes(cfg: SAEConfig, sae: SAE) -> None:
    for name, shape in expected_shapes(cfg).items():
        if list(getattr(sae, name).shape) != shape:
            raise SourceError(cfg.source, f"{name} shape does not match {CONFIG_FILE}")
