"""The "steer when" row without a model: its concept vector is made on the row's worker,
never by ``condition()``, and the concept slider's stops fit a cosine.

The fake ``concept_vector`` blocks off the test's thread until released (so a test can look
at the row while the vector is being made) and returns at once on the test's own thread,
where it counts a call that should never happen: work counted, never timed."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import torch

from steer_widgets.errors import RequestError
from steer_widgets.steering.entries import Vector, When
from steer_widgets.widgets.condition_row import COSINE_RANGE, ConditionRow

VECTOR = Vector(torch.ones(8) / 8**0.5, "blocks.1.hook_resid_post", 1.0)


class FakeVectors:
    def __init__(self, error: Exception | None = None) -> None:
        self.calls: list[str] = []
        self.on_caller = 0  # calls made on the test's (the UI's) thread
        self.entered, self.release = threading.Event(), threading.Event()
        self.error = error
        self.main = threading.current_thread()

    def __call__(self, name: str) -> Vector:
        if threading.current_thread() is self.main:
            self.on_caller += 1
            return VECTOR
        self.calls.append(name)
        self.entered.set()
        assert self.release.wait(60), "the test never released the fake"
        if self.error is not None:
            raise self.error
        return VECTOR


def make_row(vectors, top: float = 10.0):
    changes, news = [], []
    row = ConditionRow(lambda: changes.append(1), lambda _s, _i: top, vectors, news.append)
    return row, changes, news


def test_the_concept_slider_has_cosine_sized_stops_after_a_large_feature():
    vectors = FakeVectors()
    vectors.release.set()
    row, _, _ = make_row(vectors, top=200.0)
    row.kind.value = "feature"
    row.what.value = "5-smollm2-res-4k #3187"
    assert row.threshold.step == pytest.approx(1.0)  # 200 stops over the feature's top
    row.kind.value = "concept"
    t = row.threshold
    assert (t.min, t.max, t.value) == (-COSINE_RANGE, COSINE_RANGE, 0.05)
    assert (t.max - t.min) / t.step >= 60
    stops_to_default = (0.05 - t.min) / t.step  # the front end snaps to min + k * step
    assert stops_to_default == pytest.approx(round(stops_to_default), abs=1e-6)
    row.close()


@contextmanager
def naming_food(vectors):
    """A row whose concept kind names "food" (its vector then made on the row's worker);
    closed after, the fake released."""
    row, changes, news = make_row(vectors)
    try:
        row.kind.value = "concept"
        row.what.value = "food"
        yield row, changes, news
    finally:
        vectors.release.set()
        row.close()


def test_condition_never_makes_the_vector_and_its_arrival_asks_for_a_run():
    vectors = FakeVectors()
    with naming_food(vectors) as (row, changes, news):
        with pytest.raises(RequestError, match="'food' is still being made"):
            row.condition()
        assert vectors.on_caller == 0
        assert vectors.entered.wait(60) and vectors.calls == ["food"]
        assert row.making == "food" and "making" in row.summary.value
        assert [(n.state, n.name) for n in news] == [("making", "food")]
        before = len(changes)
        vectors.release.set()
        assert row.wait(60)
        assert row.condition() == When(VECTOR, above=0.05, scope="token", reduce="mean")
        assert len(changes) == before + 1  # the row asks for the run that now can go
        assert [n.state for n in news] == ["making", "ready"] and row.making is None
        row.kind.value = "always"
        row.kind.value = "concept"  # back to the concept: its text and vector come back
        assert row.what.value == "food" and row.condition().on == VECTOR
        assert vectors.calls == ["food"] and vectors.on_caller == 0


def test_stop_drops_the_vector_being_made_and_make_starts_it_again():
    vectors = FakeVectors()
    with naming_food(vectors) as (row, changes, news):
        assert vectors.entered.wait(60)
        assert row.stop() == "food" and row.stop() is None  # nothing left to stop
        assert row.wait(0) and row.making is None and news[-1].state == "stopped"
        assert "stopped" in row.summary.value
        with pytest.raises(RequestError, match="stopped"):
            row.condition()
        assert not row.make(run_after=True)  # a run that began before Stop leaves it stopped
        before = len(changes)
        row.retry()  # a later change (or Run)
        assert row.make(run_after=True)  # is made again (queued behind the dropped job)
        vectors.release.set()
        assert row.wait(60)
        assert vectors.calls == ["food"]  # the dropped job's vector was kept, not remade
        assert row.condition().on == VECTOR and len(changes) == before + 1
        assert (news[-1].state, news[-1].run) == ("ready", True)


def test_a_vector_that_cannot_be_made_is_an_error_and_a_new_name_retries():
    vectors = FakeVectors(RequestError("positive", "does not differ from the negatives"))
    row, changes, news = make_row(vectors)
    try:
        row.kind.value = "concept"
        before = len(changes)
        row.what.value = "food"
        vectors.release.set()
        assert row.wait(60)
        assert news[-1].state == "failed" and "does not differ" in news[-1].error
        assert len(changes) == before + 1  # the text change's own, none for the failure
        with pytest.raises(RequestError, match="no concept vector for 'food'.*does not differ"):
            row.condition()
        assert not row.make(run_after=True)  # a run does not retry a failure over and over
        vectors.error = None
        row.what.value = "music"
        assert row.wait(60) and row.condition().on == VECTOR
        assert vectors.calls == ["food", "music"] and vectors.on_caller == 0
    finally:
        vectors.release.set()
        row.close()
