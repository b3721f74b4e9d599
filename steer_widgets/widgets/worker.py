"""One background thread for a widget's slow work (attribution, a Neuronpedia fetch).

Widget callbacks run on the kernel's message thread: anything slow there freezes the
notebook. A widget hands such work to its ``Worker``; ``close`` lets the thread end without
waiting for work in flight (a hanging network call must not hang the explorer's ``close``).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent import futures
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor


class Worker:
    """A one-thread executor that remembers the last job it was given, for ``wait``."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._pending: Future | None = None

    def submit(self, fn: Callable, *args) -> bool:
        """Queue ``fn(*args)``; False once closed (the job is dropped)."""
        try:
            self._pending = self._pool.submit(fn, *args)
        except RuntimeError:  # closed
            self._pending = None
            return False
        return True

    def close(self) -> None:
        """Drop queued jobs and let the thread end after the job it is on."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the last job submitted is over (False: still running at ``timeout``).
        A job's own exception is raised here, a ``TimeoutError`` of its own included.

        ``Future.result`` raises ``concurrent.futures.TimeoutError``, which is the builtin
        ``TimeoutError`` from Python 3.11 but another class on 3.10: both are caught, and
        which one it was is told by whether the job is over, not by the class."""
        pending = self._pending
        if pending is None:
            return True
        try:
            pending.result(timeout)
        except (TimeoutError, futures.TimeoutError) as err:
            if _raised_by_job(pending, err):
                raise
            return False
        except CancelledError:
            pass
        return True


def _raised_by_job(future: Future, err: BaseException) -> bool:
    """Whether ``err`` is the job's own exception rather than the wait's timeout."""
    return future.done() and not future.cancelled() and future.exception() is err
