"""A run's cancellation: one token per run, whoever stops it.

A run (``steer``, ``steer_stream``, ``steer_batch``, ``samples``, an evaluation, a remote
request) can be stopped three ways: by its caller's event, by ``Engine.cancel_all``, and, for
a batch split into parts, it must stop every later part too. Three flags for one fact is how
a cut-off row came back labelled complete, so all three are one ``threading.Event``: the
caller's own when one is given, else a fresh one, registered here for the whole run. The
decode loop checks that token before every prefill and every decode step.

At interpreter exit every run still going (an explorer's, on a daemon thread) is cancelled,
and the runs and every ``worker_thread`` are waited for: Python 3.11 ends a daemon thread
that returns from a native op after finalization has begun by unwinding it, which aborts the
process through torch's C++ frames ("terminate called without an active exception", exit
status 134).
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_WAIT_S = 10.0  # how long exit waits for cancelled runs and workers (a step or forward)
WORKER = "steer_widgets-worker"  # the start of every worker_thread's name
_ALL: weakref.WeakSet[Runs] = weakref.WeakSet()


def worker_thread(role: str, target, *args) -> threading.Thread:
    """A daemon thread (not yet started) to run ``target(*args)``, the widgets' background
    work, named for its ``role`` and so that exit waits for it (``stop_all_runs``)."""
    return threading.Thread(target=target, args=args, daemon=True, name=f"{WORKER}-{role}")


class Runs:
    """The tokens of the runs going on now; ``cancel_all`` sets every one of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: Counter[threading.Event] = Counter()
        _ALL.add(self)

    @contextmanager
    def run(self, cancel: threading.Event | None = None) -> Iterator[threading.Event]:
        """The run's token (``cancel`` itself, or a fresh event), registered until the run
        ends. A part of a run registers the same token again (a batch's parts, a decode
        inside a steer): it stays registered until the outermost one ends."""
        token = cancel if cancel is not None else threading.Event()
        with self._lock:
            self._active[token] += 1
        try:
            yield token
        finally:
            with self._lock:
                self._active[token] -= 1
                if self._active[token] <= 0:
                    del self._active[token]

    def cancel_all(self) -> None:
        """Set every running run's token: each stops before its next prefill or step."""
        with self._lock:
            active = list(self._active)
        for token in active:
            token.set()

    def __len__(self) -> int:
        """How many runs are registered now (for tests and diagnostics)."""
        with self._lock:
            return len(self._active)


@atexit.register
def stop_all_runs(wait_s: float = EXIT_WAIT_S) -> bool:
    """Cancel every run of every engine, then wait up to ``wait_s`` in all for the runs and
    the worker threads to end (at exit, before daemon threads are stopped); True when none is
    left."""
    everyone = list(_ALL)
    for runs in everyone:
        runs.cancel_all()
    deadline = time.monotonic() + wait_s
    while any(len(runs) for runs in everyone):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    me = threading.current_thread()
    workers = [t for t in threading.enumerate() if t.name.startswith(WORKER) and t is not me]
    for thread in workers:
        thread.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in workers)
