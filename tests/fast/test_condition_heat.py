"""The heatmap of a condition's score marks where its token gate is on: tokens above an
``above=`` bound, below a ``below=`` bound, between the two of a band. No model: a scripted
``condition_scores``."""

from __future__ import annotations

from types import SimpleNamespace

import steer_widgets as sw
from steer_widgets.steering.results import Completion
from steer_widgets.widgets.heat_pipeline import HeatJob, heat_rows

SCALE = 2.0  # the condition's units: thresholds are read as SCALE times what was written


class ScoresOnly:
    """``condition_scores`` as the engine gives it: values, and the ``above`` bound (else the
    ``below`` one) in score units."""

    def condition_scores(self, when, prompt, completion=None):
        ids = [1, 7] + list(completion.token_ids if completion else [])
        text = SimpleNamespace(
            ids=ids, tokens=[str(i) for i in ids], special=[True] + [False] * (len(ids) - 1)
        )
        bound = when.above if when.above is not None else when.below
        return text, [0.5 * i for i in range(len(ids))], bound * SCALE


def _bounds(**thresholds):
    when = sw.When(sw.Feature("src", 3), **thresholds)
    outputs = {"STEERED": Completion("ab", (5, 6), "length")}
    job = HeatJob("hi", outputs, "", -1, True, None, condition=when)
    rows, bounds = heat_rows(ScoresOnly(), job)
    assert [r["label"] for r in rows] == ["prompt", "STEERED"]
    return bounds


def test_each_kind_of_bound_is_marked_as_its_gate_reads_it():
    assert _bounds(above=1.0) == (2.0, None)
    assert _bounds(below=1.5) == (None, 3.0)  # not an "above" line: a below= condition
    assert _bounds(above=0.5, below=1.5) == (1.0, 3.0)  # a band, both lines
