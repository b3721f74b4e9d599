"""Field checks shared by every validator: each raises ``RequestError`` naming the field.

One place decides what a number, an integer or a flag is, so ``True`` is never a number, a
NaN is never a strength, and ``None`` in any field is a named error, not a ``TypeError``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

from .errors import RequestError

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


def number(name: str, value, minimum: float | None = None) -> float:
    """A finite real number (not a bool), at least ``minimum`` if given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RequestError(name, f"must be a finite number, got {value!r}")
    if not math.isfinite(value):
        raise RequestError(name, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise RequestError(name, f"must be a finite number >= {minimum:g}, got {value!r}")
    return float(value)


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


def path(name: str, value) -> Path:
    """A file path (str or ``os.PathLike``), not a number or a list that happens to print."""
    text = str(value) if isinstance(value, (str, PathLike)) else ""
    try:
        if text.strip() and b"\x00" not in os.fsencode(text):  # what open() can take
            return Path(value)
    except UnicodeEncodeError:
        pass
    raise RequestError(name, f"must be a file path, got {value!r}")


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
