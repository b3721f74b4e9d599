"""The explorer's heatmap, computed beside the runner instead of after it.

A run hands each frame's outputs to ``HeatPipeline.submit`` and goes on decoding; a worker
thread colours the prompt and completions by the chosen feature, at most every
``interval_s`` while tokens stream and once more for the final frame. Only the newest job
counts, so the next slider change never waits for a heatmap: it starts its run at once and
the worker catches up with whatever the panes show by then.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..analysis.projection import projection
from ..errors import SteerWidgetsError
from ..steering.cancel import worker_thread
from ..steering.entries import When
from ..steering.requests import Feature, Vector
from ..steering.results import Completion
from .condition_row import describe
from .heatmap import Bounds, Heatmap, heat_row

TOP_K = 5  # top features per token kept in the heatmap state
HEAT_LABELS = ("DEFAULT", "STEERED")  # sweep rows stay text-only: one forward pass each


@dataclass(frozen=True)
class HeatJob:
    """Colour ``outputs`` of ``prompt`` by feature ``index`` of ``source``, or (with
    ``vector``, a concept row) by the residual's projection on that vector's direction."""

    prompt: Any
    outputs: Mapping[str, Completion]
    source: str
    index: int
    final: bool = True  # the panes will not change any more for this run
    on_shown: Callable[[float], None] | None = field(default=None, compare=False)
    vector: Vector | None = None
    name: str = ""  # the concept's name, for the title
    condition: When | None = None  # colour by this condition's score instead

    @property
    def title(self) -> str:
        if self.condition is not None:
            return f"score of the condition {describe(self.condition)}"
        if self.vector is not None:
            return f"projection on concept {self.name} ({self.vector.hook})"
        return f"activation of {self.source} #{self.index}"


def heat_job(prompt, outputs, choice: Feature | tuple, final=True, on_shown=None):
    """The job for a heatmap choice: a ``Feature``, a concept's ``(name, Vector)`` or the
    request's condition ``("condition", When)``."""
    if isinstance(choice, Feature):
        return HeatJob(prompt, outputs, choice.source, choice.index, final, on_shown)
    name, target = choice
    if isinstance(target, When):
        return HeatJob(prompt, outputs, "", -1, final, on_shown, condition=target)
    return HeatJob(prompt, outputs, "", -1, final, on_shown, target, name)


def heat_rows(engine, job: HeatJob, top_k: int = TOP_K) -> tuple[list[dict], Bounds | None]:
    """Prompt, DEFAULT and STEERED rows (per-token values and each token's top features),
    and the bounds to mark (a condition's ``(above, below)``; ``None`` otherwise)."""
    if job.condition is not None:
        return _condition_rows(engine, job)
    if job.vector is not None:
        return _projection_rows(engine, job), None
    rows: list[dict] = []
    for label in HEAT_LABELS:
        comp = job.outputs.get(label)
        if comp is None:
            continue
        acts = engine.activations(job.prompt, job.source, job.index, comp)
        top = engine.top_features_per_token(job.prompt, job.source, top_k, comp)
        pairs = list(zip(top.indices, top.values, strict=True))
        n = len(acts.tokens) - len(comp.token_ids)
        if not rows:
            rows.append(
                heat_row("prompt", acts.tokens[:n], acts.values[:n], acts.special[:n], pairs[:n])
            )
        rows.append(heat_row(label, acts.tokens[n:], acts.values[n:], acts.special[n:], pairs[n:]))
    return rows, None


def _condition_rows(engine, job: HeatJob) -> tuple[list[dict], Bounds]:
    """Prompt, DEFAULT and STEERED rows coloured by the condition's score, and its bounds
    in the same units (a token-scope gate is on where a token's score passes them)."""
    rows: list[dict] = []
    threshold = 0.0
    for label in HEAT_LABELS:
        comp = job.outputs.get(label)
        if comp is None:
            continue
        text, values, threshold = engine.condition_scores(job.condition, job.prompt, comp)
        n = len(text.ids) - len(comp.token_ids)
        if not rows:
            rows.append(heat_row("prompt", text.tokens[:n], values[:n], text.special[:n]))
        rows.append(heat_row(label, text.tokens[n:], values[n:], text.special[n:]))
    return rows, _bounds(engine, job, threshold)


def _bounds(engine, job: HeatJob, threshold: float) -> Bounds:
    """``(above, below)`` in score units: ``condition_scores`` gives the ``above`` bound
    (else the ``below`` one); a band's ``below`` needs the condition without its ``above``."""
    when = job.condition
    if when.above is None:
        return (None, threshold)
    if when.below is None:
        return (threshold, None)
    _, _, below = engine.condition_scores(replace(when, above=None), job.prompt)
    return (threshold, below)


def _projection_rows(engine, job: HeatJob) -> list[dict]:
    """Prompt, DEFAULT and STEERED rows coloured by the projection on a concept vector."""
    rows: list[dict] = []
    for label in HEAT_LABELS:
        comp = job.outputs.get(label)
        if comp is None:
            continue
        text, values = projection(engine, job.prompt, comp, job.vector)
        n = len(text.ids) - len(comp.token_ids)
        if not rows:
            rows.append(heat_row("prompt", text.tokens[:n], values[:n], text.special[:n]))
        rows.append(heat_row(label, text.tokens[n:], values[n:], text.special[n:]))
    return rows


class HeatPipeline:
    """One worker thread at a time; ``submit`` replaces any job not yet started."""

    def __init__(
        self, engine, heatmap: Heatmap, on_error: Callable[[str], None], interval_s: float = 0.5
    ) -> None:
        self.live = True  # False: colour only finished runs (no work while tokens stream)
        self.engine = engine
        self.heatmap = heatmap
        self.on_error = on_error
        self.interval_s = interval_s
        self.last_traceback = ""
        self._cond = threading.Condition()
        self._job: HeatJob | None = None
        self._busy = False
        self._epoch = 0  # bumped by clear(): a job computed before it is not shown

    def submit(self, job: HeatJob) -> None:
        """Queue ``job`` (dropping an older queued one); returns at once."""
        if not (job.final or self.live):
            return
        with self._cond:
            self._job = job
            self._cond.notify_all()
            if not self._busy:  # the worker clears _busy under this lock as it exits
                self._busy = True
                worker_thread("heatmap", self._loop).start()

    def clear(self, message: str) -> None:
        """Drop queued work and show ``message`` instead of rows."""
        if self.heatmap.title == message and not self.heatmap.rows:
            return
        with self._cond:
            self._job = None
            self._epoch += 1
        self.heatmap.show(message, [])

    def wait(self, timeout: float | None = None) -> bool:
        """Block until no job is queued or being computed; False if ``timeout`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._busy, timeout)

    def _loop(self) -> None:
        last = float("-inf")
        while True:
            with self._cond:
                if self._job is not None and not self._job.final:  # throttle live updates
                    self._cond.wait_for(
                        lambda: self._job is None or self._job.final,
                        max(0.0, last + self.interval_s - time.monotonic()),
                    )
                job, epoch, self._job = self._job, self._epoch, None
                if job is None:
                    self._busy = False
                    self._cond.notify_all()
                    return
            last = time.monotonic()
            self._compute(job, epoch)

    def _compute(self, job: HeatJob, epoch: int) -> None:
        try:
            rows, bounds = heat_rows(self.engine, job)
        except SteerWidgetsError as err:
            self.on_error(str(err))
            return
        except Exception as err:  # keep the widget alive; the traceback stays inspectable
            self.last_traceback = traceback.format_exc()
            self.on_error(f"{type(err).__name__}: {err}")
            return
        with self._cond:
            if epoch != self._epoch:
                return
        self.heatmap.show(job.title, rows, bounds)
        if job.on_shown is not None:
            job.on_shown(time.perf_counter())
