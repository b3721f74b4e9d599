"""Steering requests and the maths of each steer method.

Names and defaults follow the reference steering tools (Neuronpedia's steering page and its
inference server), so a request written for one reads the same here:

* ``SIMPLE_ADDITIVE``:   h + c v
* ``ORTHOGONAL_DECOMP``: (I - P) h + c P h with P = v^ v^T, written h + (c - 1)(h . v^) v^ so
  that c = 1 returns h exactly
* ``PROJECTION_CAP``:    the component of h along v^ is clamped to at most c

with c = ``strength_multiplier * strength`` and v a feature's decoder row or a custom vector
(divided by its norm when ``normalize_steering``). Each direction is applied once, at its own
hook point, at every prompt position and every generated token; at the prompt's positions c
is multiplied by ``prompt_multiplier`` (1 by default, as in the reference tools).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from .. import checks
from ..checks import public_methods
from ..errors import ArgumentError, RequestError, SourceError
from ..runtime.tokens import check_prompt
from . import conditions
from .entries import Condition, Feature, Vector
from .gates import Resolved, RowGates
from .generation import DEFAULT_SAMPLING, Row, RowOp, Sampling, check_sampling_keys

if TYPE_CHECKING:
    from ..sae.store import SAEStore


TYPES = ("DEFAULT", "STEERED")
METHODS = ("SIMPLE_ADDITIVE", "ORTHOGONAL_DECOMP", "PROJECTION_CAP")
SteerMethod = Literal["SIMPLE_ADDITIVE", "ORTHOGONAL_DECOMP", "PROJECTION_CAP"]


@public_methods
@dataclass(frozen=True)
class SteerRequest:
    """Everything that determines a steering result; a result can be replayed from it.

    The sampling fields (``n_completion_tokens``, ``temperature``, ``freq_penalty``,
    ``seed``) take their defaults from ``generation.DEFAULT_SAMPLING`` and are read back as
    one ``Sampling`` through ``.sampling``.
    """

    prompt: str | Sequence[dict]
    features: Sequence[Feature] = ()
    vectors: Sequence[Vector] = ()
    types: Sequence[str] = TYPES
    steer_method: SteerMethod = "SIMPLE_ADDITIVE"
    strength_multiplier: float = 1.0
    normalize_steering: bool = False
    steer_special_tokens: bool = True
    prompt_multiplier: float = 1.0  # c at the prompt's positions is multiplied by this
    n_completion_tokens: int = DEFAULT_SAMPLING.n_completion_tokens
    temperature: float = DEFAULT_SAMPLING.temperature
    freq_penalty: float = DEFAULT_SAMPLING.freq_penalty
    seed: int = DEFAULT_SAMPLING.seed
    sweep: Sequence[float] = ()  # extra STEERED rows at these strength multipliers
    when: Condition | None = None  # steer only where this holds (sw.When); entries add theirs

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.freq_penalty, self.seed, self.n_completion_tokens)

    def with_(self, **changes) -> SteerRequest:
        unknown = sorted(set(changes) - set(self.__dataclass_fields__))
        if unknown:
            raise ArgumentError(unknown[0], "is not a SteerRequest field")
        return replace(self, **changes)

    def to_dict(self) -> dict:
        """A JSON-able record (custom vectors as lists) that ``from_dict`` turns back."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["prompt"] = (
            self.prompt if isinstance(self.prompt, str) else [dict(m) for m in self.prompt]
        )
        d["features"] = [
            _with_when({"source": f.source, "index": f.index, "strength": f.strength}, f.when)
            for f in self.features
        ]
        d["vectors"] = [
            _with_when(
                {"vector": _as_list(v.vector), "hook": v.hook, "strength": v.strength}, v.when
            )
            for v in self.vectors
        ]
        d["types"], d["sweep"] = list(self.types), list(self.sweep)
        if self.when is None:  # a record without a condition reads as it did before them
            del d["when"]
        else:
            d["when"] = self.when.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> SteerRequest:
        """The request of a record; a malformed record raises ``RequestError`` naming the key."""
        if not isinstance(d, Mapping):
            raise RequestError("request", f"must be a dict of request fields, got {d!r}")
        unknown = sorted(set(d) - set(cls.__dataclass_fields__), key=str)
        if unknown:
            raise RequestError(str(unknown[0]), "is not a SteerRequest field")
        if "prompt" not in d:
            raise RequestError("prompt", "is missing from the record")
        known = dict(d)
        known["features"] = tuple(
            _feature_from_dict(i, f)
            for i, f in enumerate(checks.sequence("features", d.get("features", ())))
        )
        known["vectors"] = tuple(
            _vector_from_dict(i, v)
            for i, v in enumerate(checks.sequence("vectors", d.get("vectors", ())))
        )
        for key in ("types", "sweep"):
            if key in known:
                known[key] = tuple(checks.sequence(key, known[key]))
        if known.get("when") is not None:
            known["when"] = conditions.from_record(known["when"], "when")
        return cls(**known)


def conditions_of(request: SteerRequest) -> list[tuple[str, Condition]]:
    """Every condition of ``request`` with its field (``when``, ``features[0].when``), the
    request's first; checked or not (an entry of the wrong type has none)."""
    out = [] if request.when is None else [("when", request.when)]
    for name, entries in (("features", request.features), ("vectors", request.vectors)):
        for i, entry in enumerate(entries):
            if getattr(entry, "when", None) is not None:
                out.append((f"{name}[{i}].when", entry.when))
    return out


def conditioned(request: SteerRequest) -> str | None:
    """The first field of ``request`` that holds a condition, or ``None``: for the tools
    that cannot apply one and refuse it by name."""
    found = conditions_of(request)
    return found[0][0] if found else None


def unsteered(prompt, sampling: Mapping) -> SteerRequest:
    """The request ``generate``/``samples`` make of a prompt and sampling keywords."""
    check_sampling_keys(sampling)
    return SteerRequest(prompt=prompt, types=("DEFAULT",), **sampling)


MAX_SAMPLES = 64  # rows of one samples() call (one batch)


def sample_seeds(request: SteerRequest, n: int) -> list[int]:
    """The seeds of ``samples``' ``n`` rows, ``seed + i``: ``n`` and the last seed checked
    here, for the local and the remote engine alike (``request`` checks only the first)."""
    checks.integer("n", n, lo=1, hi=MAX_SAMPLES)
    checks.integer("seed", request.seed + n - 1, *checks.SEED_RANGE)  # the last row's
    return [request.seed + i for i in range(n)]


def _entry(name: str, value, required: tuple[str, ...], optional: tuple[str, ...]) -> dict:
    """A record entry as keyword arguments, with its keys checked."""
    if not isinstance(value, Mapping):
        raise RequestError(name, f"must be a dict, got {value!r}")
    missing = [k for k in required if k not in value]
    extra = sorted(set(value) - set(required) - set(optional), key=str)
    if missing or extra:
        keys = ", ".join(required + optional)
        raise RequestError(name, f"must have the keys {keys} (missing {missing}, extra {extra})")
    return dict(value)


def _feature_from_dict(i: int, f) -> Feature:
    kw = _entry(f"features[{i}]", f, ("source", "index"), ("strength", "when"))
    return Feature(**_when_from_dict(kw, f"features[{i}].when"))


def _vector_from_dict(i: int, v) -> Vector:
    kw = _entry(f"vectors[{i}]", v, ("vector", "hook"), ("strength", "when"))
    try:
        kw["vector"] = torch.tensor(kw["vector"], dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as err:
        raise RequestError(f"vectors[{i}].vector", f"is not a list of numbers: {err}") from None
    return Vector(**_when_from_dict(kw, f"vectors[{i}].when"))


def _when_from_dict(kw: dict, field: str) -> dict:
    if kw.get("when") is not None:
        kw["when"] = conditions.from_record(kw["when"], field)
    return kw


def _with_when(entry: dict, when: Condition | None) -> dict:
    """An entry's record, with its condition only where it has one (older records read
    the same)."""
    if when is not None:
        entry["when"] = when.to_dict()
    return entry


def sweep_label(multiplier: float) -> str:
    """Output key of a sweep row, e.g. ``STEERED*-2``; distinct multipliers, distinct keys."""
    short = f"{multiplier:g}"
    return f"STEERED*{short if float(short) == multiplier else repr(float(multiplier))}"


@dataclass(frozen=True)
class Direction:
    """One resolved direction: where it goes, which way, and its base strength.

    ``centred``: the direction's SAE reads this hook mean-centred (``hook_view``), so the
    component along it is taken of the centred value, as TransformerLens would see it.
    """

    hook: str
    vector: Tensor
    strength: float
    field: str = "vectors"  # the request field it came from, for errors about it
    centred: bool = False
    entry: str = ""  # the entry it steers for (``features[0]``), the key of its gate


@dataclass(frozen=True)
class PlannedRow:
    """One output of a plan: its key, its strength multiplier (None for DEFAULT), its row."""

    label: str
    multiplier: float | None
    row: Row


@dataclass
class Plan:
    """A validated request turned into rows, in output order (DEFAULT, STEERED, sweep)."""

    outputs: list[PlannedRow] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        return [o.label for o in self.outputs]

    @property
    def rows(self) -> list[Row]:
        return [o.row for o in self.outputs]


def output_multipliers(request: SteerRequest) -> dict[str, float | None]:
    """Each output's key and strength multiplier (None: DEFAULT is never steered), in order."""
    out: dict[str, float | None] = {}
    if "DEFAULT" in request.types:
        out["DEFAULT"] = None
    if "STEERED" in request.types:
        out["STEERED"] = float(request.strength_multiplier)
    for m in request.sweep:
        out[sweep_label(m)] = float(m)
    return out


def build_plan(
    request: SteerRequest,
    directions: Sequence[Direction],
    special: Sequence[bool],
    gated: Resolved | None = None,
    generated: Sequence[bool] = (),
) -> Plan:
    """The rows of a validated request; ``special`` flags the prompt's special tokens,
    ``gated`` holds its resolved conditions (each steered row gets its own state) and
    ``generated`` flags an earlier reply's own tokens in a chat's history (steered as the
    completion positions they were: the plain coefficient, never masked)."""
    check_combinable(request.steer_method, directions)
    replies = torch.tensor(list(generated) or [False] * len(special), dtype=torch.bool)
    unsteered = torch.tensor(list(special), dtype=torch.bool) & ~replies
    if request.steer_special_tokens:
        unsteered = torch.zeros(len(special), dtype=torch.bool)
    prompt = PromptPositions(float(request.prompt_multiplier), unsteered, replies)
    by_hook: dict[str, list[Direction]] = {}
    for d in directions:
        by_hook.setdefault(d.hook, []).append(d)
    plan = Plan()
    for label, mult in output_multipliers(request).items():
        if mult is None:
            plan.outputs.append(PlannedRow(label, mult, Row()))
            continue
        gates = None if gated is None else gated.row(len(special))
        ops = {
            h: row_op(request.steer_method, ds, mult, prompt, gates) for h, ds in by_hook.items()
        }
        for h in gated.hooks if gated is not None else ():
            ops[h] = _reading(gates, h, ops.get(h))
        plan.outputs.append(PlannedRow(label, mult, Row(ops, gates=gates)))
    return plan


def _reading(gates: RowGates, hook: str, op: RowOp | None) -> RowOp:
    """The row's op at ``hook`` after its conditions read their scores there (before any
    steering at the hook)."""

    def read_then_steer(x: Tensor, start: int) -> Tensor:
        gates.read(hook, x, start)
        return x if op is None else op(x, start)

    return read_then_steer


def resolve_directions(
    request: SteerRequest, saes: SAEStore, hook_widths: Mapping[str, int]
) -> list[Direction]:
    """Features and vectors as directions at their hooks, checked against model and SAEs."""
    out = []
    for i, f in enumerate(request.features):
        try:
            cfg = saes.config(f.source)
            vec = saes.direction(f.source, f.index)
        except SourceError as err:
            raise RequestError(f"features[{i}]", str(err)) from err
        if request.normalize_steering:
            vec = unit(vec, f"features[{i}]")
        out.append(
            Direction(
                cfg.hook_name,
                vec,
                float(f.strength),
                f"features[{i}]",
                cfg.view.centre,
                f"features[{i}]",
            )  # fmt: skip
        )
    for i, v in enumerate(request.vectors):
        out.append(_vector_direction(i, v, hook_widths, request.normalize_steering))
    return out


def check_vector(v, widths: Mapping[str, int], field: str) -> None:
    """``v`` is a ``Vector`` at a hook of the model, of its width, with a finite strength."""
    if not isinstance(v, Vector):
        raise RequestError(field, f"must be a Vector (say, engine.concept_vector(...)), got {v!r}")
    try:
        _vector_direction(0, v, widths, False)
    except RequestError as err:
        raise RequestError(err.field.replace("vectors[0]", field), err.problem) from None
    checks.number(f"{field}.strength", v.strength)


def _vector_direction(i: int, v: Vector, widths: Mapping[str, int], normalize: bool) -> Direction:
    if not isinstance(v.hook, str) or v.hook not in widths:
        raise RequestError(f"vectors[{i}].hook", f"the model has no hook {v.hook!r}")
    vec = checks.floats(f"vectors[{i}].vector", v.vector).flatten()
    if vec.numel() != widths[v.hook]:
        raise RequestError(
            f"vectors[{i}].vector",
            f"has width {vec.numel()}, but {v.hook} is {widths[v.hook]} wide",
        )
    if normalize:
        vec = unit(vec, f"vectors[{i}].vector")
    return Direction(v.hook, vec, float(v.strength), f"vectors[{i}].vector", entry=f"vectors[{i}]")


def validate_shape(request: SteerRequest) -> None:
    """Every check that needs no model: each field's type and range, ``None`` included."""
    if not isinstance(request, SteerRequest):
        raise RequestError("request", f"must be a SteerRequest or a record dict, got {request!r}")
    check_prompt(request.prompt)
    types = tuple(checks.sequence("types", request.types))
    if not types:
        raise RequestError("types", "is empty; ask for DEFAULT, STEERED or both")
    for t in types:
        if t not in TYPES:
            raise RequestError("types", f"{t!r} is not one of {TYPES}")
    if len(set(types)) != len(types):
        raise RequestError("types", f"repeats a type: {list(types)}")
    if not isinstance(request.steer_method, str) or request.steer_method not in METHODS:
        raise RequestError("steer_method", f"{request.steer_method!r} is not one of {METHODS}")
    checks.number("strength_multiplier", request.strength_multiplier)
    checks.flag("normalize_steering", request.normalize_steering)
    checks.flag("steer_special_tokens", request.steer_special_tokens)
    checks.number("prompt_multiplier", request.prompt_multiplier)
    request.sampling.validate()
    _check_features(request.features)
    _check_vectors(request.vectors)
    _check_sweep(request.sweep)
    if request.when is not None:
        conditions.check(request.when, "when")
    steers = "STEERED" in types or request.sweep
    if steers and not (request.features or request.vectors):
        raise RequestError("features", "STEERED needs at least one feature or vector")


def _check_features(features) -> None:
    for i, f in enumerate(checks.sequence("features", features)):
        if not isinstance(f, Feature):
            raise RequestError(f"features[{i}]", f"must be a Feature, got {f!r}")
        checks.text(f"features[{i}].source", f.source)
        checks.integer(f"features[{i}].index", f.index, lo=0)
        checks.number(f"features[{i}].strength", f.strength)
        if f.when is not None:
            conditions.check(f.when, f"features[{i}].when")


def _check_vectors(vectors) -> None:
    for i, v in enumerate(checks.sequence("vectors", vectors)):
        if not isinstance(v, Vector):
            raise RequestError(f"vectors[{i}]", f"must be a Vector, got {v!r}")
        checks.text(f"vectors[{i}].hook", v.hook)
        checks.number(f"vectors[{i}].strength", v.strength)
        if v.vector is None or isinstance(v.vector, (str, bytes)):
            got = f"got {v.vector!r}"
            raise RequestError(f"vectors[{i}].vector", f"must be a list of numbers, {got}")
        if v.when is not None:
            conditions.check(v.when, f"vectors[{i}].when")


def _check_sweep(sweep) -> None:
    seen: dict[float, int] = {}
    for i, m in enumerate(checks.sequence("sweep", sweep)):
        value = checks.number(f"sweep[{i}]", m)
        if value in seen:
            raise RequestError(f"sweep[{i}]", f"repeats sweep[{seen[value]}] ({m!r})")
        seen[value] = i


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


@dataclass(frozen=True)
class PromptPositions:
    """How a row treats the prompt's positions: ``multiplier`` scales every coefficient there
    and ``unsteered`` (one flag per prompt token) leaves positions alone. Generated positions
    always get the plain coefficient."""

    multiplier: float
    unsteered: Tensor  # bool [prompt length]
    generated: Tensor | None = None  # bool [prompt length]: an earlier reply's own tokens

    def plain_from(self, start: int) -> bool:
        """Positions from ``start`` on are steered with the plain coefficient: every decode
        step, and the whole prompt when it is neither scaled nor masked."""
        if start >= len(self.unsteered):
            return True
        return self.multiplier == 1.0 and not bool(self.unsteered[start:].any())

    def scaled(self, pos: Tensor) -> Tensor:
        """Which of ``pos`` take ``multiplier``: prompt positions, not earlier replies'."""
        in_prompt = pos < len(self.unsteered)
        if self.generated is None or not bool(self.generated.any()):
            return in_prompt
        return in_prompt & ~self.generated[pos.clamp(max=len(self.unsteered) - 1)]


def row_op(
    method: str,
    directions: Sequence[Direction],
    multiplier: float,
    prompt: PromptPositions | None = None,
    gates: RowGates | None = None,
) -> RowOp:
    """The per-row intervention for one hook: every direction at that hook, in order.
    ``prompt=None`` steers every position with the plain coefficient. A direction whose
    entry is gated is selected per position (``torch.where``) between the residual it
    steers and the one it was given: where the gate is off, nothing changes."""
    coefs = [multiplier * d.strength for d in directions]
    units = [unit(d.vector, d.field) for d in directions] if method != "SIMPLE_ADDITIVE" else None
    gated = set() if gates is None else set(gates.resolved.entries)

    def steer(x: Tensor, scale: float | Tensor, start: int, kept: Tensor | None = None) -> Tensor:
        new = x
        for i, d in enumerate(directions):
            c = coefs[i] * scale
            stepped = _apply(method, new, d.vector, units[i] if units else None, c, d.centred)
            if d.entry in gated:
                on = gates.mask(d.entry, start, x.shape[1], kept).to(x.device)
                stepped = torch.where(on.view(1, -1, *[1] * (x.dim() - 2)), stepped, new)
            new = stepped
        return new

    def op(x: Tensor, start: int) -> Tensor:
        if prompt is None or prompt.plain_from(start):
            return steer(x, 1.0, start)
        pos = torch.arange(start, start + x.shape[1])
        in_prompt = pos < len(prompt.unsteered)
        scale: float | Tensor = 1.0  # a mask alone keeps the plain coefficient's arithmetic
        if prompt.multiplier != 1.0:
            scaled = prompt.scaled(pos)
            scale = torch.where(scaled, prompt.multiplier, 1.0).to(x.device)[None, :, None]
        kept = in_prompt & prompt.unsteered[pos.clamp(max=len(prompt.unsteered) - 1)]
        keep = kept.to(x.device).view(1, -1, *[1] * (x.dim() - 2))  # hook_z is [B, T, H, d]
        return torch.where(keep, x, steer(x, scale, start, kept))

    return op


def _apply(
    method: str, x: Tensor, v: Tensor, u: Tensor | None, c: float | Tensor, centred: bool = False
) -> Tensor:
    """One direction applied to ``x``; ``c`` is a number or one coefficient per position
    ([1, T, 1]), which broadcasts through each method's formula."""
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
