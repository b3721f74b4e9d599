"""Calls checked against their signatures, so a misspelt keyword is a named error.

Python's own ``TypeError`` for ``f(nope=1)`` names the argument only in its message; the
public API promises a ``SteerWidgetsError`` with ``field`` set, which a widget can show and a
caller can catch with everything else this package refuses. ``public`` wraps one function,
``public_methods`` every public method (and ``__init__``) of a class.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import TypeVar

from .errors import ArgumentError

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
