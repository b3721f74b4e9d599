"""The explorer while the "steer when" row's concept vector is being made, on the real
default engine: no public call waits for it, the run follows it, Stop and close reach it.

``engine.concept_vector`` is replaced by a fake that blocks off the test's thread until the
test releases it and returns a real direction of the model at once (a unit vector at the
concept hook): the tests count calls and look at the explorer while the fake is blocked,
never time anything. A call on the test's own thread is the UI thread computing: counted,
and it returns at once so the test fails instead of hanging."""

from __future__ import annotations

import threading

import pytest
import torch

import steer_widgets as sw
from steer_widgets.errors import RequestError
from steer_widgets.widgets import Explorer

FEATURE = ("10-smollm2-res-4k", 100, 30.0)


class BlockingVectors:
    def __init__(self, engine) -> None:
        hook = engine.concepts.default_hook()
        width = engine.model.runtime.hook_widths()[hook]
        g = torch.Generator().manual_seed(0)
        direction = torch.nn.functional.normalize(torch.randn(width, generator=g), dim=0)
        self.vector = sw.Vector(direction, hook, 1.0)
        self.calls: list[str] = []
        self.on_caller = 0
        self.entered, self.release = threading.Event(), threading.Event()
        self.main = threading.current_thread()

    def __call__(self, name, negative=None, hook=None):
        if threading.current_thread() is self.main:
            self.on_caller += 1
            return self.vector
        self.calls.append(name)
        self.entered.set()
        assert self.release.wait(120), "the test never released the fake"
        return self.vector


@pytest.fixture
def vectors(engine, monkeypatch):
    fake = BlockingVectors(engine)
    monkeypatch.setattr(engine, "concept_vector", fake)
    yield fake
    fake.release.set()


def make(engine, **kw) -> Explorer:
    ex = Explorer(engine, prompt="My favourite thing to do on a Sunday is", temperature=0.0,
                  n_completion_tokens=6, features=[FEATURE], **kw)  # fmt: skip
    assert ex.wait(120), ex.status
    return ex


def name_concept(ex: Explorer, name: str) -> None:
    """Gate on ``name`` decided from the prompt (read at the concept layer, after the
    feature's: a token-scope decision there would come too late for the feature)."""
    with ex.batch():
        ex.condition_row.kind.value = "concept"
        ex.condition_row.what.value = name
        ex.condition_row.scope.value = "prompt"


def test_no_call_waits_for_the_concept_vector_and_the_run_follows_it(engine, vectors, tmp_path):
    ex = make(engine)
    name_concept(ex, "food")
    with pytest.raises(RequestError, match="'food' is still being made"):
        ex.request()
    with pytest.raises(RequestError, match="still being made"):
        ex.save_view(tmp_path / "view.json")
    assert ex.save_vectors(tmp_path / "v.gguf") is None and "still being made" in ex.error
    assert ex.evaluate(["Hi"], [0, 1]) is False
    assert "still being made" in ex.view.evaluation.error
    assert vectors.on_caller == 0  # nothing above made the vector on the caller's thread
    assert vectors.entered.wait(120) and vectors.calls == ["food"]
    assert "making the concept vector for 'food'" in ex.status
    vectors.release.set()
    assert ex.wait(120), ex.status
    assert ex.error == "" and ex.status.startswith("done"), ex.status
    when = ex.request().when
    assert when.on == vectors.vector and ex.request_done.when == when
    assert "features[0]" in ex.outputs["STEERED"].gates  # the run was gated
    assert vectors.calls == ["food"] and vectors.on_caller == 0
    ex.save_view(tmp_path / "view.json")  # the vector is here now: saved at once
    ex.close()


def test_stop_ends_the_vector_being_made_and_a_later_change_makes_it(engine, vectors):
    ex = make(engine)
    name_concept(ex, "food")
    assert vectors.entered.wait(120)
    ex.stop()
    assert ex.wait(30)  # the fake still blocks: nothing of the explorer waits for it now
    assert ex.status.startswith("stopped by you") and "'food'" in ex.status, ex.status
    assert ex.condition_row.making is None
    with pytest.raises(RequestError, match="'food' was stopped"):
        ex.request()
    runs = ex.runner.started
    vectors.release.set()
    ex.condition_row._worker.wait(120)  # the dropped job's end, which no public call waits for
    assert ex.runner.started == runs and ex.status.startswith("stopped by you")  # no run
    ex.condition_row.threshold.value = 0.1  # a later change runs, and its run retries
    assert ex.wait(120), ex.status
    assert ex.error == "" and ex.request_done.when.on == vectors.vector
    assert vectors.calls == ["food"] and vectors.on_caller == 0
    ex.close()


def test_close_drops_the_vector_being_made(engine, vectors):
    ex = make(engine)
    name_concept(ex, "music")
    assert vectors.entered.wait(120)
    ex.close(timeout=30)  # returns while the fake still blocks
    runs = ex.runner.started
    assert ex.condition_row.making is None
    vectors.release.set()
    ex.condition_row._worker.wait(120)  # the dropped job's end, which no public call waits for
    assert ex.runner.started == runs  # the vector came to a closed explorer: no run


def test_run_pressed_while_the_vector_is_made_follows_it_when_not_live(engine, vectors):
    ex = make(engine, live=False)
    name_concept(ex, "food")
    assert vectors.entered.wait(120)
    ex.run()
    assert ex.runner.wait(120)  # the run ended at once: it waits for the vector, no error
    assert ex.error == "" and "the run follows when it is ready" in ex.status, ex.status
    assert ex.request_done is None
    vectors.release.set()
    assert ex.wait(120), ex.status
    assert ex.error == "" and ex.status.startswith("done"), ex.status
    assert ex.request_done.when.on == vectors.vector and vectors.calls == ["food"]
    ex.close()
