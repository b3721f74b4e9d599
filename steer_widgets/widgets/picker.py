"""Feature picker: choose an SAE source, then find features by text, index or neighbours.

Search runs over the engine's feature index (top output tokens and, for shipped SAEs, top
activating contexts). Each result shows its top tokens and one activating context, with a
button that hands the feature to ``on_pick``.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as widgets

from ..errors import SteerWidgetsError

PickCallback = Callable[[str, int], None]
ErrorCallback = Callable[[str], None]


def describe(info, cosine: float | None = None) -> str:
    """One result line as HTML: index, top tokens, typical max activation, a context."""
    tokens = ", ".join(repr(t) for t in info.top_tokens[:6])
    bits = [f"<b>#{info.index}</b>"]
    if cosine is not None:
        bits.append(f"cos {cosine:.2f}")
    if info.max_act is not None:
        bits.append(f"max {info.max_act:.1f}")
    bits.append(f"<code>{html.escape(tokens)}</code>")
    line = " · ".join(bits)
    if info.example:
        line += f"<br><span style='opacity:0.7'>{html.escape(info.example[:160])}</span>"
    return line


class FeaturePicker:
    """Source dropdown, search box and result list; ``ui`` is the widget to display."""

    def __init__(self, engine, on_pick: PickCallback, on_error: ErrorCallback, limit: int = 8):
        self.engine = engine
        self.on_pick = on_pick
        self.on_error = on_error
        self.limit = limit
        sources = engine.saes.sources()
        self.source = widgets.Dropdown(
            options=sources, value=sources[0] if sources else None, description="SAE"
        )
        self.query = widgets.Text(
            placeholder="search top tokens / contexts, or a feature index",
            continuous_update=False,
            layout=widgets.Layout(width="24em"),
        )
        self.search_button = widgets.Button(description="Search", layout={"width": "6em"})
        self.results = widgets.VBox([])
        self.message = widgets.HTML("")
        self.query.observe(lambda _: self.search(self.query.value), names="value")
        self.search_button.on_click(lambda _: self.search(self.query.value))
        self.source.observe(lambda _: self._clear(), names="value")
        self.ui = widgets.VBox(
            [
                widgets.HBox([self.source, self.query, self.search_button]),
                self.message,
                self.results,
            ]
        )

    def _clear(self) -> None:
        self.results.children = ()
        self.message.value = ""

    def search(self, query: str) -> list:
        """Text or index search over the current source; shows and returns FeatureInfos."""
        source = self.source.value
        if not source or not query.strip():
            self._clear()
            return []
        try:
            infos = self.engine.feature_index(source).search(query, limit=self.limit)
        except SteerWidgetsError as err:
            self.on_error(str(err))
            return []
        self._show(infos, None, f"{len(infos)} result(s) for {query!r}")
        return infos

    def neighbours(self, source: str, index: int) -> list:
        """Features whose decoder rows point the same way as ``index`` (cosine)."""
        try:
            pairs = self.engine.neighbours(source, index, n=self.limit)
            fi = self.engine.feature_index(source)
        except SteerWidgetsError as err:
            self.on_error(str(err))
            return []
        if self.source.value != source:
            self.source.value = source
        infos = [fi[i] for i, _ in pairs]
        self._show(infos, [c for _, c in pairs], f"decoder neighbours of #{index}")
        return infos

    def _show(self, infos, cosines, caption: str) -> None:
        source = self.source.value
        rows = []
        for k, info in enumerate(infos):
            add = widgets.Button(description=f"+ #{info.index}", layout={"width": "6.5em"})
            add.on_click(lambda _, i=info.index: self.on_pick(source, i))
            near = widgets.Button(description="≈", layout={"width": "2.5em"})
            near.on_click(lambda _, i=info.index: self.neighbours(source, i))
            text = widgets.HTML(describe(info, None if cosines is None else cosines[k]))
            rows.append(widgets.HBox([add, near, text]))
        self.message.value = f"<i>{html.escape(caption)}</i>"
        self.results.children = tuple(rows)
