"""What the heatmap colours: the menu's choice of row, and the outputs the panes show.

Why a module of its own: the menu follows the strength rows (a feature or a concept each),
and a new choice recolours the outputs already shown instead of starting a run. This keeps
the last shown outputs and hands each job to ``HeatPipeline``, which never blocks a run.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets

from ..steering.entries import When
from ..steering.requests import Feature, SteerRequest, Vector
from .feature_rows import FeatureRows
from .heat_pipeline import HeatJob, HeatPipeline, heat_job

CONDITION = "condition"  # the menu's value for the request's condition


class HeatMenu:
    """The heatmap's menu (``menu``) over ``rows``; ``submit`` is a run's frame callback.

    ``busy()`` says a run is going (its next frame picks up a new choice); ``on_final`` gets
    each finished run's outputs (the explain panel's effects and "what changed").
    """

    def __init__(
        self,
        menu: widgets.Dropdown,
        rows: FeatureRows,
        heat: HeatPipeline,
        busy: Callable[[], bool],
        on_final: Callable[[SteerRequest, dict], None],
        gated: Callable[[], bool] = lambda: False,
    ) -> None:
        self.menu, self.rows, self.heat = menu, rows, heat
        self.busy, self.on_final, self.gated = busy, on_final, gated
        self.shown: tuple[SteerRequest, dict] | None = None  # what the heatmap colours

    def choice(self) -> Feature | tuple[str, Vector] | str | None:
        """The menu's choice: a feature, a concept row's ``(name, Vector)``, or
        ``"condition"`` (the score of the request's condition)."""
        i = self.menu.value
        if i == CONDITION:
            return CONDITION
        if isinstance(i, tuple):  # ("concept", j): the residual's projection on its vector
            concepts = self.concepts()
            return concepts[i[1]] if i[1] < len(concepts) else None
        feats = self.rows.features()
        return feats[i] if i is not None and 0 <= i < len(feats) else None

    def concepts(self) -> list[tuple[str, Vector]]:
        """The concept rows as ``(name, Vector)``, in the order the menu lists them."""
        return [(r.name, r.vector) for r in self.rows.rows if r.vector is not None]

    def sync(self) -> None:
        """Options after rows came or went; the choice stays where its row still exists."""
        current = self.menu.value
        options = [(f"{f.source} #{f.index}", i) for i, f in enumerate(self.rows.features())]
        options += [(f"concept {n}", ("concept", j)) for j, (n, _) in enumerate(self.concepts())]
        if self.gated():
            options.append(("the condition's score", CONDITION))
        if options == [tuple(o) for o in self.menu.options]:
            return  # nothing came, went or was renamed (a row's place is not its name)
        self.menu.options = options
        if options:
            values = [v for _, v in options]
            self.menu.value = current if current in values else values[0]

    def submit(self, req: SteerRequest, outputs: dict, final: bool, run: dict) -> None:
        """Hand the shown outputs to the heatmap worker; never waits for it."""
        if final and run:  # a run finished (not a recolouring): effects, "what changed"
            self.on_final(req, outputs)
        choice = self.choice()
        if choice == CONDITION:
            if not isinstance(req.when, When):
                self.heat.clear("the condition is not one score: pick a feature")
                return
            choice = (CONDITION, req.when)
        if choice is None:
            self.heat.clear("pick a feature to see its activations")
            return

        def shown(at: float) -> None:
            run["heat_at"] = at

        self.shown = (req, outputs)
        self.heat.submit(heat_job(req.prompt, outputs, choice, final, shown))

    def recolor(self) -> None:
        """Another feature for the heatmap: recolor what the panes show, no new run."""
        if self.shown is None or self.busy():
            return  # the running run's next frame uses the new choice
        req, outputs = self.shown
        self.submit(req, outputs, True, {})

    def heat_of(self, source: str, index: int) -> None:
        """Heatmap of any feature (a "what changed" row) over what the panes show."""
        if self.shown is not None:
            req, outputs = self.shown
            self.heat.submit(HeatJob(req.prompt, outputs, source, index))
