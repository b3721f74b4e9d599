"""``Worker.wait`` returns False at its timeout whichever ``TimeoutError`` class the future
raises, and raises a job's own ``TimeoutError`` rather than reading it as the wait's."""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from steer_widgets.widgets.worker import Worker


class FuturesTimeout(Exception):
    """``concurrent.futures.TimeoutError`` as Python 3.10 has it: not the builtin one."""


def test_a_timeout_is_false_with_either_timeout_class(monkeypatch):
    """On 3.11+ ``concurrent.futures.TimeoutError`` is the builtin, so the 3.10 case is made
    here: the name ``Future.result`` raises (``concurrent.futures._base.TimeoutError``) and
    the public one both become a class of their own, as on 3.10. A wait that caught only the
    builtin let it escape."""
    for cls in (TimeoutError, FuturesTimeout):
        monkeypatch.setattr(concurrent.futures, "TimeoutError", cls)
        monkeypatch.setattr(concurrent.futures._base, "TimeoutError", cls)
        worker, release = Worker("test-wait"), threading.Event()
        worker.submit(release.wait)
        try:
            assert worker.wait(0.01) is False  # the job waits for release: it cannot be over
        finally:
            release.set()
        assert worker.wait() is True
        worker.close()


def test_a_jobs_own_timeout_error_is_raised():
    """A job that raised TimeoutError (a network call's) is over: that is its exception, not
    a wait that ran out (which the builtin class alone could not tell on 3.11+)."""
    worker = Worker("test-own")

    def times_out() -> None:
        raise TimeoutError("the server did not answer")

    worker.submit(times_out)
    with pytest.raises(TimeoutError, match="did not answer"):
        worker.wait()
    worker.close()
