""" "add as features": a concept as the few SAE features that steer together, one row each.

The first click on a concept reads its requests through the model (tens of seconds on a
laptop CPU), so it runs on a worker thread and the kernel stays responsive while the status
line says what is happening; later clicks on the same concept hit the engine's caches and
take a fraction of a second. What was found, and how long it took, stays under the concept
box (a run that starts next rewrites the status line).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import ipywidgets as widgets

from .. import checks
from ..errors import SteerWidgetsError
from .picker import hint
from .status import StatusLine
from .worker import Worker

AddRows = Callable[[object], list[int]]  # a ConceptFeatures -> the rows added


class ConceptSets:
    """Finds a concept's features (``engine.concept_features``) and hands them to ``add``."""

    def __init__(
        self,
        engine,
        status_line: StatusLine,
        message: widgets.HTML,
        add: AddRows,
        on_error: Callable[[Exception], None],
    ) -> None:
        self.engine, self.status_line, self.message = engine, status_line, message
        self.add, self.on_error = add, on_error
        self._worker = Worker("sw-concept-features")

    def add_now(self, concept: str, k: int | None = None) -> list[int]:
        """Find and add ``concept``'s features on this thread; the rows added ([] when
        refused, and the status line says why)."""
        try:
            concept = checks.text("concept", concept).strip()
            self.status_line.show("finding", f"finding the SAE features that make up {concept!r}…")
            started = time.perf_counter()
            found = self.engine.concept_features(concept, k=k)
        except SteerWidgetsError as err:
            self.status_line.show("idle")
            self.on_error(err)
            return []
        seconds = time.perf_counter() - started
        self.message.value = hint(
            f"{len(found)} features of {concept!r} (their sum points along its concept vector "
            f"with cosine {found.cosine:.2f}), found in {seconds:.1f} s"
        )
        self.status_line.show("idle", f"added {len(found)} features of {concept!r}")
        return self.add(found)

    def submit(self, concept: str) -> bool:
        """The button's path: ``add_now`` on the worker thread."""
        return self._worker.submit(self.add_now, concept)

    def wait(self, timeout: float | None = None) -> bool:
        return self._worker.wait(timeout)

    def close(self) -> None:
        self._worker.close()
