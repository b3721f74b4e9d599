"""A run's cancellation: one token per run, whoever stops it.

A run (``steer``, ``steer_stream``, ``steer_batch``, ``samples``, an evaluation, a remote
request) can be stopped three ways: by its caller's event, by ``Engine.cancel_all``, and, for
a batch split into parts, it must stop every later part too. Three flags for one fact is how
a cut-off row came back labelled complete, so all three are one ``threading.Event``: the
caller's own when one is given, else a fresh one, registered here for the whole run. The
decode loop checks that token before every prefill and every decode step.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager


class Runs:
    """The tokens of the runs going on now; ``cancel_all`` sets every one of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active: Counter[threading.Event] = Counter()

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
