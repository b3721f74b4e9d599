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
