"""The explorer's "why did the text change": effect colouring, a token's attribution table,
and "what changed" beside the heatmap, wired to the engine's ``steering_effect``,
``attribute`` and ``steering_features`` (``analysis/explain.py``).

Each finished run hands its outputs to ``shown``, which returns at once: a worker thread
reads the effects when the colouring is on (one cached forward per steered output) and "what
changed" (one forward to the SAE's layer), so the next run never waits for them; a newer run
replaces work not yet started, and ``wait`` blocks until it is done. A click on a token
computes its attribution (about a second on the default model) and puts the table into the
panes' state. Engines without these methods (remote ones) leave the panel empty.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..analysis.gradients import local_runtime
from ..errors import SteerWidgetsError
from ..steering.results import SteerResult, cut_short
from .completions import Completions, effect_state
from .heatmap import Heatmap, changed_rows
from .worker import Worker

N_CHANGED = 8  # rows of "what changed"
N_FEATURES = 8  # SAE features in an attribution table


class ExplainPanel:
    """Keeps the panes' effects and attribution, and the heatmap's side list, current."""

    def __init__(
        self,
        engine,
        completions: Completions,
        heatmap: Heatmap,
        show_feature: Callable[[str, int], None],
        on_error: Callable[[str], None],
        open_card: Callable[[str, int], None] | None = None,
        steer_with: Callable[[str, int], object] | None = None,
    ) -> None:
        self.engine, self.completions, self.heatmap = engine, completions, heatmap
        self.show_feature, self.on_error = show_feature, on_error
        self.actions = {"card": open_card, "steer": steer_with}
        self.result: SteerResult | None = None
        self.available = local_runtime(engine.model.runtime)
        self._lock = threading.Lock()
        self._worker = Worker("sw-explain")
        self._epoch = 0  # bumped by every run shown: older work is dropped
        completions.observe(lambda _: self._effects(), names="effect_on")
        completions.observe(lambda c: self._clicked(c["new"]), names="selected")
        heatmap.observe(lambda c: self._picked(c["new"]), names="picked")
        completions.observe(lambda c: self._act(c["new"]), names="feature_action")

    def shown(self, request, outputs: dict) -> None:
        """A run finished with ``outputs``: refresh effects and "what changed" (returns at
        once; a cancelled run changes nothing)."""
        if not self.available or cut_short(outputs):
            return
        self._epoch += 1
        epoch = self._epoch
        self._worker.submit(self._refresh, request, dict(outputs), epoch)  # closed: dropped

    def close(self) -> None:
        """Drops queued work and lets the worker thread end (after the item it is on)."""
        self._epoch += 1
        self._worker.close()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the last run's effects and "what changed" are shown."""
        return self._worker.wait(timeout)

    def _refresh(self, request, outputs: dict, epoch: int) -> None:
        if epoch != self._epoch:
            return  # a newer run was shown meanwhile
        try:
            self.result = self.engine.result(request, outputs)
            with self.completions.hold_sync():
                self.completions.effects = {}
                self.completions.attribution = {}
                self.completions.selected = {}
            self._effects()
            self._changed()
        except Exception as err:  # keep the explorer alive; say what failed
            self.on_error(f"{type(err).__name__}: {err}")

    def source(self) -> str | None:
        """Which SAE "what changed" reads: the first steering feature's, else the first SAE
        at or after a steering vector's layer, else none."""
        result = self.result
        if result is None:
            return None
        if result.request.features:
            return result.request.features[0].source
        from ..runtime.protocol import hook_layer

        layers = [hook_layer(v.hook) or 0 for v in result.request.vectors]
        saes = self.engine.saes
        later = [s for s in saes.sources() if layers and (saes.config(s).layer or 0) >= min(layers)]
        return later[0] if later else None

    def _steered(self) -> list[str]:
        return [label for label in self.result.outputs if label != "DEFAULT"] if self.result else []

    def _effects(self) -> None:
        if not (self.completions.effect_on and self.result and self.available):
            return
        try:
            effects = {
                label: effect_state(self.engine.steering_effect(self.result, label))
                for label in self._steered()
                if self.result.outputs[label].token_ids
            }
        except SteerWidgetsError as err:
            self.on_error(str(err))
            return
        self.completions.effects = effects

    def _changed(self) -> None:
        source = self.source()
        if source is None or "STEERED" not in self.result.outputs or not self._has_default():
            self.heatmap.changed, self.heatmap.changed_title = [], ""
            return
        try:
            changed = self.engine.steering_features(self.result, source, N_CHANGED)
        except SteerWidgetsError as err:
            self.heatmap.changed, self.heatmap.changed_title = [], ""  # not an older run's list
            self.on_error(str(err))
            return
        with self.heatmap.hold_sync():
            self.heatmap.changed_title = f"what changed ({source}, mean over the completion)"
            self.heatmap.changed = changed_rows(changed)

    def _has_default(self) -> bool:
        return "DEFAULT" in self.result.outputs

    def _clicked(self, selected: dict) -> None:
        if not selected or self.result is None or not self.available:
            return
        self.attribute(selected["label"], selected["position"])

    def attribute(self, label: str, position: int):
        """The attribution table of one token (also what a click on it shows)."""
        with self._lock:
            try:
                a = self.engine.attribute(self.result, label, position, n=N_FEATURES)
            except SteerWidgetsError as err:
                self.completions.attribution = {"label": label, "position": position,
                                                "error": str(err)}  # fmt: skip
                return None
            self.completions.attribution = a.to_dict()
            return a

    def _act(self, action: dict) -> None:
        """A feature's "card" or "steer" button in the attribution table."""
        fn = self.actions.get(action.get("action")) if action else None
        if fn is not None:
            fn(action["source"], int(action["index"]))

    def _picked(self, picked: dict) -> None:
        if picked:
            self.show_feature(picked["source"], int(picked["index"]))
