"""The explorer's "steer when" row: gate the whole steering on a feature or a concept.

Three choices: always (no condition), while a feature is active (its activation above the
threshold, the slider spanning the feature's top activation), or while the text is about a
concept (the cosine of the residual with the concept's vector above the threshold). Either
decides at each token or once from the prompt. ``Explorer.set(when=...)`` takes any
condition from Python; one the row cannot show is listed as "set from Python" until the row
is changed.

A concept's vector reads the model (tens of seconds the first time), so naming a concept
starts it on the row's own worker and ``condition()`` never computes: until the vector is
here it raises ``VectorPending``, so no caller (a run, a save, an evaluation) waits on the
kernel's thread or out of Stop's reach. When it arrives the row asks for a run. ``stop``
drops the vector being made (nothing reads its result, no run follows: the model's forward
passes cannot be cut off, so the job ends on its own and its vector is kept for the next
time); a later run makes it again.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import ipywidgets as widgets

from ..errors import Cancelled, RequestError, SteerWidgetsError
from ..steering.entries import Condition, Feature, When
from .fields import LABEL_WIDTH, TOOLTIP
from .picker import hint
from .worker import Worker

KINDS = [
    ("always", "always"),
    ("while a feature is active", "feature"),
    ("while the text is about a concept", "concept"),
]
CUSTOM = ("as set from Python", "custom")
COSINE_RANGE = 0.3  # a concept's cosine with a residual rarely leaves ±0.3
COSINE_STEP = 0.005  # 120 stops over ±0.3, and the start value 0.05 is one of them
COSINE_READOUT = ".3f"


class VectorPending(RequestError):
    """The row names a concept whose vector is still being made: ask again once it is."""

    def __init__(self, name: str) -> None:
        self.what = f"the concept vector for {name!r}"
        super().__init__(
            "when", f"{self.what} is still being made; the run follows when it is ready"
        )


class VectorStopped(RequestError):
    """The row names a concept whose vector was stopped: a later change or Run makes it."""

    def __init__(self, name: str) -> None:
        problem = "was stopped: change a control or press Run to make it again"
        super().__init__("when", f"making the concept vector for {name!r} {problem}")


@dataclass(frozen=True)
class VectorNews:
    """What became of a concept's vector: ``state`` is "making", "ready", "stopped" or
    "failed" (``error`` says why); ``run``: a run waited for it (``make(run_after=True)``)."""

    state: str
    name: str
    error: str = ""
    run: bool = False


class ConditionRow:
    """The row's widgets (``ui``) and the condition they describe (``condition()``).

    ``on_vector`` hears about the concept vectors the row makes (``VectorNews``), on the
    row's worker thread except for "making" and "stopped"."""

    def __init__(
        self,
        on_change: Callable[[], None],
        feature_max: Callable[[str, int], float | None],
        concept_vector: Callable[[str], object],
        on_vector: Callable[[VectorNews], None] = lambda news: None,
        label: str = "steer",
    ) -> None:
        self._feature_max, self._concept_vector = feature_max, concept_vector
        self._on_vector = on_vector
        self._custom: Condition | None = None
        self._texts = {"feature": "", "concept": ""}  # each kind's own text, kept apart
        self._switching = False  # the kind is changing: the text it restores is no edit
        # The vectors, guarded by _lock: read by runs, saves and evaluations, written by
        # the worker. A job counts only while it is _job (stop and newer jobs move it on).
        self._lock = threading.Lock()
        self._vectors: dict[str, object] = {}  # concept name -> its vector, made once
        self._failed: dict[str, str] = {}  # concept name -> why it could not be made
        self._stopped: set[str] = set()
        self._making: str | None = None
        self._job = 0
        self._done: threading.Event | None = None  # set when the current job is over
        self._run_after = False
        self._worker = Worker("sw-concept-vector")
        self.last_traceback = ""  # of a vector that failed with a bug, for inspection
        style = {"description_width": LABEL_WIDTH}
        self.kind = widgets.Dropdown(
            options=KINDS, value="always", description=label, style=style,
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
        """The condition the row describes (``None``: always). Never computes: a concept
        whose vector is not here yet is a ``VectorPending`` (a ``RequestError``), one that
        was stopped or failed a ``RequestError`` saying so, as is a feature it cannot read."""
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
        with self._lock:
            vector, failed = self._vectors.get(name), self._failed.get(name)
            stopped, making = name in self._stopped, self._making == name
        if vector is not None:
            return When(vector, above=above, scope=scope, reduce="mean")
        if failed is not None:
            raise RequestError("when", f"no concept vector for {name!r}: {failed}")
        if stopped or not making:
            raise VectorStopped(name)
        raise VectorPending(name)

    def state(self) -> dict | None:
        """What the controls say, for a saved view: kind, text, threshold and scope
        (``None`` for "always" and for a condition set from Python, which the request's
        record carries whole)."""
        kind = self.kind.value
        if kind not in self._texts:
            return None
        return {"kind": kind, "what": self.what.value, "threshold": float(self.threshold.value),
                "scope": self.scope.value}  # fmt: skip

    def show_state(self, state: Mapping, vector: object = None) -> None:
        """Put a saved ``state`` back into the controls, editable as the user left them; a
        concept's ``vector`` as it was saved (no model work, and a replay reads the same
        bits)."""
        kind, what = state["kind"], str(state["what"])
        if kind == "concept" and vector is not None:
            with self._lock:
                self._vectors[what.strip()] = vector
        self._texts[kind] = what
        self.kind.value = kind  # the kind's own text and slider range come with it
        self.what.value = what
        self.scope.value = state["scope"]
        self.threshold.value = float(state["threshold"])

    @property
    def making(self) -> str | None:
        """The concept whose vector is being made now, if any."""
        with self._lock:
            return self._making

    def make(self, run_after: bool = False) -> bool:
        """Start making the named concept's vector unless it is here, being made, stopped
        or failed (``retry`` lets those be made again); True while it is being made.
        ``run_after``: the caller's run waits for it (its "ready" news says so)."""
        name = self.what.value.strip() if self.kind.value == "concept" else ""
        with self._lock:
            if not name or name in self._vectors or name in self._failed:
                return False
            if name in self._stopped:
                return False
            self._run_after = self._run_after or run_after
            if self._making == name:
                return True
            self._job += 1
            self._making, self._done = name, threading.Event()
            job, done = self._job, self._done
        self._note("making its vector…")
        self._on_vector(VectorNews("making", name))
        if not self._worker.submit(self._build, name, job, done):  # closed
            self._drop(job)
            done.set()
            return False
        return True

    def retry(self, failed: bool = False) -> None:
        """A change after a Stop (or Run): a stopped vector may be made again, and with
        ``failed`` (the row's own edits) the named concept's failed one too. A run started
        before the Stop does not restart it: it asks ``make`` without ``retry``."""
        with self._lock:
            self._stopped.clear()
            if failed:
                self._failed.pop(self.what.value.strip(), None)

    def stop(self) -> str | None:
        """Drop the vector being made (its job ends on its own; nothing follows it); the
        concept it was for, or None."""
        with self._lock:
            name, job = self._making, self._job
        if name is None or not self._drop(job):  # nothing in flight, or it just ended
            return None
        self._note("stopped: change a control or press Run to make its vector again")
        self._on_vector(VectorNews("stopped", name))
        return name

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the vector being made is here (False: still making at ``timeout``);
        a stopped one is not waited for."""
        with self._lock:
            done = self._done
        return done is None or done.wait(timeout)

    def close(self) -> None:
        """Drop the vector being made and end the worker (it does not wait for the job)."""
        self.stop()
        self._worker.close()

    def _drop(self, job: int) -> bool:
        """``job`` no longer counts: ``wait`` stops waiting for it, no run follows it;
        False when it had already ended."""
        with self._lock:
            if job != self._job or self._making is None:
                return False
            self._stopped.add(self._making)
            self._job += 1
            done, self._done = self._done, None
            self._making, self._run_after = None, False
        if done is not None:
            done.set()
        return True

    def _build(self, name: str, job: int, done: threading.Event) -> None:
        """The worker's job: make ``name``'s vector, keep it, and say so if it still counts
        (one stopped or replaced before it began is skipped)."""
        try:
            with self._lock:
                if job != self._job:
                    return
                vector = self._vectors.get(name)  # a dropped job may have made it already
            if vector is None:
                vector = self._concept_vector(name)
        except Cancelled:  # cut off by cancel_all: as if stopped
            self._finish(name, job, "stopped")
        except SteerWidgetsError as err:
            self._finish(name, job, "failed", str(err))
        except Exception as err:  # a bug: said in the status line, the row stays usable
            self.last_traceback = traceback.format_exc()
            self._finish(name, job, "failed", f"{type(err).__name__}: {err}")
        else:
            self._finish(name, job, "ready", vector=vector)
        finally:
            done.set()

    def _finish(
        self, name: str, job: int, state: str, error: str = "", vector: object = None
    ) -> None:
        with self._lock:
            if vector is not None:
                self._vectors[name] = vector  # kept even for a dropped job: the work is done
                self._stopped.discard(name)
            current = job == self._job
            if not current:
                return
            if state == "failed":
                self._failed[name] = error
            elif state == "stopped":
                self._stopped.add(name)
            run = self._run_after
            self._making, self._run_after, self._done = None, False, None
            self._job += 1
        if self.kind.value != "concept" or self.what.value.strip() != name:
            return  # the row moved on: nothing to say about this concept
        self._note({"ready": "", "failed": "could not make its vector"}.get(state, "stopped"))
        self._on_vector(VectorNews(state, name, error, run))
        if state == "ready":
            self._on_change()  # the run that waited for it can go

    def _note(self, text: str) -> None:
        """The row's word on its concept vector, beside the slider (hidden when empty)."""
        self.summary.value = hint(text) if text else ""
        self._show_parts()

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
        old, new = change["old"], change["new"]
        if new != "custom" and self._custom is not None:
            self._custom = None
            self.kind.options = KINDS  # the Python condition is replaced
        if old in self._texts:  # a feature's text is no concept's name, nor the reverse
            self._texts[old] = self.what.value
        if new in self._texts:
            self._switching = True
            try:
                self.what.value = self._texts[new]
            finally:
                self._switching = False
        if new == "concept":
            self.threshold.min, self.threshold.max = -COSINE_RANGE, COSINE_RANGE
            self.threshold.step, self.threshold.readout_format = COSINE_STEP, COSINE_READOUT
            self.threshold.value = 0.05
            self._note("")
            self.retry(failed=True)
            self.make()
        elif new == "feature":
            self._fit_slider()
        self._show_parts()
        self._on_change()

    def _what_changed(self, _change) -> None:
        if self._switching:
            return
        if self.kind.value == "feature":
            self._fit_slider()
        elif self.kind.value == "concept":
            self._note("")
            self.retry(failed=True)
            self.make()
        self._on_change()

    def _fit_slider(self) -> None:
        """Span 0 to the feature's top activation (10 where the index has none)."""
        try:
            top = self._feature_max(*parse_feature(self.what.value)) or 10.0
        except RequestError:
            top = 10.0
        self.threshold.min, self.threshold.max = 0.0, max(float(top), 0.01)
        self.threshold.step = self.threshold.max / 200
        self.threshold.readout_format = ".2f"
        self.threshold.value = min(max(self.threshold.value, 0.0), self.threshold.max)

    def _show_parts(self) -> None:
        kind = self.kind.value
        for w in (self.what, self.threshold, self.scope):
            w.layout.display = "" if kind in ("feature", "concept") else "none"
        shown = kind == "custom" or (kind == "concept" and self.summary.value)
        self.summary.layout.display = "" if shown else "none"


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
