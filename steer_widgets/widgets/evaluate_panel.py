"""The explorer's evaluate panel: does the current steering work over many prompts?

``EvaluatePanel`` is an anywidget: an editable prompt list and strength ladder, a progress
bar, the trade-off chart (SVG from ``Evaluation.svg``) and a grid of prompts x strengths
coloured by hit, each cell's text on hover. Everything it draws is widget state, so a saved
notebook or a static export shows the last evaluation without a kernel. Clicks (evaluate,
stop, a strength) come back as messages handled by ``Evaluating``.

The boxes are text, one prompt per line, and text cannot hold every input: a multi-line
prompt, a chat of several messages or a float with many digits. So the panel keeps the input
given from Python as given and the boxes only show it; a box is read back once it is edited.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import anywidget
import traitlets

from ..analysis.evaluation import Evaluation, grid
from ..errors import RequestError
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
LINE_BREAK = "\u23ce"  # ⏎: a prompt's line break, in the one-prompt-per-line box


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
        # the input as given and the box texts it was shown as (edited box: text differs)
        self._prompts: list = []
        self._strengths: list = []
        self._prompts_shown = self._strengths_shown = ""
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
        """The prompts to evaluate: as last given while the box shows them. Once edited, the
        box's lines (``chat:`` lines are chat requests), but a line still as it was shown is
        its given prompt, so a multi-line prompt or a whole chat survives editing another."""
        if self.prompts_text == self._prompts_shown:
            return list(self._prompts)
        given = {prompt_line(p).strip(): p for p in self._prompts}
        lines = (line.strip() for line in self.prompts_text.splitlines())
        return [given[t] if t in given else _typed_prompt(t) for t in lines if t]

    def ladder(self) -> list:
        """The strengths to evaluate: as last given while the box shows them (exact floats),
        once edited the box's numbers."""
        if self.ladder_text == self._strengths_shown:
            return list(self._strengths)
        try:
            return [float(s) for s in self.ladder_text.replace(",", " ").split()]
        except ValueError:
            raise RequestError("strengths", f"expected numbers, got {self.ladder_text!r}") from None

    def set_inputs(self, prompts: Sequence, strengths: Sequence) -> None:
        """Keep ``prompts`` and ``strengths`` as given (checked ones: the evaluation gets
        exactly these) and show them in the boxes as readable text."""
        self._prompts, self._strengths = list(prompts), list(strengths)
        self._prompts_shown = "\n".join(prompt_line(p) for p in self._prompts)
        self._strengths_shown = ", ".join(strength_text(m) for m in self._strengths)
        with self.hold_sync():
            self.prompts_text, self.ladder_text = self._prompts_shown, self._strengths_shown


def prompt_line(prompt) -> str:
    """A checked prompt as one line of the box: line breaks as ⏎, a chat as ``chat:`` and
    its messages (a lone user message without its role, as one is typed)."""
    if isinstance(prompt, str):
        return _one_line(prompt)
    if len(prompt) == 1 and prompt[0]["role"] == "user":
        return f"{CHAT_PREFIX} {_one_line(prompt[0]['content'])}"
    said = " | ".join(f"{m['role']}: {_one_line(m['content'])}" for m in prompt)
    return f"{CHAT_PREFIX} {said}"


def strength_text(strength: float) -> str:
    """A strength short where that is exact (1, 0.5), else with every digit it needs."""
    short = f"{float(strength):g}"
    return short if float(short) == float(strength) else repr(float(strength))


def _one_line(text: str) -> str:
    return LINE_BREAK.join(text.splitlines())


def _typed_prompt(text: str):
    """A line typed in the box: a plain prompt, or after ``chat:`` a one-message chat."""
    if text.lower().startswith(CHAT_PREFIX):
        return [{"role": "user", "content": text[len(CHAT_PREFIX) :].strip()}]
    return text
