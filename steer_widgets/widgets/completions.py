"""Side-by-side completions (DEFAULT, STEERED, sweep rows) with the divergence marked.

An anywidget: panes are plain traitlets, drawn in the browser, so they stream live in a
kernel session and still render in a static HTML export.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anywidget
import traitlets

_ESM = (Path(__file__).parent / "completions.js").read_text()


class Completions(anywidget.AnyWidget):
    """``panes``: ``[{label, tokens, special, diverge, stop, streaming, note}]``.

    ``diverge`` is the first token position where this pane departs from the other side
    (DEFAULT vs STEERED/sweep), or -1 while they still agree.
    """

    _esm = traitlets.Unicode(_ESM).tag(sync=True)
    prompt = traitlets.Unicode("").tag(sync=True)
    panes = traitlets.List([]).tag(sync=True)

    def text(self, label: str) -> str:
        """The text a pane shows (its tokens joined), e.g. ``text("STEERED")``."""
        for p in self.panes:
            if p["label"] == label:
                return "".join(p["tokens"])
        raise KeyError(label)

    def pane(self, label: str) -> dict:
        for p in self.panes:
            if p["label"] == label:
                return p
        raise KeyError(label)


def divergence(ids: Sequence[int], reference: Sequence[int], reference_done: bool) -> int:
    """First position where ``ids`` departs from ``reference``; -1 while none is known.

    A sequence that is still a prefix of an unfinished reference has not departed yet; one
    that runs past a finished reference departs where the reference ended.
    """
    for i, (a, b) in enumerate(zip(ids, reference, strict=False)):
        if a != b:
            return i
    if reference_done and len(ids) > len(reference):
        return len(reference)
    return -1
