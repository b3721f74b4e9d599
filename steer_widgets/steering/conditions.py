"""When steering acts: conditions on a feature, a direction or token positions.

A condition is a plain value (``When``), combined with ``&``, ``|`` and ``~``, attached to a
whole request (``SteerRequest(when=...)``) or to one entry (``Feature(..., when=...)``,
``Vector(..., when=...)``; the entry then steers where both hold). Its meaning, exact by
construction (``docs/conditions.md`` walks through an example token by token):

* A **score** condition measures, at every position, an SAE feature's activation at its
  SAE's hook (``When(Feature(source, i), above=2.0)``) or a direction's signed cosine with
  the residual at the vector's hook (``When(vector, above=0.3)``; ``measure="projection"``
  for the component along the unit direction). It holds where the score is ``> above``
  and/or ``< below``. ``relative=True`` reads a feature's threshold as a fraction of its
  top activation in the feature index. The BOS position scores 0, as in
  ``Engine.feature_values``.
* ``scope="token"`` (the default) decides at each position as the text is decoded, from the
  gated run's own residual, read before any steering at that hook point; it may therefore
  gate steering only at hook points at or after its own (``blocks.L.hook_resid_post`` and
  ``blocks.L+1.hook_resid_pre`` are one point). ``off_below`` adds hysteresis: once on, it
  stays on until the score falls below ``off_below``.
* ``scope="prompt"`` decides once per request from an unsteered pass over the prompt,
  reducing the scores of its non-special tokens (``reduce="max" | "mean" | "last"``), and
  then holds at every position or at none.
* ``When.tokens(start, stop, of)`` holds at positions ``start <= k < stop`` counted from
  the first completion position (``of="completion"``), the first prompt position
  (``of="prompt"``: prompt positions only) or position 0 (``of="all"``). A completion
  position is a generated token's own residual: the first generated token is predicted
  from the last prompt position.

Where a gate is off the residual is left exactly as it was (selection, never a zero
coefficient), so a condition that never holds gives exactly DEFAULT's tokens and one that
always holds gives exactly the unconditional steering.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .. import checks
from ..errors import RequestError
from ..runtime.protocol import HOOK_KINDS, hook_layer
from .entries import AllOf, AnyOf, Condition, Feature, Not, Tokens, Vector, When

SCOPES = ("token", "prompt")
REDUCES = ("max", "mean", "last")
MEASURES = ("cosine", "projection")
COUNTS_FROM = ("completion", "prompt", "all")
__all__ = ["AllOf", "AnyOf", "Condition", "Not", "Tokens", "When"]


# -- checks that need no model ---------------------------------------------------------------
def check(cond, field: str) -> None:
    """Every check of a condition that needs no model, each error naming its field."""
    if not isinstance(cond, Condition):
        raise RequestError(field, f"must be a condition (sw.When), got {cond!r}")
    if isinstance(cond, When):
        _check_when(cond, field)
    elif isinstance(cond, Tokens):
        _check_tokens(cond, field)
    elif isinstance(cond, (AllOf, AnyOf)):
        parts = checks.sequence(f"{field}.conditions", cond.conditions)
        if not parts:
            raise RequestError(f"{field}.conditions", "is empty")
        for i, part in enumerate(parts):
            check(part, f"{field}.conditions[{i}]")
    elif isinstance(cond, Not):
        check(cond.condition, f"{field}.condition")
    else:
        raise RequestError(field, f"{type(cond).__name__} is not a condition this version reads")


def _check_when(w: When, field: str) -> None:
    if isinstance(w.on, Feature):
        checks.text(f"{field}.on.source", w.on.source)
        checks.integer(f"{field}.on.index", w.on.index, lo=0)
    elif isinstance(w.on, Vector):
        checks.text(f"{field}.on.hook", w.on.hook)
        checks.floats(f"{field}.on.vector", w.on.vector)
    else:
        raise RequestError(f"{field}.on", f"must be a Feature or a Vector, got {w.on!r}")
    if w.above is None and w.below is None:
        raise RequestError(field, "needs a threshold: above=, below= or both")
    above = None if w.above is None else checks.number(f"{field}.above", w.above)
    below = None if w.below is None else checks.number(f"{field}.below", w.below)
    if above is not None and below is not None and not above < below:
        raise RequestError(field, f"holds nowhere: above={above} is not below below={below}")
    _one_of(f"{field}.scope", w.scope, SCOPES)
    _one_of(f"{field}.reduce", w.reduce, REDUCES)
    _one_of(f"{field}.measure", w.measure, MEASURES)
    checks.flag(f"{field}.relative", w.relative)
    if w.relative and not isinstance(w.on, Feature):
        raise RequestError(f"{field}.relative", "applies to a feature's activation only")
    if w.measure != "cosine" and not isinstance(w.on, Vector):
        raise RequestError(f"{field}.measure", "applies to a direction (a Vector) only")
    if w.off_below is not None:
        off = checks.number(f"{field}.off_below", w.off_below)
        if w.scope != "token" or above is None or below is not None:
            raise RequestError(
                f"{field}.off_below", "is hysteresis for a token-scope condition with above= only"
            )
        if off > above:
            raise RequestError(f"{field}.off_below", f"is {off}, above the threshold {above}")


def _check_tokens(t: Tokens, field: str) -> None:
    start = checks.integer(f"{field}.start", t.start, lo=0)
    if t.stop is not None:
        stop = checks.integer(f"{field}.stop", t.stop, lo=0)
        if stop < start:
            raise RequestError(f"{field}.stop", f"is {stop}, before start {start}")
    _one_of(f"{field}.of", t.of, COUNTS_FROM)


def _one_of(field: str, value, allowed: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise RequestError(field, f"{value!r} is not one of {allowed}")


# -- records ---------------------------------------------------------------------------------
_WHEN_KEYS = ("above", "below", "scope", "reduce", "relative", "measure", "off_below")


def from_record(d, field: str = "when") -> Condition:
    """The condition of a record (``Condition.to_dict``); a malformed one names its key."""
    if isinstance(d, Condition):
        return d
    if not isinstance(d, Mapping) or "kind" not in d:
        raise RequestError(field, f"must be a condition record with a 'kind', got {d!r}")
    kind, rest = d["kind"], {k: v for k, v in d.items() if k != "kind"}
    if kind in ("all", "any"):
        _keys(field, rest, ("parts",))
        parts = checks.sequence(f"{field}.parts", rest["parts"])
        made = tuple(from_record(p, f"{field}.parts[{i}]") for i, p in enumerate(parts))
        return AllOf(made) if kind == "all" else AnyOf(made)
    if kind == "not":
        _keys(field, rest, ("part",))
        return Not(from_record(rest["part"], f"{field}.part"))
    if kind == "tokens":
        _keys(field, rest, (), ("start", "stop", "of"))
        return Tokens(**rest)
    if kind == "feature":
        _keys(field, rest, ("source", "index"), _WHEN_KEYS)
        on = Feature(rest.pop("source"), rest.pop("index"))
        return When(on, **rest)
    if kind == "vector":
        _keys(field, rest, ("vector", "hook"), _WHEN_KEYS)
        try:
            vector = torch.tensor(rest.pop("vector"), dtype=torch.float32)
        except (TypeError, ValueError, RuntimeError) as err:
            raise RequestError(f"{field}.vector", f"is not a list of numbers: {err}") from None
        return When(Vector(vector, rest.pop("hook")), **rest)
    raise RequestError(f"{field}.kind", f"{kind!r} is not a condition kind")


def _keys(field: str, d: Mapping, required: tuple[str, ...], optional=()) -> None:
    missing = [k for k in required if k not in d]
    extra = sorted(set(d) - set(required) - set(optional), key=str)
    if missing or extra:
        raise RequestError(field, f"has missing keys {missing} or unknown keys {extra}")


# -- execution order of hook points ----------------------------------------------------------
def point(hook: str) -> tuple[int, int]:
    """Where ``hook`` runs in a forward pass, as a sortable key: ``blocks.L+1.hook_resid_pre``
    is the same point as ``blocks.L.hook_resid_post`` (one tensor)."""
    layer = hook_layer(hook)
    if layer is None:
        return (-1, 0)
    kind = hook.split(".", 2)[2]
    rank = HOOK_KINDS.index(kind) if kind in HOOK_KINDS else len(HOOK_KINDS)
    if kind == "hook_resid_pre" and layer > 0:
        return (layer - 1, HOOK_KINDS.index("hook_resid_post"))
    return (layer, rank)


def read_hook(hook: str) -> str:
    """The hook a token-scope condition at ``hook`` is read at: the first name of its point,
    so that steering at either name of a shared point comes after the read."""
    layer = hook_layer(hook)
    if layer and hook == f"blocks.{layer}.hook_resid_pre":
        return f"blocks.{layer - 1}.hook_resid_post"
    return hook
