"""Input checks shared by every public entry point, each a named error.

Field checks: one place decides what a number, an integer or a flag is, so ``True`` is never
a number, a NaN is never a strength, and ``None`` in any field is a named ``RequestError``,
not a ``TypeError``.

Calls checked against their signatures: Python's own ``TypeError`` for ``f(nope=1)`` names
the argument only in its message; the public API promises a ``SteerWidgetsError`` with
``field`` set, which a widget can show and a caller can catch with everything else this
package refuses. ``public`` wraps one function, ``public_methods`` every public method (and
``__init__``) of a class.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from .errors import ArgumentError, RequestError, SteerWidgetsError

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


Refusal = Callable[[str, str], SteerWidgetsError]  # (field or source, problem) -> the error


def number(name: str, value, minimum: float | None = None, error: Refusal = RequestError) -> float:
    """A finite real number (not a bool), at least ``minimum`` if given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(name, f"must be a finite number, got {value!r}")
    if not math.isfinite(value):
        raise error(name, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise error(name, f"must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


def floats(name: str, value, error: Refusal = RequestError) -> torch.Tensor:
    """``value`` (a list, array or tensor) as a float32 CPU copy of finite numbers: what a
    steering vector must be, whether it comes in a request or from a file (``error`` is that
    caller's error family)."""
    try:
        t = torch.as_tensor(value, dtype=torch.float32).detach().cpu().clone()
    except (TypeError, ValueError, RuntimeError) as err:
        raise error(name, f"is not a list of numbers: {err}") from None
    if not torch.isfinite(t).all():
        raise error(name, "contains NaN or infinite values")
    return t


def integer(name: str, value, lo: int | None = None, hi: int | None = None) -> int:
    """An integer (not a bool) within ``lo..hi`` (inclusive) where given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise RequestError(name, f"must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        span = f"{'' if lo is None else lo}..{'' if hi is None else hi}"
        raise RequestError(name, f"must be an integer in {span}, got {value!r}")
    return int(value)


def flag(name: str, value) -> bool:
    """True or False, nothing else (``None`` or ``1`` would hide a mistake)."""
    if not isinstance(value, bool):
        raise RequestError(name, f"must be True or False, got {value!r}")
    return value


def text(name: str, value) -> str:
    if not isinstance(value, str):
        raise RequestError(name, f"must be a string, got {value!r}")
    return value


def token_ids(name: str, value, vocab_size: int) -> list[int]:
    """Token ids of the model's vocabulary: a list or tuple of integers in 0..vocab-1."""
    ids = sequence(name, value)
    for i, token in enumerate(ids):
        integer(f"{name}[{i}]", token, 0, vocab_size - 1)
    return [int(t) for t in ids]


def sequence(name: str, value) -> Sequence:
    """A list or tuple (a string is not a sequence of items here)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise RequestError(name, f"must be a list or tuple, got {value!r}")
    return value


F = TypeVar("F", bound=Callable)
C = TypeVar("C", bound=type)


def check_call(signature: inspect.Signature, where: str, args: tuple, kwargs: dict) -> None:
    """Raise ``ArgumentError`` naming the first argument that does not fit ``signature``."""
    params = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if not takes_any:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL)
        keywords = {n for n, p in params.items() if p.kind not in positional}
        for name in kwargs:
            if name not in keywords:
                raise ArgumentError(str(name), f"is not an argument of {where}")
    try:
        signature.bind(*args, **kwargs)
    except TypeError as err:
        name = _named(str(err), where)
        raise ArgumentError(name, str(err) if name == where else f"{where}: {err}") from None


def _named(message: str, where: str) -> str:
    """The argument a binding error is about ('n' in "missing ... argument: 'n'")."""
    quoted = message.split("'")
    return quoted[1] if len(quoted) >= 3 else where


def public(fn: F) -> F:
    """``fn`` with its arguments checked against its signature before it runs."""
    signature = inspect.signature(fn)
    where = fn.__qualname__.replace(".__init__", "")

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        check_call(signature, where, args, kwargs)
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


def public_methods(cls: C) -> C:
    """Wrap ``cls``'s own public methods, class methods and ``__init__`` with ``public``."""
    for name, value in list(vars(cls).items()):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(value, classmethod):
            setattr(cls, name, classmethod(public(value.__func__)))
        elif isinstance(value, staticmethod):
            setattr(cls, name, staticmethod(public(value.__func__)))
        elif inspect.isfunction(value):
            setattr(cls, name, public(value))
    return cls
