"""What the heatmap colours: the menu's choice of row, and the outputs the panes show.

Why a module of its own: the menu follows the strength rows (a feature or a concept each),
and a new choice recolours the outputs already shown instead of starting a run. This keeps
the last shown outputs and hands each job to ``HeatPipeline``, which never blocks a run.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as widgets

from ..steering.requests import Feature, SteerRequest, Vector
from .feature_rows import FeatureRows
from .heat_pipeline import HeatJob, HeatPipeline, heat_job


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
    ) -> None:
        self.menu, self.rows, self.heat = menu, rows, heat
        self.busy, self.on_final = busy, on_final
        self.shown: tuple[SteerRequest, dict] | None = None  # what the heatmap colours

    def choice(self) -> Feature | tuple[str, Vector] | None:
        """The menu's choice: a feature, or a concept row's ``(name, Vector)``."""
        i = self.menu.value
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
        self.menu.options = options
        if options:
            values = [v for _, v in options]
            self.menu.value = current if current in values else values[0]

    def submit(self, req: SteerRequest, outputs: dict, final: bool, run: dict) -> None:
        """Hand the shown outputs to the heatmap worker; never waits for it."""
        if final and run:  # a run finished (not a recolouring): effects, "what changed"
            self.on_final(req, outputs)
        choice = self.choice()
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
