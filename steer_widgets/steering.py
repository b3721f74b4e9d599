"""Steering requests and the maths of each steer method.

Names and defaults follow the reference steering tools (Neuronpedia's steering page and its
inference server), so a request written for one reads the same here:

* ``SIMPLE_ADDITIVE``:   h + c v
* ``ORTHOGONAL_DECOMP``: (I - P) h + c P h with P = v^ v^T, written h + (c - 1)(h . v^) v^ so
  that c = 1 returns h exactly
* ``PROJECTION_CAP``:    the component of h along v^ is clamped to at most c

with c = ``strength_multiplier * strength`` and v a feature's decoder row or a custom vector
(divided by its norm when ``normalize_steering``). Each direction is applied once, at its own
hook point, at every prompt position and every generated token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from torch import Tensor

from .errors import RequestError
from .generation import Row, Sampling

TYPES = ("DEFAULT", "STEERED")
METHODS = ("SIMPLE_ADDITIVE", "ORTHOGONAL_DECOMP", "PROJECTION_CAP")
SteerMethod = Literal["SIMPLE_ADDITIVE", "ORTHOGONAL_DECOMP", "PROJECTION_CAP"]


@dataclass(frozen=True)
class Feature:
    """An SAE feature: ``source`` names the SAE (e.g. ``10-smollm2-res-4k``)."""

    source: str
    index: int
    strength: float = 40.0


@dataclass(frozen=True)
class Vector:
    """A custom steering direction added at ``hook`` (a TransformerLens hook name)."""

    vector: Tensor | Sequence[float]
    hook: str
    strength: float = 1.0


@dataclass(frozen=True)
class SteerRequest:
    """Everything that determines a steering result; a result can be replayed from it."""

    prompt: str | Sequence[dict]
    features: Sequence[Feature] = ()
    vectors: Sequence[Vector] = ()
    types: Sequence[str] = TYPES
    steer_method: SteerMethod = "SIMPLE_ADDITIVE"
    strength_multiplier: float = 1.0
    normalize_steering: bool = False
    steer_special_tokens: bool = True
    n_completion_tokens: int = 64
    temperature: float = 0.5
    freq_penalty: float = 1.0
    seed: int = 16
    sweep: Sequence[float] = ()  # extra STEERED rows at these strength multipliers

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.freq_penalty, self.seed, self.n_completion_tokens)

    def with_(self, **changes) -> SteerRequest:
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """A JSON-able record (custom vectors as lists) that ``from_dict`` turns back."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["prompt"] = (
            self.prompt if isinstance(self.prompt, str) else [dict(m) for m in self.prompt]
        )
        d["features"] = [vars(f).copy() for f in self.features]
        d["vectors"] = [
            {"vector": _as_list(v.vector), "hook": v.hook, "strength": v.strength}
            for v in self.vectors
        ]
        d["types"], d["sweep"] = list(self.types), list(self.sweep)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SteerRequest:
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        known["features"] = tuple(Feature(**f) for f in d.get("features", ()))
        known["vectors"] = tuple(
            Vector(torch.tensor(v["vector"], dtype=torch.float32), v["hook"], v["strength"])
            for v in d.get("vectors", ())
        )
        for key in ("types", "sweep"):
            if key in known:
                known[key] = tuple(known[key])
        return cls(**known)


def sweep_label(multiplier: float) -> str:
    """Output key of a sweep row, e.g. ``STEERED*-2``."""
    return f"STEERED*{multiplier:g}"


@dataclass(frozen=True)
class Direction:
    """One resolved direction: where it goes, which way, and its base strength.

    ``centred``: the direction's SAE reads this hook mean-centred (``hook_view``), so the
    component along it is taken of the centred value, as TransformerLens would see it.
    """

    hook: str
    vector: Tensor
    strength: float
    centred: bool = False


@dataclass
class Plan:
    """A validated request turned into rows: labels[i] is produced by rows[i]."""

    labels: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)


def validate_shape(request: SteerRequest) -> None:
    """Checks that need no model: types, method, strengths, sweep."""
    types = tuple(request.types)
    if not types:
        raise RequestError("types", "is empty; ask for DEFAULT, STEERED or both")
    for t in types:
        if t not in TYPES:
            raise RequestError("types", f"{t!r} is not one of {TYPES}")
    if len(set(types)) != len(types):
        raise RequestError("types", f"repeats a type: {list(types)}")
    if request.steer_method not in METHODS:
        raise RequestError("steer_method", f"{request.steer_method!r} is not one of {METHODS}")
    _finite("strength_multiplier", request.strength_multiplier)
    for i, f in enumerate(request.features):
        _finite(f"features[{i}].strength", f.strength)
        if not isinstance(f.index, int) or isinstance(f.index, bool):
            raise RequestError(f"features[{i}].index", f"must be an integer, got {f.index!r}")
    for i, v in enumerate(request.vectors):
        _finite(f"vectors[{i}].strength", v.strength)
    for i, m in enumerate(request.sweep):
        _finite(f"sweep[{i}]", m)
    steers = "STEERED" in types or request.sweep
    if steers and not (request.features or request.vectors):
        raise RequestError("features", "STEERED needs at least one feature or vector")


def _finite(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(name, f"must be a finite number, got {value!r}")


def check_combinable(method: str, directions: Sequence[Direction]) -> None:
    """ORTHOGONAL_DECOMP and PROJECTION_CAP act on one direction's component: two directions
    at one hook would make the result depend on their order, so we refuse it."""
    if method == "SIMPLE_ADDITIVE":
        return
    hooks = [d.hook for d in directions]
    dup = sorted({h for h in hooks if hooks.count(h) > 1})
    if dup:
        raise RequestError(
            "features",
            f"{method} takes one direction per hook point, but {dup} has several "
            "(combine them with SIMPLE_ADDITIVE, or use one feature or vector per layer)",
        )


def unit(v: Tensor, field_name: str) -> Tensor:
    norm = v.norm()
    if not torch.isfinite(norm) or norm == 0:
        raise RequestError(field_name, "has zero or non-finite norm and cannot be normalized")
    return v / norm


def row_op(
    method: str,
    directions: Sequence[Direction],
    multiplier: float,
    unsteered_positions: Tensor | None,
):
    """The per-row intervention for one hook: every direction at that hook, in order.

    ``unsteered_positions`` is a bool mask over prompt positions left alone
    (``steer_special_tokens=False``); positions past the prompt are always steered.
    """
    coefs = [multiplier * d.strength for d in directions]
    units = [unit(d.vector, "vectors") for d in directions] if method != "SIMPLE_ADDITIVE" else None

    def op(x: Tensor, start: int) -> Tensor:
        new = x
        for i, d in enumerate(directions):
            new = _apply(method, new, d.vector, units[i] if units else None, coefs[i], d.centred)
        if unsteered_positions is None or start >= len(unsteered_positions):
            return new
        keep = unsteered_positions[start : start + x.shape[1]]
        keep = torch.cat([keep, keep.new_zeros(x.shape[1] - len(keep))])
        return torch.where(keep[None, :, None], x, new)

    return op


def _apply(
    method: str, x: Tensor, v: Tensor, u: Tensor | None, c: float, centred: bool = False
) -> Tensor:
    flat = x.reshape(x.shape[0], x.shape[1], -1)  # attn.hook_z is [B, T, heads, d_head]
    v, u = v.to(flat.device), None if u is None else u.to(flat.device)  # no-op on one device
    if method == "SIMPLE_ADDITIVE":
        out = flat + c * v
    else:
        seen = flat - flat.mean(-1, keepdim=True) if centred else flat
        comp = (seen * u).sum(-1, keepdim=True)  # h . v^
        if method == "ORTHOGONAL_DECOMP":
            out = flat + (c - 1.0) * comp * u
        else:  # PROJECTION_CAP
            out = flat + (comp.clamp(max=c) - comp) * u
    return out.view(x.shape)


def _as_list(v) -> list:
    return v.tolist() if isinstance(v, Tensor) else list(v)
