"""The decode loop: several rows decoded together, each exactly as if alone.

Rows may share one prompt and sampling settings or each have their own (a ragged batch:
different prompts, positions, seeds, temperatures and lengths). Three rules make a batched
row bit-identical to the same row generated alone:
1. Prefill runs one row at a time, so its shapes never depend on the batch.
2. Decode steps run all rows together through kernels that are batch-invariant at the row
   counts used (``linear.py``, ``invariance.py``); rotary, the cache write and attention run
   per row at that row's own position (``transformer.Ragged``). A row that has finished
   leaves the batch: the rest never depended on it.
3. Every row samples from its own ``torch.Generator`` seeded with its seed, on its own 1-D
   logits, so a row's draws never depend on which other rows exist.

Per-row interventions (steering) are functions applied to that row's slice only.

Each step also records, per row, the chosen token's log-probability and the ``TOP_K`` most
likely tokens (``TokenProb``), read from the same 1-D logits the row samples from, so it
changes no token and costs one softmax and one top-k over the vocabulary per row and step.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from .. import checks
from ..errors import ArgumentError, RequestError
from ..runtime import native
from ..runtime.protocol import Hook, Runtime, Start, hook_layer

if TYPE_CHECKING:
    from .gates import RowGates

RowOp = Callable[[Tensor, int], Tensor]  # (x [1, T, d] of one row, start position) -> new x
TOP_K = 5  # alternatives recorded per generated position


@dataclass(frozen=True)
class TokenProb:
    """One generated position: the chosen token's log-probability and the ``TOP_K`` most
    likely tokens as ``(token id, logprob)``, most likely first.

    The distribution is the model's own next-token distribution for that row, steering
    included: ``log_softmax`` of the row's logits *before* temperature and frequency penalty
    (what Neuronpedia and OpenAI-style ``logprobs`` report), so the numbers do not depend on
    sampling settings and the unsteered row's equal ``Engine.token_logprobs``. A token drawn
    at temperature > 0 may therefore fall outside ``top``.
    """

    logprob: float
    top: tuple[tuple[int, float], ...]

    @property
    def prob(self) -> float:
        return math.exp(self.logprob)


def token_prob(logits: Tensor, token: int, k: int = TOP_K) -> TokenProb:
    """``TokenProb`` of ``token`` under ``logits`` [vocab] (one row, never a batch)."""
    logp = torch.log_softmax(logits.float(), dim=-1).cpu().numpy()
    return TokenProb(float(logp[token]), _top(logp, k))


def _top(values: np.ndarray, k: int) -> tuple[tuple[int, float], ...]:
    """The ``k`` largest ``values`` as ``(index, value)``, largest first, ties by index: k
    passes of numpy's argmax (a few us each; ``torch.topk`` over a vocabulary costs ~0.1 ms
    per decode step on one thread)."""
    rest, out = values.copy(), []
    for _ in range(min(k, values.size)):
        i = int(rest.argmax())
        if rest[i] == -np.inf:  # the rest are -inf (or taken): order them by index
            taken = {j for j, _ in out}
            out += [(j, float(values[j])) for j in range(values.size) if j not in taken]
            return tuple(out[:k])
        out.append((i, float(values[i])))
        rest[i] = -np.inf
    return tuple(out)


@dataclass(frozen=True)
class Sampling:
    """Sampling settings, the one place their defaults live (the reference steering tools'
    web defaults). ``SteerRequest`` and the explorer take theirs from ``DEFAULT_SAMPLING``."""

    temperature: float = 0.5
    freq_penalty: float = 1.0
    seed: int = 16
    n_completion_tokens: int = 64

    def validate(self, max_new: int | None = None) -> None:
        """The one validator of sampling fields; ``max_new`` is the room left after the prompt."""
        checks.number("temperature", self.temperature, minimum=0)
        checks.number("freq_penalty", self.freq_penalty, minimum=0)
        checks.integer("seed", self.seed, *checks.SEED_RANGE)
        checks.integer("n_completion_tokens", self.n_completion_tokens, lo=1)
        if max_new is not None and self.n_completion_tokens > max_new:
            raise RequestError(
                "n_completion_tokens",
                f"is {self.n_completion_tokens}, but the prompt leaves room for {max_new}",
            )


DEFAULT_SAMPLING = Sampling()


def check_sampling_keys(sampling: Mapping) -> None:
    """Every keyword a ``Sampling`` field: a misspelt one is a named error, not a TypeError."""
    unknown = sorted(set(sampling) - set(Sampling.__dataclass_fields__), key=str)
    if unknown:
        raise ArgumentError(str(unknown[0]), "is not a sampling setting")


@dataclass
class Row:
    """One sequence to decode: its interventions, keyed by hook name, and its own seed
    (``None``: the request's), so several samples of one prompt decode in one batch.

    ``follow``: an earlier row whose tokens this row is fed instead of sampling its own, so
    its ``TokenProb`` are that row's tokens scored under this row's own model (say, a
    steered text under the unsteered model: the fluency of a steering, at the cost of one
    more row in a decode step instead of another forward over the whole text). It shares
    that row's prompt and number of new tokens.

    ``prompt_ids`` and ``sampling``: the row's own prompt and settings in a ragged batch
    (``None``: the decode's). ``gates``: where its conditional steering was on, per
    position, written by its ops as they run.
    """

    ops: Mapping[str, RowOp] = field(default_factory=dict)
    seed: int | None = None
    follow: int | None = None
    prompt_ids: tuple[int, ...] | None = None
    sampling: Sampling | None = None
    gates: RowGates | None = None  # its conditions' state and log (``gates.py``)

    def on(self, prompt_ids: Sequence[int] | None, sampling: Sampling | None) -> Row:
        """This row with its prompt and sampling filled in from the decode's defaults."""
        prompt = tuple(self.prompt_ids if self.prompt_ids is not None else prompt_ids or ())
        own = self.sampling if self.sampling is not None else sampling
        if not prompt or own is None:
            raise ValueError("a row needs a prompt and sampling settings (its own or the decode's)")
        return replace(self, prompt_ids=prompt, sampling=own)


@dataclass
class Step:
    """Tokens produced by one decode step (and their ``TokenProb``); ``None`` for rows that
    already finished. ``done``: the rows that have stopped at a stop token."""

    tokens: list[int | None]
    done: list[bool]
    probs: list[TokenProb | None] = field(default_factory=list)


def decode(
    model: Runtime,
    prompt_ids: Sequence[int] | None,
    rows: Sequence[Row],
    sampling: Sampling | None,
    stop_ids: frozenset[int],
    cancel: threading.Event | None = None,
    pauses: bool = False,
) -> Iterator[Step | None]:
    """Yield one ``Step`` per generated position until every row stops or is cancelled.

    ``prompt_ids`` and ``sampling`` are the defaults of rows without their own. The runtime
    must decode ragged batches (``Runtime.ragged``): rows leave the batch as they finish.
    With ``pauses``, ``None`` is yielded after each row's prefill too, so a caller that
    takes a lock per item lets other work in between. ``cancel`` is checked before every
    row's prefill and every step: once it is set no forward pass starts (a batch cancelled
    before it starts runs none at all).
    """
    rows = [row.on(prompt_ids, sampling) for row in rows]
    _check_follows(rows)
    prompts = _prompt_groups(rows)
    if not getattr(model, "ragged", False):  # a finished row leaves the batch: rows= per step
        raise ValueError(f"{type(model).__name__} does not decode rows of their own (ragged)")
    if _stopped(cancel):
        return
    n_new = [row.sampling.n_completion_tokens for row in rows]
    room = max(len(row.prompt_ids) + row.sampling.n_completion_tokens for row in rows)
    cache = model.new_cache(len(rows), room)
    vocab = model.cfg.vocab_size
    samplers = [RowSampler(row.sampling, row.prompt_ids, vocab, row.seed) for row in rows]
    ended, done, made = [False] * len(rows), [False] * len(rows), [0] * len(rows)
    try:
        _prefetch(samplers, rows, ended)  # drawn while the prompts run
        last: dict[int, Tensor] = {}
        for prompt, members in prompts.items():
            for _ in _prefill(model, prompt, rows, members, cache, last):
                if pauses:
                    yield None
                if _stopped(cancel):  # before the next row's prefill
                    return
        live = list(range(len(rows)))
        logits = torch.stack([last[r] for r in live]).float().cpu()  # one copy per step
        hooks = _HookCache(rows)
        while True:
            if _stopped(cancel):
                return
            with native.one_openmp_thread():
                tokens, probs = sample_step(samplers, rows, live, logits)
            for r in live:
                made[r] += 1
                done[r] = tokens[r] in stop_ids
                ended[r] = done[r] or made[r] >= n_new[r]
            yield Step(tokens, list(done), probs)
            live = [r for r in live if not ended[r]]
            if not live:
                return  # no forward pass for a token nobody will sample
            _prefetch(samplers, rows, ended)  # drawn while the model runs
            logits = _forward_step(model, cache, hooks, live, tokens)
    finally:
        for sampler in samplers:
            sampler.close()


def _stopped(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


def _forward_step(model: Runtime, cache, hooks: _HookCache, live: list[int], tokens) -> Tensor:
    """The next logits of the ``live`` rows, each fed its last token at its own position."""
    feed = torch.tensor([[tokens[r]] for r in live], device=model.device)
    return model.forward(feed, cache, hooks=hooks.of(live), rows=live)[:, -1].float().cpu()


class _HookCache:
    """The batched hooks of each set of live rows, built when the set changes (a row ends)."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows, self.built = rows, {}

    def of(self, live: Sequence[int]) -> dict:
        key = tuple(live)
        if key not in self.built:
            self.built = {key: _batched_hooks([self.rows[r] for r in live])}
        return self.built[key]


def _prompt_groups(rows: Sequence[Row]) -> dict[tuple[int, ...], list[int]]:
    """The rows of each prompt, prompts in the order their first row comes."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, row in enumerate(rows):
        groups.setdefault(row.prompt_ids, []).append(r)
    return groups


def _prefetch(samplers: Sequence[RowSampler], rows: Sequence[Row], ended: Sequence[bool]) -> None:
    """Queue the next draw of every row that samples its own next token."""
    for sampler, row, finished in zip(samplers, rows, ended, strict=True):
        if not finished and row.follow is None:
            sampler.prefetch()


Picks = tuple[list[int | None], list[TokenProb | None]]  # each row's token and TokenProb


def sample_step(
    samplers: Sequence[RowSampler], rows: Sequence[Row], live: Sequence[int], logits: Tensor
) -> Picks:
    """Each live row's token (a follower copies its row's) and its ``TokenProb``, from
    ``logits`` [len(live), vocab]; ``None`` for the other rows. One native pass over every
    row where the kernel is loaded (``native.vocab_pass``: the same tokens and numbers, rows
    side by side), else ``sample_rows``."""
    tokens: list[int | None] = [None] * len(rows)
    probs: list[TokenProb | None] = [None] * len(rows)
    if _native_step(samplers, rows, live, logits, tokens, probs):
        return tokens, probs
    return sample_rows(samplers, rows, live, logits)


def sample_rows(
    samplers: Sequence[RowSampler], rows: Sequence[Row], live: Sequence[int], logits: Tensor
) -> Picks:
    """``sample_step`` row by row in torch: where the kernel is not loaded, and the
    reference the native pass is held to."""
    tokens: list[int | None] = [None] * len(rows)
    probs: list[TokenProb | None] = [None] * len(rows)
    for b, r in enumerate(live):
        follow = rows[r].follow
        tokens[r] = samplers[r].next(logits[b]) if follow is None else tokens[follow]
        probs[r] = token_prob(logits[b], tokens[r])
    return tokens, probs


def _native_step(
    samplers: Sequence[RowSampler],
    rows: Sequence[Row],
    live: Sequence[int],
    logits: Tensor,
    tokens: list[int | None],
    probs: list[TokenProb | None],
) -> bool:
    """``sample_step`` in one ``native.vocab_pass``, filling ``tokens`` and ``probs``; False
    (nothing done) where the kernel is not loaded, or where rows sample and torch's
    multinomial is not the argmax of probs over noise (``draws_are_torchs``)."""
    leads = [rows[r].follow is None for r in live]
    draws = any(lead and samplers[r].draws for lead, r in zip(leads, live, strict=True))
    if not native.loaded("vocab_pass") or (draws and not draws_are_torchs()):
        return False
    position = {r: b for b, r in enumerate(live)}
    inputs = [
        samplers[r].pass_inputs() if lead else (0.0, 0.0, None, None)
        for lead, r in zip(leads, live, strict=True)
    ]
    temperature, penalty, counts, noise = (list(column) for column in zip(*inputs, strict=True))
    follow = [-1 if lead else position[rows[r].follow] for lead, r in zip(leads, live, strict=True)]
    k = min(TOP_K, logits.shape[-1])
    passed = native.vocab_pass(logits, temperature, penalty, counts, noise, follow, k)
    chosen, logprob, top_ids, top_values = (t.tolist() for t in passed)
    for b, r in enumerate(live):
        tokens[r] = chosen[b]
        probs[r] = TokenProb(logprob[b], tuple(zip(top_ids[b], top_values[b], strict=True)))
    return True


def _prefill(
    model: Runtime,
    prompt: Sequence[int],
    rows: Sequence[Row],
    members: Sequence[int],
    cache,
    last: dict[int, Tensor],
) -> Iterator[None]:
    """The rows ``members`` of ``prompt``: each one's last prompt logits into ``last``, one
    row at a time (rule 1), yielding after each row's forward pass.

    The blocks below a row's first intervention compute exactly what they compute for an
    earlier row without one there (the same tokens, one row alone). Where the runtime can
    resume a forward pass, the row copies that row's keys and values for those blocks, bit
    for bit, and continues from its residual: a steered row at layer 12 of 30 computes 17
    blocks. Two rows without interventions share the whole prefill.
    """
    n_layers = model.cfg.n_layers
    tokens = torch.tensor([list(prompt)], device=model.device)
    depths = [_shared_blocks(rows[r], n_layers) for r in members]
    if not hasattr(cache, "copy_row"):
        depths = [0] * len(members)
    elif not getattr(model, "resumes", False):  # whole prefills only
        depths = [d if d == n_layers else 0 for d in depths]
    sources = [_share_with(depths, i) for i in range(len(members))]
    wanted = {(q, d) for q, d in sources if 0 < d < n_layers}
    saved: dict[tuple[int, int], Tensor] = {}  # (member, blocks) -> residual they left
    for i, r in enumerate(members):
        q, depth = sources[i]
        if depth == n_layers:  # neither row intervenes: the same prefill
            cache.copy_row(members[q], r, positions=len(prompt))
            last[r] = last[members[q]]
        else:
            hooks = dict(rows[r].ops)
            for d in sorted(d for q_, d in wanted if q_ == i):
                name = f"blocks.{d - 1}.hook_resid_post"
                hooks[name] = _recording(saved, (i, d), hooks.get(name))
            resume = {}
            if depth:
                cache.copy_row(members[q], r, layers=depth, positions=len(prompt))
                resume = {"start_at_layer": depth, "resid": saved[(q, depth)]}
            out = model.forward(tokens, cache.view(r), hooks=hooks, last_only=True, **resume)
            last[r] = out[0, -1]
        cache.lengths[r] = len(prompt)
        yield None


def _shared_blocks(row: Row, n_layers: int) -> int:
    """How many first blocks of ``row`` compute what they compute without interventions:
    those below its first hooked block, and that block too where its hook is the block's
    output (``hook_resid_post``, the hook point of most residual SAEs). ``n_layers`` for a
    row without interventions, 0 for a hook outside the blocks."""
    if not row.ops:
        return n_layers
    depth = n_layers - 1  # a hook anywhere changes the logits
    for name in row.ops:
        layer = hook_layer(name)
        if layer is None:
            return 0
        depth = min(depth, layer + 1 if name == f"blocks.{layer}.hook_resid_post" else layer)
    return depth


def _share_with(depths: Sequence[int], r: int) -> tuple[int, int]:
    """The earlier row that row ``r`` shares most blocks with (the earliest of equals,
    which always computed those blocks itself) and how many: ``(r, 0)`` for none."""
    best = (r, 0)
    for q in range(r):
        shared = min(depths[q], depths[r])
        if shared > best[1]:
            best = (q, shared)
    return best


def _recording(saved: dict, key: tuple[int, int], op: RowOp | None) -> Hook:
    """A hook that keeps a copy of the residual it is given under ``key``, then applies the
    row's own ``op`` (if any) at that point."""

    def hook(x: Tensor, start: int) -> Tensor | None:
        saved[key] = x.clone()
        return None if op is None else op(x, start)

    return hook


def _check_follows(rows: Sequence[Row]) -> None:
    for r, row in enumerate(rows):
        if row.follow is None:
            continue
        if not 0 <= row.follow < r:
            raise ValueError(f"row {r} follows row {row.follow}: only an earlier row")
        lead = rows[row.follow]
        if lead.prompt_ids != row.prompt_ids or (
            lead.sampling.n_completion_tokens != row.sampling.n_completion_tokens
        ):
            raise ValueError(f"row {r} follows row {row.follow}: not the same prompt and length")


class RowSampler:
    """Greedy or temperature sampling for one row, with its own random stream.

    ``freq_penalty`` follows TransformerLens' ``sample_logits`` (which the reference server
    uses): logits are divided by the temperature, then ``freq_penalty`` times the count of
    each token in the whole sequence so far (prompt included) is subtracted. Greedy decoding
    (temperature 0) takes the argmax and ignores the penalty, as TransformerLens does.
    """

    def __init__(
        self, sampling: Sampling, prompt_ids: Sequence[int], vocab: int, seed: int | None = None
    ) -> None:
        self.s, self.vocab = sampling, vocab
        self.gen = torch.Generator(device="cpu").manual_seed(
            sampling.seed if seed is None else seed
        )
        ids = torch.tensor(list(prompt_ids), dtype=torch.long)
        self.counts = torch.bincount(ids, minlength=vocab).float()
        self._queued: tuple[int, Tensor] | None = None  # a prefetched draw: ticket, values

    @property
    def draws(self) -> bool:
        """Whether ``next`` takes a ``noise()`` draw (sampling, not greedy)."""
        return self.s.temperature != 0

    def prefetch(self) -> None:
        """Queue the next draw on the native kernels' idle threads, which draw it while the
        model runs: the uniform draws ``exponential_`` would make its Exp(1) noise of, in the
        same order from this row's generator. ``vocab_pass`` takes their logarithms (most of
        ``exponential_``'s cost) only where a token can win. A no-op for greedy rows, with a
        draw queued, or without the kernel."""
        if self.draws and self._queued is None and draws_are_torchs():
            out = torch.empty(self.vocab, dtype=torch.float64)
            ticket = native.noise_start(out, self.gen)
            self._queued = None if ticket is None else (ticket, out)

    def next_draw(self) -> Tensor:
        """The generator's next draw: the queued uniforms (float64), finished here, after
        ``prefetch``; else Exp(1) over the vocabulary (float32), drawn now."""
        if self._queued is None:
            return torch.empty(self.vocab).exponential_(1, generator=self.gen)
        (ticket, out), self._queued = self._queued, None
        native.noise_finish(ticket)
        return out

    def noise(self) -> Tensor:
        """The generator's next draw: Exp(1) over the vocabulary, ``exponential_``'s bits."""
        drawn = self.next_draw()
        return drawn if drawn.dtype == torch.float32 else native.exponential_of(drawn)

    def close(self) -> None:
        """Drop a queued draw nobody will use (the row's decode ended)."""
        if self._queued is not None:
            native.noise_cancel(self._queued[0])
            self._queued = None

    def pass_inputs(self) -> tuple[float, float, Tensor, Tensor | None]:
        """What ``native.vocab_pass`` needs to choose this row's next token as ``next`` does:
        the temperature, the frequency penalty, the counts it raises, and the noise (the
        queued uniforms or Exp(1) values; None for a greedy row, which takes none)."""
        noise = self.next_draw() if self.draws else None
        return self.s.temperature, self.s.freq_penalty, self.counts, noise

    def next(self, logits: Tensor) -> int:
        """The row's next token."""
        logits = logits.float().cpu()
        if self.s.temperature == 0:
            token = int(logits.numpy().argmax())  # numpy's: ~30x torch's on one thread
        else:
            scaled = logits / self.s.temperature
            if self.s.freq_penalty > 0:
                scaled = scaled - self.s.freq_penalty * self.counts
            probs = torch.softmax(scaled, dim=-1)
            if draws_are_torchs():
                token = _multinomial(probs, self.noise())
            else:  # another torch: its own call, on the row's generator (no queued noise)
                token = int(torch.multinomial(probs, 1, generator=self.gen))
        self.counts[token] += 1
        return token


@functools.cache
def draws_are_torchs() -> bool:
    """Whether ``torch.multinomial``'s one-sample path is the first argmax of ``probs /
    noise`` with ``noise`` one ``exponential_`` draw on the same generator (what rows
    compute, so that the noise can be queued), checked once per process. It holds for torch
    2.13; where it does not, rows call ``torch.multinomial`` themselves (the same tokens,
    without queued noise) and one warning says so."""
    vocab, ok = 4099, True
    for seed in range(4):
        logits = torch.randn(vocab, generator=torch.Generator().manual_seed(seed)) * 3
        probs = torch.softmax(logits, -1)
        want = int(torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed)))
        noise = torch.empty(vocab).exponential_(1, generator=torch.Generator().manual_seed(seed))
        ok &= _multinomial(probs, noise) == want
    if not ok:
        warnings.warn(
            f"torch {torch.__version__} samples unlike torch 2.13: rows call torch.multinomial "
            "(the same tokens, without queued noise)",
            RuntimeWarning,
            stacklevel=2,
        )
    return bool(ok)


def _multinomial(probs: Tensor, noise: Tensor) -> int:
    """``torch.multinomial(probs, 1, generator=g)``'s token, with ``noise`` the generator's
    Exp(1) draw: its one-sample path is the first argmax of probs / noise (its checks too)."""
    if not bool((probs.max() < math.inf) & (probs.min() >= 0)):
        raise RuntimeError("probability tensor contains either `inf`, `nan` or element < 0")
    if not bool(probs.sum() > 0):
        raise RuntimeError("invalid multinomial distribution (sum of probabilities <= 0)")
    return int(torch.argmax(probs / noise))


def _batched_hooks(rows: Sequence[Row]) -> dict:
    """One hook per hook name that applies each row's op to that row's slice only, at that
    row's position."""
    names = {name for row in rows for name in row.ops}
    hooks = {}
    for name in names:
        ops = [(r, row.ops[name]) for r, row in enumerate(rows) if name in row.ops]

        def hook(x: Tensor, start: Start, ops=ops) -> Tensor:
            out = x.clone()
            for r, op in ops:  # a ragged step gives each row's own position
                out[r : r + 1] = op(x[r : r + 1], start if isinstance(start, int) else start[r])
            return out

        hooks[name] = hook
    return hooks
