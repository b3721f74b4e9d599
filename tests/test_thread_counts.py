"""Exactness at the thread counts users have (1, 2, 4 and 8; this machine has 2 cores, so 4
and 8 are oversubscribed): results computed at N threads equal the references computed at
one thread, bit for bit and token for token. Rows of a batch equal their solo runs (a
conditional steering's too), the
quantized default model's logits equal its float32 copy's, a shared prefill equals each row
computed whole, queued noise equals ``exponential_``, evaluate's rows equal solo steers.

Crashes are the stress's business (``test_kernel_threads.py``, one process per count)."""

from __future__ import annotations

import pytest
import torch
from test_invariance import assert_ragged_step_rows_equal_rows_alone
from test_shared_prefill import ROWS, _prefill
from torch_threads import at_threads

import steer_widgets as sw
from steer_widgets.runtime import native
from steer_widgets.runtime.model import load_model
from steer_widgets.steering.generation import Row, RowSampler, Sampling, sample_step

THREADS = [1, 2, 4, 8]
CHAT = [{"role": "user", "content": "Tell me about the ocean."}]

pytestmark = pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")


@pytest.fixture(params=THREADS, ids=lambda n: f"{n}threads")
def threads(request):
    with at_threads(request.param) as n:
        yield n


def requests(sources: list[str]) -> list[sw.SteerRequest]:
    early, middle, late = sources[0], sources[len(sources) // 2], sources[-1]
    return [
        sw.SteerRequest("I think that", features=[sw.Feature(middle, 11, 60.0)], sweep=(-1.0, 2.0),
                        n_completion_tokens=10, temperature=0.8, freq_penalty=1.0, seed=3),
        sw.SteerRequest(CHAT, features=[sw.Feature(early, 5, 40.0), sw.Feature(late, 3, 30.0)],
                        steer_method="ORTHOGONAL_DECOMP", steer_special_tokens=False,
                        prompt_multiplier=2.0, n_completion_tokens=10, temperature=0.0),
        sw.SteerRequest(CHAT, features=[sw.Feature(middle, 11, 40.0)], sweep=(2.0,),
                        when=sw.When(sw.Feature(early, 3187), above=5.0) | sw.When.tokens(6, 9),
                        n_completion_tokens=10, temperature=0.8, seed=4),
    ]  # fmt: skip


def tokens(result) -> dict:
    return {label: c.token_ids for label, c in result.outputs.items()}


@pytest.fixture(scope="module")
def solo_rows(engine, sources) -> list[dict]:
    """Each request's rows, each generated alone at one thread (as every reference is)."""
    out = []
    with at_threads(1):
        for request in requests(sources):
            rows = {}
            engine.clear_caches()
            rows["DEFAULT"] = tokens(engine.steer(request.with_(types=("DEFAULT",), sweep=())))
            for m in (1.0, *request.sweep):
                engine.clear_caches()
                alone = request.with_(
                    types=("STEERED",),
                    sweep=(),
                    strength_multiplier=m * request.strength_multiplier,
                )
                rows[m] = tokens(engine.steer(alone))["STEERED"]
            rows["DEFAULT"] = rows["DEFAULT"]["DEFAULT"]
            out.append(rows)
    return out


def test_rows_of_a_batch_equal_their_solo_runs(engine, sources, solo_rows, threads):
    for request, want in zip(requests(sources), solo_rows, strict=True):
        engine.clear_caches()
        got = list(engine.steer(request).outputs.values())
        assert got[0].token_ids == want["DEFAULT"], threads
        steered = [want[m] for m in (1.0, *request.sweep)]
        assert [c.token_ids for c in got[1:]] == steered, threads


@pytest.fixture(scope="module")
def float_logits(engine):
    """The float32 copy's prefill and five greedy decode steps, at one thread."""
    with at_threads(1):
        runtime = sw.Engine(load_model(quantized=False)).model.runtime
        ids = torch.tensor([engine.tokenizer.encode(CHAT).ids])
        return ids, greedy_logits(runtime, ids)


def greedy_logits(runtime, ids: torch.Tensor) -> list[torch.Tensor]:
    cache, step, out = runtime.new_cache(1, ids.shape[1] + 6), ids, []
    for _ in range(6):
        logits = runtime.forward(step, cache, last_only=True)
        out.append(logits)
        step = logits[:, -1].argmax(-1, keepdim=True)
    return out


def test_quantized_logits_equal_the_float32_copy(engine, float_logits, threads):
    ids, want = float_logits
    got = greedy_logits(engine.model.runtime, ids)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), threads


@pytest.mark.parametrize("case", ["resid_post_12", "z_5_and_post_20", "no_plain_row"])
def test_shared_prefill_equals_rows_computed_whole(engine, case, threads, monkeypatch):
    runtime, (ops, _) = engine.model.runtime, ROWS[case]
    rows = [Row(ops=o) for o in ops]
    ids = engine.tokenizer.encode("The lighthouse keeper counted the ships").ids
    shared, cache, _ = _prefill(runtime, ids, rows, True, monkeypatch)
    with at_threads(1):
        whole, cache_whole, _ = _prefill(runtime, ids, rows, False, monkeypatch)
    assert torch.equal(shared, whole)
    n = len(ids)  # the positions written (the cache is allocated unfilled)
    for layer in range(runtime.cfg.n_layers):
        assert torch.equal(cache.k[layer][:, :, :n], cache_whole.k[layer][:, :, :n]), layer
        assert torch.equal(cache.v[layer][:, :, :n], cache_whole.v[layer][:, :, :n]), layer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_queued_noise_equals_exponential(threads, dtype):
    """float32: the Exp(1) values; float64: the uniform draws decoding queues, through
    ``exponential_of``; and tokens drawn from queued noise, row by row and in the native pass."""
    sizes, vocab = [1, 513, 49152], 49152
    outs = [torch.empty(n, dtype=dtype) for n in sizes]
    tickets = [native.noise_start(o, torch.Generator().manual_seed(s)) for s, o in enumerate(outs)]
    for i in reversed(range(len(sizes))):
        native.noise_finish(tickets[i])
    for s, (n, out) in enumerate(zip(sizes, outs, strict=True)):
        want = torch.empty(n).exponential_(1, generator=torch.Generator().manual_seed(s))
        got = out if dtype == torch.float32 else native.exponential_of(out)
        assert torch.equal(got, want), n
    logits = [torch.randn(vocab, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    sampling = Sampling(temperature=0.7, freq_penalty=0.5, seed=16)
    with at_threads(1):
        inline = RowSampler(sampling, [5, 9], vocab)
        want = [inline.next(step) for step in logits]
    queued = RowSampler(sampling, [5, 9], vocab)
    got = []
    for step in logits:
        queued.prefetch()
        got.append(queued.next(step))
    assert got == want
    passed, rows = RowSampler(sampling, [5, 9], vocab), [Row()]
    got = []
    for step in logits:  # the native pass on the queued uniform draws, as decoding runs it
        passed.prefetch()
        got.append(sample_step([passed], rows, [0], step.unsqueeze(0))[0][0])
    assert got == want


def test_a_ragged_step_of_many_rows_equals_each_row_alone(engine, threads):
    """More rows than the calibration measures, in one fused call a block."""
    assert_ragged_step_rows_equal_rows_alone(engine.model.runtime, rows=40)


def test_evaluate_rows_equal_solo_steers(engine, threads):
    direction = engine.concept_vector("weather")
    request = sw.SteerRequest("", vectors=[direction], prompt_multiplier=2.0)
    prompts = ["My favourite food is", [{"role": "user", "content": "Is water wet?"}]]
    ev = engine.evaluate(
        request, prompts, strengths=(0, 2), judge=["rain"], progress=False,
        temperature=0.9, n_completion_tokens=8, seed=5,
    )  # fmt: skip
    assert ev.complete and len(ev.rows) == 4
    with at_threads(1):
        for row in ev.rows:
            x1 = ev.steerings[row.steering]
            alone = x1.with_(
                prompt=ev.prompts[row.prompt_index], types=("STEERED",),
                strength_multiplier=x1.strength_multiplier * row.strength, **ev.sampling,
            )  # fmt: skip
            engine.clear_caches()
            want = engine.steer(alone).outputs["STEERED"].token_ids
            assert row.token_ids == want, (row.prompt_index, row.strength, threads)


def test_a_ragged_batch_equals_solo_rows(engine, sources, solo_rows, threads):
    """Both requests (two prompts, greedy and sampled) as one ragged ``steer_batch``."""
    reqs = requests(sources)
    engine.clear_caches()
    got = engine.steer_batch({str(i): r for i, r in enumerate(reqs)})
    for i, (request, want) in enumerate(zip(reqs, solo_rows, strict=True)):
        outputs = list(got[str(i)].outputs.values())
        assert outputs[0].token_ids == want["DEFAULT"], threads
        steered = [want[m] for m in (1.0, *request.sweep)]
        assert [c.token_ids for c in outputs[1:]] == steered, threads
