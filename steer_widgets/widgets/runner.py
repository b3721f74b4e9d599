"""Debounced, cancellable background runs: the control flow behind a live widget.

A lone change starts a run at once (leading edge); a burst of changes (a dragged slider)
then becomes one more run after ``debounce_s`` of quiet (trailing edge). A new
run sets the previous run's cancel Event and waits for it to drain before starting, so at
most one generation uses the CPU (and the engine's decode lock) at a time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ..steering.cancel import worker_thread

Job = Callable[[threading.Event], None]


class Runner:
    """Runs ``job(cancel)`` on a background thread; one at a time, newest wins."""

    def __init__(self, job: Job, debounce_s: float = 0.15, leading: bool = True) -> None:
        self.job = job
        self.debounce_s = debounce_s
        self.leading = leading
        self._last_change = float("-inf")
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._starting = 0
        self._cancel: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self.started = 0  # runs started so far

    def schedule(self) -> None:
        """Start a run after ``debounce_s`` unless another change comes first.

        With ``leading``, a change after ``debounce_s`` of quiet starts at once instead.
        """
        with self._lock:
            now = time.monotonic()
            quiet = now - self._last_change > self.debounce_s and self._timer is None
            self._last_change = now
            self._drop_timer()
            delay = 0.0 if self.leading and quiet else self.debounce_s
            timer = threading.Timer(delay, self._fire)
            timer.args = (timer,)
            timer.daemon = True
            self._timer = timer
            timer.start()

    def start(self) -> None:
        """Cancel any pending or running job and start a new one now."""
        with self._lock:
            self._drop_timer()
            self._starting += 1
        self._start()

    def cancel(self) -> None:
        """Stop the pending and the running job (within one decode step)."""
        with self._lock:
            self._drop_timer()
            if self._cancel is not None:
                self._cancel.set()

    def _drop_timer(self) -> None:
        """Cancel the pending debounce timer, if any (caller holds the lock)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    @property
    def busy(self) -> bool:
        with self._lock:
            thread = self._thread
            return (
                self._timer is not None
                or self._starting > 0
                or (thread is not None and thread.is_alive())
            )

    def wait(self, timeout: float | None = None) -> bool:
        """Block until nothing is pending or running; False if ``timeout`` ran out."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.busy:
            if deadline is not None and time.monotonic() > deadline:
                return False
            thread = self._thread
            if thread is not None and thread.is_alive():
                thread.join(0.05)
            else:
                time.sleep(0.01)
        return True

    def _fire(self, timer: threading.Timer) -> None:
        with self._lock:
            if self._timer is not timer:  # superseded by a later change
                return
            self._timer = None
            self._starting += 1
        self._start()

    def _start(self) -> None:
        try:
            with self._start_lock:
                if self._cancel is not None:
                    self._cancel.set()
                if self._thread is not None:
                    self._thread.join()  # drain: the engine runs one decode at a time
                cancel = threading.Event()
                thread = worker_thread("runner", self.job, cancel)
                with self._lock:
                    self._cancel, self._thread = cancel, thread
                    self.started += 1
                thread.start()
        finally:
            with self._lock:
                self._starting -= 1
