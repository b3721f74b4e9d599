"""The explorer: composition and the Python API; each other idea lives in its own module.

``layout`` (the widgets in reading order), ``fields`` (settings controls from one table of
request fields), ``request_form`` (the controls as a request), ``arguments`` (the explorer's
argument checks), ``feature_rows`` (strength sliders), ``recommend`` (what a new row starts
with), ``picker`` and ``card`` (search, feature card), ``streaming`` (one run streamed into
the panes, with its true state), ``completions`` (panes), ``heat_menu`` and
``heat_pipeline`` (what the heatmap colours, computed beside the run), ``status`` (status
line), ``runner`` (debounced background runs), ``views`` (save and load), ``presets`` (the
gallery). Every
control change schedules a run (a lone change starts at once, a burst is debounced); a newer
run cancels and drains the older one. Everything a user can do with the mouse is also a
Python method, which is how the tests and benchmarks drive it::

    ex = sw.Explorer()                    # the offline default engine
    ex.add_feature("10-smollm2-res-4k", 123)
    ex.set_strength(0, 80); ex.wait()
    ex.outputs["STEERED"].text, ex.record(), ex.status
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import checks
from ..checks import public_methods
from ..errors import RequestError, SteerWidgetsError
from ..steering import conditions
from ..steering.entries import Condition
from ..steering.requests import Feature, SteerRequest, Vector, check_vector
from ..steering.results import Completion, SteerResult
from ..steering.vector_files import SUFFIXES, load_vectors, save_vectors
from . import recommend
from .arguments import check_options, check_row, check_settings, check_strength
from .concept_sets import ConceptSets
from .condition_row import ConditionRow, VectorNews, VectorPending, VectorStopped
from .evaluating import Evaluating, judge_words
from .explain_panel import ExplainPanel
from .feature_rows import FeatureRows
from .fields import Controls, defaults
from .heat_menu import HeatMenu
from .heat_pipeline import HeatPipeline
from .layout import Layout, close_tree
from .picker import FeaturePicker
from .presets import PresetMenu
from .request_form import read_request, set_control
from .runner import Runner
from .streaming import RunLoop


@public_methods
class Explorer:
    """A live steering explorer on ``engine`` (default: ``Engine.default()``).

    Keyword settings are request fields (``n_completion_tokens``, ``temperature``,
    ``freq_penalty``, ``seed``, ``strength_multiplier``, ``steer_method``,
    ``steer_special_tokens``, ``prompt_multiplier``: the engine's recommendation unless given)
    plus ``prompt``, ``chat`` and ``sweep``; ``features`` is a list of
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
        from ..engine import Engine

        if engine is None:
            engine = Engine.default()
        elif not isinstance(engine, Engine):
            raise RequestError("engine", f"must be an Engine (None: the default), got {engine!r}")
        check_settings(settings)
        check_options(prompt, chat, features, live, debounce_s)
        self.engine = engine
        self._quiet = 0  # > 0 while several controls change as one
        self.picker = FeaturePicker(
            engine, self._picked, self._fail, on_concept=self._concept,
            on_concept_features=lambda concept: self.concept_sets.submit(concept),
        )  # fmt: skip
        self.features_ui = FeatureRows(
            self._rows_changed, self.picker.neighbours, self.picker.card.show,
            make_condition=self._row_condition,
        )  # fmt: skip
        recommended = {"prompt_multiplier": recommend.prompt_multiplier(engine)}
        self.controls = Controls({**defaults(), **recommended, **settings})
        self.presets = PresetMenu(engine.model.name, self._apply_view, self._fail)
        self.condition_row = ConditionRow(
            self._condition_changed, self._feature_max, engine.concept_vector, self._vector_news
        )
        self._run_waits: VectorPending | VectorStopped | None = None  # set on the run thread
        self.view = Layout(
            prompt, chat, self.controls, self.picker.ui, self.features_ui.ui, self.presets.ui,
            self.condition_row.ui,
        )  # fmt: skip
        v = self.view
        self.ui, self.completions, self.heatmap = v.ui, v.completions, v.heatmap
        self.status_line, self.record_box, self.live = v.status_line, v.record_box, v.live
        self.concept_sets = ConceptSets(
            engine, self.status_line, self.picker.concept_message, self._add_set, self._fail
        )
        self.heat = HeatPipeline(engine, self.heatmap, self._fail)
        self.heat_menu = HeatMenu(
            v.heat_feature, self.features_ui, self.heat, lambda: self.runner.busy,
            lambda req, outputs: self.explain.shown(req, outputs),
            gated=lambda: self.condition_row.kind.value != "always",
        )  # fmt: skip
        # why the text changed: effect colouring, a token's attribution, "what changed"
        self.explain = ExplainPanel(
            engine, self.completions, self.heatmap, self.heat_menu.heat_of, self._fail,
            open_card=self.picker.card.show, steer_with=self.add_feature,
        )  # fmt: skip
        self.runs = RunLoop(
            engine, self.completions, self.status_line, self._run_request,
            self.heat_menu.submit, self._run_failed,
        )  # fmt: skip
        self.runner = Runner(lambda cancel: self.runs.work(cancel, self.runner.started), debounce_s)
        self.evaluating = Evaluating(
            engine, v.evaluation, self._evaluated_steering, self.set_strength,
            lambda: [float(r.slider.value) for r in self.features_ui.rows],
        )  # fmt: skip
        with self.batch(run=False):
            if sweep:
                self.set(sweep=sweep)
            for f in features:
                self.add_feature(*f)
        self.live.value = live
        self._watch()
        if not self.engine.saes.sources():
            self.status_line.show("idle", "no SAE sources registered: Engine(saes=[...]) adds some")
        if live:
            self.runner.schedule()

    def _watch(self) -> None:
        v = self.view
        for w in (v.prompt, v.mode, v.sweep_on, v.sweep_text):
            w.observe(self._changed, names="value")
        self.controls.observe(self._changed)
        v.heat_feature.observe(lambda _: self.heat_menu.recolor(), names="value")
        v.run_button.on_click(lambda _: self.run())
        v.stop_button.on_click(lambda _: self.stop())
        v.record_button.on_click(lambda _: self._toggle_record())
        v.save_vectors_button.on_click(
            lambda _: self.save_vectors(
                v.vector_path.value or "vectors" + SUFFIXES[v.vector_format.value],
                v.vector_format.value,
            )
        )
        v.load_vectors_button.on_click(lambda _: self.load_vectors(v.vector_path.value))

    def close(self, timeout: float | None = 30.0) -> None:
        """Stops the run and the evaluation, ends the explain panel's and the feature card's
        worker threads (neither waits for work in flight) and closes every widget of the
        explorer (the front end drops them and the kernel can collect the explorer). The
        engine stays usable."""
        self.stop()
        self.stop_evaluation()
        self.explain.close()
        self.picker.card.close()
        self.concept_sets.close()
        for row in self._condition_rows():
            row.close()
        self.wait(timeout)
        self.wait_evaluation(timeout)
        close_tree(self.ui)

    def _ipython_display_(self, **kwargs) -> None:
        from IPython.display import display

        display(self.ui)

    # -- what the last run left (RunLoop keeps it) ----------------------------------------
    @property
    def outputs(self) -> dict[str, Completion]:
        """The last finished run's outputs, e.g. ``ex.outputs["STEERED"].text``."""
        return self.runs.outputs

    @property
    def request_done(self) -> SteerRequest | None:
        return self.runs.request_done

    @property
    def default_generations(self) -> int:
        return self.runs.default_generations

    @property
    def history(self) -> list[dict]:
        return self.runs.history

    @property
    def last_run(self) -> dict:
        return self.runs.last_run

    @property
    def last_traceback(self) -> str:
        return self.runs.last_traceback or self.heat.last_traceback

    # -- Python API ----------------------------------------------------------------------
    def add_feature(self, source: str, index: int, strength: float | None = None) -> int:
        """Pick a feature: adds a strength slider row; returns its row number (-1: refused)."""
        try:
            cfg = self.engine.saes.check_index(source, index)
            info = recommend.feature_info(self.engine, source, index)
            norm = recommend.typical_norm(self.engine, cfg.hook_name)
            if strength is None:
                strength = recommend.start_strength(self.engine, source, info)
            check_strength(strength)
        except SteerWidgetsError as err:
            self._fail(err)
            return -1
        label = recommend.row_label(self.engine, source, int(index), info)
        with self.batch():
            row = self.features_ui.add(source, int(index), float(strength), label, norm)
            self.heat_menu.sync()
        return row

    def add_concept(self, name: str, vector: Vector) -> int:
        """Steer with a custom direction (e.g. ``engine.concept_vector(...)``); its row
        (-1: refused, and the status line says why)."""
        try:
            checks.text("name", name)
            check_vector(vector, self.engine.model.runtime.hook_widths(), "vector")
        except RequestError as err:
            self._fail(err)
            return -1
        with self.batch():
            norm = recommend.typical_norm(self.engine, vector.hook)
            row = self.features_ui.add_vector(name, vector, norm)
            if vector.when is not None:  # the vector's own condition becomes the row's
                self.features_ui.condition_of(row).show_custom(vector.when)
            self.heat_menu.sync()
            return row

    def add_concept_features(self, concept: str, k: int | None = None) -> list[int]:
        """Add ``concept`` as the few SAE features that steer together
        (``engine.concept_features``), one row and slider each at its fitted strength; the
        rows added ([] when refused, and the status line says why). The "add as features"
        button does the same on a worker thread (``wait`` waits for it)."""
        return self.concept_sets.add_now(concept, k)

    def _add_set(self, found) -> list[int]:
        with self.batch():
            return [self.add_feature(f.source, f.index, f.strength) for f in found]

    def add_vectors(self, name: str, vectors: list[Vector]) -> int:
        """One row for several vectors (a multi-layer vector): one slider sets them all;
        its row (-1: refused, and the status line says why)."""
        try:
            checks.text("name", name)
            widths = self.engine.model.runtime.hook_widths()
            vectors = checks.sequence("vectors", vectors)
            if not vectors:
                raise RequestError("vectors", "is empty")
            for i, v in enumerate(vectors):
                check_vector(v, widths, f"vectors[{i}]")
        except RequestError as err:
            self._fail(err)
            return -1
        with self.batch():
            norm = recommend.typical_norm(self.engine, vectors[0].hook)
            row = self.features_ui.add_vectors(name, list(vectors), norm)
            self.heat_menu.sync()
            return row

    def load_vectors(self, path: str | Path, name: str | None = None) -> int:
        """A vector file (``sw.load_vectors``: .gguf, Neuronpedia .json, .safetensors, .pt)
        as one row with one slider, however many layers it has; -1 when refused."""
        try:
            if name is not None:
                checks.text("name", name)
            vectors = load_vectors(path, model=self.engine)
        except SteerWidgetsError as err:
            self._fail(err)
            return -1
        default = Path(str(path)).stem if isinstance(path, (str, Path)) else ""
        return self.add_vectors(name if name is not None else default or "vectors", vectors)

    def save_vectors(self, path: str | Path, format: str = "gguf") -> Path | None:
        """The steering of the current controls as a vector file (``engine.vectors`` then
        ``sw.save_vectors``); its path, or None when refused (the status line says why)."""
        try:
            vectors = self.engine.vectors(self.request())
            out = save_vectors(vectors, path, format, model=self.engine)
        except SteerWidgetsError as err:
            self._fail(err)
            return None
        self.status_line.show("idle", f"saved {len(vectors)} vectors to {out}")
        return out

    def set_strength(self, row: int, value: float) -> None:
        """Move a row's slider (as a user would); a value beyond the range widens it."""
        try:
            check_row(row, len(self.features_ui.rows))
            check_strength(value)
        except RequestError as err:
            self._fail(err)
            return
        self.features_ui.set_strength(row, value)

    def remove_feature(self, row: int) -> None:
        """Drop a picked feature (or concept) and its slider."""
        try:
            check_row(row, len(self.features_ui.rows))
        except RequestError as err:
            self._fail(err)
            return
        with self.batch():
            self.features_ui.remove(row)
            self.heat_menu.sync()

    @property
    def features(self) -> list[Feature]:
        return self.features_ui.features()

    def set(self, **settings: Any) -> None:
        """Set controls by request field name, e.g. ``set(temperature=0, seed=3)``.

        A valid value outside a slider's range widens the slider; an invalid one is refused
        in the status line and leaves its control unchanged. All changes make one run.
        An unknown name is an ``ArgumentError`` before anything changes.
        """
        check_settings(settings, also=("prompt", "chat", "sweep", "when"))
        with self.batch():
            for name, value in settings.items():
                try:
                    if name == "when":
                        self._set_when(value)
                    else:
                        set_control(self.view, self.controls, name, value)
                except RequestError as err:
                    self._fail(err)

    @property
    def when(self) -> Condition | None:
        """The condition steering is gated on: the "steer" row's, or ``set(when=sw.When(...))``
        (``None``: always). The panes underline the tokens written while it held."""
        return self.condition_row.condition()

    def _set_when(self, value) -> None:
        if value is not None:
            conditions.check(value, "when")
        self.condition_row.show_custom(value)

    def set_when(self, row: int, when: Condition | None) -> None:
        """Gate one row's steering: ``when`` (``sw.When``; ``None``: always) holds for that
        feature or concept alone, beside the request's own (``set(when=...)``), as its
        ``when`` button does; refused in the status line when not a condition."""
        try:
            check_row(row, len(self.features_ui.rows))
            if when is not None:
                conditions.check(when, f"rows[{row}].when")
        except RequestError as err:
            self._fail(err)
            return
        with self.batch():
            self.features_ui.condition_of(row).show_custom(when)

    def _row_condition(self) -> ConditionRow:
        """A row's own "steer when" controls: the request's row, for one feature or concept."""
        row = ConditionRow(
            self._condition_changed, self._feature_max, self.engine.concept_vector,
            self._vector_news, label="this row",
        )  # fmt: skip
        row.ui.add_class("sw-row-condition")
        return row

    def _condition_rows(self) -> list[ConditionRow]:
        """The request's "steer when" row and every feature row's own."""
        return [self.condition_row, *self.features_ui.conditions()]

    def _rows_changed(self, _change=None) -> None:
        """A row came, went (its ✕ included) or moved its slider: the heatmap menu follows
        the rows, and a run follows as for any control."""
        if hasattr(self, "heat_menu"):  # not while the rows are being built
            self.heat_menu.sync()
        self._changed()

    def _condition_changed(self) -> None:
        """The "steer when" row changed: the heatmap menu offers the condition's score while
        there is one, and a run follows as for any control."""
        if hasattr(self, "heat_menu"):  # not while the row is being built
            self.heat_menu.sync()
        self._changed()

    def _vector_news(self, news: VectorNews) -> None:
        """The "steer when" row's concept vector in the status line; a run that waited for
        it while not live starts when it is here (live, the row's change schedules one)."""
        what = f"the concept vector for {news.name!r}"
        if news.state == "making":
            self.status_line.show("idle", f"making {what}…", self.status_line.error)
        elif news.state == "ready":
            self.status_line.show("idle", f"made {what}", self.status_line.error)
            if news.run and not self.live.value:
                self.run()
        elif news.state == "stopped":
            self.status_line.show(
                "stopped", f"making {what} was stopped: change a control or press Run to retry"
            )
        else:
            self._fail(f"when: no concept vector for {news.name!r}: {news.error}", run_failed=True)

    def _run_request(self) -> SteerRequest:
        """``request()`` on the run thread, which starts the concept vector the row names
        (unless Stop dropped it since the last change: ``retry``). Until the vector is here
        the run ends at once, quietly (``_run_failed``), and its arrival starts a new one."""
        for row in self._condition_rows():
            row.make(run_after=True)
        try:
            return self.request()
        except (VectorPending, VectorStopped) as err:
            self._run_waits = err
            raise

    def _run_failed(self, message: str) -> None:
        """A run that failed. One that waits for the concept vector says so instead (the
        panes are stale until the run that follows it); one whose vector Stop dropped
        leaves Stop's word in the status line."""
        quiet, self._run_waits = self._run_waits, None
        if quiet is None:
            self._fail(message, run_failed=True)
        elif isinstance(quiet, VectorPending):
            self.status_line.show("idle", f"making {quiet.what}; the run follows when it is ready")
            if self.completions.panes:
                self._mark_stale(f"they wait for {quiet.what}")

    def _feature_max(self, source: str, index: int) -> float | None:
        """A feature's top activation in its index, for the "steer" row's slider."""
        try:
            self.engine.saes.check_index(source, index)
            return self.engine.feature_index(source)[index].max_act
        except SteerWidgetsError:
            return None

    def request(self) -> SteerRequest:
        """The request the current controls describe (STEERED only when a feature is picked)."""
        return read_request(self.view, self.controls, self.features_ui, self.when)

    def run(self) -> None:
        """Start a run now (cancelling any running one); returns at once, see ``wait``."""
        for row in self._condition_rows():
            row.retry()  # a concept vector Stop dropped is made again
        self.runner.start()

    def stop(self) -> None:
        """Cancel the pending and the running generation, and drop the "steer when" row's
        concept vector being made; the status line says stopped."""
        self.runs.stopped_run = self.runner.started
        busy = self.runner.busy
        self.runner.cancel()
        dropped = [row.stop() for row in self._condition_rows()]
        if not any(dropped) and busy:  # else the rows' news says it stopped
            self.status_line.show("stopped", "stopping…")

    def wait(self, timeout: float | None = 120.0) -> bool:
        """Block until the current run and its heatmap finished, a run that waits for the
        "steer when" row's concept vector included; False on timeout."""
        if timeout is not None:
            timeout = checks.number("timeout", timeout, minimum=0)
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        found = self.concept_sets.wait(timeout)  # an "add as features" click starts a run
        ok = self.runner.wait(left())  # a run may start making the concept vector...
        made = all([row.wait(left()) for row in self._condition_rows()])  # ...then a run
        ok = self.runner.wait(left()) and ok and made and found
        return self.heat.wait(left()) and self.explain.wait(left()) and ok

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
        """Color the heatmap by the picked feature in ``row`` (a feature's, not a concept's)."""
        try:
            checks.integer("row", row, 0, len(self.features) - 1)
        except RequestError as err:
            self._fail(err)
            return
        self.view.heat_feature.value = row

    def save_view(self, path) -> dict:
        """Write prompt, features, concepts, settings and outputs to a JSON file."""
        from .views import save_view

        return save_view(self, path)

    @classmethod
    def load_view(cls, path, engine=None, **kwargs) -> Explorer:
        """A new explorer from ``save_view``'s file; its run reproduces the saved tokens."""
        from .views import load_view

        return load_view(cls, path, engine, **kwargs)

    @classmethod
    def from_preset(cls, name: str, engine=None, **kwargs) -> Explorer:
        """A new explorer showing preset ``name`` (``sw.presets()`` lists them); runs once."""
        from ..engine import Engine
        from .presets import preset_view
        from .views import load_view

        engine = engine or Engine.default()
        return load_view(cls, preset_view(name, engine), engine, **kwargs)

    def _apply_view(self, view: dict) -> None:
        """Show a saved view (a preset) in this explorer; runs once even when not live."""
        from .views import apply_view

        apply_view(self, view)
        if not self.live.value:
            self.run()

    # -- evaluation ------------------------------------------------------------------------
    def evaluate(self, prompts: list | None = None, strengths=None, judge=None) -> bool:
        """Run the steering as the sliders set it (the x1 point) over ``prompts`` (``None``:
        the panel's list, at first the engine's shipped panel) and the ``strengths`` ladder
        (``None``: the panel's, at first 0, 0.5, 1, 1.5, 2, 3), in the evaluate panel;
        returns at once (False: refused, the panel says why, and a running evaluation runs
        on). Prompts and strengths go to the evaluation exactly as given (multi-line prompts,
        whole chats, every digit); the panel's boxes show them and are read back once edited.
        ``judge`` defaults to the concepts' names and the features' label words."""
        return self.evaluating.start(prompts, strengths, judge)

    def stop_evaluation(self) -> None:
        """Cancel the running evaluation within one decode step; finished rows stay."""
        self.evaluating.stop()

    def wait_evaluation(self, timeout: float | None = 300.0) -> bool:
        """Block until the running evaluation ended; False on timeout."""
        if timeout is not None:
            timeout = checks.number("timeout", timeout, minimum=0)
        return self.evaluating.wait(timeout)

    @property
    def evaluation(self):
        """The last evaluation shown in the panel (``Evaluation``; partial while running)."""
        return self.evaluating.evaluation

    def pick_strength(self, multiplier: float) -> None:
        """Set every slider to ``multiplier`` times its value at the last evaluation (what
        clicking a strength in the chart or the grid does)."""
        try:
            checks.number("multiplier", multiplier)
        except RequestError as err:
            self._fail(err)
            return
        self.evaluating.pick(multiplier)

    def _evaluated_steering(self) -> tuple[SteerRequest, list[str]]:
        request = self.request()
        if not (request.features or request.vectors):
            raise RequestError("steering", "pick a feature or add a concept to evaluate first")
        return request, judge_words(self.engine, self.features_ui.rows)

    # -- control flow --------------------------------------------------------------------
    @contextmanager
    def batch(self, run: bool = True) -> Iterator[None]:
        """Several control changes as one run: inside ``with ex.batch():`` changes schedule
        nothing, and the outermost batch schedules a single run at its end (none with
        ``run=False``). Why: loading a view or adding a feature changes many controls, and
        one run per change would start and cancel runs for settings nobody asked for."""
        checks.flag("run", run)
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
        for row in self._condition_rows():
            row.retry()  # a change after Stop makes a dropped concept vector
        self.evaluating.redraw()  # the chart's mark follows the sliders
        self.record_box.layout.display = "none"  # it described the previous settings
        if self.live.value:
            self.runner.schedule()
        elif self.request_done is not None:
            self._mark_stale("settings changed since: press Run")

    def _picked(self, source: str, index: int, strength: float | None = None) -> None:
        self.add_feature(source, index, strength)

    def _concept(self, name: str, vector: Vector) -> None:
        self.add_concept(name, vector)

    def _mark_stale(self, why: str) -> None:
        self.completions.stale = why
        if self.heatmap.rows:
            self.heatmap.stale = why

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

    # -- records -------------------------------------------------------------------------
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
