"""The fast runtime's architectures by config: one ``TransformerConfig`` per checkpoint.

Every architecture switch of ``transformer.Transformer`` (norm kind, rotary kind and bases,
gated MLP, biases, soft-capping, sliding windows, parallel blocks) is a field here, read once
from a transformers config (``TransformerConfig.from_hf_config``), as in litgpt's
``config.py``: the model code branches on fields, never on model names. ``fast_config`` says
whether the fast runtime runs a checkpoint at all (``backend="auto"`` falls back to
TransformerLens when not).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# transformers model_type -> weight naming layout
MODEL_TYPES = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma2": "gemma",
    "gemma3_text": "gemma",
    "gpt2": "gpt2",
    "gpt_neox": "neox",
}
ARCHITECTURES = (  # the transformers classes whose checkpoints we load
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma3ForConditionalGeneration",  # its language model (Gemma 3 4B and larger)
    "GPT2LMHeadModel",
    "GPTNeoXForCausalLM",
)
STATIC_ROPE_TYPES = ("linear", "llama3", "yarn")  # position-independent inverse frequencies
ROPE_TABLE = 8192  # rotary positions tabulated up front


class UnsupportedModel(NotImplementedError):
    """The fast runtime cannot run this configuration (``backend="auto"`` then falls back)."""


def _gelu_tanh(x: Tensor) -> Tensor:
    # GPT-2's gelu_new is this tanh formula too: torch's one fused kernel is within 2.4e-7 of
    # transformers' seven ops (NewGELUActivation) and costs a third
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
}


@dataclass(frozen=True)
class Rope:
    """Rotary embedding of one layer type: inverse frequencies (``len * 2`` rotated dims of
    each head, the rest pass through) and the cos/sin scaling some rope types use."""

    inv_freq: tuple[float, ...]
    scaling: float = 1.0


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes plus the architecture switches the one forward pass reads."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    vocab_size: int
    max_context: int
    norm_eps: float
    layout: str = "llama"  # weight names: "llama", "gemma", "gpt2", "neox"
    norm: str = "rms"  # "rms" or "layer" (LayerNorm with bias)
    norm_offset: float = 0.0  # Gemma's RMSNorm multiplies by (1 + w)
    act: str = "silu"
    gated_mlp: bool = True
    qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen 3, Gemma 3)
    sandwich_norms: bool = False  # norms after attention and MLP too (Gemma)
    parallel_residual: bool = False  # x + attn(ln1 x) + mlp(ln2 x) (GPT-NeoX)
    learned_positions: bool = False  # GPT-2
    embed_scale: float | None = None  # Gemma: sqrt(d_model)
    attn_scale: float | None = None  # None: 1 / sqrt(d_head)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    windows: tuple[int | None, ...] = ()  # sliding window per layer; () for none
    ropes: tuple[Rope, ...] = ()  # rotary per layer; () with learned positions

    @classmethod
    def from_hf_config(cls, hf) -> TransformerConfig:
        """Our config for a transformers config; ``UnsupportedModel`` when some switch
        (model type, activation, rope type, ...) is not one we implement."""
        model_type = getattr(hf, "model_type", None)
        if model_type == "gemma3":  # the multimodal wrapper: run its language model
            return cls.from_hf_config(hf.text_config)
        layout = MODEL_TYPES.get(model_type)
        if layout is None:
            raise UnsupportedModel(f"model type {model_type!r} is not one of {sorted(MODEL_TYPES)}")
        cfg = {"gpt2": _gpt2_config, "neox": _neox_config}.get(layout, _llama_config)(hf)
        if cfg.act not in ACTIVATIONS:
            raise UnsupportedModel(f"activation {cfg.act!r} is not one of {sorted(ACTIVATIONS)}")
        return cfg

    def to_dict(self) -> dict:
        """Plain JSON values (floats round-trip exactly), so a converted model's config loads
        without transformers (whose config import alone costs 60 MB and a second or more)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> TransformerConfig:
        data = dict(data)
        data["windows"] = tuple(data.get("windows", ()))
        ropes = data.get("ropes", ())
        data["ropes"] = tuple(Rope(tuple(r["inv_freq"]), r.get("scaling", 1.0)) for r in ropes)
        return cls(**data)


def _llama_config(hf) -> TransformerConfig:
    """Llama, Mistral, Qwen 2/3 and Gemma 2/3: the same block with switches."""
    gemma = hf.model_type.startswith("gemma")
    if getattr(hf, "use_bidirectional_attention", False):
        raise UnsupportedModel("bidirectional attention")
    d_head = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    return TransformerConfig(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads,
        n_kv_heads=getattr(hf, "num_key_value_heads", None) or hf.num_attention_heads,
        d_head=d_head,
        d_mlp=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        max_context=hf.max_position_embeddings,
        norm_eps=hf.rms_norm_eps,
        layout="gemma" if gemma else "llama",
        norm_offset=1.0 if gemma else 0.0,
        act=getattr(hf, "hidden_activation", None) or hf.hidden_act,
        qk_norm=hf.model_type in ("qwen3", "gemma3_text"),
        sandwich_norms=gemma,
        embed_scale=hf.hidden_size**0.5 if gemma else None,
        attn_scale=hf.query_pre_attn_scalar**-0.5 if gemma else None,
        attn_softcap=getattr(hf, "attn_logit_softcapping", None),
        final_softcap=getattr(hf, "final_logit_softcapping", None),
        windows=_windows(hf),
        ropes=_ropes(hf, d_head),
    )


def _gpt2_config(hf) -> TransformerConfig:
    if hf.scale_attn_by_inverse_layer_idx or getattr(hf, "add_cross_attention", False):
        raise UnsupportedModel("GPT-2 with per-layer attention scaling or cross-attention")
    return TransformerConfig(
        n_layers=hf.n_layer,
        d_model=hf.n_embd,
        n_heads=hf.n_head,
        n_kv_heads=hf.n_head,
        d_head=hf.n_embd // hf.n_head,
        d_mlp=hf.n_inner or 4 * hf.n_embd,
        vocab_size=hf.vocab_size,
        max_context=hf.n_positions,
        norm_eps=hf.layer_norm_epsilon,
        layout="gpt2",
        norm="layer",
        act=hf.activation_function,
        gated_mlp=False,
        learned_positions=True,
        attn_scale=None if hf.scale_attn_weights else 1.0,
    )


def _neox_config(hf) -> TransformerConfig:
    d_head = hf.hidden_size // hf.num_attention_heads
    return TransformerConfig(
        n_layers=hf.num_hidden_layers,
        d_model=hf.hidden_size,
        n_heads=hf.num_attention_heads,
        n_kv_heads=hf.num_attention_heads,
        d_head=d_head,
        d_mlp=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        max_context=hf.max_position_embeddings,
        norm_eps=hf.layer_norm_eps,
        layout="neox",
        norm="layer",
        act=hf.hidden_act,
        gated_mlp=False,
        parallel_residual=hf.use_parallel_residual,
        ropes=_ropes(hf, d_head),
    )


def _layer_types(hf) -> list[str]:
    return list(getattr(hf, "layer_types", None) or ["full_attention"] * hf.num_hidden_layers)


def _windows(hf) -> tuple[int | None, ...]:
    """Sliding window per layer: the ``sliding_attention`` layers where ``layer_types``
    exists (Gemma, Qwen), every layer where only ``sliding_window`` does (Mistral)."""
    window = getattr(hf, "sliding_window", None)
    if not window:
        return ()
    if getattr(hf, "layer_types", None) is None:
        return (window,) * hf.num_hidden_layers
    return tuple(window if t == "sliding_attention" else None for t in _layer_types(hf))


def _rope_parameters(hf) -> dict:
    params = getattr(hf, "rope_parameters", None)
    if params:
        return params
    # transformers 4: rope_theta and rope_scaling on the config
    scaling = dict(getattr(hf, "rope_scaling", None) or {})
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return {"rope_theta": getattr(hf, "rope_theta", 10000.0), **scaling}


def _ropes(hf, d_head: int) -> tuple[Rope, ...]:
    """Rotary per layer; Gemma 3 keys its parameters by layer type (local / global bases)."""
    params, built = _rope_parameters(hf), {}
    out = []
    for layer_type in _layer_types(hf):
        key = layer_type if layer_type in params else None
        if key not in built:
            built[key] = _rope(hf, params[key] if key else params, key, d_head)
        out.append(built[key])
    return tuple(out)


def _rope(hf, params: dict, layer_type: str | None, d_head: int) -> Rope:
    kind = params.get("rope_type", "default")
    if kind == "default":
        dim = int(d_head * params.get("partial_rotary_factor", 1.0))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return Rope(tuple((1.0 / (params["rope_theta"] ** exponents)).tolist()))
    if kind not in STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"rope type {kind!r} (supported: default, {STATIC_ROPE_TYPES})")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    kwargs = {"layer_type": layer_type} if layer_type else {}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](hf, torch.device("cpu"), **kwargs)
    return Rope(tuple(inv_freq.float().tolist()), float(scaling))


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
