"""One configurable decoder-only transformer, addressed by TransformerLens hook names.

Why not run TransformerLens or transformers directly: both pay most of a decode step in
framework overhead on a CPU (TransformerLens copies transposed weights on every call), and
neither lets us fix the arithmetic shapes that make batched rows bit-identical to solo rows.
This module is the whole model in the style of gpt-fast and litgpt: fused QKV and gate/up
weights, a preallocated KV cache, hook points only where a caller registered a function, and
ONE forward pass whose architecture switches live in ``TransformerConfig`` (``config.py``,
built from a transformers config by ``TransformerConfig.from_hf_config``):

==============  =====================================================================
Llama, Mistral  RMSNorm, rotary (Llama 3 / linear scaling), SwiGLU, GQA, sliding window
Qwen 2 / 3      + q/k/v biases (Qwen 2), per-head q/k RMSNorm (Qwen 3)
Gemma 2 / 3     embeddings scaled by sqrt(d), (1 + w) RMSNorm in fp32, four norms per
                block, GeGLU, attention and final logit soft-capping, alternating sliding
                layers, per-layer-type rotary bases, q/k norms (Gemma 3)
GPT-2           LayerNorm with bias, learned positions, Conv1D weights, gelu_new, tied
GPT-NeoX        parallel attention and MLP, partial rotary, per-head interleaved QKV
==============  =====================================================================

Hook points: ``blocks.{L}.{kind}`` for each kind in ``runtime.HOOK_KINDS`` (a parallel block
has no ``hook_resid_mid``, as in TransformerLens). ``hook_attn_out`` and ``hook_mlp_out`` are
taken after Gemma's post-norms, where TransformerLens takes them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from . import native
from .config import ACTIVATIONS, ROPE_TABLE, Rope, TransformerConfig
from .linear import DEFAULT_KERNEL, Linear
from .protocol import HOOK_KINDS, Hook, RowLengths
from .quant import QuantLinear, QuantParts, QuantWeight

# ---------------------------------------------------------------------------- weights

Norm = tuple[Tensor, "Tensor | None"]  # weight (Gemma's offset folded in), bias
# (calibration_key, calibrate) -> row groups: measured, or kept from an earlier measurement
Remember = Callable[[dict, Callable[[], dict[str, int]]], dict[str, int]]


@dataclass
class Layer:
    attn_norm: Norm
    wqkv: Linear  # q, k and v fused along the output (q heads, then k heads, then v heads)
    wo: Linear
    mlp_norm: Norm
    w_gate_up: Linear  # the MLP's input projection; gate and up fused when gated
    w_down: Linear
    q_norm: Norm | None = None
    k_norm: Norm | None = None
    post_attn_norm: Norm | None = None
    post_mlp_norm: Norm | None = None


# Per layout: the transformers name of each weight (a tuple is fused along the output).
_NAMES = {
    "llama": {
        "embed": "model.embed_tokens",
        "final_norm": "model.norm",
        "unembed": "lm_head",
        "block": "model.layers.{}.",
        "attn_norm": "input_layernorm",
        "wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "wo": "self_attn.o_proj",
        "q_norm": "self_attn.q_norm",
        "k_norm": "self_attn.k_norm",
        "mlp_norm": "post_attention_layernorm",
        "w_gate_up": ("mlp.gate_proj", "mlp.up_proj"),
        "w_down": "mlp.down_proj",
    },
    "gpt2": {
        "embed": "transformer.wte",
        "pos_embed": "transformer.wpe",
        "final_norm": "transformer.ln_f",
        "unembed": "lm_head",
        "block": "transformer.h.{}.",
        "attn_norm": "ln_1",
        "wqkv": ("attn.c_attn",),
        "wo": "attn.c_proj",
        "mlp_norm": "ln_2",
        "w_gate_up": ("mlp.c_fc",),
        "w_down": "mlp.c_proj",
    },
    "neox": {
        "embed": "gpt_neox.embed_in",
        "final_norm": "gpt_neox.final_layer_norm",
        "unembed": "embed_out",
        "block": "gpt_neox.layers.{}.",
        "attn_norm": "input_layernorm",
        "wqkv": ("attention.query_key_value",),
        "wo": "attention.dense",
        "mlp_norm": "post_attention_layernorm",
        "w_gate_up": ("mlp.dense_h_to_4h",),
        "w_down": "mlp.dense_4h_to_h",
    },
}
_NAMES["gemma"] = _NAMES["llama"] | {
    "mlp_norm": "pre_feedforward_layernorm",
    "post_attn_norm": "post_attention_layernorm",
    "post_mlp_norm": "post_feedforward_layernorm",
}


def _canonical(cfg: TransformerConfig, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The state dict under the layout's full names, in [out, in] weight layout with q, k, v
    heads contiguous: GPT-2 checkpoints from the hub lack the ``transformer.`` prefix and
    store Conv1D weights [in, out]; GPT-NeoX interleaves q, k, v per head, and transformers 5
    names its unembedding ``lm_head`` in memory but ``embed_out`` on disk."""
    state = dict(state)
    if cfg.layout == "gemma" and "model.embed_tokens.weight" not in state:
        state = _language_model(state)
    if cfg.layout == "gpt2":
        state = {(k if k.startswith(("transformer.", "lm_head")) else "transformer." + k): v
                 for k, v in state.items()}  # fmt: skip
        conv = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
        state = {k: v.t() if k.endswith(conv) else v for k, v in state.items()}
    if cfg.layout == "neox":
        if "embed_out.weight" not in state and "lm_head.weight" in state:
            state["embed_out.weight"] = state.pop("lm_head.weight")  # transformers 5 in memory
        n, d = cfg.n_heads, cfg.d_head
        for key in [k for k in state if "attention.query_key_value." in k]:
            v = state[key]
            state[key] = v.reshape(n, 3, d, *v.shape[1:]).transpose(0, 1).reshape(v.shape)
    return state


def _language_model(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The language-model weights of a Gemma 3 multimodal checkpoint under causal-LM names
    (``model.language_model.*`` in transformers 5, ``language_model.model.*`` before)."""
    renames = {
        "model.language_model.": "model.",
        "language_model.model.": "model.",
        "language_model.lm_head.": "lm_head.",
    }
    out = {}
    for key, value in state.items():
        for old, new in renames.items():
            if key.startswith(old):
                out[new + key[len(old) :]] = value
        if key.startswith("lm_head."):
            out[key] = value
    return out


def place_layers(device: str | Sequence[str], n_layers: int) -> list[torch.device]:
    """One device per layer. A list of devices splits the layers evenly across them in order
    (a model larger than one GPU); ``"auto"`` uses every visible GPU, else the CPU."""
    if device == "auto":
        count = torch.cuda.device_count()
        device = [f"cuda:{i}" for i in range(count)] if count else "cpu"
    if isinstance(device, (str, torch.device)):
        return [torch.device(device)] * n_layers
    devices = [torch.device(d) for d in device]
    return [devices[i * len(devices) // n_layers] for i in range(n_layers)]


class KVCache(RowLengths):
    """Preallocated keys and values for a fixed number of rows, one tensor per layer on that
    layer's device; rows never change shape. Each row has its own length (``lengths``): rows
    of different prompts decode side by side, each at its own position (a ragged batch).
    The runtime's ``cache_dtype``: float32, or float16 with ``products="int8"``.

    The tensors are left unfilled: attention reads a row's keys only up to its own position,
    all written first. Zero-filling them was a parallel OpenMP fill per layer that stalled
    beside the kernels' pool, at times 0.1-0.5 s of a 2 s steer on a busy 2-core machine
    (2026-12-03)."""

    def __init__(self, cfg: TransformerConfig, rows: int, length: int, devices, dtype) -> None:
        shape = (rows, cfg.n_kv_heads, length, cfg.d_head)
        self.k = [torch.empty(shape, device=d, dtype=dtype) for d in devices]
        self.v = [torch.empty(shape, device=d, dtype=dtype) for d in devices]
        self.lengths = [0] * rows  # positions filled, per row

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def copy_row(
        self, src: int, dst: int, layers: int | None = None, positions: int | None = None
    ) -> None:
        """Row ``dst`` gets row ``src``'s keys and values, bit for bit, in every layer or in
        the first ``layers`` (a shared prefill), at every position or the first
        ``positions`` (those written: the rest of a row is never read before it is written)."""
        for kv in (*self.k[:layers], *self.v[:layers]):
            kv[dst, :, :positions].copy_(kv[src, :, :positions])

    def view(self, row: int) -> KVCache:
        """The cache of one row, sharing storage: prefill writes through it."""
        part = KVCache.__new__(KVCache)
        part.k = [k[row : row + 1] for k in self.k]
        part.v = [v[row : row + 1] for v in self.v]
        part.lengths = [0]
        return part


@dataclass(frozen=True)
class Ragged:
    """A decode step whose rows sit at positions of their own: batch row ``b`` continues cache
    row ``rows[b]`` at position ``positions[b]`` (one token each)."""

    rows: tuple[int, ...]
    positions: tuple[int, ...]
    _on: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def tensors(self, device) -> tuple[Tensor, Tensor]:
        """``rows`` and ``positions`` as int64 tensors on ``device``, made once per device for
        the whole step (every layer's attention indexes its cache with them)."""
        if device not in self._on:
            self._on[device] = (
                torch.tensor(self.rows, dtype=torch.long, device=device),
                torch.tensor(self.positions, dtype=torch.long, device=device),
            )
        return self._on[device]


# ---------------------------------------------------------------------------- the model


class Transformer:
    """The fast runtime: any ``TransformerConfig`` with weights from a transformers state
    dict. Implements ``runtime.Runtime``."""

    def __init__(
        self,
        cfg: TransformerConfig,
        state: Mapping[str, Tensor],
        device: str | Sequence[str] = "cpu",
        dtype: torch.dtype | None = None,
        kernel: str = DEFAULT_KERNEL,
        products: str = "float32",
        remember: Remember | None = None,
    ) -> None:
        """``kernel``: how decode rows share matrix products (``linear.KERNELS``): "native"
        (the CPU default: our compiled kernel, one pass over the weights for all rows, the
        fastest for one row and for several), "onednn" (what "native" falls back to when it
        cannot be built) or "rows" (a matrix-vector product per row). GPUs use "rows".
        ``products``: how GGUF blocks multiply (``quant.PRODUCTS``); matrices stored as
        floats, and a fused q/k/v of types read apart, stay float32 products in every pass.
        ``remember``: where the row groups measured for a ``calibration_key`` are kept between
        loads (``load_cache.RowGroups``); measured on every load without it."""
        dtype = dtype or torch.float32
        self.cfg, self.dtype, self.kernel, self.products = cfg, dtype, kernel, products
        self.layer_devices = place_layers(device, cfg.n_layers)
        self.device, last = self.layer_devices[0], self.layer_devices[-1]
        self.act = ACTIVATIONS[cfg.act]
        names, state = _NAMES[cfg.layout], _canonical(cfg, state)

        def w(name: str, dev=self.device) -> Tensor:
            return state[name].to(device=dev, dtype=dtype).contiguous()

        embed = names["embed"] + ".weight"
        quantized = isinstance(state[embed], QuantWeight)  # rows read from its blocks
        self.embed = self._linear(state, (names["embed"],), self.device) if quantized else w(embed)
        if isinstance(self.embed, QuantLinear):
            self.embed.prepare_rows()
        self.pos_embed = w(names["pos_embed"] + ".weight") if cfg.learned_positions else None
        unembed = names["unembed"] + ".weight"
        tied = unembed not in state
        if tied and quantized:
            self.unembed = self.embed
        else:
            source = names["embed"] if tied else names["unembed"]
            self.unembed = self._linear(state, (source,), last)
        # [vocab, d_model], for reading features out through the unembedding (see below)
        self._unembed_weight = (
            None
            if isinstance(self.unembed, QuantLinear)
            else (self.embed if tied else w(unembed, last))
        )
        self.final_norm = self._norm_weights(state, names["final_norm"], last)
        self.layers = [self._layer(state, names, i) for i in range(cfg.n_layers)]
        self._rope: dict = {}  # (Rope, device) -> (cos, signed sin), grown on demand
        # per layer, the first layer with an equal rotary on its device: a forward pass slices
        # each distinct table once (a config read back holds an equal Rope per layer)
        firsts: dict = {}
        self._rope_first = [
            firsts.setdefault((rope, dev), i)
            for i, (rope, dev) in enumerate(zip(cfg.ropes, self.layer_devices, strict=False))
        ]  # [] without rotary (learned positions)
        self._embed_scale = (
            None
            if cfg.embed_scale is None
            else torch.tensor(cfg.embed_scale, dtype=dtype, device=self.device)
        )
        # RMSNorm and rotary as one compiled call each wherever the linears got the native
        # kernel (their choice already weighed dtype, device and a working build): a decode
        # step is otherwise a few hundred small torch ops
        self._native_ops = all(
            lin.kernel == "native" for layer in self.layers for lin in (layer.wqkv, layer.wo)
        )
        if self._native_ops:
            self._rms_norm, self._rotary_op = native.op("rms_norm"), native.op("rotary")
            self._causal_attention = native.op("causal_attention")
            self._ragged_attention_op = native.op("ragged_attention")
        self._native_attention = self._native_ops and native.reads_heads_of(cfg.d_head)
        # products="int8" keeps keys and values as halves, as llama.cpp does: half the cache's
        # memory and its reads, and the native attention widens them exactly as it loads
        # them; every route (cached or not) attends to the values the cache holds
        half = products == "int8" and self._native_attention and cfg.attn_softcap is None
        self.cache_dtype = torch.float16 if half else dtype
        self._attn_scale = cfg.attn_scale or cfg.d_head**-0.5
        # per block, decoder_block's products where it computes that block in one call
        self._fused = [self._block_products(layer) for layer in self.layers]
        if any(f is not None for f in self._fused):
            self._decoder_block = native.op("decoder_block")
        # the hooks inside a block: where one is set the block runs op by op (the ones at
        # its ends, resid_pre and resid_post, run around decoder_block)
        inner = [k for k in HOOK_KINDS if k not in ("hook_resid_pre", "hook_resid_post")]
        self._inner_hooks = [tuple(f"blocks.{i}.{k}" for k in inner) for i in range(cfg.n_layers)]
        remember = remember or (lambda _, measure: measure())
        self.row_groups = remember(self.calibration_key(), self.calibrate)

    @property
    def unembed_weight(self) -> Tensor:
        """[vocab, d_model] float32; a quantized unembedding is dequantized on first use
        only (feature read-outs), so generation never holds the float32 copy."""
        if self._unembed_weight is None:
            self._unembed_weight = self.unembed.dense()
        return self._unembed_weight

    def _linear(self, state, names: Sequence[str], dev) -> Linear | QuantLinear | QuantParts:
        parts = [state[n + ".weight"] for n in names]
        biases = [state.get(n + ".bias") for n in names]
        bias = torch.cat(biases) if all(b is not None for b in biases) else None
        if any(isinstance(p, QuantWeight) for p in parts):  # GGUF blocks: see quant.py
            fused = QuantWeight.cat(parts)
            b = None if bias is None else bias.to(dtype=torch.float32)
            if fused is not None:
                return QuantLinear.of(fused, bias=b, products=self.products)
            if all(isinstance(p, QuantWeight) for p in parts) and (
                len({p.in_features for p in parts}) == 1
            ):  # q, k and v of two types
                return QuantParts(parts, bias=b, products=self.products)
            parts = [p.dequantize() if isinstance(p, QuantWeight) else p for p in parts]
        weight = torch.cat(parts)
        return Linear(
            weight.to(device=dev, dtype=self.dtype),
            kernel=self.kernel,
            bias=None if bias is None else bias.to(device=dev, dtype=self.dtype),
        )

    def _norm_weights(self, state, name: str, dev) -> Norm:
        weight = state[name + ".weight"].to(device=dev, dtype=self.dtype)
        if self.cfg.norm_offset:  # what Gemma's (1 + w) computes in fp32, from w in our dtype
            weight = weight.float() + self.cfg.norm_offset
        bias = state.get(name + ".bias")
        return weight.contiguous(), None if bias is None else bias.to(dev, self.dtype)

    def _layer(self, state, names: dict, i: int) -> Layer:
        p, dev = names["block"].format(i), self.layer_devices[i]

        def norm(key: str) -> Norm | None:
            return self._norm_weights(state, p + names[key], dev) if key in names else None

        def lin(key: str) -> Linear:
            parts = names[key]
            return self._linear(
                state, [p + n for n in (parts if isinstance(parts, tuple) else (parts,))], dev
            )

        return Layer(
            attn_norm=norm("attn_norm"),
            wqkv=lin("wqkv"),
            wo=lin("wo"),
            mlp_norm=norm("mlp_norm"),
            w_gate_up=lin("w_gate_up"),
            w_down=lin("w_down"),
            q_norm=norm("q_norm") if self.cfg.qk_norm else None,
            k_norm=norm("k_norm") if self.cfg.qk_norm else None,
            post_attn_norm=norm("post_attn_norm") if self.cfg.sandwich_norms else None,
            post_mlp_norm=norm("post_mlp_norm") if self.cfg.sandwich_norms else None,
        )

    def calibrate(self) -> dict[str, int]:
        """Measure the largest batch-invariant decode row groups (see ``invariance.py``):
        ``ANY_ROWS`` where the native kernels compute every product and the attention (each
        row alone by construction) and the measurement agrees."""
        from .invariance import ANY_ROWS, MAX_GROUP, invariant_group_sizes

        cfg, linears = self.cfg, self._measured()
        window = cfg.windows[0] if cfg.windows else None

        def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return self._attend(q, k, v, k.shape[2] - 1, window)

        groups = invariant_group_sizes(
            linears, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, self.device, self.dtype, attend
        )
        alone = self._native_attention and all(lin.kernel == "native" for lin in self._products())
        if alone and all(size == MAX_GROUP for size in groups.values()):
            return dict.fromkeys(groups, ANY_ROWS)
        return groups

    def _measured(self) -> list:
        """The products ``calibrate`` measures: the first block's and the unembedding."""
        l0 = self.layers[0]
        return [l0.wqkv, l0.wo, l0.w_gate_up, l0.w_down, self.unembed]

    def calibration_key(self) -> dict:
        """What ``calibrate``'s result depends on besides the weights' values: the kernels
        (their build: this CPU's flags, torch, the sources), the thread count, the products,
        dtype and device, and the shapes and types measured."""
        cfg = self.cfg
        return {
            "kernel": self.kernel,
            "build": native.build_tag() if self.kernel == "native" else None,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "products": self.products,
            "dtype": str(self.dtype),
            "device": str(self.device),
            "linears": [_product_shape(lin) for lin in self._measured()],
            "attention": [cfg.n_heads, cfg.n_kv_heads, cfg.d_head, list(cfg.windows or ())[:1]],
            "native_attention": self._native_attention,
        }

    @property
    def hook_names(self) -> list[str]:
        kinds = [
            k for k in HOOK_KINDS if not (self.cfg.parallel_residual and k == "hook_resid_mid")
        ]
        return [f"blocks.{i}.{k}" for i in range(self.cfg.n_layers) for k in kinds]

    def hook_widths(self) -> dict[str, int]:
        """Width of the flattened activation at every hook point (what an SAE's d_in is)."""
        z, d = self.cfg.n_heads * self.cfg.d_head, self.cfg.d_model
        return {name: z if name.endswith("hook_z") else d for name in self.hook_names}

    def _products(self) -> list:
        """Every matrix product of a forward pass: the unembedding, then each block's."""
        return [self.unembed] + [
            lin for x in self.layers for lin in (x.wqkv, x.wo, x.w_gate_up, x.w_down)
        ]

    def weight_bytes(self) -> int:
        """Bytes read per decode step (every weight once; tied embeddings counted once)."""
        linears = self._products()
        norms = [self.final_norm] + [
            n
            for x in self.layers
            for n in (
                x.attn_norm,
                x.mlp_norm,
                x.q_norm,
                x.k_norm,
                x.post_attn_norm,
                x.post_mlp_norm,
            )
            if n is not None
        ]
        tensors = [t for n in norms for t in n if t is not None]
        return sum(lin.nbytes() for lin in linears) + sum(
            t.numel() * t.element_size() for t in tensors
        )

    def differentiable(self, mm: Callable[[Tensor, Linear | QuantLinear], Tensor]) -> Callable:
        """``forward`` with autograd on, over a copy that shares every weight: torch's own
        RMSNorm, rotary and attention (the native ones have no backward), rotary tables made
        outside inference mode, and each matrix product through ``mm`` (attribution passes
        products whose backward reads the weights it needs)."""
        shadow = copy.copy(self)
        shadow._native_ops = shadow._native_attention = False
        shadow._fused = [None] * len(self.layers)
        shadow._rope = {}
        shadow._mm = mm
        raw = Transformer.forward.__wrapped__
        return lambda *args, **kw: raw(shadow, *args, **kw)

    def new_cache(self, rows: int, length: int) -> KVCache:
        return KVCache(self.cfg, rows, length, self.layer_devices, self.cache_dtype)

    resumes = True  # forward can continue from a residual (runtime.Runtime.resumes)
    ragged = True  # forward takes rows at positions of their own (runtime.Runtime.ragged)

    @torch.inference_mode()
    def forward(
        self,
        tokens: Tensor,
        cache: KVCache | None = None,
        hooks: Mapping[str, Hook] | None = None,
        stop_at_layer: int | None = None,
        last_only: bool = False,
        start_at_layer: int = 0,
        resid: Tensor | None = None,
        rows: Sequence[int] | None = None,
    ) -> Tensor:
        """Run ``tokens`` [B, T]; return logits [B, T, V], or the residual after block
        ``stop_at_layer - 1`` when stopping early (activations need no unembedding).

        ``rows``: the cache rows that ``tokens`` continue, in order (all of them by default).
        Where those rows hold different lengths, or are not all the cache's rows, the step is
        ragged: one token a row, each at its own position, with rotary, the cache write and
        attention per row (``Ragged``), so every row is what it would be decoded alone; hooks
        then get a tuple of positions, one per row, as ``start``.

        With a cache, ``tokens`` continue the cached positions and the cache is extended.
        ``last_only`` unembeds the last position only (what decoding needs). With
        ``start_at_layer`` > 0, ``resid`` is what block ``start_at_layer - 1`` wrote for
        these tokens before its ``hook_resid_post`` (another row's identical first blocks,
        whose keys and values the cache already holds): that hook and the blocks above run.

        Where the native kernels run, torch's own ops run on one OpenMP thread meanwhile:
        the kernels split their work over a pool of their own, and an OpenMP team spinning
        on the same cores made a 42-token prefill 1.4x slower (2026-12-02).
        """
        args = (tokens, cache, hooks, stop_at_layer, last_only, start_at_layer, resid, rows)
        if not self._native_ops:
            return self._forward(*args)
        with native.one_openmp_thread():
            return self._forward(*args)

    def _forward(
        self, tokens, cache, hooks, stop_at_layer, last_only, start_at_layer, resid, rows=None
    ):
        cfg, hooks = self.cfg, hooks or {}
        t = tokens.shape[1]
        start = _start(cache, rows, tokens.shape[0], t)
        if isinstance(start, Ragged):
            if start_at_layer or stop_at_layer is not None:
                raise ValueError("a ragged step runs every block, from the embedding")
            if max(start.positions) + 1 > cache.capacity:
                raise ValueError("sequence longer than the cache")
        elif start + t > (cache.capacity if cache else cfg.max_context):
            raise ValueError("sequence longer than the cache or the model's context")
        if start_at_layer:
            if resid is None or resid.shape[:2] != tokens.shape:
                raise ValueError("start_at_layer needs the residual of these tokens (resid)")
            name = f"blocks.{start_at_layer - 1}.hook_resid_post"
            x = _run(hooks, name, resid.to(self.layer_devices[start_at_layer - 1]), start)
        else:
            x = self._embed(tokens.to(self.device), start)
        n_layers = cfg.n_layers if stop_at_layer is None else stop_at_layer
        rotary = self._rotary(start, t)
        for i in range(start_at_layer, n_layers):
            if x.device != self.layer_devices[i]:
                x = x.to(self.layer_devices[i])
            x = self._block(i, x, start, cache, hooks, rotary[i])
        if isinstance(start, Ragged):
            for r in start.rows:
                cache.lengths[r] += 1
        elif cache is not None:
            cache.length = start + t
        if stop_at_layer is not None:
            return x
        if last_only:
            x = x[:, -1:]
        x = x.to(self.final_norm[0].device)
        logits = self._mm(self._norm(x, self.final_norm), self.unembed)
        if cfg.final_softcap is not None:
            logits = torch.tanh(logits / cfg.final_softcap) * cfg.final_softcap
        return logits

    def _embed(self, tokens: Tensor, start: int | Ragged) -> Tensor:
        if isinstance(self.embed, QuantLinear):
            x = self.embed.rows(tokens)
        else:
            x = F.embedding(tokens, self.embed)
        if self._embed_scale is not None:
            x = x * self._embed_scale
        if self.pos_embed is not None and isinstance(start, Ragged):
            x = x + self.pos_embed[list(start.positions)][:, None]
        elif self.pos_embed is not None:
            x = x + self.pos_embed[start : start + tokens.shape[1]]
        return x

    def _norm(self, x: Tensor, norm: Norm) -> Tensor:
        weight, bias = norm
        if self.cfg.norm == "layer":  # F.layer_norm's op without its Python wrapper
            return torch.layer_norm(x, (x.shape[-1],), weight, bias, self.cfg.norm_eps)
        if self._native_ops:
            return self._rms_norm(x, weight, self.cfg.norm_eps)
        # transformers' LlamaRMSNorm and Gemma's RMSNorm, operation for operation (the casts
        # are skipped in float32, where they do nothing but cost a dispatch each)
        h = x if x.dtype == torch.float32 else x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.cfg.norm_eps)
        if self.cfg.norm_offset:  # Gemma: (h * (1 + w)) in fp32, then cast
            h = h * weight
            return h if x.dtype == torch.float32 else h.to(x.dtype)
        return weight * (h if x.dtype == torch.float32 else h.to(x.dtype))

    def _rotary(self, start: int | Ragged, t: int) -> list[tuple[Tensor, Tensor] | None]:
        """Per layer, cos and signed sin at positions ``start..start+T``, sliced once per forward
        pass for all layers sharing a rotary and a device: [T, rotary dims] for the native op,
        [T, 1, rotary dims] (broadcast over heads) for the torch ops; in a ragged step each
        row's own position, [B, 1, rotary dims] and [B, 1, 1, rotary dims]."""
        if not self.cfg.ropes:
            return [None] * self.cfg.n_layers
        shared: dict = {}
        out = []
        for first in self._rope_first:
            if first not in shared:
                rope, dev = self.cfg.ropes[first], self.layer_devices[first]
                shared[first] = self._rotary_at(rope, dev, start, t)
            out.append(shared[first])
        return out

    def _rotary_at(self, rope: Rope, dev, start: int | Ragged, t: int) -> tuple[Tensor, Tensor]:
        if isinstance(start, Ragged):
            cos, sin = self._rope_tables(rope, dev, max(start.positions) + 1)
            at = list(start.positions)
            cos, sin = cos[at][:, None], sin[at][:, None]
        else:
            cos, sin = self._rope_tables(rope, dev, start + t)
            cos, sin = cos[start : start + t], sin[start : start + t]
        if self._native_ops:
            return cos, sin
        return cos.unsqueeze(-2), sin.unsqueeze(-2)

    def _rope_tables(self, rope: Rope, device, length: int) -> tuple[Tensor, Tensor]:
        """cos and signed sin for positions [0, n) with n >= length: the whole context when
        that is at most ``ROPE_TABLE`` positions, else grown by doubling (a position's values
        do not depend on the table size), so a 128k-context model does not hold 128k rows.
        The sin table's first half is negated, for ``_rotate``."""
        key = (rope, device)
        tables = self._rope.get(key)
        if tables is None or tables[0].shape[0] < length:
            n = min(
                self.cfg.max_context, max(length, 2 * tables[0].shape[0] if tables else ROPE_TABLE)
            )
            inv_freq = torch.tensor(rope.inv_freq, dtype=torch.float32, device=device)
            freqs = torch.outer(torch.arange(n, device=device).float(), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = emb.cos(), emb.sin()
            if rope.scaling != 1.0:
                cos, sin = cos * rope.scaling, sin * rope.scaling
            sin = torch.cat((-sin[:, : len(rope.inv_freq)], sin[:, len(rope.inv_freq) :]), dim=-1)
            tables = self._rope[key] = (cos.to(self.dtype), sin.to(self.dtype))
        return tables

    def _mm(self, x: Tensor, w: Linear) -> Tensor:
        return self._chunked("matmul", w, x)

    def _chunked(self, kind: str, fn, *xs: Tensor) -> Tensor:
        """Apply ``fn`` to decode rows in groups no larger than ``row_groups[kind]``.

        Batched rows are bit-identical to solo rows only while every kernel sees a row count
        at which it is batch-invariant (see ``invariance.py``); prefill runs one row at a time.
        """
        b, g = xs[0].shape[0], self.row_groups[kind]
        if b <= g or xs[0].shape[-2] != 1:  # T of [B, T, d] and of [B, heads, T, d_head]
            return fn(*xs)
        return torch.cat([fn(*(x[i : i + g] for x in xs)) for i in range(0, b, g)])

    def _block_products(self, layer: Layer) -> tuple | None:
        """``decoder_block``'s products of ``layer`` (packed, kinds, qtypes, widths, biases)
        where it computes the block: RMS pre-norms, rotary, no q/k norms or post-norms, a
        gated SiLU MLP, the native attention without a soft cap, each product a native one
        of one packed matrix. None elsewhere: the ops below run one by one."""
        cfg = self.cfg
        plain = (
            self._native_attention and cfg.norm != "layer" and cfg.gated_mlp
            and cfg.act in ("silu", "swish") and not cfg.parallel_residual
            and cfg.attn_softcap is None and bool(cfg.ropes) and layer.q_norm is None
            and layer.post_attn_norm is None and layer.post_mlp_norm is None
        )  # fmt: skip
        if not plain:
            return None
        lins = (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
        products = [lin.native_product() for lin in lins]
        if any(p is None for p in products):
            return None
        return tuple(list(column) for column in zip(*products, strict=True))

    def _block(self, i: int, x: Tensor, start: int | Ragged, cache, hooks, rotary) -> Tensor:
        """Block ``i`` between its end hooks (resid_pre, resid_post): one native call where
        ``decoder_block`` computes it and no hook reads inside it, else op by op."""
        p, fused = f"blocks.{i}.", self._fused[i]
        x = _run(hooks, p + "hook_resid_pre", x, start)
        if (
            fused is not None and cache is not None
            and (x.shape[1] > 1 or x.shape[0] <= min(self.row_groups.values()))
            and not any(name in hooks for name in self._inner_hooks[i])
        ):  # fmt: skip
            x = self._fused_block(i, x, start, cache, rotary, fused)
        else:
            x = self._ops_block(i, x, start, cache, hooks, rotary)
        return _run(hooks, p + "hook_resid_post", x, start)

    def _ops_block(self, i: int, x: Tensor, start: int | Ragged, cache, hooks, rotary) -> Tensor:
        """Block ``i`` op by op with its inner hooks: the residual its resid_post hook reads."""
        layer, p = self.layers[i], f"blocks.{i}."
        attn_out = self._attention(i, self._norm(x, layer.attn_norm), start, cache, hooks, rotary)
        if layer.post_attn_norm is not None:
            attn_out = self._norm(attn_out, layer.post_attn_norm)
        attn_out = _run(hooks, p + "hook_attn_out", attn_out, start)
        if self.cfg.parallel_residual:  # transformers' order: mlp + attn + x
            mlp_out = _run(hooks, p + "hook_mlp_out", self._mlp(layer, x), start)
            return mlp_out + attn_out + x
        x = _run(hooks, p + "hook_resid_mid", x + attn_out, start)
        mlp_out = _run(hooks, p + "hook_mlp_out", self._mlp(layer, x), start)
        return x + mlp_out

    def _fused_block(self, i: int, x: Tensor, start: int | Ragged, cache, rotary, fused) -> Tensor:
        """``_ops_block`` in one native call (``decoder_block``: the same ops in the same
        order, so the same bits): a block no hook reads inside, continuing every cache row at
        ``start``, or in a ragged step each row at its own position (``_ragged_attention``'s
        kernel)."""
        cfg, layer = self.cfg, self.layers[i]
        window = cfg.windows[i] if cfg.windows else None
        ragged = start.tensors(cache.k[i].device) if isinstance(start, Ragged) else (None, None)
        return self._decoder_block(
            x, layer.attn_norm[0], layer.mlp_norm[0], *fused, *rotary, cache.k[i], cache.v[i],
            start if isinstance(start, int) else 0, window or 0, cfg.norm_eps, cfg.n_heads,
            cfg.n_kv_heads, self._attn_scale, *ragged,
        )  # fmt: skip

    def _mlp(self, layer: Layer, x: Tensor) -> Tensor:
        """The MLP of the residual ``x``, from its input norm to its post-norm (if any)."""
        h = self._mm(self._norm(x, layer.mlp_norm), layer.w_gate_up)
        if self.cfg.gated_mlp:
            gate, up = h.chunk(2, dim=-1)
            h = self.act(gate) * up
        else:
            h = self.act(h)
        out = self._mm(h, layer.w_down)
        return out if layer.post_mlp_norm is None else self._norm(out, layer.post_mlp_norm)

    def _attention(self, i: int, x: Tensor, start: int | Ragged, cache, hooks, rotary) -> Tensor:
        cfg, layer = self.cfg, self.layers[i]
        b, t, _ = x.shape
        nh, nkv = cfg.n_heads, cfg.n_kv_heads
        # [B, heads, T, d_head] views of the fused product, q and k heads rotating together
        qkv = self._mm(x, layer.wqkv).view(b, t, nh + 2 * nkv, cfg.d_head)
        if layer.q_norm is not None or rotary is not None:
            qk = qkv[:, :, : nh + nkv]
            if layer.q_norm is not None:
                q, k = qk[:, :, :nh], qk[:, :, nh:]
                qk = torch.cat((self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)), dim=2)
            if rotary is not None:
                qk = self._rotate(qk, *rotary)
            qk, v = qk.transpose(1, 2), qkv[:, :, nh + nkv :].transpose(1, 2)
            q, k = qk[:, :nh], qk[:, nh:]
        else:
            qkv = qkv.transpose(1, 2)
            q, k, v = qkv[:, :nh], qkv[:, nh : nh + nkv], qkv[:, nh + nkv :]
        window = cfg.windows[i] if cfg.windows else None
        if isinstance(start, Ragged):
            z = self._ragged_attention(i, q, k, v, cache, start, window)
        else:
            if cache is not None:
                cache.k[i][:, :, start : start + t] = k
                cache.v[i][:, :, start : start + t] = v
                k, v = cache.k[i][:, :, : start + t], cache.v[i][:, :, : start + t]
                if not self._native_attention:  # torch's attention reads the model's dtype
                    k, v = k.to(self.dtype), v.to(self.dtype)
            elif self.cache_dtype != self.dtype:  # no cache: the values one would hold
                k, v = _held(k, self.cache_dtype), _held(v, self.cache_dtype)
            z = self._chunked(
                "attention", lambda q, k, v: self._attend(q, k, v, start, window), q, k, v
            )
        z = _run(hooks, f"blocks.{i}.attn.hook_z", z.transpose(1, 2), start)  # [B, T, H, d_head]
        return self._mm(z.reshape(b, t, -1), layer.wo)

    def _ragged_attention(self, i: int, q, k, v, cache, step: Ragged, window) -> Tensor:
        """A ragged step's attention: each row's key and value written at its own position of
        its cache row, then each row attends its own keys (the native kernel does both, and
        reads every row alone; elsewhere one row at a time), exactly as that row decoded
        alone."""
        cache_k, cache_v = cache.k[i], cache.v[i]
        rows, positions = step.tensors(cache_k.device)
        if self.cfg.attn_softcap is None and self._native_attention:
            return self._ragged_attention_op(
                q, cache_k, cache_v, k, v, self._attn_scale, rows, positions, window or 0
            )
        cache_k[rows, :, positions] = k[:, :, 0]
        cache_v[rows, :, positions] = v[:, :, 0]
        parts = []
        for b, (r, p) in enumerate(zip(step.rows, step.positions, strict=True)):
            k_r, v_r = (c[r : r + 1, :, : p + 1].to(q.dtype) for c in (cache_k, cache_v))
            parts.append(self._attend(q[b : b + 1], k_r, v_r, p, window))
        return torch.cat(parts)

    def _rotate(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return self._rotary_op(x, cos, sin) if self._native_ops else _rotate(x, cos, sin)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, start: int, window: int | None) -> Tensor:
        """Causal attention of positions ``start..start+T`` over keys ``0..start+T``, within
        ``window`` positions where the layer slides."""
        t, total = q.shape[2], k.shape[2]
        cap = self.cfg.attn_softcap
        if cap is None and self._native_attention:
            # every (row, head, position) alone in one fixed order: the same bits at any thread
            # count (SDPA's flash kernel changed a prefill's bits with torch's thread count)
            # and a prompt position's the same as that position decoded alone
            return self._causal_attention(q, k, v, self._attn_scale, start, window or 0)
        if window is not None and t == 1 and total > window:  # decode: the last window keys
            k, v = k[:, :, total - window :], v[:, :, total - window :]
        mask, causal = None, False
        if t > 1 and start == 0 and (window is None or total <= window):
            causal = True
        elif t > 1:
            q_pos = torch.arange(start, start + t, device=q.device)[:, None]
            kv_pos = torch.arange(total, device=q.device)[None]
            mask = kv_pos <= q_pos
            if window is not None:
                mask &= kv_pos > q_pos - window
        if cap is None:
            return F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=mask,
                is_causal=causal,
                scale=self.cfg.attn_scale,
                enable_gqa=True,
            )
        return _softcapped_attention(q, k, v, mask, causal, self.cfg.attn_scale, cap)


def _product_shape(lin) -> list:
    """A product's kind, shape and the types of its parts (what its kernels depend on)."""
    if isinstance(lin, QuantParts):
        kinds = [part.qtype_name for part in lin.parts]
    elif isinstance(lin, QuantLinear):
        kinds = [lin.qtype_name]
    else:
        kinds = [f"{lin.kernel}/{lin.element_size}"]
    return [type(lin).__name__, lin.out_features, lin.in_features, kinds]


def _held(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` as a cache of ``dtype`` holds it (rounded to it, back in ``x``'s dtype), for a
    pass without a cache; under autograd the rounding passes the gradient through unchanged
    (its value is exactly the rounded one: x + (r - x) is r, r - x being exact so close to x)."""
    held = x.to(dtype).to(x.dtype)
    return x + (held - x).detach() if x.requires_grad else held


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of the first ``cos.shape[-1]`` dims of each head of ``x`` [B, T, H,
    d_head]: transformers' ``x * cos + rotate_half(x) * sin`` with the sign of
    ``rotate_half`` folded into ``sin`` (the same products, so the same bits)."""
    dim = cos.shape[-1]
    if dim == x.shape[-1]:
        return x * cos + x.roll(dim // 2, dims=-1) * sin
    r = x[..., :dim]
    return torch.cat((r * cos + r.roll(dim // 2, dims=-1) * sin, x[..., dim:]), dim=-1)


def _softcapped_attention(q, k, v, mask, causal: bool, scale: float | None, cap: float) -> Tensor:
    """Gemma 2's eager attention: scores soft-capped by ``cap * tanh(s / cap)`` before the
    mask and softmax (SDPA has no soft-capping)."""
    b, nh, t, d = q.shape
    rep = nh // k.shape[1]
    if t == 1 and mask is None:
        # decode: a kv head's query heads are rows of one product (no copy of the cache)
        q = q.reshape(b, k.shape[1], rep, d)
    else:
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = torch.matmul(q, k.transpose(2, 3)) * (scale or d**-0.5)
    scores = torch.tanh(scores / cap) * cap
    if causal:
        total = k.shape[2]
        mask = torch.ones(t, total, dtype=torch.bool, device=q.device).tril(total - t)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, v).reshape(b, nh, t, d)


def _start(cache, rows: Sequence[int] | None, batch: int, t: int) -> int | Ragged:
    """Where ``tokens`` [batch, t] start: one position for every row, or a ``Ragged`` step."""
    if cache is None:
        return 0
    lengths = cache.lengths
    everyone = rows is None or list(rows) == list(range(len(lengths)))
    if everyone and all(n == lengths[0] for n in lengths):
        return lengths[0]
    rows = range(len(lengths)) if rows is None else rows
    if t != 1 or len(rows) != batch:
        raise ValueError("a ragged step takes one token for each of its rows")
    return Ragged(tuple(rows), tuple(lengths[r] for r in rows))


def _run(hooks: Mapping[str, Hook], name: str, x: Tensor, start: int | Ragged) -> Tensor:
    fn = hooks.get(name)
    if fn is None:
        return x
    out = fn(x, start.positions if isinstance(start, Ragged) else start)
    if out is None:
        return x
    # a hook may compute in float32 (steering vectors are float32): keep the model's dtype
    return out if out.dtype == x.dtype else out.to(x.dtype)
