"""Activation heatmap: tokens colored by one feature's activation, as an anywidget.

The coloring runs in the browser from plain traitlets (tokens, values, per-token top
features), so a notebook saved with widget state shows the heatmap without a kernel.
"""

from __future__ import annotations

import anywidget
import traitlets

from . import assets

Bounds = tuple[float | None, float | None]  # a condition's (above, below), in its units


class Heatmap(anywidget.AnyWidget):
    """Rows of tokens (prompt, DEFAULT, STEERED, ...) colored by one feature.

    ``rows``: ``[{label, tokens, values, special, top}]`` where ``top[i]`` lists the token's
    strongest features as ``[index, value]`` pairs. ``selected`` is ``[row, position]`` of the
    clicked token (``[-1, -1]`` for none). Hover shows the same information in the widget.

    Beside the rows, "what changed": ``changed`` lists the features the steering moved most
    (``[{source, index, label, default, steered, change}]``, see
    ``Engine.steering_features``); clicking one sets ``picked`` (``{source, index}``) and
    the heatmap then shows that feature.
    """

    _esm = traitlets.Unicode(assets.esm("heatmap")).tag(sync=True)
    _css = traitlets.Unicode(assets.css("heatmap")).tag(sync=True)
    title = traitlets.Unicode("").tag(sync=True)
    rows = traitlets.List(traitlets.Dict()).tag(sync=True)
    max_value = traitlets.Float(0.0).tag(sync=True)
    selected = traitlets.List(traitlets.Int(), [-1, -1], minlen=2, maxlen=2).tag(sync=True)
    stale = traitlets.Unicode("").tag(sync=True)  # why the rows no longer match the panes
    changed_title = traitlets.Unicode("").tag(sync=True)
    changed = traitlets.List(traitlets.Dict()).tag(sync=True)
    picked = traitlets.Dict({}).tag(sync=True)
    # a condition's bounds [above, below] (either None): tokens whose value is > above and
    # < below are outlined (where its token gate would be on), and the colour scale carries
    # a line at each bound ([None, None]: no condition shown)
    bounds = traitlets.List([None, None], minlen=2, maxlen=2).tag(sync=True)

    def pick(self, source: str, index: int) -> None:
        """Click a "what changed" row: the heatmap shows that feature."""
        self.picked = {"source": source, "index": int(index)}

    def show(self, title: str, rows: list[dict], bounds: Bounds | None = None) -> None:
        """Replace the whole heatmap at once (one message to the browser)."""
        peak = max((v for r in rows for v in r["values"]), default=0.0)
        with self.hold_sync():
            self.title = title
            self.rows = rows
            self.max_value = float(peak)
            self.bounds = list(bounds or (None, None))
            self.stale = ""
            row, pos = self.selected
            if not 0 <= row < len(rows) or pos >= len(rows[row]["tokens"]):
                self.selected = [-1, -1]

    def token_info(self, row: int, position: int) -> dict:
        """What hovering/clicking a token shows: token, value and its top features."""
        r = self.rows[row]
        top = r.get("top") or []
        return {
            "label": r["label"],
            "token": r["tokens"][position],
            "value": r["values"][position],
            "top": [tuple(p) for p in top[position]] if position < len(top) else [],
        }

    @property
    def selected_info(self) -> dict | None:
        """``token_info`` of the clicked token, or None."""
        row, pos = self.selected
        return None if row < 0 else self.token_info(row, pos)


def changed_rows(changed) -> list[dict]:
    """``ChangedFeatures`` as the JSON the side list shows (rounded: small saved state)."""
    return [
        {"source": changed.source, "index": f.index, "label": f.label,
         "default": round(f.default, 3), "steered": round(f.steered, 3),
         "change": round(f.change, 3)}
        for f in changed.features
    ]  # fmt: skip


def heat_row(label: str, tokens, values, special, top=None) -> dict:
    """A JSON-able heatmap row; values rounded to keep the saved state small."""
    return {
        "label": label,
        "tokens": list(tokens),
        "values": [round(float(v), 4) for v in values],
        "special": [bool(s) for s in special],
        "top": [
            [[int(i), round(float(v), 3)] for i, v in zip(ii, vv, strict=True)] for ii, vv in top
        ]
        if top is not None
        else [],
    }
