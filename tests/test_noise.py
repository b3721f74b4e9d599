"""Sampling noise queued on the native kernels' idle pool threads (``native.noise_start``) has
the bits of ``exponential_`` on the row's generator, drawn in order whoever draws which chunk,
so sampled tokens do not depend on how the draws were scheduled."""

from __future__ import annotations

import time

import pytest
import torch

from steer_widgets.runtime import native
from steer_widgets.steering.generation import RowSampler, Sampling


@pytest.fixture
def two_threads():
    """The pool works only with more than one thread (the tests run one)."""
    assert native.extension() is not None
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # noise_start starts the pool's worker
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("threads,dtype", [(1, torch.float32), (2, torch.float32),
                                           (2, torch.float64)])  # fmt: skip
def test_queued_draws_equal_exponential_on_the_generator(threads, dtype, two_threads):
    """float32: the Exp(1) values; float64: the uniform draws they are made of, which
    ``exponential_of`` turns into the same values."""
    torch.set_num_threads(threads)
    sizes = [1, 511, 512, 513, 49152, 3000]  # whole chunks, a partial one, less than one
    seeds = range(len(sizes))
    outs = [torch.empty(n, dtype=dtype) for n in sizes]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    tickets = [native.noise_start(o, g) for o, g in zip(outs, gens, strict=True)]
    time.sleep(0.002)  # the worker draws some chunks meanwhile
    for i in reversed(range(len(sizes))):  # finished in another order than queued
        native.noise_finish(tickets[i])
    for n, s, out, gen in zip(sizes, seeds, outs, gens, strict=True):
        ref_gen = torch.Generator().manual_seed(s)
        values = out if dtype == torch.float32 else native.exponential_of(out)
        assert torch.equal(values, torch.empty(n).exponential_(1, generator=ref_gen)), n
        # the generators stand where one exponential_ left them
        assert torch.equal(gen.get_state(), ref_gen.get_state()), n


def test_uniform_draws_continue_a_generator_from_any_point_of_its_state(two_threads):
    """The float64 draws (the kernel's own Mersenne Twister over whole arrays) from a
    generator part-way through its 624 words: after an odd number of words (float32 uniform_
    takes one a draw), one short of a twist, at it and past it; lengths that end inside a
    twist's words. Each equals torch's uniform_ and leaves the generator where it does."""
    for seed in range(3):
        for used in (1, 311, 623, 624, 1000):
            for n in (1, 312, 513, 4099):
                ours, torchs = (
                    torch.Generator().manual_seed(seed),
                    torch.Generator().manual_seed(seed),
                )
                for gen in (ours, torchs):
                    torch.empty(used).uniform_(generator=gen)
                out = torch.empty(n, dtype=torch.float64)
                native.noise_finish(native.noise_start(out, ours))
                ref = torch.empty(n, dtype=torch.float64).uniform_(generator=torchs)
                assert torch.equal(out, ref), (seed, used, n)
                assert torch.equal(ours.get_state(), torchs.get_state()), (seed, used, n)


def test_a_cancelled_draw_is_dropped_and_unknown_tickets_are_named(two_threads):
    gen = torch.Generator().manual_seed(1)
    ticket = native.noise_start(torch.empty(49152), gen)
    native.noise_cancel(ticket)
    native.noise_cancel(ticket)  # twice: nothing left to drop
    with pytest.raises(RuntimeError, match="no noise job"):
        native.noise_finish(ticket)
    out = torch.empty(100)
    native.noise_finish(native.noise_start(out, torch.Generator().manual_seed(2)))
    assert torch.equal(
        out, torch.empty(100).exponential_(1, generator=torch.Generator().manual_seed(2))
    )


def test_prefetched_rows_sample_the_tokens_of_inline_draws(two_threads):
    """Inline draws are torch.multinomial's (tests/fast/test_sampling.py)."""
    vocab, prompt = 49152, [5, 9, 9, 2]
    gen = torch.Generator().manual_seed(100)
    logits = [torch.randn(vocab, generator=gen) * 4 for _ in range(12)]
    sampling = Sampling(temperature=0.7, freq_penalty=0.5, seed=16)
    inline = RowSampler(sampling, prompt, vocab)
    want = [inline.next(step) for step in logits]
    rows = [RowSampler(sampling, prompt, vocab) for _ in range(3)]
    drawn = []
    for step in logits:
        for row in rows:
            row.prefetch()
            row.prefetch()  # a second call queues nothing more
        drawn.append([row.next(step) for row in rows])
    assert all(column == want for column in map(list, zip(*drawn, strict=True)))
    rows[0].prefetch()
    rows[0].close()  # a decode that ended: the queued draw is dropped
    assert rows[0]._queued is None


HANG_S = 300  # a hang guard only: the worker draws its first chunk within milliseconds


def test_the_pool_draws_queued_noise_while_idle(two_threads):
    """Waits for the worker's first chunk however long the machine takes to schedule it; only
    a worker that never draws (a hang) reaches the guard."""
    out = torch.full((49152,), float("nan"))
    ticket = native.noise_start(out, torch.Generator().manual_seed(4))
    guard = time.monotonic() + HANG_S
    while bool(out.isnan().all()) and time.monotonic() < guard:
        time.sleep(0.001)
    drawn = int((~out.isnan()).sum())
    native.noise_finish(ticket)
    assert drawn > 0, f"the idle worker drew no chunk in {HANG_S} s (hang guard)"
    assert torch.equal(
        out, torch.empty(49152).exponential_(1, generator=torch.Generator().manual_seed(4))
    )


def test_a_torch_whose_chunked_draws_differ_is_detected_and_draws_inline(monkeypatch, two_threads):
    """``queue_is_exact`` compares the queue's draw with one ``exponential_`` once; where they
    differ (simulated: chunks drawn last first) ``noise_start`` queues nothing and rows draw
    inline, the same tokens."""
    real = native.op

    def chunks_reversed(out, gen):
        for begin in reversed(range(0, out.numel(), 512)):
            chunk = out[begin : begin + 512]
            if out.dtype == torch.float64:
                chunk.uniform_(generator=gen)
            else:
                chunk.exponential_(1, generator=gen)
        return 0

    def fake(name):
        if name == "noise_start":
            return chunks_reversed
        return (lambda ticket: None) if name == "noise_finish" else real(name)

    monkeypatch.setattr(native, "op", fake)
    with pytest.warns(RuntimeWarning, match="differ from one exponential_"):
        assert native.queue_is_exact.__wrapped__() is False
    monkeypatch.setattr(native, "op", real)
    assert native.queue_is_exact.__wrapped__() is True  # this torch's real queue
    monkeypatch.setattr(native, "queue_is_exact", lambda: False)
    assert native.noise_start(torch.empty(10), torch.Generator()) is None
    vocab, logits = (
        4000,
        [torch.randn(4000, generator=torch.Generator().manual_seed(i)) for i in range(8)],
    )
    sampling = Sampling(temperature=0.9, seed=2)
    row, inline = RowSampler(sampling, [1], vocab), RowSampler(sampling, [1], vocab)
    got = []
    for step in logits:
        row.prefetch()
        assert row._queued is None
        got.append(row.next(step))
    assert got == [inline.next(step) for step in logits]
