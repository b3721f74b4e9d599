"""The end of a decode step in one native pass over every row (``native.vocab_pass``): the
tokens, counts and ``TokenProb`` of the row-by-row Python path (``RowSampler.next`` and
``token_prob``, torch's softmax and multinomial) bit for bit, on rows run side by side at
several pool thread counts, and the pass is what decoding uses where the kernel is loaded."""

from __future__ import annotations

import math

import pytest
import torch

from steer_widgets.runtime import native
from steer_widgets.steering.generation import (
    Row,
    RowSampler,
    Sampling,
    sample_rows,
    sample_step,
    token_prob,
)

VOCAB = 49152  # the default model's
NAN, INF = float("nan"), float("inf")
# (temperature, frequency penalty) per row: greedy, sampled, sampled without a penalty
SETTINGS = [(0.0, 1.0), (0.5, 1.0), (1.0, 0.0), (0.7, 2.0), (0.0, 0.0), (1.3, 1.0), (0.2, 0.5)]


def samplers(seed: int = 0) -> list[RowSampler]:
    prompt = [1, 2, 3, 5, 5, 7, 7, 7]
    return [
        RowSampler(Sampling(temperature=t, freq_penalty=f, seed=seed + i), prompt, VOCAB)
        for i, (t, f) in enumerate(SETTINGS)
    ]


def logits_of(seed: int, rows: int) -> torch.Tensor:
    x = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 4
    x[1, :300] = -INF  # a row with tokens it can never choose
    x[2, 100:110] = x[2].max() + 1  # ties for the largest: the first index wins, as in torch
    return x


@pytest.fixture
def threads():
    """Sets torch's thread count (the kernels' pool follows it) for one test."""
    assert native.extension() is not None
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("n_threads,queued", [(1, False), (3, True), (8, True), (8, False)])
def test_the_native_pass_equals_the_row_by_row_path(threads, n_threads, queued):
    """``queued``: the native pass's rows take their noise as queued uniform draws (what
    decoding does), the reference's as Exp(1) values drawn inline."""
    threads(n_threads)
    rows = [Row() for _ in SETTINGS]
    rows[6] = Row(follow=1)  # copies row 1's token, with its own probabilities
    live = list(range(len(rows)))
    fast, slow = samplers(), samplers()
    for step in range(6):
        logits = logits_of(step, len(live))
        for sampler in fast if queued else ():
            sampler.prefetch()
        got = sample_step(fast, rows, live, logits)
        want = sample_rows(slow, rows, live, logits)
        assert got == want, f"step {step}"
        for a, b in zip(fast, slow, strict=True):
            assert torch.equal(a.counts, b.counts)
        if step % 2:  # rows leave the batch, as finished rows do (a followed row stays)
            live.remove([0, 2, 3][step // 2])
    assert len({t for t in got[0] if t is not None}) > 2  # the rows chose different tokens


def uniform_cases(n: int = VOCAB):
    """(probabilities, uniform draws) that a lazy draw could get wrong: draws of exactly 0
    (Exp(1) of -0.0: an infinite or NaN quotient), tiny draws on unlikely tokens, draws near
    1, tokens of probability 0, flat and peaked distributions, quotients tied."""
    gen = torch.Generator().manual_seed(5)
    for case in range(40):
        logits = torch.randn(n, generator=gen) * (0.0, 0.5, 4.0, 12.0)[case % 4]
        logits[torch.randint(n, (n // 10,), generator=gen)] = -INF
        u = torch.rand(n, generator=gen, dtype=torch.float64)
        if case % 5 == 1:
            u[torch.randint(n, (3,), generator=gen)] = 0.0
        if case % 5 == 2:
            u[logits.argsort()[: n // 100]] = 1e-12  # the least likely tokens draw tiny u
        if case % 5 == 3:
            u[torch.randint(n, (n // 2,), generator=gen)] = 1 - 2**-53
        if case % 5 == 4:
            logits[:] = 0.0
            u[100:110] = u[100]  # the same quotient ten times: the first index wins
        probs = torch.softmax(logits, -1)
        if case % 5 == 0:  # a less likely token's quotient just above the likeliest one's
            top, other = int(probs.argmax()), int(probs.argsort()[n // 2])
            u[top] = 0.3
            above = (1.01, 1 + 2**-20, 1 + 2**-23, 1 - 2**-23)[case // 5 % 4]
            quotient = probs[top].item() / -math.log1p(-0.3)
            u[other] = probs[other].item() / quotient / above  # its Exp(1) is about u
        yield probs, u


def test_uniform_draws_choose_the_token_of_their_exp1_values(threads):
    """Where the noise comes as uniform draws the pass takes the logarithm only where a
    token can still win: the token is the one the Exp(1) values of the same draws give."""
    threads(1)
    chosen = []
    for probs, u in uniform_cases():
        logits = probs.log().unsqueeze(0)  # softmax of log p is p (up to rounding: shared)
        args = ([1.0], [0.0], [torch.zeros(VOCAB)])
        lazy = native.vocab_pass(logits, *args, [u], [-1], 5)[0]
        args = ([1.0], [0.0], [torch.zeros(VOCAB)])
        full = native.vocab_pass(logits, *args, [native.exponential_of(u)], [-1], 5)[0]
        assert lazy.item() == full.item()
        chosen.append(lazy.item())
    assert len(set(chosen)) > 30  # the cases drew different tokens


def test_a_row_gets_the_same_results_beside_any_other_rows(threads):
    threads(4)
    alone = samplers(seed=9)[3:4]
    together = samplers(seed=9)
    logits = logits_of(1, len(SETTINGS))
    one = sample_step(alone, [Row()], [0], logits[3:4].clone())
    many = sample_step(together, [Row() for _ in SETTINGS], range(7), logits)
    assert (one[0][0], one[1][0]) == (many[0][3], many[1][3])


def test_top_values_order_nan_first_and_ties_by_id(threads):
    threads(2)
    row = torch.full((2, 16), -INF)
    row[0, [3, 9]] = 0.0
    row[1, 5] = NAN  # log_softmax of a row with a NaN is NaN everywhere
    tokens, logp, ids, values = native.vocab_pass(
        row, [0.0, 0.0], [0.0, 0.0], [torch.zeros(16), torch.zeros(16)], [None, None], [-1, -1], 5
    )
    want = [(i, v) for i, v in token_prob(row[0], 3).top]
    assert list(zip(ids[0].tolist(), values[0].tolist(), strict=True)) == want
    assert ids[0].tolist() == [3, 9, 0, 1, 2] and tokens.tolist() == [3, 5]
    assert ids[1].tolist() == [0, 1, 2, 3, 4] and torch.isnan(values[1]).all()
    assert logp[0] == values[0, 0] and torch.isnan(logp[1])


@pytest.mark.parametrize("bad", [NAN, -INF, INF])
def test_bad_probabilities_raise_torchs_errors(threads, bad):
    """A row whose probabilities are not a distribution (softmax of a NaN, of every logit
    -inf, of +inf) fails as torch.multinomial does, naming why."""
    threads(2)
    logits = torch.zeros(2, 64)
    logits[1] = bad
    reference = RowSampler(Sampling(temperature=1.0, freq_penalty=0.0), [1], 64)
    with pytest.raises(RuntimeError) as want:
        reference.next(logits[1])
    counts = [torch.zeros(64), torch.zeros(64)]
    noise = [torch.ones(64), torch.ones(64)]
    with pytest.raises(RuntimeError) as got:
        native.vocab_pass(logits, [1.0, 1.0], [0.0, 0.0], counts, noise, [-1, -1], 5)
    assert str(want.value) in str(got.value)


def test_bad_arguments_are_named_before_any_row_runs(threads):
    counts = torch.zeros(8)
    one, two = torch.zeros(1, 8), torch.zeros(2, 8)
    with pytest.raises(RuntimeError, match="needs its noise"):
        native.vocab_pass(one, [0.5], [0.0], [counts], [None], [-1], 5)
    with pytest.raises(RuntimeError, match="one entry per row"):
        native.vocab_pass(two, [0.5], [0.0], [counts], [None], [-1], 5)
    with pytest.raises(RuntimeError, match="k must be"):
        native.vocab_pass(one, [0.0], [0.0], [counts], [None], [-1], 9)
    with pytest.raises(RuntimeError, match="either its counts"):
        native.vocab_pass(one, [0.0], [0.0], [counts], [None], [0], 5)
    with pytest.raises(RuntimeError, match="not a row that chooses"):
        native.vocab_pass(two, [0.0, 0.0], [0.0, 0.0], [None, None], [None, None], [1, 0], 5)
    assert counts.sum() == 0  # nothing ran


def test_decoding_uses_the_native_pass(engine, monkeypatch):
    """Decoding calls the pass once per step (so the tests above test what decodes), and the
    tokens are those of decoding without it."""
    calls = []
    real = native.vocab_pass

    def counted(logits, *args):
        calls.append(logits.shape[0])
        return real(logits, *args)

    monkeypatch.setattr(native, "vocab_pass", counted)
    out = engine.generate("The weather today", n_completion_tokens=5, temperature=0.8, seed=3)
    assert calls == [1] * len(out.token_ids)
    monkeypatch.setattr(native, "loaded", lambda name: False)  # as without the kernel
    engine.clear_caches()
    again = engine.generate("The weather today", n_completion_tokens=5, temperature=0.8, seed=3)
    assert again.token_ids == out.token_ids and again.token_probs == out.token_probs
