"""Any TransformerLens ``HookedTransformer`` behind the ``runtime.Runtime`` interface.

The fast runtime (``transformer.py``) covers the architectures SAE users study most; this one
runs everything else TransformerLens supports, at TransformerLens' speed. We cannot
choose its kernels, so rows are made exact the plain way: each row runs alone, prefill and
every decode step, on its own cache. A fixed padded batch is not enough: on some CPUs (AMD
EPYC with AVX-512, measured 2026-12-01) a row's logits depend on its position in the batch, so a
sweep row at position 1 differed from its solo run at position 0 in the sixth decimal.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .protocol import HOOK_KINDS, RowLengths


@dataclass(frozen=True)
class RuntimeConfig:
    n_layers: int
    d_model: int
    vocab_size: int
    max_context: int


class RowCaches(RowLengths):
    """One TransformerLens cache per row: each row prefills and decodes alone, at its own
    position (``lengths``), so rows of different prompts decode side by side."""

    def __init__(self, model, rows: int, length: int) -> None:
        from transformer_lens import TransformerLensKeyValueCache

        self.capacity = length
        make = TransformerLensKeyValueCache.init_cache
        self.per_row = [make(model.cfg, model.cfg.device, 1) for _ in range(rows)]
        self.lengths = [0] * rows

    def view(self, row: int) -> _RowView:
        return _RowView(self, row)


@dataclass
class _RowView:
    caches: RowCaches
    row: int
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.caches.capacity


class TransformerLensRuntime:
    """Wraps a ``HookedTransformer`` (loaded unprocessed: the raw hook values SAEs train on)."""

    resumes = False  # every prefill runs from the embedding
    ragged = True  # each row decodes on its own cache, at its own position
    products = "float32"  # TransformerLens computes every product in the model's dtype

    def __init__(self, model) -> None:
        self.tl = model.eval()
        cfg = model.cfg
        self.cfg = RuntimeConfig(cfg.n_layers, cfg.d_model, cfg.d_vocab, cfg.n_ctx)
        self.device = torch.device(cfg.device or "cpu")
        self.layer_devices = [self.device] * cfg.n_layers
        self.row_groups = {"decode_rows": 1}
        self._lock = threading.Lock()
        self.unembed_weight = model.W_U.T  # [vocab, d_model]
        self._z_width = cfg.n_heads * cfg.d_head

    @property
    def hook_names(self) -> list[str]:
        names = [f"blocks.{i}.{k}" for i in range(self.cfg.n_layers) for k in HOOK_KINDS]
        return [n for n in names if n in self.tl.hook_dict]

    def hook_widths(self) -> dict[str, int]:
        return {
            n: self._z_width if n.endswith("hook_z") else self.cfg.d_model for n in self.hook_names
        }

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.tl.parameters())

    def new_cache(self, rows: int, length: int) -> RowCaches:
        return RowCaches(self.tl, rows, length)

    @torch.inference_mode()
    def forward(
        self,
        tokens: Tensor,
        cache: RowCaches | _RowView | None = None,
        hooks: Mapping | None = None,
        stop_at_layer: int | None = None,
        last_only: bool = False,
        rows: Sequence[int] | None = None,
    ) -> Tensor:
        """Same contract as ``Runtime.forward``; a decode step on ``RowCaches`` runs each row
        alone on its own cache (``rows``: which, each at its own position)."""
        kwargs = {"stop_at_layer": stop_at_layer} if stop_at_layer is not None else {}
        if isinstance(cache, RowCaches):
            rows = range(len(cache.per_row)) if rows is None else rows
            out = self._decode_rows(tokens, cache, hooks or {}, list(rows), kwargs)
            return out[:, -1:] if last_only and stop_at_layer is None else out
        start = cache.length if cache is not None else 0
        if isinstance(cache, _RowView):
            kwargs["past_kv_cache"] = cache.caches.per_row[cache.row]
        fwd_hooks = [(n, _adapt(fn, start)) for n, fn in (hooks or {}).items()]
        out = self._run(tokens, fwd_hooks, kwargs)
        if cache is not None:
            cache.length = start + tokens.shape[1]
        return out[:, -1:] if last_only and stop_at_layer is None else out

    def _decode_rows(self, tokens, cache: RowCaches, hooks: Mapping, rows: list, kwargs: dict):
        """One decode step, row by row; each row's hooks see it where the batched hooks expect
        it (row ``b`` of the batch), so the engine's hooks need not know. Rows at different
        positions give the hooks a tuple of positions, as the fast runtime's ragged steps do."""
        starts = tuple(cache.lengths[r] for r in rows)
        start = starts[0] if len(set(starts)) == 1 else starts
        outs = []
        for b, r in enumerate(rows):
            fwd = [(n, _adapt(_one_row(fn, b, len(rows)), start)) for n, fn in hooks.items()]
            row_kwargs = {**kwargs, "past_kv_cache": cache.per_row[r]}
            outs.append(self._run(tokens[b : b + 1], fwd, row_kwargs))
            cache.lengths[r] += tokens.shape[1]
        return torch.cat(outs)

    def _run(self, tokens: Tensor, fwd_hooks: list, kwargs: dict) -> Tensor:
        with self._lock:  # run_with_hooks registers hooks on the shared module
            return self.tl.run_with_hooks(tokens.to(self.device), fwd_hooks=fwd_hooks, **kwargs)


def _one_row(fn, row: int, rows: int):
    """``fn`` (a hook over a batch of ``rows``) applied to one row's activation [1, ...]."""

    def hook(x: Tensor, start: int) -> Tensor:
        full = x.new_zeros((rows, *x.shape[1:]))
        full[row : row + 1] = x
        out = fn(full, start)
        return (full if out is None else out)[row : row + 1]

    return hook


def _adapt(fn, start: int):
    def hook(activation: Tensor, hook) -> Tensor:
        out = fn(activation, start)
        return activation if out is None else out

    return hook


def hooked_llama(folder, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """A ``HookedTransformer`` for a Llama-family folder TransformerLens does not know by name
    (SmolLM2 among them): its config filled by hand, weights converted by TransformerLens."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    c = hf.config
    head = c.hidden_size // c.num_attention_heads
    cfg = HookedTransformerConfig(
        d_model=c.hidden_size, d_head=head, n_heads=c.num_attention_heads,
        n_key_value_heads=c.num_key_value_heads, d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers, n_ctx=min(c.max_position_embeddings, 8192),
        d_vocab=c.vocab_size, act_fn="silu", normalization_type="RMS",
        positional_embedding_type="rotary", rotary_dim=head, gated_mlp=True, final_rms=True,
        rotary_base=float(getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]),
        eps=c.rms_norm_eps, original_architecture="LlamaForCausalLM",
        default_prepend_bos=False, tokenizer_prepends_bos=False, dtype=dtype, device=device,
    )  # fmt: skip
    model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(folder))
    model.load_state_dict(convert_llama_weights(hf, cfg), strict=False)
    return model.to(device).eval()
