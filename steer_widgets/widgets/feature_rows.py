"""The picked steering directions: one strength slider row per feature or concept vector.

A row reads ``#index strength [slider] ≈ card ✕ when`` with the feature's label beside it.
Strengths set from Python that lie outside the slider's range widen it (never clamped).
``when`` opens the row's own "steer when" controls (a ``ConditionRow`` the explorer makes):
that row then steers only where its condition holds, beside the request's own.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, replace

import ipywidgets as widgets

from ..steering.entries import Condition
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
    ui: widgets.VBox | None = None  # the row, with its condition's controls under it when open
    condition: object | None = None  # its own ConditionRow, made on first use
    when_button: widgets.Button | None = None

    def when(self) -> Condition | None:
        """The row's own condition (``None``: it steers wherever the request does)."""
        return None if self.condition is None else self.condition.condition()


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
        make_condition: Callable[[], object] | None = None,
    ) -> None:
        self.rows: list[Row] = []
        self.make_condition = make_condition
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
        row.ui = widgets.VBox([row.box], layout={"width": "100%"})
        if self.make_condition is not None:
            row.when_button = _button("when", "steer with this row only where a condition holds")
            row.when_button.add_class("sw-when")
            row.when_button.on_click(lambda _: self.toggle_condition(self.rows.index(row)))
            *head, text = row.box.children
            row.box.children = (*head, row.when_button, text)
        row.slider.observe(self.on_change, names="value")
        self.rows.append(row)
        self._redraw()
        self.on_change()
        return len(self.rows) - 1

    def remove(self, i: int) -> None:
        row = self.rows.pop(i)
        if row.condition is not None:
            row.condition.close()  # its concept vector, if one is being made, is dropped
        self._redraw()
        self.on_change()

    def set_strength(self, i: int, value: float) -> None:
        slider = self.rows[i].slider
        widen(slider, float(value))
        slider.value = float(value)

    def condition_of(self, i: int):
        """Row ``i``'s own ``ConditionRow``, made (closed, "always") on first use."""
        row = self.rows[i]
        if row.condition is None:
            row.condition = self.make_condition()
            row.condition.kind.observe(lambda _: self._mark(row), "value")
        return row.condition

    def toggle_condition(self, i: int, show: bool | None = None) -> None:
        """Open or close row ``i``'s condition controls (closing keeps the condition)."""
        row, cond = self.rows[i], self.condition_of(i)
        show = len(row.ui.children) == 1 if show is None else show
        row.ui.children = (row.box, cond.ui) if show else (row.box,)

    def conditions(self) -> list:
        """Every row's own ``ConditionRow`` made so far."""
        return [r.condition for r in self.rows if r.condition is not None]

    def _mark(self, row: Row) -> None:
        """The ``when`` button says whether its row is gated."""
        gated = row.condition is not None and row.condition.kind.value != "always"
        if row.when_button is not None:
            row.when_button.description = "when ●" if gated else "when"

    def features(self) -> list[Feature]:
        return [
            Feature(r.source, r.index, float(r.slider.value), when=r.when())
            for r in self.rows
            if not r.vector
        ]

    def vectors(self) -> list[Vector]:
        out = []
        for r in self.rows:
            if r.vector is None:
                continue
            when = r.when()
            out += [replace(v, strength=float(r.slider.value), when=when)
                    for v in (r.vector, *r.extra)]  # fmt: skip
        return out

    def _redraw(self) -> None:
        self.ui.children = tuple(r.ui for r in self.rows) or (self.empty,)
