"""The explorer's own argument checks, made before anything changes.

Why here: the explorer's methods refuse a bad value with a named ``RequestError`` (or an
``ArgumentError`` for a name that is no setting) instead of a traceback from deep inside a
widget; these are the checks the request fields' table (``fields``) does not cover.
"""

from __future__ import annotations

import math
from typing import Any

from .. import checks
from ..errors import ArgumentError, RequestError
from .fields import BY_NAME


def check_settings(settings: dict, also: tuple[str, ...] = ()) -> None:
    """Every name is a request field (or one of ``also``); an unknown one names them all."""
    for name in settings:
        if name not in BY_NAME and name not in also:
            known = sorted([*BY_NAME, *also])
            raise ArgumentError(str(name), f"is not a setting of the explorer; known: {known}")


def check_options(prompt, chat, features, live, debounce_s) -> None:
    """The explorer's own arguments (each feature is checked as it is added)."""
    checks.text("prompt", prompt)
    checks.flag("chat", chat)
    checks.flag("live", live)
    checks.number("debounce_s", debounce_s, minimum=0)
    for i, f in enumerate(checks.sequence("features", features)):
        if isinstance(f, (str, bytes)) or not isinstance(f, (tuple, list)) or not 2 <= len(f) <= 3:
            raise RequestError(f"features[{i}]", f"must be (source, index[, strength]), got {f!r}")


def check_strength(value: Any, field: str = "strength") -> None:
    """A strength (or a sweep multiplier) is a finite number; a bool is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(field, f"must be a finite number, got {value!r}")


def check_row(row: Any, rows: int) -> None:
    """``row`` is one of ``rows`` strength rows; with none, the message says so."""
    if not rows:
        raise RequestError("row", f"there is no row {row!r}: no feature picked yet")
    checks.integer("row", row, 0, rows - 1)
