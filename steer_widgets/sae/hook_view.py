"""What an SAE sees at its hook point, and where its decoder rows go back in.

Our runtimes give the raw hook values of the model's own weights, which is what SAE Lens
trains on (``HookedTransformer.from_pretrained_no_processing``) unless the SAE's metadata
names weight processing in ``model_from_pretrained_kwargs``. Of those settings only a few
change the values at a hook, and the one the flagship releases use (``gpt2-small-res-jb``:
``center_writing_weights``) is an exact, cheap map at the hook:

* ``center_writing_weights`` subtracts the mean over ``d_model`` from every weight and bias
  that writes into the residual stream (embeddings, W_O, b_O, W_out, b_out). The residual
  stream is their sum, so under TransformerLens every residual, attention-out and MLP-out
  value is the raw value minus its own mean over ``d_model``. TransformerLens does this only
  for pre-LayerNorm models (never for RMSNorm ones, where it would change the outputs), so
  neither do we. Every LayerNorm subtracts the mean anyway, so the model computes the same.
* ``hook_head_index`` makes the SAE read one head's slice of a per-head hook
  (``attn.hook_z``); its decoder rows are written back into that slice only.

Steering adds a decoder row to the raw value at the hook. For a centred SAE this moves the
model exactly as adding it to TransformerLens' centred stream does (the row's mean component
is removed by every LayerNorm that reads the stream), and ``ORTHOGONAL_DECOMP`` and
``PROJECTION_CAP`` take the component along the row of the centred value
(``steering.Direction.centred``), so they too act as on TransformerLens' stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import Tensor

from ..errors import SourceError

# Hooks whose value is a sum of residual-stream writes, so centring the writes centres them.
WRITE_HOOKS = (
    "hook_resid_pre",
    "hook_resid_mid",
    "hook_resid_post",
    "hook_attn_out",
    "hook_mlp_out",
    "hook_embed",
    "hook_pos_embed",
)
HEAD_HOOKS = ("attn.hook_z", "attn.hook_q", "attn.hook_k", "attn.hook_v")
# Processing that changes per-head attention values; we cannot rebuild it at the hook.
HEAD_PROCESSING = ("fold_value_biases", "refactor_factored_attn_matrices")


@dataclass(frozen=True)
class HookView:
    """The map from a hook's raw value to the SAE's input, and from a decoder row back."""

    centre: bool = False
    head: int | None = None
    d_head: int = 0

    def to_sae(self, x: Tensor) -> Tensor:
        """Raw hook values [..., width] to what the SAE was trained on [..., d_in]."""
        if self.head is not None:
            x = x[..., self.head * self.d_head : (self.head + 1) * self.d_head]
        if self.centre:
            x = x - x.mean(-1, keepdim=True)
        return x

    def to_hook(self, row: Tensor, width: int) -> Tensor:
        """A decoder row [d_in] as a direction at the hook [width] (a head's slice, else as is)."""
        if self.head is None:
            return row
        out = row.new_zeros(width)
        out[self.head * self.d_head : (self.head + 1) * self.d_head] = row
        return out


def view_for(
    source: str,
    hook_name: str,
    d_in: int,
    head_index: int | None,
    model_kwargs: Mapping,
    width: int,
    centres_writes: bool,
) -> HookView:
    """The view an SAE needs on this model, or a ``SourceError`` if we cannot give it."""
    kind = hook_name.split(".", 2)[-1] if hook_name.startswith("blocks.") else hook_name
    if head_index is not None:
        if kind not in HEAD_HOOKS or width % d_in or not 0 <= head_index < width // d_in:
            raise SourceError(
                source,
                f"hook_head_index {head_index} with d_in {d_in} does not fit {hook_name} "
                f"({width} wide)",
            )
    elif width != d_in:
        raise SourceError(source, f"d_in is {d_in} but the model's {hook_name} is {width} wide")
    if kind in HEAD_HOOKS:
        asked = [k for k in HEAD_PROCESSING if model_kwargs.get(k)]
        if asked:
            raise SourceError(
                source,
                f"was trained with {asked} in model_from_pretrained_kwargs, which changes "
                f"{kind} values in a way we do not reproduce",
            )
    centre = bool(model_kwargs.get("center_writing_weights")) and centres_writes
    return HookView(centre and kind in WRITE_HOOKS, head_index, d_in)


def centres_writes(runtime) -> bool:
    """Whether TransformerLens' ``center_writing_weights`` would act on this model: only on
    pre-LayerNorm models (GPT-2, Pythia, ...), not RMSNorm ones (Llama, Gemma, Qwen, ...).

    A runtime says which norm it uses as TransformerLens does, ``cfg.normalization_type``
    ("LN"/"RMS", on itself or on its ``tl`` model), or as ours does, ``cfg.norm`` ("layer"/
    "rms"); a runtime that says nothing is RMSNorm.
    """
    cfg = getattr(getattr(runtime, "tl", None), "cfg", None) or getattr(runtime, "cfg", None)
    layer_norm = getattr(cfg, "normalization_type", None) in ("LN", "LNPre")
    return (
        (layer_norm or getattr(cfg, "norm", None) == "layer")
        and not getattr(cfg, "final_rms", False)
        and getattr(cfg, "positional_embedding_type", "standard") != "shortformer"
    )
