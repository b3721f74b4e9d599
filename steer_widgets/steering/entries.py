"""The values a request lists: SAE features, custom vectors and the conditions that gate them.

One module because each names the other: a condition measures a feature or a direction
(``When(Feature(...), above=2)``) and an entry carries its own condition
(``Feature(..., when=...)``). What conditions mean, their checks and records are in
``conditions.py``; how a decode applies them is in ``gates.py``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from ..checks import public_methods
from ..errors import RequestError


@public_methods
@dataclass(frozen=True)
class Feature:
    """An SAE feature: ``source`` names the SAE (e.g. ``10-smollm2-res-4k``). ``when``
    steers with it only where that condition holds (``sw.When``)."""

    source: str
    index: int
    strength: float = 40.0
    when: Condition | None = None


@public_methods
@dataclass(frozen=True)
class Vector:
    """A custom steering direction added at ``hook`` (a TransformerLens hook name). ``when``
    steers with it only where that condition holds (``sw.When``)."""

    vector: Tensor | Sequence[float]
    hook: str
    strength: float = 1.0
    when: Condition | None = None


class Condition:
    """Anything that can gate steering: ``When`` values and their ``&``, ``|``, ``~``."""

    def __and__(self, other: Condition) -> Condition:
        return AllOf((self, _condition(other, "&")))

    def __or__(self, other: Condition) -> Condition:
        return AnyOf((self, _condition(other, "|")))

    def __invert__(self) -> Condition:
        return Not(self)

    def parts(self) -> tuple[Condition, ...]:
        return ()

    def leaves(self) -> Iterator[Condition]:
        """The score and token-window conditions this one is made of, in order."""
        if not self.parts():
            yield self
        for part in self.parts():
            yield from part.leaves()

    def to_dict(self) -> dict:
        raise NotImplementedError


def _condition(value, op: str) -> Condition:
    if not isinstance(value, Condition):
        raise RequestError("when", f"{op} combines conditions (sw.When), got {value!r}")
    return value


@public_methods
@dataclass(frozen=True)
class When(Condition):
    """A score condition: ``on`` is the ``Feature`` or ``Vector`` measured (a feature's
    strength, a vector's strength and their own ``when`` play no part)."""

    on: Feature | Vector
    above: float | None = None
    below: float | None = None
    scope: str = "token"
    reduce: str = "max"
    relative: bool = False
    measure: str = "cosine"
    off_below: float | None = None

    @staticmethod
    def tokens(start: int = 0, stop: int | None = None, of: str = "completion") -> Tokens:
        """A window of positions: ``start <= k < stop`` counted as ``of`` says."""
        return Tokens(start, stop, of)

    def to_dict(self) -> dict:
        if isinstance(self.on, Feature):
            d: dict = {"kind": "feature", "source": self.on.source, "index": self.on.index}
        else:
            vector = self.on.vector
            as_list = vector.tolist() if isinstance(vector, torch.Tensor) else list(vector)
            d = {"kind": "vector", "vector": as_list, "hook": self.on.hook}
        for key in ("above", "below", "scope", "reduce", "relative", "measure", "off_below"):
            d[key] = getattr(self, key)
        return d


@public_methods
@dataclass(frozen=True)
class Tokens(Condition):
    """Positions ``start <= k < stop`` (``stop=None``: to the end), ``k`` counted from the
    first completion position, the first prompt position or position 0 (``of``)."""

    start: int = 0
    stop: int | None = None
    of: str = "completion"

    def holds(self, positions: torch.Tensor, prompt_length: int) -> torch.Tensor:
        """Whether the window holds at each absolute position."""
        k = positions - prompt_length if self.of == "completion" else positions
        on = k >= self.start
        if self.stop is not None:
            on &= k < self.stop
        if self.of == "prompt":
            on &= positions < prompt_length
        return on

    def to_dict(self) -> dict:
        return {"kind": "tokens", "start": self.start, "stop": self.stop, "of": self.of}


@dataclass(frozen=True)
class Group(Condition):
    """Several conditions joined: ``AllOf`` (``a & b``) or ``AnyOf`` (``a | b``)."""

    conditions: tuple[Condition, ...]
    kind: ClassVar[str] = ""

    def parts(self) -> tuple[Condition, ...]:
        return self.conditions

    def to_dict(self) -> dict:
        return {"kind": self.kind, "parts": [c.to_dict() for c in self.conditions]}


class AllOf(Group):
    """Holds where every part holds (``a & b``)."""

    kind = "all"


class AnyOf(Group):
    """Holds where any part holds (``a | b``)."""

    kind = "any"


@dataclass(frozen=True)
class Not(Condition):
    """Holds where its condition does not (``~a``)."""

    condition: Condition

    def parts(self) -> tuple[Condition, ...]:
        return (self.condition,)

    def to_dict(self) -> dict:
        return {"kind": "not", "part": self.condition.to_dict()}
