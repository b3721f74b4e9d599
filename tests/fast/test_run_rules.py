"""The two rules every run shares, without a model: one cancel token per run
(``cancel.Runs``) and one rule for "this output is complete" (``results.final_stop``)."""

from __future__ import annotations

import threading

from steer_widgets.steering.cancel import Runs
from steer_widgets.steering.results import Completion, final_stop

STOPS = frozenset({0, 2})


def test_complete_iff_a_stop_token_or_all_wanted_tokens():
    assert final_stop([5, 6, 0], 8, STOPS) == "eos"
    assert final_stop([5, 6, 7], 3, STOPS) == "length"
    assert final_stop([5, 6, 2], 3, STOPS) == "eos"  # a stop token on the last step
    assert final_stop([5, 6], 3, STOPS) == "cancelled"  # cut off: never "length"
    assert final_stop([], 3, STOPS) == "cancelled"
    assert Completion("", (5,), "length").complete and Completion("", (0,), "eos").complete
    assert not Completion("", (5,), "cancelled").complete
    assert not Completion("", (5,), "").complete  # still streaming


def test_a_token_stays_registered_until_its_outermost_run_ends():
    runs = Runs()
    caller = threading.Event()
    with runs.run(caller) as token:
        assert token is caller  # the caller's own event is the run's token
        with runs.run(token):  # a part of the run (a batch's part, a decode in a steer)
            pass
        runs.cancel_all()  # between parts: the run is still registered
        assert caller.is_set()
    with runs.run() as fresh:  # no caller event: a fresh one, reached by cancel_all
        runs.cancel_all()
        assert fresh.is_set()
    with runs.run() as ended:
        pass
    assert len(runs) == 0
    runs.cancel_all()  # a run that ended is not reached
    assert not ended.is_set()


def test_cancel_all_reaches_every_run_registered_at_that_moment_from_many_threads():
    """32 threads (more than the cores here), 40 rounds: each opens a run (some nested, some
    sharing one caller's event), ``cancel_all`` lands while all are open, then every token
    is set, the runs close to an empty register, and runs opened after it are untouched."""
    import random

    threads, rounds = 32, 40
    runs, shared = Runs(), [threading.Event() for _ in range(rounds)]
    opened, cancelled, closed = (threading.Barrier(threads + 1) for _ in range(3))
    seen: list[tuple[bool, bool]] = []  # (set after cancel_all, set when opened afresh)
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for r in range(rounds):
            caller = shared[r] if seed % 4 == 0 else None
            with runs.run(caller) as token:
                depth = rng.randint(0, 2)  # parts of the same run register it again
                for _ in range(depth):
                    with runs.run(token):
                        pass
                opened.wait()
                cancelled.wait()
                was_set = token.is_set()
            closed.wait()
            with runs.run() as after:
                fresh = not after.is_set()
            with lock:
                seen.append((was_set, fresh))

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for _ in range(rounds):
        opened.wait()
        runs.cancel_all()
        cancelled.wait()
        closed.wait()
    for t in pool:
        t.join()
    assert len(seen) == threads * rounds
    assert all(was_set for was_set, _ in seen)
    assert all(fresh for _, fresh in seen)
    assert len(runs) == 0
