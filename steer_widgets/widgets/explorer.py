"""The explorer: feature picker, strength sliders, live side-by-side completions, heatmaps.

Composition and control flow only; the engine does the work. Every control change schedules
a run on a background thread (``Runner``: a lone change starts at once, a burst is debounced);
a newer run cancels and drains the older one. Everything a user can do with the mouse is also
a Python method, which is how the tests and benchmarks drive it::

    ex = sw.Explorer()                    # the offline default engine
    ex.add_feature("10-smollm2-res-4k", 123)
    ex.set_strength(0, 80); ex.wait()
    ex.outputs["STEERED"].text, ex.record(), ex.status
"""

from __future__ import annotations

import html
import json
import threading
import time
import traceback
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import ipywidgets as widgets

from ..errors import RequestError, SourceError, SteerWidgetsError
from ..results import Completion, SteerResult
from ..steering import METHODS, Feature, SteerRequest
from .completions import Completions, divergence
from .heatmap import Heatmap, heat_row
from .picker import FeaturePicker
from .runner import Runner

STRENGTH_RANGE = 300.0  # the reference tools' slider range
DEFAULT_STRENGTH = 40.0  # for features without a known max activation
TOP_K = 5  # top features per token kept in the heatmap state
DEFAULT_SWEEP = "-2, -1, 1, 2, 4"


@dataclass
class _Row:
    """One picked feature: its slider and the row widget that holds it."""

    source: str
    index: int
    slider: widgets.FloatSlider
    box: widgets.HBox


def _stats_line(stats: dict, keys: tuple[str, ...]) -> str:
    return " ".join(f"{k} {stats[k]}" for k in keys if k in stats)


class Explorer:
    """A live steering explorer on ``engine`` (default: ``Engine.default()``).

    Keyword settings (``prompt``, ``chat``, ``n_completion_tokens``, ``temperature``,
    ``freq_penalty``, ``seed``, ``strength_multiplier``, ``steer_method``,
    ``steer_special_tokens``, ``sweep``) set the initial controls; ``features`` is a list of
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
        n_completion_tokens: int = 32,
        temperature: float = 0.5,
        freq_penalty: float = 1.0,
        seed: int = 16,
        strength_multiplier: float = 1.0,
        steer_method: str = "SIMPLE_ADDITIVE",
        steer_special_tokens: bool = True,
        sweep: tuple[float, ...] | None = None,
        live: bool = True,
        debounce_s: float = 0.15,
    ) -> None:
        if engine is None:
            from ..engine import Engine

            engine = Engine.default()
        self.engine = engine
        self.outputs: dict[str, Completion] = {}
        self.request_done: SteerRequest | None = None  # the request behind ``outputs``
        self.default_generations = 0  # DEFAULT rows actually decoded (not from the cache)
        self.history: list[dict] = []  # one summary per finished or cancelled run
        self.last_run: dict = {}
        self.error = ""
        self.last_traceback = ""
        self._message = "idle"
        self._rows: list[_Row] = []
        self._tokens: dict[int, tuple[str, bool]] = {}
        self._heat_lock = threading.Lock()
        self._heat_thread: threading.Thread | None = None
        self.runner = Runner(self._work, debounce_s)
        self._build(prompt, chat, n_completion_tokens, temperature, freq_penalty, seed)
        self.multiplier.value = strength_multiplier
        self.method.value = steer_method
        self.special.value = steer_special_tokens
        if sweep:
            self.sweep_on.value = True
            self.sweep_text.value = ", ".join(f"{m:g}" for m in sweep)
        self.live.value = False  # one run for the whole initial state, not one per feature
        for f in features:
            self.add_feature(*f)
        self.live.value = live
        self._watch()
        if not self.engine.saes.sources():
            self._message = "no SAE sources registered: Engine(saes=[...]) adds some"
        self._refresh_status()
        if live:
            self.runner.schedule()

    # -- layout --------------------------------------------------------------------------
    def _build(self, prompt, chat, n_tokens, temperature, freq_penalty, seed) -> None:
        wide = {"description_width": "initial"}
        self.picker = FeaturePicker(self.engine, self._picked, self._fail)
        self.prompt = widgets.Textarea(
            value=prompt, rows=2, continuous_update=False, layout={"width": "98%"}
        )
        self.mode = widgets.ToggleButtons(
            options=["completion", "chat"], value="chat" if chat else "completion"
        )
        self.rows_box = widgets.VBox([])
        self.multiplier = widgets.FloatSlider(
            value=1.0, min=0.0, max=10.0, step=0.1, description="multiplier", style=wide
        )
        self.method = widgets.Dropdown(options=list(METHODS), description="method", style=wide)
        self.temperature = widgets.FloatSlider(
            value=temperature, min=0.0, max=2.0, step=0.05, description="temperature", style=wide
        )
        self.freq_penalty = widgets.FloatSlider(
            value=freq_penalty, min=0.0, max=2.0, step=0.05, description="freq_penalty", style=wide
        )
        self.seed = widgets.IntText(value=seed, description="seed", layout={"width": "10em"})
        self.n_tokens = widgets.IntSlider(
            value=n_tokens, min=1, max=256, description="tokens", style=wide
        )
        self.special = widgets.Checkbox(
            value=True, description="steer special tokens", indent=False
        )
        self.sweep_on = widgets.Checkbox(value=False, description="strength sweep", indent=False)
        self.sweep_text = widgets.Text(
            value=DEFAULT_SWEEP, continuous_update=False, layout={"width": "12em"}
        )
        self.live = widgets.Checkbox(value=True, description="live", indent=False)
        self.run_button = widgets.Button(description="Run", button_style="primary")
        self.stop_button = widgets.Button(description="Stop")
        self.record_button = widgets.Button(description="Record")
        self.record_box = widgets.Textarea(layout={"width": "98%", "display": "none"}, rows=8)
        self.completions = Completions()
        self.heatmap = Heatmap()
        self.heat_feature = widgets.Dropdown(options=[], description="heatmap of", style=wide)
        self.status_html = widgets.HTML("")
        controls = widgets.VBox(
            [
                widgets.HBox([self.multiplier, self.method]),
                widgets.HBox([self.temperature, self.freq_penalty, self.seed]),
                widgets.HBox([self.n_tokens, self.special, self.sweep_on, self.sweep_text]),
            ]
        )
        self.ui = widgets.VBox(
            [
                self.picker.ui,
                widgets.HTML("<b>Steering features</b>"),
                self.rows_box,
                controls,
                widgets.HBox([self.mode, self.live, self.run_button, self.stop_button]),
                self.prompt,
                self.completions,
                self.heat_feature,
                self.heatmap,
                widgets.HBox([self.record_button]),
                self.record_box,
                self.status_html,
            ]
        )

    def _watch(self) -> None:
        for w in (
            self.prompt,
            self.mode,
            self.multiplier,
            self.method,
            self.temperature,
            self.freq_penalty,
            self.seed,
            self.n_tokens,
            self.special,
            self.sweep_on,
            self.sweep_text,
        ):
            w.observe(self._changed, names="value")
        self.heat_feature.observe(lambda _: self._heat_in_background(), names="value")
        self.run_button.on_click(lambda _: self.run())
        self.stop_button.on_click(lambda _: self.stop())
        self.record_button.on_click(lambda _: self._show_record())

    def _ipython_display_(self, **kwargs) -> None:
        from IPython.display import display

        display(self.ui)

    # -- Python API ----------------------------------------------------------------------
    def add_feature(self, source: str, index: int, strength: float | None = None) -> int:
        """Pick a feature: adds a strength slider row; returns its row number."""
        try:
            cfg = self.engine.saes.config(source)
            if not 0 <= int(index) < cfg.d_sae:
                raise SourceError(source, f"feature index {index} out of range 0..{cfg.d_sae - 1}")
            info = self._info(source, index)
            if strength is None:
                strength = info.max_act if info and info.max_act else DEFAULT_STRENGTH
        except SteerWidgetsError as err:
            self._fail(err)
            return -1
        limit = max(STRENGTH_RANGE, abs(float(strength)))
        slider = widgets.FloatSlider(
            value=float(strength), min=-limit, max=limit, step=1.0, description=f"#{index}"
        )
        slider.add_class("sw-strength")
        remove = widgets.Button(description="✕", layout={"width": "2.5em"})
        near = widgets.Button(description="≈", layout={"width": "2.5em"})
        label = widgets.HTML(self._label(source, info))
        row = _Row(source, int(index), slider, widgets.HBox([slider, near, remove, label]))
        remove.on_click(lambda _: self.remove_feature(self._rows.index(row)))
        near.on_click(lambda _: self.picker.neighbours(row.source, row.index))
        slider.observe(self._changed, names="value")
        self._rows.append(row)
        self.rows_box.children = tuple(r.box for r in self._rows)
        self._sync_heat_options()
        self._changed()
        return len(self._rows) - 1

    def set_strength(self, row: int, value: float) -> None:
        """Move a feature's slider (as a user would); a live explorer reruns after debounce."""
        self._rows[row].slider.value = float(value)

    def remove_feature(self, row: int) -> None:
        """Drop a picked feature and its slider."""
        self._rows.pop(row)
        self.rows_box.children = tuple(r.box for r in self._rows)
        self._sync_heat_options()
        self._changed()

    @property
    def features(self) -> list[Feature]:
        return [Feature(r.source, r.index, float(r.slider.value)) for r in self._rows]

    def set(self, **settings: Any) -> None:
        """Set controls by request field name, e.g. ``set(temperature=0, seed=3)``."""
        widgets_by_field = {
            "prompt": self.prompt,
            "strength_multiplier": self.multiplier,
            "steer_method": self.method,
            "temperature": self.temperature,
            "freq_penalty": self.freq_penalty,
            "seed": self.seed,
            "n_completion_tokens": self.n_tokens,
            "steer_special_tokens": self.special,
        }
        for name, value in settings.items():
            if name == "chat":
                self.mode.value = "chat" if value else "completion"
            elif name == "sweep":
                self.sweep_on.value = bool(value)
                if value:
                    self.sweep_text.value = ", ".join(f"{m:g}" for m in value)
            elif name in widgets_by_field:
                widgets_by_field[name].value = value
            else:
                raise TypeError(f"unknown setting {name!r}")

    def request(self) -> SteerRequest:
        """The request the current controls describe (STEERED only when a feature is picked)."""
        text = self.prompt.value
        prompt = [{"role": "user", "content": text}] if self.mode.value == "chat" else text
        features = tuple(self.features)
        sweep: tuple[float, ...] = ()
        if self.sweep_on.value and features:
            try:
                sweep = tuple(float(s) for s in self.sweep_text.value.replace(",", " ").split())
            except ValueError as err:
                raise RequestError(
                    "sweep", f"expected numbers, got {self.sweep_text.value!r}"
                ) from err
        return SteerRequest(
            prompt=prompt,
            features=features,
            types=("DEFAULT", "STEERED") if features else ("DEFAULT",),
            steer_method=self.method.value,
            strength_multiplier=float(self.multiplier.value),
            steer_special_tokens=bool(self.special.value),
            n_completion_tokens=int(self.n_tokens.value),
            temperature=float(self.temperature.value),
            freq_penalty=float(self.freq_penalty.value),
            seed=int(self.seed.value),
            sweep=sweep,
        )

    def run(self) -> None:
        """Start a run now (cancelling any running one); returns at once, see ``wait``."""
        self.runner.start()

    def stop(self) -> None:
        """Cancel the pending and the running generation."""
        self.runner.cancel()

    def wait(self, timeout: float | None = 120.0) -> bool:
        """Block until the current run (and its heatmap) finished; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ok = self.runner.wait(timeout)
        heat = self._heat_thread
        if heat is not None:
            heat.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            ok = ok and not heat.is_alive()
        return ok

    @property
    def status(self) -> str:
        """The status line as plain text: what the engine does, caches, the last error."""
        text = self._message
        if self.error:
            text += f" | error: {self.error}"
        return text

    def record(self) -> dict:
        """Settings and outputs of the last finished run; ``engine.steer(record)`` replays it."""
        if self.request_done is None:
            raise RequestError("record", "nothing has run yet: call run() and wait()")
        return self._result().to_dict()

    def sweep_frame(self):
        """The last run's outputs as a pandas DataFrame: one row per DEFAULT/STEERED/sweep."""
        if self.request_done is None:
            raise RequestError("record", "nothing has run yet: call run() and wait()")
        return self._result().to_frame()

    def show_activations(self, row: int) -> None:
        """Color the heatmap by the picked feature in ``row``."""
        self.heat_feature.value = row

    # -- control flow --------------------------------------------------------------------
    def _changed(self, _change=None) -> None:
        if self.live.value:
            self.runner.schedule()

    def _picked(self, source: str, index: int) -> None:
        self.add_feature(source, index)

    def _work(self, cancel: threading.Event) -> None:
        """One run on the runner's thread: stream frames into the panes, then the heatmap."""
        started = time.perf_counter()
        run = {"started_at": started, "first_frame_at": None, "first_steered_at": None}
        self.last_run = run
        try:
            req = self.request()
            run["request"] = req
            self._set_status("preparing (loading SAE if needed)…")
            prompt_text = self.engine.text(req.prompt)
            frame = None
            with closing(self.engine.steer_stream(req, cancel)) as stream:
                for frame in stream:
                    if run["first_frame_at"] is None:
                        run["first_frame_at"] = time.perf_counter()
                        default = frame.outputs.get("DEFAULT")
                        run["default_cached"] = default is not None and default.stop != ""
                        if default is not None and not run["default_cached"]:
                            self.default_generations += 1
                    self._show(req, prompt_text, frame)
                    steered = frame.outputs.get("STEERED")
                    if steered and steered.token_ids and run["first_steered_at"] is None:
                        run["first_steered_at"] = time.perf_counter()
                    self._progress(req, frame.step, started, run)
            run["done_at"] = time.perf_counter()
            run["outputs"] = dict(frame.outputs) if frame else {}
            run["cancelled"] = cancel.is_set()
            self.history.append(run)
            if cancel.is_set():
                self._set_status("cancelled (a newer change replaced this run)")
                return
            self.outputs, self.request_done, self.error = dict(frame.outputs), req, ""
            self._heatmap(cancel)
            self._set_status(self._summary(req, frame.step, started, run))
        except SteerWidgetsError as err:
            self._fail(err)
        except Exception as err:  # keep the UI alive; the traceback stays inspectable
            self.last_traceback = traceback.format_exc()
            self._fail(f"{type(err).__name__}: {err}")

    def _show(self, req: SteerRequest, prompt_text, frame) -> None:
        """Put a frame's outputs into the panes, marking where STEERED departs from DEFAULT."""
        outs = frame.outputs
        default = outs.get("DEFAULT")
        self._learn_tokens(req.prompt, len(prompt_text.ids), [c.token_ids for c in outs.values()])
        panes = []
        for label, comp in outs.items():
            tokens = [self._tokens[i] for i in comp.token_ids]
            if label == "DEFAULT":
                other = outs.get("STEERED")
                diverge = (
                    divergence(comp.token_ids, other.token_ids, other.stop != "") if other else -1
                )
            else:
                diverge = divergence(comp.token_ids, default.token_ids, default.stop != "")
            panes.append(
                {
                    "label": label,
                    "tokens": [t for t, _ in tokens],
                    "special": [s for _, s in tokens],
                    "diverge": diverge,
                    "stop": comp.stop,
                    "streaming": not frame.done,
                    "note": "",
                }
            )
        if "STEERED" not in outs:
            note = "pick a feature to steer"
            panes.append(self._empty_pane("STEERED", note))
        prompt = "".join(
            t for t, s in zip(prompt_text.tokens, prompt_text.special, strict=True) if not s
        )
        with self.completions.hold_sync():
            self.completions.prompt = prompt
            self.completions.panes = panes

    @staticmethod
    def _empty_pane(label: str, note: str) -> dict:
        return {
            "label": label,
            "tokens": [],
            "special": [],
            "diverge": -1,
            "stop": "",
            "streaming": False,
            "note": note,
        }

    def _learn_tokens(self, prompt, base: int, id_lists) -> None:
        """Token strings for new ids, one ``engine.text`` call per frame at most."""
        new = sorted({i for ids in id_lists for i in ids if i not in self._tokens})
        if not new:
            return
        text = self.engine.text(prompt, new)
        for i, tok, special in zip(new, text.tokens[base:], text.special[base:], strict=True):
            self._tokens[i] = (tok, special)

    # -- heatmap -------------------------------------------------------------------------
    def _heat_choice(self) -> _Row | None:
        row = self.heat_feature.value
        return self._rows[row] if row is not None and 0 <= row < len(self._rows) else None

    def _sync_heat_options(self) -> None:
        current = self.heat_feature.value
        options = [(f"{r.source} #{r.index}", i) for i, r in enumerate(self._rows)]
        self.heat_feature.options = options
        if options:
            self.heat_feature.value = (
                current if current is not None and current < len(options) else 0
            )

    def _heat_in_background(self) -> None:
        """Recolor for another feature without regenerating (unless a run will do it)."""
        if self.runner.busy or self.request_done is None:
            return
        thread = threading.Thread(target=self._heatmap_guarded, daemon=True)
        self._heat_thread = thread
        thread.start()

    def _heatmap_guarded(self) -> None:
        try:
            self._heatmap(threading.Event())
        except SteerWidgetsError as err:
            self._fail(err)
        except Exception as err:
            self.last_traceback = traceback.format_exc()
            self._fail(f"{type(err).__name__}: {err}")

    def _heatmap(self, cancel: threading.Event) -> None:
        """Prompt and each completion colored by the chosen feature, with top-k per token."""
        choice, req = self._heat_choice(), self.request_done
        if choice is None or req is None:
            self.heatmap.show("pick a feature to see its activations", [])
            return
        with self._heat_lock:
            rows = []
            for label in ("DEFAULT", "STEERED"):
                comp = self.outputs.get(label)
                if comp is None or cancel.is_set():
                    continue
                acts = self.engine.activations(req.prompt, choice.source, choice.index, comp)
                top = self.engine.top_features_per_token(req.prompt, choice.source, TOP_K, comp)
                pairs = list(zip(top.indices, top.values, strict=True))
                n = len(acts.tokens) - len(comp.token_ids)
                if not rows:
                    rows.append(
                        heat_row(
                            "prompt", acts.tokens[:n], acts.values[:n], acts.special[:n], pairs[:n]
                        )
                    )
                rows.append(
                    heat_row(label, acts.tokens[n:], acts.values[n:], acts.special[n:], pairs[n:])
                )
            if not cancel.is_set():
                self.heatmap.show(f"activation of {choice.source} #{choice.index}", rows)

    # -- status and records --------------------------------------------------------------
    def _progress(self, req: SteerRequest, step: int, started: float, run: dict) -> None:
        elapsed = time.perf_counter() - started
        rate = step / elapsed if elapsed > 0 else 0.0
        cached = " · DEFAULT from cache" if run.get("default_cached") else ""
        self._set_status(
            f"generating {step}/{req.n_completion_tokens} tokens, {rate:.1f} tokens/s{cached}"
        )

    def _summary(self, req: SteerRequest, step: int, started: float, run: dict) -> str:
        elapsed = run["done_at"] - started
        rate = step / elapsed if elapsed > 0 else 0.0
        first = run["first_steered_at"]
        first_ms = f", first steered token {1000 * (first - started):.0f} ms" if first else ""
        cached = " · DEFAULT from cache" if run.get("default_cached") else ""
        return f"done: {step} steps in {elapsed:.2f} s ({rate:.1f} tokens/s){first_ms}{cached}"

    def _set_status(self, message: str) -> None:
        self._message = message
        self._refresh_status()

    def _fail(self, err) -> None:
        """Show an error in the status line; the explorer stays usable."""
        self.error = str(err)
        self._refresh_status()

    def _refresh_status(self) -> None:
        try:
            sae = _stats_line(self.engine.saes.stats(), ("hits", "misses", "evictions"))
            mb = self.engine.saes.stats().get("resident_bytes", 0) / 2**20
            res = _stats_line(self.engine.residual_cache.stats(), ("hits", "misses", "entries"))
            caches = f"SAE cache: {sae}, {mb:.1f} MB · residual cache: {res}"
        except Exception:  # stats are informative only
            caches = ""
        err = (
            f"<div style='color:#c62828'><b>error:</b> {html.escape(self.error)}</div>"
            if self.error
            else ""
        )
        self.status_html.value = (
            f"<div class='sw-status'>{html.escape(self._message)}</div>{err}"
            f"<div style='opacity:0.6;font-size:0.85em'>{html.escape(caches)}</div>"
        )

    def _result(self) -> SteerResult:
        return self.engine.result(self.request_done, self.outputs)

    def _show_record(self) -> None:
        try:
            self.record_box.value = json.dumps(self.record(), indent=1)
            self.record_box.layout.display = None
        except SteerWidgetsError as err:
            self._fail(err)

    @staticmethod
    def _label(source: str, info) -> str:
        tokens = ", ".join(repr(t) for t in info.top_tokens[:5]) if info else ""
        return f"<code>{html.escape(source)}</code> {html.escape(tokens)}"

    def _info(self, source: str, index: int):
        try:
            return self.engine.feature_index(source)[int(index)]
        except (SteerWidgetsError, IndexError):
            return None
