"""A small, fast Llama forward pass addressed by TransformerLens hook names.

Why not run TransformerLens or transformers directly: both pay most of a decode step in
framework overhead on a CPU (TransformerLens copies transposed weights on every call), and
neither lets us fix the arithmetic shapes that make batched rows bit-identical to solo rows.
This module is the whole model in the style of gpt-fast: fused QKV and gate/up weights, a
preallocated KV cache, and hook points only where a caller registered a function.

Hook points (TransformerLens names): ``blocks.{L}.hook_resid_pre``, ``blocks.{L}.attn.hook_z``,
``blocks.{L}.hook_attn_out``, ``blocks.{L}.hook_resid_mid``, ``blocks.{L}.hook_mlp_out``,
``blocks.{L}.hook_resid_post``. A hook is ``fn(x, start) -> Tensor | None`` where ``start`` is
the sequence position of ``x[:, 0]`` (so position-dependent steering works with a KV cache).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .linear import Linear

Hook = Callable[[Tensor, int], "Tensor | None"]
HOOK_KINDS = (
    "hook_resid_pre",
    "attn.hook_z",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_out",
    "hook_resid_post",
)


@dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_mlp: int
    vocab_size: int
    max_context: int
    rope_theta: float
    norm_eps: float

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def from_hf(cls, hf_cfg) -> LlamaConfig:
        return cls(
            n_layers=hf_cfg.num_hidden_layers,
            d_model=hf_cfg.hidden_size,
            n_heads=hf_cfg.num_attention_heads,
            n_kv_heads=hf_cfg.num_key_value_heads,
            d_mlp=hf_cfg.intermediate_size,
            vocab_size=hf_cfg.vocab_size,
            max_context=hf_cfg.max_position_embeddings,
            rope_theta=float(_rope_theta(hf_cfg)),
            norm_eps=hf_cfg.rms_norm_eps,
        )


def _rope_theta(hf_cfg) -> float:
    theta = getattr(hf_cfg, "rope_theta", None)
    if theta is None:  # transformers 5 moved it under rope_parameters
        theta = (getattr(hf_cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    return theta


@dataclass
class Layer:
    attn_norm: Tensor
    wqkv: Linear  # q, k and v fused along the output
    wo: Linear
    mlp_norm: Tensor
    w_gate_up: Linear  # gate and up fused along the output
    w_down: Linear


class KVCache:
    """Preallocated keys and values for a fixed number of rows, one tensor per layer on that
    layer's device; rows never change shape."""

    def __init__(self, cfg: LlamaConfig, rows: int, length: int, devices, dtype) -> None:
        shape = (rows, cfg.n_kv_heads, length, cfg.d_head)
        self.k = [torch.zeros(shape, device=d, dtype=dtype) for d in devices]
        self.v = [torch.zeros(shape, device=d, dtype=dtype) for d in devices]
        self.length = 0  # positions filled, the same for every row

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def view(self, row: int) -> KVCache:
        """The cache of one row, sharing storage: prefill writes through it."""
        part = KVCache.__new__(KVCache)
        part.k = [k[row : row + 1] for k in self.k]
        part.v = [v[row : row + 1] for v in self.v]
        part.length = 0
        return part


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


class Llama:
    """Llama-family decoder (Llama, SmolLM2, Mistral without sliding window)."""

    def __init__(
        self,
        cfg: LlamaConfig,
        state: Mapping[str, Tensor],
        device: str | Sequence[str] = "cpu",
        dtype: torch.dtype | None = None,
    ) -> None:
        dtype = dtype or torch.float32
        self.cfg, self.dtype = cfg, dtype
        self.layer_devices = place_layers(device, cfg.n_layers)
        self.device, last = self.layer_devices[0], self.layer_devices[-1]

        def w(name: str, dev=self.device) -> Tensor:
            return state[name].to(device=dev, dtype=dtype).contiguous()

        def lin(*names: str, dev=self.device) -> Linear:  # fused along the output dimension
            return Linear(torch.cat([state[n] for n in names]).to(device=dev, dtype=dtype))

        self.embed = w("model.embed_tokens.weight")
        unembed_name = (
            "lm_head.weight" if "lm_head.weight" in state else "model.embed_tokens.weight"
        )
        self.unembed = lin(unembed_name, dev=last)
        # [vocab, d_model], for reading features out through the unembedding
        self.unembed_weight = self.embed if unembed_name.startswith("model.") else w(unembed_name)
        self.final_norm = w("model.norm.weight", dev=last)
        self.layers = [self._layer(i, w, lin) for i in range(cfg.n_layers)]
        self._rope = {d: _rope_tables(cfg, d, dtype) for d in set(self.layer_devices)}
        self.row_groups = self.calibrate()

    def _layer(self, i: int, w, lin) -> Layer:
        p, dev = f"model.layers.{i}.", self.layer_devices[i]
        return Layer(
            attn_norm=w(p + "input_layernorm.weight", dev),
            wqkv=lin(*(p + f"self_attn.{n}_proj.weight" for n in "qkv"), dev=dev),
            wo=lin(p + "self_attn.o_proj.weight", dev=dev),
            mlp_norm=w(p + "post_attention_layernorm.weight", dev),
            w_gate_up=lin(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight", dev=dev),
            w_down=lin(p + "mlp.down_proj.weight", dev=dev),
        )

    def calibrate(self) -> dict[str, int]:
        """Measure the largest batch-invariant decode row groups (see ``invariance.py``)."""
        from .invariance import invariant_group_sizes

        l0, cfg = self.layers[0], self.cfg
        linears = [l0.wqkv, l0.wo, l0.w_gate_up, l0.w_down, self.unembed]
        return invariant_group_sizes(
            linears, cfg.n_heads, cfg.n_kv_heads, cfg.d_head, self.device, self.dtype
        )

    @property
    def hook_names(self) -> list[str]:
        return [f"blocks.{i}.{k}" for i in range(self.cfg.n_layers) for k in HOOK_KINDS]

    def hook_widths(self) -> dict[str, int]:
        """Width of the flattened activation at every hook point (what an SAE's d_in is)."""
        d = self.cfg.d_model
        return {name: d for name in self.hook_names}  # attn.hook_z flattens heads to d_model

    def weight_bytes(self) -> int:
        """Bytes read per decode step (every weight once; tied embeddings counted once)."""
        linears = [self.unembed] + [
            lin for x in self.layers for lin in (x.wqkv, x.wo, x.w_gate_up, x.w_down)
        ]
        norms = [self.final_norm] + [n for x in self.layers for n in (x.attn_norm, x.mlp_norm)]
        return sum(lin.nbytes() for lin in linears) + sum(
            n.numel() * n.element_size() for n in norms
        )

    def new_cache(self, rows: int, length: int) -> KVCache:
        return KVCache(self.cfg, rows, length, self.layer_devices, self.dtype)

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        # Same order of operations as transformers' LlamaRMSNorm.
        var = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(var + self.cfg.norm_eps))

    def _rotate(self, x: Tensor, start: int) -> Tensor:
        t = x.shape[2]
        cos, sin = self._rope[x.device]
        cos, sin = cos[start : start + t], sin[start : start + t]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(
        self,
        tokens: Tensor,
        cache: KVCache | None = None,
        hooks: Mapping[str, Hook] | None = None,
        stop_at_layer: int | None = None,
        last_only: bool = False,
    ) -> Tensor:
        """Run ``tokens`` [B, T]; return logits [B, T, V], or the residual after block
        ``stop_at_layer - 1`` when stopping early (activations need no unembedding).

        With a cache, ``tokens`` continue the cached positions and the cache is extended.
        ``last_only`` unembeds the last position only (what decoding needs).
        """
        cfg, hooks = self.cfg, hooks or {}
        start = cache.length if cache is not None else 0
        if start + tokens.shape[1] > (cache.capacity if cache else cfg.max_context):
            raise ValueError("sequence longer than the cache or the model's context")
        x = F.embedding(tokens.to(self.device), self.embed)
        n_layers = cfg.n_layers if stop_at_layer is None else stop_at_layer
        for i in range(n_layers):
            x = self._block(i, x.to(self.layer_devices[i]), start, cache, hooks)
        if cache is not None:
            cache.length = start + tokens.shape[1]
        if stop_at_layer is not None:
            return x
        if last_only:
            x = x[:, -1:]
        x = x.to(self.final_norm.device)
        return self._mm(self._norm(x, self.final_norm), self.unembed)

    def _mm(self, x: Tensor, w: Linear) -> Tensor:
        return self._chunked("matmul", w, x)

    def _chunked(self, kind: str, fn, *xs: Tensor) -> Tensor:
        """Apply ``fn`` to decode rows in groups no larger than ``row_groups[kind]``.

        Batched rows are bit-identical to solo rows only while every kernel sees a row count
        at which it is batch-invariant (see ``invariance.py``); prefill runs one row at a time.
        """
        b, t = xs[0].shape[0], xs[0].shape[-2] if xs[0].dim() == 4 else xs[0].shape[1]
        g = self.row_groups[kind]
        if b <= g or t != 1:
            return fn(*xs)
        return torch.cat([fn(*(x[i : i + g] for x in xs)) for i in range(0, b, g)])

    def _block(self, i: int, x: Tensor, start: int, cache, hooks) -> Tensor:
        cfg, layer, p = self.cfg, self.layers[i], f"blocks.{i}."
        x = _run(hooks, p + "hook_resid_pre", x, start)
        b, t, _ = x.shape
        hd, nh, nkv = cfg.d_head, cfg.n_heads, cfg.n_kv_heads
        qkv = self._mm(self._norm(x, layer.attn_norm), layer.wqkv)
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = self._rotate(q.view(b, t, nh, hd).transpose(1, 2), start)
        k = self._rotate(k.view(b, t, nkv, hd).transpose(1, 2), start)
        v = v.view(b, t, nkv, hd).transpose(1, 2)
        if cache is not None:
            cache.k[i][:, :, start : start + t] = k
            cache.v[i][:, :, start : start + t] = v
            k, v = cache.k[i][:, :, : start + t], cache.v[i][:, :, : start + t]
        z = self._chunked("attention", lambda q, k, v: _attention(q, k, v, start), q, k, v)
        z = _run(hooks, p + "attn.hook_z", z.transpose(1, 2), start)  # [B, T, H, d_head]
        attn_out = _run(hooks, p + "hook_attn_out", self._mm(z.reshape(b, t, -1), layer.wo), start)
        x = _run(hooks, p + "hook_resid_mid", x + attn_out, start)
        gate, up = self._mm(self._norm(x, layer.mlp_norm), layer.w_gate_up).chunk(2, dim=-1)
        mlp_out = _run(hooks, p + "hook_mlp_out", self._mm(F.silu(gate) * up, layer.w_down), start)
        return _run(hooks, p + "hook_resid_post", x + mlp_out, start)


def _rope_tables(cfg: LlamaConfig, device, dtype) -> tuple[Tensor, Tensor]:
    exponents = torch.arange(0, cfg.d_head, 2, dtype=torch.int64).float().to(device) / cfg.d_head
    inv_freq = 1.0 / (cfg.rope_theta**exponents)
    freqs = torch.outer(torch.arange(cfg.max_context, device=device).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _attention(q: Tensor, k: Tensor, v: Tensor, start: int) -> Tensor:
    t = q.shape[2]
    if t == 1:  # one new position attends to everything cached
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    if start == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    total = k.shape[2]
    mask = torch.ones(t, total, dtype=torch.bool, device=q.device).tril(diagonal=start)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _run(hooks: Mapping[str, Hook], name: str, x: Tensor, start: int) -> Tensor:
    fn = hooks.get(name)
    if fn is None:
        return x
    out = fn(x, start)
    return x if out is None else out
