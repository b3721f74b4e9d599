"""The one place a model decodes and scores: every steer, evaluation and explanation runs here.

The engine, the evaluator and the explainer all decode rows and read log-probabilities on
one model. Doing it through one ``Decoder`` means one lock orders every pass that decodes
or reads log-probabilities (a decode step, an attribution's forward and backward, a
log-probability read), one set of running runs answers ``cancel_all`` (``cancel.Runs``: one
token per run), and one DEFAULT cache serves every caller: an evaluation's DEFAULT row is the
explorer's DEFAULT for the same prompt and settings. Whether a row is complete is
``results.final_stop``'s to say, here and in the cache alike.

Activation reads (``analysis.activations.residuals``) run their forward outside the lock: a
forward without a KV cache changes nothing a decode reads (its rotary tables grow with the
values they already held), so it may overlap a decode step; the two then share the cores.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager

import torch
from torch import Tensor

from ..lru import LRU
from ..runtime.protocol import Hook, Runtime
from .cancel import Runs
from .gates import RowGates
from .generation import Row, Sampling, Step, TokenProb, decode
from .results import Completion, final_stop

DEFAULT_CACHE_SIZE = 32  # DEFAULT completions kept, by (prompt ids, sampling)
_END = object()  # the decode loop has no more steps


class Transcript:
    """What each row of a decode has produced so far: its token ids and their ``TokenProb``."""

    def __init__(self, n_rows: int) -> None:
        self.ids: list[list[int]] = [[] for _ in range(n_rows)]
        self.probs: list[list[TokenProb]] = [[] for _ in range(n_rows)]

    def add(self, step: Step) -> None:
        """Append one decode step's tokens to each row that is still decoding."""
        for r, token in enumerate(step.tokens):
            if token is not None:
                self.ids[r].append(token)
                self.probs[r].append(step.probs[r])


class Decoder:
    """Rows decoded on one runtime, under one lock, with the DEFAULT cache.

    ``lock`` is held for each decode step, not for a whole decode: callers that run the
    model outside ``rows`` (an attribution, a log-probability read) hold it for their pass,
    and wait at most one step for a decode running on another thread.
    """

    def __init__(
        self,
        runtime: Runtime,
        tokenizer,
        stop_ids: frozenset[int],
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        self.runtime, self.tokenizer, self.stop_ids = runtime, tokenizer, stop_ids
        self.lock = threading.Lock()  # one pass over the model at a time: the CPU is the bound
        self._state = threading.Lock()  # guards _defaults across threads
        self.runs = Runs()  # the running runs' cancel tokens
        self._defaults: LRU[tuple, Completion] = LRU(cache_size)

    @property
    def local(self) -> bool:
        """Whether rows decode in this process (a remote engine's runtime has no KV cache)."""
        return hasattr(self.runtime, "new_cache")

    def rows(
        self,
        prompt_ids: Sequence[int] | None,
        rows: list[Row],
        sampling: Sampling | None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Step]:
        """The decode loop's steps, each computed under ``lock``; ``cancel`` (or
        ``cancel_all``) stops it before the next prefill or step. ``prompt_ids`` and
        ``sampling`` are the defaults of rows without their own (rows on different prompts
        decode as one ragged batch). Decodes on several threads take turns step by step, and
        each row's prefill is a turn of its own, so a large batch starting never holds a live
        run back for longer than one row's prompt. Each row is still exactly its solo run."""
        with self.running(cancel) as token:
            steps = decode(
                self.runtime, prompt_ids, rows, sampling, self.stop_ids, token, pauses=True
            )
            try:
                while True:
                    with self.lock:  # not held while the caller looks at a step
                        step = next(steps, _END)
                    if step is _END:
                        return
                    if step is not None:  # None: a prefill's turn ended
                        yield step
            finally:
                steps.close()  # drops the decode's queued noise now, not at garbage collection

    def running(self, cancel: threading.Event | None = None) -> AbstractContextManager:
        """The run's one cancel token (``cancel``, or a fresh event), registered for
        ``cancel_all`` while the run goes on, here or remotely (``cancel.Runs.run``)."""
        return self.runs.run(cancel)

    def decode_all(
        self,
        prompt_ids: Sequence[int] | None,
        rows: list[Row],
        sampling: Sampling | None,
        cancel: threading.Event | None = None,
    ) -> list[Completion]:
        """Decode ``rows`` to the end in one batch (no streaming, no cache); rows with their
        own prompts and sampling make a ragged batch. A row cut off by a cancel stops
        "cancelled" (``final``)."""
        transcript = Transcript(len(rows))
        for step in self.rows(prompt_ids, rows, sampling, cancel):
            transcript.add(step)
        return [
            self.final(ids, (row.sampling or sampling).n_completion_tokens, probs, row.gates)
            for row, ids, probs in zip(rows, transcript.ids, transcript.probs, strict=True)
        ]

    def final(
        self,
        ids: Sequence[int],
        wanted: int,
        probs: Sequence[TokenProb] | None = None,
        gates: RowGates | None = None,
    ) -> Completion:
        """A row that stopped decoding as a ``Completion``, its stop by the one rule
        (``results.final_stop``): "eos", "length" at ``wanted`` tokens, else "cancelled"."""
        return self.completion(ids, final_stop(ids, wanted, self.stop_ids), probs, gates)

    def complete(self, ids: Sequence[int], wanted: int) -> bool:
        """Whether a row with these tokens has ended complete (``results.final_stop``)."""
        return final_stop(ids, wanted, self.stop_ids) != "cancelled"

    def completion(
        self,
        ids: Sequence[int],
        stop: str,
        probs: Sequence[TokenProb] | None = None,
        gates: RowGates | None = None,
    ) -> Completion:
        """A row's tokens as a ``Completion`` (stop tokens kept in ids, not in the text),
        with its gates' log where its steering is conditional."""
        text_ids = [i for i in ids if i not in self.stop_ids]
        token_probs = tuple(probs) if probs is not None else None
        log = None if gates is None else gates.log()
        return Completion(self.tokenizer.decode(text_ids), tuple(ids), stop, token_probs, log)

    def logprobs(
        self, ids: Sequence[int], n: int, hooks: Mapping[str, Hook] | None = None
    ) -> Tensor:
        """Log-probability of each of the last ``n`` tokens of ``ids`` given the tokens
        before it, in one forward pass under ``lock`` (with ``hooks``: as steered)."""
        if n == 0:
            return torch.zeros(0)
        tokens = torch.tensor([list(ids)], device=self.runtime.device)
        with self.lock, torch.no_grad():
            logits = self.runtime.forward(tokens, hooks=dict(hooks or {}))
        logits = logits[0, -n - 1 : -1].float().cpu()
        targets = torch.tensor(list(ids[-n:]))
        return torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]

    # -- the DEFAULT cache -----------------------------------------------------------------
    def cached_default(self, prompt_ids: Sequence[int], sampling: Sampling) -> Completion | None:
        """The DEFAULT completion already decoded for this prompt and sampling, if kept."""
        with self._state:
            return self._defaults.get((tuple(prompt_ids), sampling))

    def remember_default(
        self, prompt_ids: Sequence[int], sampling: Sampling, completion: Completion
    ) -> None:
        """Keep a DEFAULT completion for the next request that needs it, if it is complete
        (``Completion.complete``): a cut-off one is never served as finished."""
        if not completion.complete:
            return
        with self._state:
            self._defaults.put((tuple(prompt_ids), sampling), completion)

    def clear(self) -> None:
        """Forget every cached DEFAULT."""
        with self._state:
            self._defaults.clear()

    def cancel_all(self) -> None:
        """Stop every running run before its next prefill or decode step."""
        self.runs.cancel_all()
