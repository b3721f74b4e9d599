"""The picked steering directions: one strength slider row per feature or concept vector.

A row reads ``#index strength [slider] ≈ ✕`` with the feature's label beside it. Strengths
set from Python that lie outside the slider's range widen it (never clamped).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as widgets

from ..steering.requests import Feature, Vector
from ..steering.vectors import added
from .fields import widen

STRENGTH_RANGE = 300.0  # the reference tools' slider range, where no typical norm is known
DEFAULT_STRENGTH = 40.0  # for features without a known max activation, on such engines
NORMS_PER_RANGE = 2.0  # a slider spans +-2 typical residual norms of its hook


@dataclass
class Row:
    """One picked direction: a feature (``source``, ``index``) or a concept ``vector``."""

    source: str
    index: int
    slider: widgets.FloatSlider
    box: widgets.HBox
    vector: Vector | None = None  # set for concept rows
    name: str = ""
    # the other layers of a loaded multi-layer vector: at the slider's strength, as ``vector``
    extra: tuple[Vector, ...] = ()


def _slider(strength: float, typical_norm: float | None = None) -> widgets.FloatSlider:
    """A strength slider over +-2 typical residual norms of the hook (the unit strengths are
    read in), or the reference tools' +-300 where the engine knows no typical norm."""
    span = STRENGTH_RANGE if not typical_norm else NORMS_PER_RANGE * typical_norm
    limit = max(span, abs(float(strength)))
    step = 1.0 if limit >= 300 else float(f"{limit / 300:.1g}")
    slider = widgets.FloatSlider(
        value=float(strength),
        min=-limit,
        max=limit,
        step=step,
        description="strength",
        style={"description_width": "5em"},
        layout={"flex": "1 1 20em", "min_width": "20em", "width": "auto"},
    )
    slider.add_class("sw-strength")
    return slider


def _button(text: str, tip: str) -> widgets.Button:
    return widgets.Button(
        description=text, tooltip=tip, layout={"width": "auto", "min_width": "2.5em"}
    )


class FeatureRows:
    """The rows, their container ``ui``, and callbacks for change / neighbours / removal."""

    def __init__(
        self,
        on_change: Callable,
        on_near: Callable[[str, int], None],
        on_card: Callable[[str, int], None],
    ) -> None:
        self.rows: list[Row] = []
        self.on_change = on_change
        self.on_near = on_near
        self.on_card = on_card
        self.empty = widgets.HTML(
            "<span class='sw-hint'>no feature picked yet: search above</span>"
        )
        self.ui = widgets.VBox([self.empty])

    def add(
        self, source: str, index: int, strength: float, label: str, norm: float | None = None
    ) -> int:
        slider = _slider(strength, norm)
        name = widgets.HTML(f"<b>#{index}</b>", layout={"min_width": "3.5em"})
        near = _button("≈", "decoder neighbours")
        card = _button("card", "what this feature is: tokens, contexts, neighbours")
        remove = _button("✕", "remove this feature")
        text = widgets.HTML(
            f"<code>{html.escape(source)}</code> {html.escape(label)}",
            layout={"flex": "1 1 12em", "min_width": "0"},
        )
        box = widgets.HBox(
            [name, slider, near, card, remove, text], layout={"flex_flow": "row wrap"}
        )
        box.add_class("sw-wrap")
        row = Row(source, int(index), slider, box)
        near.on_click(lambda _: self.on_near(row.source, row.index))
        card.on_click(lambda _: self.on_card(row.source, row.index))
        return self._append(row, remove)

    def add_vector(self, name: str, vector: Vector, norm: float | None = None) -> int:
        slider = _slider(vector.strength, norm)
        remove = _button("✕", "remove this concept")
        text = widgets.HTML(
            f"concept <b>{html.escape(name)}</b> <code>{html.escape(vector.hook)}</code>",
            layout={"flex": "1 1 12em", "min_width": "0"},
        )
        box = widgets.HBox([slider, remove, text], layout={"flex_flow": "row wrap"})
        box.add_class("sw-wrap")
        return self._append(Row("", -1, slider, box, vector, name), remove)

    def add_vectors(self, name: str, vectors: list[Vector], norm: float | None = None) -> int:
        """One row for a loaded vector, however many layers it has: one slider moves them
        all. Equal strengths start the slider there; unequal ones are folded into the
        vectors and the slider starts at 1, so each layer adds what the file says."""
        if len(vectors) == 1:
            return self.add_vector(name, vectors[0], norm)
        strengths = {float(v.strength) for v in vectors}
        equal = len(strengths) == 1
        start = strengths.pop() if equal else 1.0
        base = [Vector(v.vector if equal else added(v), v.hook) for v in vectors]
        slider = _slider(start, norm)
        remove = _button("✕", "remove these vectors")
        hooks = f"{vectors[0].hook} and {len(vectors) - 1} more layers"
        text = widgets.HTML(
            f"vectors <b>{html.escape(name)}</b> <code>{html.escape(hooks)}</code>",
            layout={"flex": "1 1 12em", "min_width": "0"},
        )
        box = widgets.HBox([slider, remove, text], layout={"flex_flow": "row wrap"})
        box.add_class("sw-wrap")
        first = Vector(base[0].vector, base[0].hook, start)
        return self._append(Row("", -1, slider, box, first, name, tuple(base[1:])), remove)

    def _append(self, row: Row, remove: widgets.Button) -> int:
        remove.on_click(lambda _: self.remove(self.rows.index(row)))
        row.slider.observe(self.on_change, names="value")
        self.rows.append(row)
        self._redraw()
        self.on_change()
        return len(self.rows) - 1

    def remove(self, i: int) -> None:
        self.rows.pop(i)
        self._redraw()
        self.on_change()

    def set_strength(self, i: int, value: float) -> None:
        slider = self.rows[i].slider
        widen(slider, float(value))
        slider.value = float(value)

    def features(self) -> list[Feature]:
        return [
            Feature(r.source, r.index, float(r.slider.value)) for r in self.rows if not r.vector
        ]

    def vectors(self) -> list[Vector]:
        return [
            Vector(v.vector, v.hook, float(r.slider.value))
            for r in self.rows
            if r.vector is not None
            for v in (r.vector, *r.extra)
        ]

    def _redraw(self) -> None:
        self.ui.children = tuple(r.box for r in self.rows) or (self.empty,)
