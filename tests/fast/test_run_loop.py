"""The explorer's run loop decides "cancelled" as the engine does, from the outputs
(``results.cut_short``), not from whether the cancel event was set: a cancel that lands
after the last step keeps the run's complete outputs. No model: a scripted engine."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from steer_widgets.steering.requests import SteerRequest
from steer_widgets.steering.results import Completion, Frame
from steer_widgets.widgets.completions import Completions
from steer_widgets.widgets.status import StatusLine
from steer_widgets.widgets.streaming import RunLoop

TOKENS = {5: "a", 6: "b", 2: "<|im_end|>"}


class ScriptedEngine:
    """Streams the frames it is given; ``text`` knows the few token ids they use."""

    def __init__(self, frames: list[Frame]) -> None:
        self.frames = frames
        self.saes = SimpleNamespace(resident=lambda: ["x"], stats=dict)
        self.residual_cache = SimpleNamespace(stats=dict)

    def text(self, prompt, completion=None):
        ids = list(completion or [])
        return SimpleNamespace(
            ids=[1, *ids],
            tokens=["<s>", *(TOKENS[i] for i in ids)],
            special=[True] + [False] * len(ids),
        )

    def steer_stream(self, request, cancel):
        yield from self.frames


def _loop(frames: list[Frame]) -> tuple[RunLoop, list]:
    seen: list = []
    loop = RunLoop(
        ScriptedEngine(frames), Completions(), StatusLine(),
        lambda: SteerRequest("hi", n_completion_tokens=2), lambda *a: seen.append(a[2]),
        seen.append,
    )  # fmt: skip
    return loop, seen


def test_a_cancel_after_the_last_step_keeps_the_complete_outputs():
    done = {"DEFAULT": Completion("ab", (5, 6), "length")}
    loop, _ = _loop([Frame({"DEFAULT": Completion("a", (5,))}, 1), Frame(done, 2, done=True)])
    cancel = threading.Event()
    cancel.set()  # Stop pressed as the last frame arrived
    loop.work(cancel, 1)
    assert loop.outputs == done and loop.request_done is not None
    assert loop.history[-1]["cancelled"] is False
    assert loop.status.state == "done", loop.status.text


def test_a_run_cut_short_is_cancelled_whatever_the_event_says():
    cut = {"DEFAULT": Completion("a", (5,), "cancelled")}
    loop, _ = _loop([Frame(cut, 1, done=True)])
    loop.stopped_run = 3
    loop.work(threading.Event(), 3)  # cancelled through the engine (cancel_all), not the event
    assert loop.outputs == {} and loop.request_done is None
    assert loop.history[-1]["cancelled"] is True
    assert loop.status.state == "stopped", loop.status.text
