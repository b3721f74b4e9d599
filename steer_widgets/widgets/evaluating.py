"""Evaluations run from the explorer: one at a time, on a thread, with their true state.

Pressing evaluate takes the steering as the sliders set it (features and concepts at their
strengths: the x1 point) and runs ``Engine.evaluate_stream`` over the panel's prompts and
ladder. Input is checked in full before anything running is cancelled: refused input is an
error (the explorer stays usable, and a running evaluation runs on). An accepted newer
evaluation cancels the running one (which then says "replaced"), stop says "stopped by you",
and the rows finished so far stay drawn.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence

from ..analysis.evaluation import Evaluation
from ..analysis.judges import label_words
from ..errors import SteerWidgetsError
from ..steering.cancel import worker_thread
from ..steering.requests import SteerRequest
from .evaluate_panel import EvaluatePanel


class Evaluating:
    """Runs evaluations for one explorer; ``current`` says where the sliders are now."""

    def __init__(
        self,
        engine,
        panel: EvaluatePanel,
        steering: Callable[[], tuple[SteerRequest, list[str]]],
        set_strength: Callable[[int, float], None],
        current: Callable[[], list[float]],
    ) -> None:
        self.engine, self.panel = engine, panel
        self._steering, self._set_strength, self._current = steering, set_strength, current
        self.evaluation: Evaluation | None = None
        self.x1: list[float] = []  # each row's strength when the evaluation started
        self.last_traceback = ""
        self._cancel: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        panel.handlers.update(
            evaluate=lambda _: self.start(),
            stop=lambda _: self.stop(),
            pick=lambda msg: self.pick(msg.get("strength")),
        )

    def start(self, prompts=None, strengths=None, judge=None) -> bool:
        """Start an evaluation (replacing a running one); False if the input was refused.
        The input is checked before the running one is cancelled, so a typo costs nothing."""
        cancel = threading.Event()
        try:
            prompts, strengths = self._inputs(prompts, strengths)
            request, words = self._steering()
            stream = self.engine.evaluate_stream(
                request, prompts, strengths, judge or words or None, cancel
            )
        except SteerWidgetsError as err:
            self._refuse(err)
            return False
        self.panel.set_inputs(prompts, strengths)
        self._replace()
        self.x1 = self._current()
        thread = worker_thread("evaluate", self._work, stream, cancel)
        with self._lock:
            self._cancel, self._thread = cancel, thread
        self.panel.show_state("running", f"0 of {stream.total} rows")
        self.panel.total_rows, self.panel.done_rows = stream.total, 0
        thread.start()
        return True

    def _inputs(self, prompts, strengths) -> tuple:
        """Prompts and ladder as given, else the panel's (at first the shipped ones)."""
        from ..analysis.evaluator import LADDER, panel

        if prompts is None:
            prompts = self.panel.prompts() if self.panel.prompts_text.strip() else panel()
        if strengths is None:
            strengths = self.panel.ladder() if self.panel.ladder_text.strip() else LADDER
        return _listed(prompts), _listed(strengths)

    def _refuse(self, err: SteerWidgetsError) -> None:
        """Say why nothing started. A running evaluation goes on and stays cancellable (its
        state stays "running"), so only the error line tells."""
        if self._running():
            self.panel.error = str(err)
        else:
            self.panel.show_state("error", "nothing ran", str(err))

    def _running(self) -> bool:
        with self._lock:
            thread = self._thread
        return thread is not None and thread.is_alive()

    def _replace(self) -> None:
        with self._lock:
            cancel, thread = self._cancel, self._thread
        if thread is not None and thread.is_alive():
            cancel.replaced = True
            cancel.set()
            thread.join()

    def _work(self, stream, cancel: threading.Event) -> None:
        evaluation = None
        try:
            for evaluation in stream:
                self.evaluation = evaluation
                self.panel.draw(evaluation, self.position())
                self.panel.message = f"{len(evaluation.rows)} of {evaluation.total} rows"
        except SteerWidgetsError as err:
            partial = getattr(err, "evaluation", None)
            if partial is not None:
                self.evaluation = partial
                self.panel.draw(partial, self.position())
            self.panel.show_state("error", "the rows before it are kept", str(err))
            return
        except Exception as err:  # a bug: say so, keep the explorer alive
            self.last_traceback = traceback.format_exc()
            self.panel.show_state("error", "", f"{type(err).__name__}: {err}")
            return
        if evaluation is None:
            return
        if evaluation.cancelled:
            state = "replaced" if getattr(cancel, "replaced", False) else "stopped"
            self.panel.show_state(state, f"{len(evaluation.rows)} of {evaluation.total} rows kept")
        else:
            best = evaluation.best(steering=next(iter(evaluation.steerings)))
            tail = "none turned within 1 nat" if best is None else f"best within 1 nat: x{best:g}"
            seconds = evaluation.stats.get("seconds", 0.0)
            self.panel.show_state("done", f"{len(evaluation.rows)} rows in {seconds:.1f} s; {tail}")

    def stop(self) -> None:
        with self._lock:
            cancel = self._cancel
        if cancel is not None:
            cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        with self._lock:
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def pick(self, strength) -> None:
        """Set every slider to ``strength`` times its value when the evaluation started."""
        if not isinstance(strength, (int, float)) or isinstance(strength, bool):
            return
        for row, s in enumerate(self.x1):
            self._set_strength(row, float(strength) * s)
        self.redraw()

    def position(self) -> float | None:
        """Where the sliders are now as a multiple of the evaluated point (None: moved
        apart, or nothing evaluated)."""
        now = self._current()
        if not self.x1 or len(now) != len(self.x1):
            return None
        ratios = {round(n / s, 6) for n, s in zip(now, self.x1, strict=True) if s}
        return ratios.pop() if len(ratios) == 1 else None

    def redraw(self) -> None:
        """The chart's current-strength mark after a slider moved."""
        if self.evaluation is not None:
            self.panel.draw(self.evaluation, self.position())


def _listed(value):
    """A generator or an array (numpy strengths) as a list of its items, as the explorer has
    always taken them; anything else as given, for the engine to check (a string is not a
    list of prompts)."""
    if isinstance(value, (str, bytes, Sequence, Mapping)) or not isinstance(value, Iterable):
        return value
    return list(value)


def judge_words(engine, rows) -> list[str]:
    """What the explorer's evaluation looks for: each concept's name and each picked
    feature's label words."""
    words: list[str] = []
    for row in rows:
        if row.vector is not None:
            words.append(row.name)
        else:
            words += label_words(engine.feature_index(row.source).label(row.index))
    return list(dict.fromkeys(w for w in words if w))
