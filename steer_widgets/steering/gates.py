"""Conditions at run time: per row, where each gated steering entry is on.

``conditions`` holds the values users write; this module holds what a decode runs. A
condition is resolved once per request into a tree of ``Gate`` nodes (scores read at hooks,
prompt decisions already taken, token windows). Each decoded row gets its own ``RowGates``:
the row's ops call ``read`` at each score's hook before their own steering, then ask
``mask`` for each gated entry, which ``log`` keeps per position for the output. A row's
state starts afresh whenever a forward pass starts at position 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from ..errors import RequestError
from .conditions import AllOf, AnyOf, Condition, Not, Tokens, When, point, read_hook

ScoreFn = Callable[[Tensor], Tensor]  # hook values [T, width] -> score [T]


@dataclass(frozen=True)
class Score:
    """A token-scope score read at ``hook``: on where ``> above`` and ``< below``; with
    ``off_below``, once on it stays on until the score is ``< off_below``. ``zero_first``:
    position 0 is BOS and scores 0."""

    hook: str
    fn: ScoreFn
    above: float | None
    below: float | None
    off_below: float | None = None
    zero_first: bool = False


class Gate:
    """A node of a resolved condition."""

    def mask(self, gates: RowGates, positions: Tensor) -> Tensor:
        raise NotImplementedError

    def children(self) -> tuple[Gate, ...]:
        """The gates this one joins or negates (none for a leaf)."""
        return ()


@dataclass(frozen=True)
class ScoreGate(Gate):
    slot: int  # index into the request's scores

    def mask(self, gates: RowGates, positions: Tensor) -> Tensor:
        return gates.current[self.slot]


@dataclass(frozen=True)
class Fixed(Gate):
    """A decision already taken (a prompt-scope condition)."""

    on: bool

    def mask(self, gates: RowGates, positions: Tensor) -> Tensor:
        return torch.full(positions.shape, self.on)


@dataclass(frozen=True)
class Window(Gate):
    tokens: Tokens

    def mask(self, gates: RowGates, positions: Tensor) -> Tensor:
        return self.tokens.holds(positions, gates.prompt_length)


@dataclass(frozen=True)
class Joined(Gate):
    """Parts joined position by position: ``Every`` (and) or ``Some`` (or)."""

    parts: tuple[Gate, ...]
    join: ClassVar[Callable[[Tensor, Tensor], Tensor]]

    def mask(self, gates: RowGates, positions: Tensor) -> Tensor:
        out = self.parts[0].mask(gates, positions)
        for part in self.parts[1:]:
            out = type(self).join(out, part.mask(gates, positions))
        return out

    def children(self) -> tuple[Gate, ...]:
        return self.parts


class Every(Joined):
    join = torch.logical_and


class Some(Joined):
    join = torch.logical_or


@dataclass(frozen=True)
class Negated(Gate):
    part: Gate

    def mask(self, gates: RowGates, positions: Tensor) -> Tensor:
        return ~self.part.mask(gates, positions)

    def children(self) -> tuple[Gate, ...]:
        return (self.part,)


@dataclass(frozen=True)
class Recorded(Gate):
    """A gate as a finished output logged it (``Completion.gates``), so that a text read
    again (explanations) is steered exactly where it was. Positions past the log are off:
    the last generated token was never run while decoding, so it had no gate."""

    log: tuple[bool, ...]

    def mask(self, gates: RowGates, positions: Tensor) -> Tensor:
        n = len(self.log)
        return torch.tensor([p < n and self.log[p] for p in positions.tolist()], dtype=torch.bool)


def recorded(logs: Mapping[str, Sequence[bool]]) -> Resolved:
    """The gates an output recorded, as a ``Resolved`` that reads nothing."""
    return Resolved((), {name: Recorded(tuple(bool(v) for v in log)) for name, log in logs.items()})


@dataclass(frozen=True)
class Resolved:
    """A request's conditions, resolved: the scores its rows read and each gated entry's
    gate (by entry name, ``features[0]``, ``vectors[1]``)."""

    scores: tuple[Score, ...] = ()
    entries: Mapping[str, Gate] = field(default_factory=dict)

    @property
    def hooks(self) -> set[str]:
        return {s.hook for s in self.scores}

    def row(self, prompt_length: int) -> RowGates:
        """Fresh state for one decoded row."""
        return RowGates(self, prompt_length)

    def decided(self) -> dict[str, bool]:
        """Each entry's gate where every one is already decided before decoding (prompt-scope
        conditions only): what a server that takes no per-position gate can still apply."""
        if self.scores or any(_has_window(g) for g in self.entries.values()):
            raise ValueError("token-scope conditions and windows are decided per position")
        state, first = RowGates(self, 0), torch.zeros(1, dtype=torch.long)
        return {name: bool(gate.mask(state, first)[0]) for name, gate in self.entries.items()}


class RowGates:
    """One row's condition state: each score's on/off at the positions of the current
    forward pass, the hysteresis carried between passes, and the log of each entry."""

    def __init__(self, resolved: Resolved, prompt_length: int) -> None:
        self.resolved, self.prompt_length = resolved, prompt_length
        n = len(resolved.scores)
        self.current: list[Tensor] = [torch.zeros(0, dtype=torch.bool)] * n
        self._was_on = [False] * n
        self._log: dict[str, list[bool]] = {name: [] for name in resolved.entries}

    def read(self, hook: str, x: Tensor, start: int) -> None:
        """Score the positions ``start..`` of ``x`` [1, T, ...] at ``hook`` (before any
        steering there); a pass starting at 0 starts the row afresh."""
        if start == 0:
            self._restart()
        flat = x[0].reshape(x.shape[1], -1)
        for slot, score in enumerate(self.resolved.scores):
            if score.hook != hook:
                continue
            s = score.fn(flat.float().cpu()).double()  # thresholds compare as Python floats
            if score.zero_first and start == 0:
                s[0] = 0.0
            self.current[slot] = self._decide(slot, score, s)

    def mask(self, entry: str, start: int, length: int, kept: Tensor | None = None) -> Tensor:
        """Where ``entry``'s gate is on at positions ``start..start+length``. The log
        records where it steered: not at positions the row keeps unsteered anyway (``kept``,
        the special tokens ``steer_special_tokens=False`` leaves alone)."""
        positions = torch.arange(start, start + length)
        on = self.resolved.entries[entry].mask(self, positions)
        log = self._log[entry]
        del log[start:]
        log += (on if kept is None else on & ~kept).tolist()
        return on

    def log(self) -> dict[str, tuple[bool, ...]]:
        """Each gated entry's gate at every position run so far (prompt, then completion)."""
        return {name: tuple(values) for name, values in self._log.items()}

    def _restart(self) -> None:
        self._was_on = [False] * len(self._was_on)
        for values in self._log.values():
            values.clear()

    def _decide(self, slot: int, score: Score, s: Tensor) -> Tensor:
        if score.off_below is None:
            on = torch.ones(s.shape, dtype=torch.bool)
            if score.above is not None:
                on &= s > score.above
            if score.below is not None:
                on &= s < score.below
            return on
        out, was = [], self._was_on[slot]
        for v in s.tolist():  # a position's state depends on the one before (Python floats)
            was = v >= score.off_below if was else v > score.above
            out.append(was)
        self._was_on[slot] = was
        return torch.tensor(out, dtype=torch.bool)


def _has_window(gate: Gate) -> bool:
    return isinstance(gate, Window) or any(_has_window(p) for p in gate.children())


# -- resolving a request's conditions ---------------------------------------------------------
@dataclass(frozen=True)
class Measured:
    """What the engine resolves a score condition to: the hook it is read at, its score
    over hook values, and the factor its thresholds are read in (``relative``)."""

    hook: str
    fn: ScoreFn
    scale: float = 1.0


class _Compiler:
    """Conditions to gates, each score condition once however many entries share it."""

    def __init__(self, measure, decide, zero_first: bool) -> None:
        self.measure, self.decide, self.zero_first = measure, decide, zero_first
        self.scores: list[Score] = []
        self.fields: list[str] = []  # each score's field, for errors about its hook
        self._done: dict[int, Gate] = {}

    def gate(self, cond: Condition, field: str) -> Gate:
        key = id(cond)
        if key not in self._done:
            self._done[key] = self._compile(cond, field)
        return self._done[key]

    def _compile(self, cond: Condition, field: str) -> Gate:
        if isinstance(cond, Tokens):
            return Window(cond)
        if isinstance(cond, AllOf):
            return Every(tuple(self.gate(c, f"{field}.conditions[{i}]") for i, c in _each(cond)))
        if isinstance(cond, AnyOf):
            return Some(tuple(self.gate(c, f"{field}.conditions[{i}]") for i, c in _each(cond)))
        if isinstance(cond, Not):
            return Negated(self.gate(cond.condition, f"{field}.condition"))
        assert isinstance(cond, When)
        if cond.scope == "prompt":
            return Fixed(bool(self.decide(cond, field)))
        m = self.measure(cond, field)
        scaled = [None if t is None else t * m.scale for t in (cond.above, cond.below)]
        off = None if cond.off_below is None else cond.off_below * m.scale
        self.scores.append(Score(read_hook(m.hook), m.fn, *scaled, off, self.zero_first))
        self.fields.append(field)
        return ScoreGate(len(self.scores) - 1)

    def reads(self, gate: Gate) -> list[int]:
        """The score slots ``gate`` reads."""
        if isinstance(gate, ScoreGate):
            return [gate.slot]
        return [slot for part in gate.children() for slot in self.reads(part)]


def _each(cond: AllOf | AnyOf):
    return enumerate(cond.conditions)


def resolve(
    request_when: Condition | None,
    entries: Mapping[str, tuple[Condition | None, str]],
    measure: Callable[[When, str], Measured],
    decide: Callable[[When, str], bool],
    zero_first: bool,
) -> Resolved | None:
    """The gates of a request: ``entries`` maps each entry name to its own condition and its
    hook. ``measure`` resolves a token-scope score condition, ``decide`` takes a
    prompt-scope one's decision; each raises a ``RequestError`` naming the field. A
    token-scope condition read after an entry's hook point is refused here, before any
    work. ``None`` where nothing is gated."""
    if request_when is None and all(w is None for w, _ in entries.values()):
        return None
    comp = _Compiler(measure, decide, zero_first)
    shared = None if request_when is None else comp.gate(request_when, "when")
    gates: dict[str, Gate] = {}
    for name, (own, hook) in entries.items():
        parts = [comp.gate(own, f"{name}.when")] if own is not None else []
        parts += [shared] if shared is not None else []
        if not parts:
            continue  # ungated: it steers everywhere, as without any condition
        gates[name] = parts[0] if len(parts) == 1 else Every(tuple(parts))
        for slot in comp.reads(gates[name]):
            read = comp.scores[slot].hook
            if point(read) > point(hook):
                raise RequestError(
                    comp.fields[slot],
                    f"is a token-scope condition read at {read}, after {name}'s hook {hook}: "
                    "its decision is not known when that steering runs (read it at or "
                    "before the steering's hook, or use scope='prompt')",
                )
    _check_reads_unsteered(comp, gates, {name: hook for name, (_, hook) in entries.items()})
    return Resolved(tuple(comp.scores), gates)


def _check_reads_unsteered(comp: _Compiler, gates: Mapping[str, Gate], hooks: Mapping[str, str]):
    """Rule 1 of ``docs/conditions.md`` across entries: a token-scope score is what the
    unsteered model computes only if no entry steers at an earlier point. Any entry there,
    gated or not, changes the residual the score reads, so the request is refused, naming
    the condition, the entry it gates and the entry that steers first."""
    for name, gate in gates.items():
        for slot in comp.reads(gate):
            read = comp.scores[slot].hook
            for other, hook in hooks.items():
                if point(hook) < point(read):
                    raise RequestError(
                        comp.fields[slot],
                        f"is a token-scope condition of {name} read at {read}, but {other} "
                        f"steers earlier, at {hook}: the score would read a steered residual, "
                        "not the unsteered model's (move the condition to or before "
                        f"{hook}, or use scope='prompt')",
                    )
