"""The explorer: composition and the Python API; each piece lives in its own module.

``fields`` (settings controls from one table), ``feature_rows`` (strength sliders),
``picker`` (search), ``completions`` (panes), ``heat_pipeline`` (heatmap beside the run),
``status`` (the status line), ``runner`` (debounced background runs), ``views`` (save and
load). Every control change schedules a run on the runner (a lone change starts at once, a
burst is debounced); a newer run cancels and drains the older one. Everything a user can do
with the mouse is also a Python method, which is how the tests and benchmarks drive it::

    ex = sw.Explorer()                    # the offline default engine
    ex.add_feature("10-smollm2-res-4k", 123)
    ex.set_strength(0, 80); ex.wait()
    ex.outputs["STEERED"].text, ex.record(), ex.status
"""

from __future__ import annotations

import json
import math
import threading
import time
import traceback
from contextlib import closing, contextmanager
from typing import Any

import ipywidgets as widgets

from ..errors import RequestError, SourceError, SteerWidgetsError
from ..results import Completion, SteerResult
from ..steering import Feature, SteerRequest, Vector
from .completions import Completions, build_panes
from .feature_rows import DEFAULT_STRENGTH, FeatureRows
from .fields import BY_NAME, LABEL_WIDTH, TOOLTIP, Controls, defaults
from .heat_pipeline import HeatJob, HeatPipeline
from .heatmap import Heatmap
from .picker import FeaturePicker
from .runner import Runner
from .status import StatusLine, cache_details

DEFAULT_SWEEP = "-2, -1, 2, 4"
WRAP = {"flex_flow": "row wrap", "width": "100%"}


def _section(title: str) -> widgets.HTML:
    heading = widgets.HTML(title)
    heading.add_class("sw-heading")
    return heading


def _row(children: list, *classes: str) -> widgets.HBox:
    box = widgets.HBox(children, layout=WRAP)
    for c in ("sw-wrap", *classes):
        box.add_class(c)
    return box


def _size(w: widgets.Widget) -> None:
    """Sliders grow but never below a usable track; boxes and menus keep their text."""
    if isinstance(w, (widgets.FloatSlider, widgets.IntSlider)):
        w.layout = widgets.Layout(flex="1 1 24em", min_width="24em", width="auto")
    elif isinstance(w, widgets.Checkbox):
        w.layout = widgets.Layout(width="auto", flex="0 0 auto")
    elif isinstance(w, widgets.Dropdown):  # the longest option must stay readable
        w.layout = widgets.Layout(flex="0 1 24em", min_width="22em", width="auto")
    else:
        w.layout = widgets.Layout(flex="0 1 17em", min_width="15em", width="auto")


class Explorer:
    """A live steering explorer on ``engine`` (default: ``Engine.default()``).

    Keyword settings are request fields (``n_completion_tokens``, ``temperature``,
    ``freq_penalty``, ``seed``, ``strength_multiplier``, ``steer_method``,
    ``steer_special_tokens``) plus ``prompt``, ``chat`` and ``sweep``; ``features`` is a list of
    ``(source, index)`` or ``(source, index, strength)``. ``live=False`` runs only on ``run()``
    or the Run button.
    """

    def __init__(
        self,
        engine=None,
        *,
        prompt: str = "I think that",
        chat: bool = False,
        features: list[tuple] = (),
        sweep: tuple[float, ...] | None = None,
        live: bool = True,
        debounce_s: float = 0.15,
        **settings: Any,
    ) -> None:
        if engine is None:
            from ..engine import Engine

            engine = Engine.default()
        unknown = set(settings) - set(BY_NAME)
        if unknown:
            raise TypeError(f"unknown setting(s) {sorted(unknown)}; known: {sorted(BY_NAME)}")
        self.engine = engine
        self.outputs: dict[str, Completion] = {}
        self.request_done: SteerRequest | None = None  # the request behind ``outputs``
        self.default_generations = 0  # DEFAULT rows actually decoded (not from the cache)
        self.history: list[dict] = []  # one summary per finished, stopped or replaced run
        self.last_run: dict = {}
        self.last_traceback = ""
        self._quiet = 0  # > 0 while several controls change as one
        self._stopped_run = -1  # the run number Stop was pressed for
        self._tokens: dict[int, tuple[str, bool]] = {}  # token id -> (text, is special)
        self._heat_shown: tuple[SteerRequest, dict] | None = None  # what the heatmap colours
        self.runner = Runner(self._work, debounce_s)
        self._build(prompt, chat, {**defaults(), **settings})
        self.heat = HeatPipeline(engine, self.heatmap, self._fail)
        with self._batch(run=False):
            if sweep:
                self.set(sweep=sweep)
            for f in features:
                self.add_feature(*f)
        self.live.value = live
        self._watch()
        if not self.engine.saes.sources():
            self.status_line.show("idle", "no SAE sources registered: Engine(saes=[...]) adds some")
        self._details()
        if live:
            self.runner.schedule()

    # -- layout --------------------------------------------------------------------------
    def _build(self, prompt: str, chat: bool, values: dict) -> None:
        self.mode = widgets.ToggleButtons(
            options=["completion", "chat"],
            value="chat" if chat else "completion",
            tooltips=["continue the text", "the text is a user message (chat template)"],
            style={"button_width": "7em"},
        )
        self.prompt = widgets.Textarea(
            value=prompt,
            rows=2,
            continuous_update=False,
            placeholder="a prompt to complete",
            layout={"flex": "1 1 20em", "min_width": "15em", "width": "auto"},
        )
        self.picker = FeaturePicker(self.engine, self._picked, self._fail, on_concept=self._concept)
        self.features_ui = FeatureRows(self._changed, self.picker.neighbours, self.picker.card.show)
        self.controls = Controls(values)
        for w in self.controls.widgets.values():
            _size(w)
        self.sweep_on = widgets.Checkbox(value=False, description="sweep", indent=False)
        self.sweep_on.layout = widgets.Layout(width="auto", flex="0 0 auto")
        self.sweep_text = widgets.Text(
            value=DEFAULT_SWEEP,
            continuous_update=False,
            description="multipliers",
            **{TOOLTIP: "extra STEERED panes at these multipliers (x-2, x4, ...)"},
            style={"description_width": "6em"},
            layout={"flex": "0 1 16em", "min_width": "14em", "width": "auto"},
        )
        self.live = widgets.Checkbox(value=True, description="live", indent=False)
        self.live.layout = widgets.Layout(width="auto")
        self.run_button = widgets.Button(description="Run", button_style="primary")
        self.stop_button = widgets.Button(description="Stop")
        self.record_button = widgets.Button(description="Record", tooltip="show settings+outputs")
        for b in (self.run_button, self.stop_button, self.record_button):
            b.layout = widgets.Layout(width="auto", min_width="5.5em")
        self.record_box = widgets.Textarea(layout={"width": "100%", "display": "none"}, rows=8)
        self.completions = Completions()
        self.heatmap = Heatmap()
        self.heat_feature = widgets.Dropdown(
            options=[],
            description="heatmap of",
            style={"description_width": LABEL_WIDTH},
            layout={"width": "32em", "max_width": "100%"},
        )
        self.status_line = StatusLine()
        steering = self.controls.group("steering")
        self.ui = widgets.VBox(
            [
                _section("Prompt"),
                _row([self.mode, self.prompt]),
                _section("Features"),
                self.picker.ui,
                self.features_ui.ui,
                _row([*steering, self.sweep_on, self.sweep_text]),
                _section("Generation"),
                _row(self.controls.group("generation")),
                _row(
                    [self.run_button, self.stop_button, self.live, self.record_button],
                    "sw-actions",
                ),
                self.status_line,
                self.completions,
                self.heat_feature,
                self.heatmap,
                self.record_box,
            ],
            layout={"width": "100%"},
        )
        self.ui.add_class("sw-explorer")

    def _watch(self) -> None:
        for w in (self.prompt, self.mode, self.sweep_on, self.sweep_text):
            w.observe(self._changed, names="value")
        self.controls.observe(self._changed)
        self.heat_feature.observe(lambda _: self._recolor(), names="value")
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        self.record_button.on_click(lambda _: self._toggle_record())

    def _ipython_display_(self, **kwargs) -> None:
        from IPython.display import display

        display(self.ui)

    # -- Python API ----------------------------------------------------------------------
    def add_feature(self, source: str, index: int, strength: float | None = None) -> int:
        """Pick a feature: adds a strength slider row; returns its row number (-1: refused)."""
        try:
            cfg = self.engine.saes.config(source)
            if not 0 <= int(index) < cfg.d_sae:
                raise SourceError(source, f"feature index {index} out of range 0..{cfg.d_sae - 1}")
            info = self._info(source, index)
            if strength is None:
                strength = info.max_act if info and info.max_act else DEFAULT_STRENGTH
            _check_strength(strength)
        except SteerWidgetsError as err:
            self._fail(err)
            return -1
        label = ", ".join(repr(t) for t in info.top_tokens[:5]) if info else ""
        with self._batch():
            row = self.features_ui.add(source, int(index), float(strength), label)
            self._sync_heat_options()
        return row

    def add_concept(self, name: str, vector: Vector) -> int:
        """Steer with a custom direction (e.g. ``engine.concept_vector(...)``); its row."""
        with self._batch():
            return self.features_ui.add_vector(name, vector)

    def set_strength(self, row: int, value: float) -> None:
        """Move a row's slider (as a user would); a value beyond the range widens it."""
        try:
            _check_strength(value)
        except RequestError as err:
            self._fail(err)
            return
        self.features_ui.set_strength(row, value)

    def remove_feature(self, row: int) -> None:
        """Drop a picked feature (or concept) and its slider."""
        with self._batch():
            self.features_ui.remove(row)
            self._sync_heat_options()

    @property
    def features(self) -> list[Feature]:
        return self.features_ui.features()

    def set(self, **settings: Any) -> None:
        """Set controls by request field name, e.g. ``set(temperature=0, seed=3)``.

        A valid value outside a slider's range widens the slider; an invalid one is refused
        in the status line and leaves its control unchanged. All changes make one run.
        """
        with self._batch():
            for name, value in settings.items():
                try:
                    self._set_one(name, value)
                except RequestError as err:
                    self._fail(err)

    def _set_one(self, name: str, value: Any) -> None:
        if name == "prompt":
            if not isinstance(value, str):
                raise RequestError("prompt", f"must be text, got {value!r}")
            self.prompt.value = value
        elif name == "chat":
            self.mode.value = "chat" if value else "completion"
        elif name == "sweep":
            values = tuple(value or ())
            for m in values:
                _check_strength(m, "sweep")
            self.sweep_on.value = bool(values)
            if values:
                self.sweep_text.value = ", ".join(f"{m:g}" for m in values)
        elif name in BY_NAME:
            self.controls.set(name, value)
        else:
            raise TypeError(f"unknown setting {name!r}")

    def request(self) -> SteerRequest:
        """The request the current controls describe (STEERED only when a feature is picked)."""
        text = self.prompt.value
        prompt = [{"role": "user", "content": text}] if self.mode.value == "chat" else text
        features, vectors = tuple(self.features), tuple(self.features_ui.vectors())
        values = self.controls.values()
        sweep: tuple[float, ...] = ()
        if self.sweep_on.value and (features or vectors):
            try:
                parsed = [float(s) for s in self.sweep_text.value.replace(",", " ").split()]
            except ValueError as err:
                raise RequestError(
                    "sweep", f"expected numbers, got {self.sweep_text.value!r}"
                ) from err
            # STEERED itself is the row at the current multiplier; each row once
            mult = values["strength_multiplier"]
            sweep = tuple(dict.fromkeys(m for m in parsed if m != mult))
        steered = features or vectors
        return SteerRequest(
            prompt=prompt,
            features=features,
            vectors=vectors,
            types=("DEFAULT", "STEERED") if steered else ("DEFAULT",),
            sweep=sweep,
            **values,
        )

    def run(self) -> None:
        """Start a run now (cancelling any running one); returns at once, see ``wait``."""
        self.runner.start()

    def stop(self) -> None:
        """Cancel the pending and the running generation; the status line says stopped."""
        self._stopped_run = self.runner.started
        busy = self.runner.busy
        self.runner.cancel()
        if busy:
            self.status_line.show("stopped", "stopping…")

    def wait(self, timeout: float | None = 120.0) -> bool:
        """Block until the current run and its heatmap finished; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self.runner.wait(timeout)
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        return self.heat.wait(left) and ok

    @property
    def status(self) -> str:
        """The status line as plain text: state, what happened, the last error."""
        return self.status_line.text

    @property
    def error(self) -> str:
        return self.status_line.error

    def record(self) -> dict:
        """Settings and outputs of the last finished run; ``engine.steer(record)`` replays it."""
        return self._result().to_dict()

    def sweep_frame(self):
        """The last run's outputs as a pandas DataFrame: one row per DEFAULT/STEERED/sweep."""
        return self._result().to_frame()

    def show_activations(self, row: int) -> None:
        """Color the heatmap by the picked feature in ``row``."""
        self.heat_feature.value = row

    def save_view(self, path) -> dict:
        """Write prompt, features, concepts, settings and outputs to a JSON file."""
        from .views import save_view

        return save_view(self, path)

    @classmethod
    def load_view(cls, path, engine=None, **kwargs) -> Explorer:
        """A new explorer from ``save_view``'s file; its run reproduces the saved tokens."""
        from .views import load_view

        return load_view(cls, path, engine, **kwargs)

    # -- control flow --------------------------------------------------------------------
    @contextmanager
    def _batch(self, run: bool = True):
        """Several control changes as one: a single run (if ``run``) at the end."""
        self._quiet += 1
        try:
            yield
        finally:
            self._quiet -= 1
        if run and not self._quiet:
            self._changed()

    def _changed(self, _change=None) -> None:
        if self._quiet:
            return
        self.record_box.layout.display = "none"  # it described the previous settings
        if self.live.value:
            self.runner.schedule()
        elif self.request_done is not None:
            self._mark_stale("settings changed since: press Run")

    def _picked(self, source: str, index: int, strength: float | None = None) -> None:
        self.add_feature(source, index, strength)

    def _concept(self, name: str, vector: Vector) -> None:
        self.add_concept(name, vector)

    def _work(self, cancel: threading.Event) -> None:
        """One run on the runner's thread: stream frames into the panes; heatmap beside."""
        run_no = self.runner.started
        started = time.perf_counter()
        run = {"started_at": started, "first_frame_at": None, "first_steered_at": None}
        self.last_run = run
        try:
            req = self.request()
            run["request"] = req
            missing = sorted({f.source for f in req.features} - set(self.engine.saes.resident()))
            if missing:
                self.status_line.show("loading", ", ".join(missing), self.error)
            else:
                self.status_line.show("generating", "starting…", self.error)
            prompt_text = self.engine.text(req.prompt)
            frame = None
            with closing(self.engine.steer_stream(req, cancel)) as stream:
                for frame in stream:
                    self._frame(req, prompt_text, frame, run, started)
            run["done_at"] = time.perf_counter()
            run["outputs"] = dict(frame.outputs) if frame else {}
            run["cancelled"] = cancel.is_set()
            self.history.append(run)
            if cancel.is_set():
                self._cancelled(run, run_no, frame)
                return
            self.outputs, self.request_done = dict(frame.outputs), req
            self.status_line.show("done", self._summary(frame.step, started, run))
        except SteerWidgetsError as err:
            self._fail(err, run_failed=True)
        except Exception as err:  # keep the UI alive; the traceback stays inspectable
            self.last_traceback = traceback.format_exc()
            self._fail(f"{type(err).__name__}: {err}", run_failed=True)
        finally:
            self._details()

    def _frame(self, req: SteerRequest, prompt_text, frame, run: dict, started: float) -> None:
        now = time.perf_counter()
        if run["first_frame_at"] is None:
            run["first_frame_at"] = now
            default = frame.outputs.get("DEFAULT")
            run["default_cached"] = default is not None and default.stop != ""
            if default is not None and not run["default_cached"]:
                self.default_generations += 1
        self._show(req, prompt_text, frame)
        steered = frame.outputs.get("STEERED")
        if steered and steered.token_ids and run["first_steered_at"] is None:
            run["first_steered_at"] = time.perf_counter()
        n = sum(len(c.token_ids) for c in frame.outputs.values())
        if n > run.get("n_shown", -1):  # the heatmap lag counts from the last new token
            run["n_shown"], run["last_token_at"] = n, time.perf_counter()
        self._submit_heat(req, frame.outputs, frame.done, run)
        if not frame.done:
            rate = frame.step / (now - started) if now > started else 0.0
            cached = " · DEFAULT from cache" if run.get("default_cached") else ""
            self.status_line.show(
                "generating",
                f"{frame.step}/{req.n_completion_tokens} tokens, {rate:.1f} tokens/s{cached}",
            )

    def _cancelled(self, run: dict, run_no: int, frame) -> None:
        steps = frame.step if frame else 0
        if self._stopped_run == run_no:
            run["cancel_reason"] = "stopped"
            self.status_line.show("stopped", f"after {steps} tokens; the panes show them")
        else:
            run["cancel_reason"] = "replaced"
            self.status_line.show("replaced", f"after {steps} tokens; the newer run follows")

    def _show(self, req: SteerRequest, prompt_text, frame) -> None:
        """Put a frame's outputs into the panes (they now match the controls again)."""
        outs = frame.outputs
        self._learn_tokens(req.prompt, len(prompt_text.ids), [c.token_ids for c in outs.values()])
        prompt = "".join(
            t for t, s in zip(prompt_text.tokens, prompt_text.special, strict=True) if not s
        )
        panes = build_panes(outs, self._tokens.__getitem__, streaming=not frame.done)
        with self.completions.hold_sync():
            self.completions.prompt = prompt
            self.completions.panes = panes
            self.completions.stale = ""

    def _learn_tokens(self, prompt, base: int, id_lists) -> None:
        """Token strings for new ids, one ``engine.text`` call per frame at most."""
        new = sorted({i for ids in id_lists for i in ids if i not in self._tokens})
        if not new:
            return
        text = self.engine.text(prompt, new)
        for i, tok, special in zip(new, text.tokens[base:], text.special[base:], strict=True):
            self._tokens[i] = (tok, special)

    def _mark_stale(self, why: str) -> None:
        self.completions.stale = why
        if self.heatmap.rows:
            self.heatmap.stale = why

    # -- heatmap -------------------------------------------------------------------------
    def _heat_choice(self) -> Feature | None:
        i = self.heat_feature.value
        feats = self.features
        return feats[i] if i is not None and 0 <= i < len(feats) else None

    def _sync_heat_options(self) -> None:
        current = self.heat_feature.value
        options = [(f"{f.source} #{f.index}", i) for i, f in enumerate(self.features)]
        self.heat_feature.options = options
        if options:
            self.heat_feature.value = (
                current if current is not None and current < len(options) else 0
            )

    def _submit_heat(self, req: SteerRequest, outputs: dict, final: bool, run: dict) -> None:
        """Hand the shown outputs to the heatmap worker; never waits for it."""
        choice = self._heat_choice()
        if choice is None:
            self.heat.clear("pick a feature to see its activations")
            return

        def shown(at: float) -> None:
            run["heat_at"] = at

        self._heat_shown = (req, dict(outputs))
        job = HeatJob(req.prompt, dict(outputs), choice.source, choice.index, final, shown)
        self.heat.submit(job)

    def _recolor(self) -> None:
        """Another feature for the heatmap: recolor what the panes show, no new run."""
        shown = self._heat_shown
        if shown is None or self.runner.busy:
            return  # the running run's next frame uses the new choice
        req, outputs = shown
        self._submit_heat(req, outputs, True, {})

    # -- status and records --------------------------------------------------------------
    def _summary(self, step: int, started: float, run: dict) -> str:
        elapsed = run["done_at"] - started
        rate = step / elapsed if elapsed > 0 else 0.0
        first = run["first_steered_at"]
        first_ms = f", first steered token {1000 * (first - started):.0f} ms" if first else ""
        cached = " · DEFAULT from cache" if run.get("default_cached") else ""
        return f"{step} tokens in {elapsed:.2f} s ({rate:.1f} tokens/s){first_ms}{cached}"

    def _fail(self, err, run_failed: bool = False) -> None:
        """Show an error in the status line; the explorer stays usable.

        A failed run (``run_failed``) also ends the run's state and marks the panes stale:
        they still show the last good run, not the current controls.
        """
        if run_failed:
            self.status_line.show("error", "", str(err))
            if self.completions.panes:
                self._mark_stale("they show the last good run; the current settings failed")
        else:
            self.status_line.error = str(err)

    def _details(self) -> None:
        self.status_line.details = cache_details(self.engine)

    def _result(self) -> SteerResult:
        if self.request_done is None:
            raise RequestError("record", "nothing has run yet: call run() and wait()")
        return self.engine.result(self.request_done, self.outputs)

    def _toggle_record(self) -> None:
        if self.record_box.layout.display != "none":
            self.record_box.layout.display = "none"
            return
        try:
            self.record_box.value = json.dumps(self.record(), indent=1)
            self.record_box.layout.display = None
        except SteerWidgetsError as err:
            self._fail(err)

    def _info(self, source: str, index: int):
        try:
            return self.engine.feature_index(source)[int(index)]
        except (SteerWidgetsError, IndexError):
            return None


def _check_strength(value: Any, field: str = "strength") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(field, f"must be a finite number, got {value!r}")
