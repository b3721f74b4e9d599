"""One explorer run: stream the engine's frames into the panes and tell the truth about it.

``RunLoop.work`` runs on the runner's thread. It reports each state where it happens
(loading SAE, generating with tokens/s, done, stopped by you, replaced by a newer change,
error), hands every shown frame to the heatmap (``on_frame``, which never blocks), and keeps
what records and benchmarks need: the last finished request and outputs, and per-run
timings (first steered token, last token shown, heatmap shown).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from contextlib import closing

from ..errors import SteerWidgetsError
from ..steering.requests import SteerRequest
from ..steering.results import Completion, cut_short
from .completions import Completions, build_panes
from .status import StatusLine, cache_details
from .token_probs import alternative_ids

FrameCallback = Callable[[SteerRequest, dict, bool, dict], None]  # request, outputs, final, run


class RunLoop:
    """Streams runs into ``completions`` and ``status``; ``request()`` says what to run."""

    def __init__(
        self,
        engine,
        completions: Completions,
        status: StatusLine,
        request: Callable[[], SteerRequest],
        on_frame: FrameCallback,
        on_fail: Callable[[str], None],
    ) -> None:
        self.engine = engine
        self.completions = completions
        self.status = status
        self.request = request
        self.on_frame = on_frame
        self.on_fail = on_fail
        self.outputs: dict[str, Completion] = {}
        self.request_done: SteerRequest | None = None  # the request behind ``outputs``
        self.default_generations = 0  # DEFAULT rows actually decoded (not from the cache)
        self.history: list[dict] = []  # one summary per finished, stopped or replaced run
        self.last_run: dict = {}
        self.last_traceback = ""
        self.stopped_run = -1  # the run number Stop was pressed for
        self._tokens: dict[int, tuple[str, bool]] = {}  # token id -> (text, is special)

    def work(self, cancel: threading.Event, run_no: int) -> None:
        """Run ``request()`` to the end (or until ``cancel``); never raises."""
        started = time.perf_counter()
        run = {"started_at": started, "first_frame_at": None, "first_steered_at": None}
        self.last_run = run
        try:
            req = self.request()
            run["request"] = req
            missing = sorted({f.source for f in req.features} - set(self.engine.saes.resident()))
            if missing:
                self.status.show("loading", ", ".join(missing), self.status.error)
            else:
                self.status.show("generating", "starting…", self.status.error)
            prompt_text = self.engine.text(req.prompt)
            frame = None
            with closing(self.engine.steer_stream(req, cancel)) as stream:
                for frame in stream:
                    self._frame(req, prompt_text, frame, run, started)
            run["done_at"] = time.perf_counter()
            run["outputs"] = dict(frame.outputs) if frame else {}
            run["cancelled"] = frame is None or not frame.done or cut_short(frame.outputs)
            self.history.append(run)
            if run["cancelled"]:  # the outputs decide (final_stop), not when cancel was set
                self._cancelled(run, run_no, frame)
                return
            self.outputs, self.request_done = dict(frame.outputs), req
            self.status.show("done", _summary(frame.step, started, run))
        except SteerWidgetsError as err:
            self.on_fail(str(err))
        except Exception as err:  # keep the UI alive; the traceback stays inspectable
            self.last_traceback = traceback.format_exc()
            self.on_fail(f"{type(err).__name__}: {err}")
        finally:
            self.status.details = cache_details(self.engine)

    def _frame(self, req: SteerRequest, prompt_text, frame, run: dict, started: float) -> None:
        now = time.perf_counter()
        if run["first_frame_at"] is None:
            run["first_frame_at"] = now
            default = frame.outputs.get("DEFAULT")
            run["default_cached"] = default is not None and default.stop != ""
            if default is not None and not run["default_cached"]:
                self.default_generations += 1
        self._show(req, prompt_text, frame)
        steered = frame.outputs.get("STEERED")
        if steered and steered.token_ids and run["first_steered_at"] is None:
            run["first_steered_at"] = time.perf_counter()
        n = sum(len(c.token_ids) for c in frame.outputs.values())
        if n > run.get("n_shown", -1):  # the heatmap lag counts from the last new token
            run["n_shown"], run["last_token_at"] = n, time.perf_counter()
        self.on_frame(req, dict(frame.outputs), frame.done, run)
        if not frame.done:
            rate = frame.step / (now - started) if now > started else 0.0
            cached = " · DEFAULT from cache" if run.get("default_cached") else ""
            self.status.show(
                "generating",
                f"{frame.step}/{req.n_completion_tokens} tokens, {rate:.1f} tokens/s{cached}",
            )

    def _cancelled(self, run: dict, run_no: int, frame) -> None:
        steps = frame.step if frame else 0
        if self.stopped_run == run_no:
            run["cancel_reason"] = "stopped"
            self.status.show("stopped", f"after {steps} tokens; the panes show them")
        else:
            run["cancel_reason"] = "replaced"
            self.status.show("replaced", f"after {steps} tokens; the newer run follows")

    def _show(self, req: SteerRequest, prompt_text, frame) -> None:
        """Put a frame's outputs into the panes (they now match the controls again)."""
        outs = frame.outputs
        ids = [c.token_ids for c in outs.values()] + [alternative_ids(outs.values())]
        self._learn_tokens(req.prompt, len(prompt_text.ids), ids)
        prompt = "".join(
            t for t, s in zip(prompt_text.tokens, prompt_text.special, strict=True) if not s
        )
        panes = build_panes(outs, self._tokens.__getitem__, streaming=not frame.done)
        with self.completions.hold_sync():
            self.completions.prompt = prompt
            self.completions.panes = panes
            self.completions.stale = ""

    def _learn_tokens(self, prompt, base: int, id_lists) -> None:
        """Token strings for new ids, one ``engine.text`` call per frame at most."""
        new = sorted({i for ids in id_lists for i in ids if i not in self._tokens})
        if not new:
            return
        text = self.engine.text(prompt, new)
        for i, tok, special in zip(new, text.tokens[base:], text.special[base:], strict=True):
            self._tokens[i] = (tok, special)


def _summary(step: int, started: float, run: dict) -> str:
    elapsed = run["done_at"] - started
    rate = step / elapsed if elapsed > 0 else 0.0
    first = run["first_steered_at"]
    first_ms = f", first steered token {1000 * (first - started):.0f} ms" if first else ""
    cached = " · DEFAULT from cache" if run.get("default_cached") else ""
    return f"{step} tokens in {elapsed:.2f} s ({rate:.1f} tokens/s){first_ms}{cached}"
