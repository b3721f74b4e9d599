"""One owner for a run's cancellation and one for "this output is complete" (issue 49).

A run's cancel token is shared by its caller's event, ``cancel_all`` and every part of a
split batch, and is checked before every prefill and every decode step; an output is
complete iff it stopped at a stop token or has all its tokens (``results.final_stop``), and
only a complete DEFAULT is cached. Cancels land at a known forward pass (``forward`` is
wrapped to count its calls), so nothing here depends on timing.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

import steer_widgets as sw
from steer_widgets.errors import Cancelled
from steer_widgets.steering.batch import MAX_ROWS

PROMPT = "Once upon a time"


@pytest.fixture
def forwards(engine, monkeypatch):
    """The runtime's ``forward`` counted; ``forwards.on(n, action)`` runs ``action`` on the
    ``n``-th call, before that pass runs."""

    class Counter:
        calls = 0
        actions: dict[int, object] = {}

        def on(self, n: int, action) -> None:
            self.actions[n] = action

    counter = Counter()
    runtime = type(engine.model.runtime)
    real = runtime.forward

    def forward(self, *args, **kwargs):
        counter.calls += 1
        if counter.calls in counter.actions:
            counter.actions[counter.calls]()
        return real(self, *args, **kwargs)

    monkeypatch.setattr(runtime, "forward", forward)
    engine.clear_caches()
    yield counter
    engine.clear_caches()


def default_only(prompt=PROMPT, **sampling) -> sw.SteerRequest:
    return sw.SteerRequest(prompt, types=("DEFAULT",), **{"temperature": 0.0, **sampling})


def cached(engine, request: sw.SteerRequest):
    return engine.decoder.cached_default(engine.plan(request)[0].ids, request.sampling)


def test_cancel_all_in_a_batch_labels_the_cut_default_cancelled_and_caches_nothing(
    engine, forwards
):
    request = default_only(n_completion_tokens=8)
    forwards.on(4, engine.cancel_all)  # the prefill, then the passes for steps 2, 3, 4
    got = engine.steer_batch({"a": request})["a"].outputs["DEFAULT"]
    assert got.stop == "cancelled" and len(got.token_ids) == 3 and not got.complete
    assert cached(engine, request) is None
    again = engine.steer(request).outputs["DEFAULT"]  # decoded afresh, to its end
    assert again.complete and len(again.token_ids) == 8
    assert again.token_ids[:3] == got.token_ids


def test_cancel_all_in_samples_labels_them_cancelled(engine, forwards):
    forwards.on(4, engine.cancel_all)
    got = engine.samples(PROMPT, 2, n_completion_tokens=8, temperature=0.9, seed=1)
    assert [(s.stop, len(s.token_ids)) for s in got] == [("cancelled", 3)] * 2


def test_an_event_set_before_a_split_batch_makes_no_forward_pass(engine, forwards):
    n = MAX_ROWS + 6  # two parts
    requests = {
        str(i): default_only(temperature=0.5, seed=i, n_completion_tokens=2) for i in range(n)
    }
    cancel = threading.Event()
    cancel.set()
    got = engine.steer_batch(requests, cancel)
    assert forwards.calls == 0
    assert {(r.outputs["DEFAULT"].stop, r.outputs["DEFAULT"].token_ids) for r in got.values()} == {
        ("cancelled", ())
    }
    assert cached(engine, requests["0"]) is None


def test_cancel_all_reaches_every_later_part_of_a_split_batch(engine, forwards):
    n = MAX_ROWS + 6
    requests = {
        str(i): default_only(temperature=0.5, seed=i, n_completion_tokens=3) for i in range(n)
    }
    forwards.on(2, engine.cancel_all)  # the first part's shared prefill, then its step 2
    got = engine.steer_batch(requests)
    assert forwards.calls == 2  # the second part never starts
    lengths = [len(got[str(i)].outputs["DEFAULT"].token_ids) for i in range(n)]
    assert lengths == [1] * MAX_ROWS + [0] * (n - MAX_ROWS)
    assert all(r.outputs["DEFAULT"].stop == "cancelled" for r in got.values())
    assert all(cached(engine, r) is None for r in requests.values())


def test_a_cancel_during_prefill_stops_before_the_next_row(engine, forwards):
    requests = {p: default_only(p, n_completion_tokens=2) for p in ("One", "Two", "Three")}
    forwards.on(1, engine.cancel_all)  # during the first row's prefill
    got = engine.steer_batch(requests)
    assert forwards.calls == 1
    assert all(r.outputs["DEFAULT"].stop == "cancelled" for r in got.values())


def test_a_row_finished_when_the_cancel_lands_is_complete_and_cached(engine, forwards):
    request = default_only(n_completion_tokens=3)
    cancel = threading.Event()
    frames = []
    for frame in engine.steer_stream(request, cancel):
        frames.append(frame)
        if not frame.done and frame.step == 3:  # after the last step, before the end
            cancel.set()
    assert cancel.is_set() and frames[-1].done
    got = frames[-1].outputs["DEFAULT"]
    assert got.stop in ("length", "eos") and len(got.token_ids) == 3
    assert cached(engine, request) == got
    calls = forwards.calls
    assert engine.steer(request).outputs["DEFAULT"] == got  # served from the cache
    assert forwards.calls == calls


@pytest.fixture
def stub_samples(engine, monkeypatch):
    """``engine.samples`` stubbed (its own cut-off labels are tested above): each call is
    recorded, and its completions stop with ``stop[0]``."""
    calls, stop = [], ["length"]

    def samples(prompt, n, **sampling):
        calls.append(prompt)
        return [sw.Completion(" Stripes.", (1,), stop[0])] * n

    monkeypatch.setattr(engine, "samples", samples)
    engine.clear_caches()
    yield calls, stop
    engine.clear_caches()


CONCEPT = "zebra crossings (test only)"


def test_concept_examples_keep_no_cut_off_sample(engine, stub_samples):
    calls, stop = stub_samples
    stop[0] = "cancelled"
    with pytest.raises(Cancelled):
        engine.concepts.examples(CONCEPT)
    stop[0] = "length"
    made = len(calls)
    first = engine.concepts.examples(CONCEPT)  # sampled again: nothing cut off was kept
    assert len(calls) > made and first
    made = len(calls)
    assert engine.concepts.examples(CONCEPT) == first and len(calls) == made  # kept now


def test_clear_caches_forgets_concept_examples(engine, stub_samples):
    calls, _ = stub_samples
    first = engine.concepts.examples(CONCEPT)
    made = len(calls)
    engine.clear_caches()
    assert engine.concepts.examples(CONCEPT) == first and len(calls) > made


EXIT_WHILE_RUNNING = """
import sys, threading, torch
import steer_widgets as sw
torch.set_num_threads(1)
engine = sw.Engine.default()
if sys.argv[1] == "explorer":
    ex = sw.Explorer(engine, live=False)
    ex.set(prompt="The sea", n_completion_tokens=200, seed=1)
    ex.run()
    while not any(pane["tokens"] for pane in ex.completions.panes):  # streaming has begun
        threading.Event().wait(0.01)
    print("decoding" if ex.runner.busy and not ex.outputs else "finished")
else:
    started = threading.Event()
    def work():
        request = sw.SteerRequest("The sea", types=("DEFAULT",), n_completion_tokens=200)
        for _ in engine.steer_stream(request):
            started.set()
    threading.Thread(target=work, daemon=True).start()
    print("decoding" if started.wait(60) else "not started")
print("exiting")
"""


@pytest.mark.parametrize("where", ["thread", "explorer"])
def test_exit_while_a_run_decodes_on_a_daemon_thread_is_clean(where):
    """The interpreter exits mid-run: the run is cancelled and waited for at exit. Before,
    the daemon thread's return from a native op after finalization began aborted the process
    (status 134) in six of six tries with a thread, and in some with an explorer."""
    for _ in range(1):
        proc = subprocess.run(
            [sys.executable, "-c", EXIT_WHILE_RUNNING, where],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0 and "exiting" in proc.stdout, proc.stderr[-2000:]
        assert "decoding" in proc.stdout, proc.stdout  # it exited mid-run, not after it
