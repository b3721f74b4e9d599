"""The explorer's status line: which state the explorer is really in, and why.

``StatusLine`` is an anywidget with typed traits: ``state`` (one of ``STATES``), a message, the
last error, and cache statistics that the browser keeps behind a details toggle. The state
is set only where it happens (the runner reports generating, done, stopped, replaced), so
what the line says is always the current truth.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets

_HERE = Path(__file__).parent

STATES = {
    "idle": "idle",
    "loading": "loading SAE",
    "finding": "finding features",
    "generating": "generating",
    "done": "done",
    "stopped": "stopped by you",
    "replaced": "replaced by a newer change",
    "error": "error",
}


class StatusLine(anywidget.AnyWidget):
    """One line: a state badge, a message, the error (if any), cache statistics on demand.

    Its stylesheet also lays out the explorer around it (``explorer.css``): anywidget adds
    a widget's ``_css`` to the page, so the responsive rules travel with the widget state.
    """

    _esm = traitlets.Unicode((_HERE / "status.js").read_text()).tag(sync=True)
    _css = traitlets.Unicode(
        (_HERE / "status.css").read_text() + (_HERE / "explorer.css").read_text()
    ).tag(sync=True)
    state = traitlets.Enum(list(STATES), default_value="idle").tag(sync=True)
    label = traitlets.Unicode(STATES["idle"]).tag(sync=True)  # what the badge reads
    message = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    details = traitlets.Unicode("").tag(sync=True)

    @traitlets.observe("state")
    def _label(self, change) -> None:
        self.label = STATES[change["new"]]

    def show(self, state: str, message: str = "", error: str = "") -> None:
        """Replace state, message and error together (one message to the browser)."""
        with self.hold_sync():
            self.state, self.message, self.error = state, message, error

    @property
    def text(self) -> str:
        """The line as plain text, e.g. ``done: 32 tokens in 0.41 s``."""
        head = STATES[self.state]
        text = f"{head}: {self.message}" if self.message else head
        return f"{text} | error: {self.error}" if self.error else text


def cache_details(engine) -> str:
    """SAE store and residual cache statistics, one line each (informative only)."""
    try:
        sae = engine.saes.stats()
        res = engine.residual_cache.stats()
    except Exception:  # stats are informative only; never break the status line
        return ""
    mb = sae.get("resident_bytes", 0) / 2**20
    pick = lambda d, keys: ", ".join(f"{k} {d[k]}" for k in keys if k in d)  # noqa: E731
    return (
        f"SAE cache: {pick(sae, ('hits', 'misses', 'evictions'))}, {mb:.1f} MB resident\n"
        f"residual cache: {pick(res, ('hits', 'misses', 'entries'))}"
    )
