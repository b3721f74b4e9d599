"""The explorer's "steer when" row: gate the whole steering on a feature or a concept.

Three choices: always (no condition), while a feature is active (its activation above the
threshold, the slider spanning the feature's top activation), or while the text is about a
concept (the cosine of the residual with the concept's vector above the threshold). Either
decides at each token or once from the prompt. ``Explorer.set(when=...)`` takes any
condition from Python; one the row cannot show is listed as "set from Python" until the row
is changed. Concept vectors are made when a run first needs them, on the run's thread.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets

from ..errors import RequestError
from ..steering.entries import Condition, Feature, When
from .fields import LABEL_WIDTH, TOOLTIP

KINDS = [
    ("always", "always"),
    ("while a feature is active", "feature"),
    ("while the text is about a concept", "concept"),
]
CUSTOM = ("as set from Python", "custom")
COSINE_RANGE = 0.3  # a concept's cosine with a residual rarely leaves ±0.3


class ConditionRow:
    """The row's widgets (``ui``) and the condition they describe (``condition()``)."""

    def __init__(
        self,
        on_change: Callable[[], None],
        feature_max: Callable[[str, int], float | None],
        concept_vector: Callable[[str], object],
    ) -> None:
        self._feature_max, self._concept_vector = feature_max, concept_vector
        self._custom: Condition | None = None
        self._vectors: dict[str, object] = {}  # concept name -> its vector, made once
        style = {"description_width": LABEL_WIDTH}
        self.kind = widgets.Dropdown(
            options=KINDS, value="always", description="steer", style=style,
            layout={"width": "auto", "min_width": "22em"},
        )  # fmt: skip
        self.what = widgets.Text(
            placeholder="10-smollm2-res-4k #123, or a concept",
            continuous_update=False,
            **{TOOLTIP: "a feature as 'source #index', or a concept's name"},
            layout={"flex": "0 1 18em", "min_width": "14em", "width": "auto"},
        )
        self.threshold = widgets.FloatSlider(
            value=0.0, min=0.0, max=10.0, step=0.01, description="above",
            continuous_update=False, style={"description_width": "3.5em"},
            layout={"flex": "1 1 18em", "min_width": "18em", "width": "auto"},
        )  # fmt: skip
        self.scope = widgets.ToggleButtons(
            options=[("each token", "token"), ("the prompt", "prompt")], value="token",
            tooltips=["decide at every position as the text is written",
                      "decide once from the prompt"],
            style={"button_width": "7em"},
        )  # fmt: skip
        self.summary = widgets.HTML("")
        self.ui = widgets.HBox(
            [self.kind, self.what, self.threshold, self.scope, self.summary],
            layout={"flex_flow": "row wrap", "width": "100%"},
        )
        self.ui.add_class("sw-wrap")
        self.ui.add_class("sw-condition")
        self.kind.observe(self._kind_changed, "value")
        self.what.observe(self._what_changed, "value")
        for w in (self.threshold, self.scope):
            w.observe(lambda _change: on_change(), "value")
        self._on_change = on_change
        self._show_parts()

    def condition(self) -> Condition | None:
        """The condition the row describes (``None``: always); a concept's vector is made
        here the first time. A feature the row cannot read is a ``RequestError``."""
        kind = self.kind.value
        if kind == "custom":
            return self._custom
        if kind == "always" or not self.what.value.strip():  # nothing named yet: ungated
            return None
        scope, above = self.scope.value, float(self.threshold.value)
        if kind == "feature":
            source, index = parse_feature(self.what.value)
            return When(Feature(source, index), above=above, scope=scope)
        name = self.what.value.strip()
        if name not in self._vectors:
            self._vectors[name] = self._concept_vector(name)
        return When(self._vectors[name], above=above, scope=scope, reduce="mean")

    def show_custom(self, cond: Condition | None) -> None:
        """A condition set from Python: listed, not editable, until the row changes."""
        self._custom = None  # so the value changes below do not drop it again
        if cond is None:
            self.kind.options, self.kind.value = KINDS, "always"
        else:
            self.kind.options = [*KINDS, CUSTOM]
            self._custom = cond
            self.kind.value = "custom"
            self.summary.value = f"<span class='sw-condition-custom'>{describe(cond)}</span>"
        self._show_parts()

    def _kind_changed(self, change) -> None:
        if change["new"] != "custom" and self._custom is not None:
            self._custom = None
            self.kind.options = KINDS  # the Python condition is replaced
        if change["new"] == "concept":
            self.threshold.min, self.threshold.max = -COSINE_RANGE, COSINE_RANGE
            self.threshold.value = 0.05
        elif change["new"] == "feature":
            self._fit_slider()
        self._show_parts()
        self._on_change()

    def _what_changed(self, _change) -> None:
        if self.kind.value == "feature":
            self._fit_slider()
        self._on_change()

    def _fit_slider(self) -> None:
        """Span 0 to the feature's top activation (10 where the index has none)."""
        try:
            top = self._feature_max(*parse_feature(self.what.value)) or 10.0
        except RequestError:
            top = 10.0
        self.threshold.min, self.threshold.max = 0.0, max(float(top), 0.01)
        self.threshold.step = self.threshold.max / 200
        self.threshold.value = min(max(self.threshold.value, 0.0), self.threshold.max)

    def _show_parts(self) -> None:
        kind = self.kind.value
        for w in (self.what, self.threshold, self.scope):
            w.layout.display = "" if kind in ("feature", "concept") else "none"
        self.summary.layout.display = "" if kind == "custom" else "none"


def parse_feature(text: str) -> tuple[str, int]:
    """``"source #index"`` (or ``"source 12"``) as ``(source, index)``."""
    parts = text.replace("#", " ").split()
    if len(parts) != 2 or not parts[1].isdigit():
        raise RequestError("when", f"name a feature as 'source #index', got {text!r}")
    return parts[0], int(parts[1])


def describe(cond: Condition) -> str:
    """A condition in one short line, for the row and the panes' legend."""
    d = cond.to_dict()
    kind = d["kind"]
    if kind in ("all", "any"):
        joiner = " and " if kind == "all" else " or "
        return "(" + joiner.join(describe(c) for c in cond.parts()) + ")"
    if kind == "not":
        return "not " + describe(cond.parts()[0])
    if kind == "tokens":
        return f"{d['of']} tokens {d['start']}..{'' if d['stop'] is None else d['stop']}"
    what = f"{d['source']} #{d['index']}" if kind == "feature" else f"a direction at {d['hook']}"
    bounds = [f"> {d['above']:g}" if d["above"] is not None else "",
              f"< {d['below']:g}" if d["below"] is not None else ""]  # fmt: skip
    return f"{what} {' '.join(b for b in bounds if b)} ({d['scope']})"
