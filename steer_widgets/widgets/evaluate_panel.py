"""The explorer's evaluate panel: does the current steering work over many prompts?

``EvaluatePanel`` is an anywidget: an editable prompt list and strength ladder, a progress
bar, the trade-off chart (SVG from ``Evaluation.svg``) and a grid of prompts x strengths
coloured by hit, each cell's text on hover. Everything it draws is widget state, so a saved
notebook or a static export shows the last evaluation without a kernel. Clicks (evaluate,
stop, a strength) come back as messages handled by ``Evaluating``.
"""

from __future__ import annotations

from collections.abc import Callable

import anywidget
import traitlets

from ..errors import RequestError
from ..evaluation import Evaluation, grid
from .assets import css, esm

STATES = {
    "idle": "not evaluated yet",
    "running": "evaluating",
    "done": "done",
    "stopped": "stopped by you",
    "replaced": "replaced by a newer evaluation",
    "error": "error",
}
CHAT_PREFIX = "chat:"


class EvaluatePanel(anywidget.AnyWidget):
    _esm = traitlets.Unicode(esm("evaluate")).tag(sync=True)
    _css = traitlets.Unicode(css("evaluate")).tag(sync=True)
    state = traitlets.Enum(list(STATES), default_value="idle").tag(sync=True)
    label = traitlets.Unicode(STATES["idle"]).tag(sync=True)
    message = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    done_rows = traitlets.Int(0).tag(sync=True)
    total_rows = traitlets.Int(0).tag(sync=True)
    svg = traitlets.Unicode("").tag(sync=True)
    strengths = traitlets.List(traitlets.Float()).tag(sync=True)
    grid = traitlets.List().tag(sync=True)
    prompts_text = traitlets.Unicode("").tag(sync=True)
    ladder_text = traitlets.Unicode("").tag(sync=True)
    best = traitlets.Float(None, allow_none=True).tag(sync=True)

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.handlers: dict[str, Callable] = {}
        self.on_msg(self._message)

    @traitlets.observe("state")
    def _label(self, change) -> None:
        self.label = STATES[change["new"]]

    def _message(self, _widget, content, _buffers) -> None:
        event = content.get("event") if isinstance(content, dict) else None
        handler = self.handlers.get(event)
        if handler is not None:
            handler(content)

    def show_state(self, state: str, message: str = "", error: str = "") -> None:
        with self.hold_sync():
            self.state, self.message, self.error = state, message, error

    def draw(self, evaluation: Evaluation, current: float | None) -> None:
        """Chart, grid and progress of ``evaluation`` (complete or not)."""
        name = next(iter(evaluation.steerings))
        with self.hold_sync():
            self.strengths = list(evaluation.strengths)
            self.grid = grid(evaluation, name)
            self.svg = evaluation.svg(current=current, steering=name)
            self.done_rows, self.total_rows = len(evaluation.rows), evaluation.total
            self.best = evaluation.best(steering=name) if evaluation.rows else None

    def prompts(self) -> list:
        """The prompt list as typed: one prompt per line, ``chat:`` lines are chat requests."""
        out: list = []
        for line in self.prompts_text.splitlines():
            text = line.strip()
            if not text:
                continue
            if text.lower().startswith(CHAT_PREFIX):
                out.append([{"role": "user", "content": text[len(CHAT_PREFIX) :].strip()}])
            else:
                out.append(text)
        return out

    def ladder(self) -> list[float]:
        try:
            return [float(s) for s in self.ladder_text.replace(",", " ").split()]
        except ValueError:
            raise RequestError("strengths", f"expected numbers, got {self.ladder_text!r}") from None

    def set_inputs(self, prompts: list, strengths) -> None:
        """Show ``prompts`` and ``strengths`` in the editable boxes."""
        lines = [p if isinstance(p, str) else f"{CHAT_PREFIX} {p[-1]['content']}" for p in prompts]
        with self.hold_sync():
            self.prompts_text = "\n".join(lines)
            self.ladder_text = ", ".join(f"{float(m):g}" for m in strengths)
