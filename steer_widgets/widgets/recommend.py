"""What a new strength row starts with: the engine's recommendations, where it has them.

Why: a slider that starts at a visible but fluent strength, over a range in the hook's own
units, is what makes a first pick show an effect. A local engine measures typical residual
norms and recommends strengths; one without them (e.g. a remote one) gets the reference
tools' choices. The label tells the user what the picked feature is.
"""

from __future__ import annotations

from ..errors import SteerWidgetsError
from .feature_rows import DEFAULT_STRENGTH


def prompt_multiplier(engine) -> float:
    """The engine's recommendation, where it has one (1: the reference tools' steering)."""
    recommended = getattr(engine, "default_prompt_multiplier", None)
    return recommended() if recommended else 1.0


def typical_norm(engine, hook: str) -> float | None:
    """The hook's typical residual norm, where the engine measures one (slider ranges)."""
    measure = getattr(engine, "typical_norm", None)
    return measure(hook) if measure else None


def start_strength(engine, source: str, info) -> float:
    """Where a new feature's slider starts: the engine's recommended strength (a fraction of
    the hook's typical norm: a visible change that stays fluent), else the reference tools'
    choice, the feature's max activation or 40."""
    recommended = getattr(engine, "default_strength", None)
    if recommended is not None:
        return recommended(source)
    return info.max_act if info and info.max_act else DEFAULT_STRENGTH


def feature_info(engine, source: str, index: int):
    """The feature's entry in its source's index (label, top tokens), or None if unknown."""
    try:
        return engine.feature_index(source)[int(index)]
    except (SteerWidgetsError, IndexError):
        return None


def row_label(engine, source: str, index: int, info) -> str:
    """The feature's readable name and its first top tokens."""
    tokens = ", ".join(repr(t) for t in info.top_tokens[:4]) if info else ""
    return f"{engine.feature_index(source).label(index)} · {tokens}"
