"""The nearest known names to one nobody knows, for error messages ("did you mean ...?").

Model loading and SAE releases both suggest names; neither may import the other for it, as
releases already asks the model module whether two names mean one model.
"""

from __future__ import annotations

import difflib


def suggest(name: str, choices: list[str], n: int = 3) -> str:
    """``"; did you mean 'a', 'b'?"`` for the nearest names (difflib), or ``""``."""
    near = difflib.get_close_matches(name, choices, n=n, cutoff=0.6)
    if not near:
        lowered = name.lower()
        near = [c for c in choices if lowered in c.lower()][:n]
    return f"; did you mean {', '.join(repr(c) for c in near)}?" if near else ""
