"""Steering vectors between the tools: where each tool adds its vector, as our hooks.

A vector made in another tool lands at the hook where that tool adds it, with
``strength * vector`` equal to what the tool adds at scale 1. Layer ``k`` is transformers'
decoder layer ``k`` (0-based), TransformerLens' block ``k``:

* llama.cpp ``direction.k`` (k >= 1; llama.cpp rejects 0): ``blocks.k.hook_resid_post``
* repeng ``directions[k]`` (the output of ``model.layers[k]``): ``blocks.k.hook_resid_post``
* steering-vectors at layer ``k``: ``decoder_block`` -> ``blocks.k.hook_resid_post``,
  ``self_attn`` -> ``blocks.k.hook_attn_out``, ``mlp`` -> ``blocks.k.hook_mlp_out``
* Neuronpedia ``hook``: that TransformerLens hook

llama.cpp adds ``direction.k`` to the output of layer ``k`` (``llama_adapter_cvec``:
``tensors[il]`` holds the data of ``direction.il``, added by ``build_cvec(cur, il)`` after
the layer's residual sum), the place repeng and EasySteer add ``directions[k]``. Adding at
``blocks.k.hook_resid_pre`` is adding to the output of block ``k - 1``, so it is written as
``direction.(k-1)``; block 0's input (the embedding) and attention or MLP hooks have no
block output and are refused by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from .. import checks
from ..checks import public
from ..errors import VectorError, VectorModelMismatch, VectorUnsupported
from ..runtime.protocol import hook_layer
from .requests import Direction, SteerRequest, Vector, conditioned

BLOCK_OUTPUT = "hook_resid_post"
# steering-vectors' layer types that add where one of our hooks is: the output of the
# decoder layer, of its attention module, of its MLP module (all before the residual sum)
SV_LAYER_TYPES = {
    "decoder_block": BLOCK_OUTPUT,
    "self_attn": "hook_attn_out",
    "mlp": "hook_mlp_out",
}
SV_HOOK_KINDS = {kind: layer_type for layer_type, kind in SV_LAYER_TYPES.items()}
# a request setting llama.cpp cannot carry, and its value when there is nothing to say
NOTE_DEFAULTS = {"prompt_multiplier": 1.0, "steer_special_tokens": True}


class VectorList(list):
    """Plain vectors plus ``notes``: request settings a vector file cannot apply (a prompt
    multiplier, special tokens left unsteered), so a writer can record and name them."""

    def __init__(self, vectors: Iterable[Vector] = (), notes: Mapping[str, Any] | None = None):
        super().__init__(vectors)
        self.notes = dict(notes or {})


def block_hook(k: int) -> str:
    """The hook where a tool that adds to the output of decoder layer ``k`` adds."""
    return f"blocks.{k}.{BLOCK_OUTPUT}"


def hook_kind(hook: str) -> str:
    """``hook_resid_post`` of ``blocks.3.hook_resid_post``; ``""`` for a name of no block."""
    return hook.split(".", 2)[2] if hook_layer(hook) is not None else ""


def block_output(hook: str, where: str) -> int:
    """The ``k`` of ``direction.k``: the block whose output adding at ``hook`` adds to."""
    layer, kind = hook_layer(hook), hook_kind(hook)
    if kind == BLOCK_OUTPUT:
        return layer
    if kind == "hook_resid_pre" and layer >= 1:
        return layer - 1
    why = (
        "block 0's input is the embedding, which no block output reaches"
        if kind == "hook_resid_pre"
        else "only block outputs (hook_resid_post, or hook_resid_pre from block 1) are"
        " control-vector layers"
    )
    raise VectorUnsupported(where, f"{hook} cannot be written as a control vector: {why}")


def as_float(vector, where: str) -> Tensor:
    """A 1-D float32 copy, or a named error for anything that is not a finite vector."""
    t = checks.floats(where, vector, VectorError)
    if t.dim() != 1 or t.numel() == 0:
        raise VectorError(where, f"must be a 1-D vector, got shape {tuple(t.shape)}")
    return t


def check_vectors(vectors, where: str = "vectors") -> list[Vector]:
    """``vectors`` as a list of ``Vector`` with finite strengths, before any work."""
    if isinstance(vectors, Vector):
        vectors = [vectors]
    bad = VectorError(where, f"must be a list of sw.Vector, got {type(vectors).__name__}")
    if isinstance(vectors, (str, bytes, Mapping, Tensor)) or not isinstance(vectors, Iterable):
        raise bad
    try:
        out = list(vectors)
    except TypeError:  # iterable in name only
        raise bad from None
    if not out:
        raise VectorError(where, "is empty")
    for i, v in enumerate(out):
        if not isinstance(v, Vector) or not isinstance(v.hook, str):
            raise VectorError(f"{where}[{i}]", f"must be a sw.Vector, got {v!r:.80}")
        checks.number(f"{where}[{i}].strength", v.strength, error=VectorError)
        if hook_layer(v.hook) is None:
            raise VectorError(f"{where}[{i}].hook", f"{v.hook!r} is not a blocks.L hook name")
        as_float(v.vector, f"{where}[{i}].vector")
    return out


def added(v: Vector) -> Tensor:
    """What steering with ``v`` adds at its hook: ``strength * vector`` in float32, the
    product the steer maths forms (``c * v``)."""
    return float(v.strength) * as_float(v.vector, v.hook)


def summed_by(vectors: Sequence[Vector], key) -> dict:
    """``strength * vector`` summed per ``key(vector)`` (say, per control-vector layer), in
    the vectors' order, as llama.cpp sums directions of one layer."""
    out: dict = {}
    for v in vectors:
        k, x = key(v), added(v)
        if k in out and out[k].numel() != x.numel():
            raise VectorModelMismatch(
                v.hook, f"is {x.numel()} wide, but a vector summed with it is {out[k].numel()}"
            )
        out[k] = x if k not in out else out[k] + x
    return out


# -- other tools' objects ------------------------------------------------------------------
def from_control_vector(obj, n_layers: int | None) -> list[Vector]:
    """A repeng ``ControlVector`` (``model_type``, ``directions: {layer: array}``):
    ``set_control(v, coeff)`` adds ``coeff * directions[i]`` to the output of
    ``model.layers[i]``, so each direction is a Vector at block ``i``'s output, strength 1."""
    where = f"{type(obj).__name__}.directions"
    directions = obj.directions
    if not isinstance(directions, Mapping) or not directions:
        raise VectorError(where, "must be a non-empty dict of layer -> vector")
    return [
        Vector(as_float(d, f"{where}[{i}]"), block_hook(layer_index(i, n_layers, where)), 1.0)
        for i, d in sorted(directions.items(), key=lambda kv: _int_key(kv[0], where))
    ]


def from_steering_vector(obj, n_layers: int | None, sandwich: bool) -> list[Vector]:
    """A steering-vectors ``SteeringVector``: ``apply(model, multiplier=1)`` adds
    ``layer_activations[i]`` to the output of the module of ``layer_type`` in layer ``i``.
    ``sandwich``: the model norms attention and MLP outputs before the residual sum, so a
    module's output is not our hook_attn_out / hook_mlp_out and those types are refused."""
    layer_type = getattr(obj, "layer_type", "decoder_block")
    where = f"SteeringVector(layer_type={layer_type!r})"
    kind = SV_LAYER_TYPES.get(layer_type)
    if kind is None:
        known = ", ".join(SV_LAYER_TYPES)
        raise VectorUnsupported(
            where, f"adds to the output of {layer_type}, where we have no hook (we read {known})"
        )
    if sandwich and kind != BLOCK_OUTPUT:
        raise VectorUnsupported(
            where, f"the model norms the {layer_type} output before the residual sum, so it "
            f"is not our {kind}"
        )  # fmt: skip
    acts = obj.layer_activations
    if not isinstance(acts, Mapping) or not acts:
        raise VectorError(where, "layer_activations must be a non-empty dict of layer -> tensor")
    out = []
    for i, act in sorted(acts.items(), key=lambda kv: _int_key(kv[0], where)):
        layer = layer_index(i, n_layers, where)
        out.append(Vector(as_float(act, f"{where}[{i}]"), f"blocks.{layer}.{kind}", 1.0))
    return out


@public
def to_steering_vector(vectors: Sequence[Vector] | Vector, model: Any = None):
    """steering-vectors' ``SteeringVector`` adding what ``vectors`` add (``strength *
    vector`` summed per layer), so ``with sv.apply(hf_model):`` steers a transformers model
    as our engine does. One layer type per SteeringVector: hooks of several kinds are
    refused by name, as are hooks it has no layer type for. ``model`` (an Engine or a loaded
    model): on one that norms attention and MLP outputs before the residual sum (Gemma),
    ``hook_attn_out`` / ``hook_mlp_out`` are not its modules' outputs and are refused."""
    vectors_ = check_vectors(vectors)
    if model is not None and getattr(_runtime_cfg(model), "sandwich_norms", False):
        for i, v in enumerate(vectors_):
            if hook_kind(v.hook) in ("hook_attn_out", "hook_mlp_out"):
                raise VectorUnsupported(
                    f"vectors[{i}]", f"the model norms the output at {v.hook} before the "
                    "residual sum, so no steering-vectors module adds there"
                )  # fmt: skip
    types = {_sv_layer(v, f"vectors[{i}]")[0] for i, v in enumerate(vectors_)}
    if len(types) > 1:
        raise VectorUnsupported(
            "vectors", f"a SteeringVector has one layer_type, these need {sorted(types)}"
        )
    warn_notes(getattr(vectors, "notes", {}), "a SteeringVector")
    try:
        from steering_vectors import SteeringVector
    except ModuleNotFoundError:
        raise VectorError(
            "steering_vectors", "is not installed: pip install --no-deps steering-vectors"
        ) from None
    acts = summed_by(vectors_, lambda v: _sv_layer(v, v.hook)[1])
    return SteeringVector(layer_activations=dict(sorted(acts.items())), layer_type=types.pop())


def _runtime_cfg(model):
    """The runtime config of an Engine or a loaded model (a named error for anything else)."""
    runtime = getattr(getattr(model, "model", model), "runtime", None)
    if runtime is None:
        raise VectorError("model", f"must be an Engine or a loaded model, got {model!r:.80}")
    return runtime.cfg


def _sv_layer(v: Vector, where: str) -> tuple[str, int]:
    kind, layer = hook_kind(v.hook), hook_layer(v.hook)
    if kind == "hook_resid_pre" and layer >= 1:
        return "decoder_block", layer - 1
    if kind in SV_HOOK_KINDS:
        return SV_HOOK_KINDS[kind], layer
    raise VectorUnsupported(where, f"steering-vectors has no layer type that adds at {v.hook}")


def layer_index(i, n_layers: int | None, where: str) -> int:
    """A tool's layer number as a block index; a negative one counts from the end, as the
    tools index their layer lists, which needs the model's depth."""
    i = _int_key(i, where)
    if i >= 0:
        return i
    if n_layers is None:
        raise VectorError(where, f"layer {i} counts from the end: pass model= to place it")
    if i + n_layers < 0:
        raise VectorModelMismatch(where, f"layer {i} is outside the model's {n_layers} layers")
    return i + n_layers


def _int_key(i, where: str) -> int:
    try:
        return int(i) if not isinstance(i, bool) and int(i) == i else _bad_layer(i, where)
    except (TypeError, ValueError):
        return _bad_layer(i, where)


def _bad_layer(i, where: str) -> int:
    raise VectorError(where, f"layer {i!r} is not an integer")


def warn_notes(notes: Mapping[str, Any], target: str) -> dict:
    """The notes that differ from a plain steering, named in a ``VectorWarning``: they are
    request settings ``target`` adds no differently at any position."""
    import warnings

    from ..errors import VectorWarning

    said = {k: v for k, v in notes.items() if NOTE_DEFAULTS.get(k) != v}
    if said:
        names = ", ".join(f"{k}={v!r}" for k, v in said.items())
        warnings.warn(
            f"{target} adds each vector at every position: {names} of the request cannot be "
            "applied there (recorded in the metadata where the format has some)",
            VectorWarning,
            stacklevel=4,  # warn_notes, the public function, its checks.public wrapper, caller
        )
    return said


# -- a request as plain vectors ------------------------------------------------------------
def request_vectors(request: SteerRequest, directions: Sequence[Direction]) -> VectorList:
    """What the STEERED output of ``request`` adds on generated tokens, as plain vectors:
    each direction (decoder row or custom vector, unit length under normalize_steering) at
    strength ``strength_multiplier * strength``, the steer maths' coefficient."""
    gated = conditioned(request)
    if gated:
        raise VectorUnsupported(
            gated,
            "is a condition, which no vector file carries: a saved vector would steer "
            "everywhere (drop the condition to save the steering, or keep the request's record)",
        )
    if request.steer_method != "SIMPLE_ADDITIVE":
        raise VectorUnsupported(
            "steer_method",
            f"{request.steer_method} is not a vector added to the residual; only "
            "SIMPLE_ADDITIVE steering turns into vectors",
        )
    multiplier = float(request.strength_multiplier)
    notes = {
        "prompt_multiplier": float(request.prompt_multiplier),
        "steer_special_tokens": bool(request.steer_special_tokens),
    }
    return VectorList(
        (
            Vector(d.vector.detach().cpu().clone(), d.hook, multiplier * d.strength)
            for d in directions
        ),
        notes,
    )


def check_fit(
    vectors: Sequence[Vector], widths: Mapping[str, int], where: str, model_name: str
) -> None:
    """Every vector at a hook of the model, of that hook's width (else a named error with
    both widths)."""
    for v in vectors:
        if v.hook not in widths:
            layers = 1 + max((hook_layer(h) or 0 for h in widths), default=-1)
            raise VectorModelMismatch(
                where, f"{v.hook} is not a hook of {model_name} ({layers} layers)"
            )
        n = torch.as_tensor(v.vector).numel()
        if n != widths[v.hook]:
            raise VectorModelMismatch(
                where, f"the vector at {v.hook} is {n} wide, but {model_name}'s is {widths[v.hook]}"
            )
