"""The explorer's settings controls, built from one table of request fields.

Each row of ``FIELDS`` names a ``SteerRequest`` field, the label a user reads, the kind of
control and its initial range. ``Controls`` builds the widgets from that table and is the
only place a value set from Python reaches them: a valid value outside a slider's range
widens the range (a slider would otherwise clamp it silently); an invalid one is refused
with a ``RequestError`` naming the field, and the control keeps its value.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import ipywidgets as widgets

from ..errors import RequestError
from ..steering.requests import METHODS, SteerRequest

# Shorter than the engine's 64 so a live explorer answers a slider move quickly.
EXPLORER_TOKENS = 32
LABEL_WIDTH = "9em"  # one width for every description, so rows line up
# ipywidgets 8 renamed ``description_tooltip`` to ``tooltip`` (7.7, on Colab, has only the old)
TOOLTIP = "tooltip" if "tooltip" in widgets.DOMWidget.class_trait_names() else "description_tooltip"


@dataclass(frozen=True)
class Field:
    """One request field as a control: ``kind`` is float, int, choice or bool."""

    name: str
    label: str
    kind: str
    group: str  # "steering" or "generation": where the control sits
    lo: float | None = None  # None: no lower bound (the value may be any number)
    hi: float | None = None
    step: float = 1.0
    hint: str = ""
    options: tuple[str, ...] = ()
    min_value: float | None = None  # smallest valid value (below it a set is refused)


FIELDS: tuple[Field, ...] = (
    Field(
        "strength_multiplier", "multiplier", "float", "steering", 0.0, 10.0, 0.1,
        "scales every feature's strength (c = multiplier x strength)",
    ),
    Field(
        "steer_method", "method", "choice", "steering", options=METHODS,
        hint="how the direction is applied at its hook",
    ),
    Field(
        "prompt_multiplier", "prompt ×", "float", "steering", 0.0, 4.0, 0.1,
        "scales the push at the prompt's positions (generated tokens get 1x): a harder push "
        "on the prompt sets the topic at less cost to fluency",
    ),
    Field(
        "steer_special_tokens", "steer special tokens", "bool", "steering",
        hint="also steer BOS and chat scaffolding in the prompt",
    ),
    Field(
        "n_completion_tokens", "tokens", "int", "generation", None, None, 1,
        "how many tokens to generate", min_value=1,
    ),
    Field(
        "temperature", "temperature", "float", "generation", 0.0, 2.0, 0.05,
        "0 = greedy", min_value=0.0,
    ),
    Field(
        "freq_penalty", "frequency penalty", "float", "generation", 0.0, 2.0, 0.05,
        "lowers the chance of tokens already generated", min_value=0.0,
    ),
    Field("seed", "seed", "int", "generation", None, None, 1, "sampling seed"),
)  # fmt: skip
BY_NAME = {f.name: f for f in FIELDS}


def defaults() -> dict[str, Any]:
    """Initial control values: the request's own defaults (one owner), tokens shorter."""
    out = {f.name: f.default for f in fields(SteerRequest) if f.name in BY_NAME}
    out["n_completion_tokens"] = EXPLORER_TOKENS
    return out


def check(field: Field, value: Any) -> Any:
    """``value`` as the control's type, or ``RequestError`` if the request could not hold it."""
    if field.kind == "choice":
        if not isinstance(value, str) or value not in field.options:
            raise RequestError(field.name, f"{value!r} is not one of {field.options}")
        return value
    if field.kind == "bool":
        if not isinstance(value, bool):
            raise RequestError(field.name, f"must be True or False, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(field.name, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise RequestError(field.name, f"must be finite, got {value!r}")
    if field.kind == "int":
        if int(value) != value:
            raise RequestError(field.name, f"must be a whole number, got {value!r}")
        value = int(value)
    if field.min_value is not None and value < field.min_value:
        raise RequestError(field.name, f"must be >= {field.min_value:g}, got {value!r}")
    return value


def _control(field: Field, value: Any) -> widgets.Widget:
    style = {"description_width": LABEL_WIDTH}
    common = {"description": field.label, TOOLTIP: field.hint, "style": style}
    if field.kind == "choice":
        return widgets.Dropdown(options=list(field.options), value=value, **common)
    if field.kind == "bool":
        return widgets.Checkbox(value=value, indent=False, description=field.label)
    if field.lo is None:  # unbounded: a text box, which never clamps
        cls = widgets.IntText if field.kind == "int" else widgets.FloatText
        return cls(value=value, **common)
    cls = widgets.IntSlider if field.kind == "int" else widgets.FloatSlider
    lo, hi = min(field.lo, value), max(field.hi, value)
    return cls(value=value, min=lo, max=hi, step=field.step, **common)


def widen(slider: widgets.Widget, value: float) -> None:
    """Stretch a slider's range to include ``value`` before setting it (no clamping)."""
    if value > slider.max:
        slider.max = value
    if value < slider.min:
        slider.min = value


class Controls:
    """The settings widgets of ``FIELDS``; ``values()`` is what the request gets."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.widgets: dict[str, widgets.Widget] = {}
        for f in FIELDS:
            w = _control(f, check(f, values[f.name]))
            w.add_class("sw-control")
            w.add_class(f"sw-{f.kind}")
            self.widgets[f.name] = w

    def group(self, name: str) -> list[widgets.Widget]:
        return [self.widgets[f.name] for f in FIELDS if f.group == name]

    def values(self) -> dict[str, Any]:
        return {name: w.value for name, w in self.widgets.items()}

    def set(self, name: str, value: Any) -> None:
        """Honour a valid ``value`` (widening a slider) or raise ``RequestError``."""
        field = BY_NAME[name]
        value = check(field, value)
        w = self.widgets[name]
        if isinstance(w, (widgets.IntSlider, widgets.FloatSlider)):
            widen(w, value)
        w.value = value

    def observe(self, callback: Callable) -> None:
        for w in self.widgets.values():
            w.observe(callback, names="value")
