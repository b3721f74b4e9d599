"""Many requests, one ragged batch: ``engine.steer_batch`` decodes requests on different
prompts (1 token to hundreds, chat and completion), sampling settings and lengths together,
and every output equals its solo ``engine.steer`` token for token and in its token
probabilities (bit for bit). Rows that end early at EOS or at their own length leave the
batch; a DEFAULT from the cache sits beside fresh rows; cancelling keeps finished rows; a
bad request is refused by its key before anything runs."""

from __future__ import annotations

import threading

import pytest

import steer_widgets as sw

LONG = " ".join(f"Line {i}: the keeper of the lighthouse wrote down the ships." for i in range(24))


def batch_requests(engine, sources) -> dict[str, sw.SteerRequest]:
    early, middle, late = sources[0], sources[len(sources) // 2], sources[-1]
    chat = [{"role": "user", "content": "Tell me about the ocean."}]
    short = [{"role": "user", "content": "Reply with one word: yes or no?"}]
    vector = sw.Vector(engine.saes.decoder_row(early, 5), "blocks.5.hook_resid_post", 20.0)
    return {
        "chat": sw.SteerRequest(chat, features=[sw.Feature(middle, 11, 40.0)],
                                n_completion_tokens=9, temperature=0.5, seed=3),
        "chat_same": sw.SteerRequest(chat, features=[sw.Feature(late, 3, 30.0)],
                                     n_completion_tokens=9, temperature=0.5, seed=3),
        "one_token": sw.SteerRequest("The", vectors=[vector], n_completion_tokens=14,
                                     temperature=0.9, freq_penalty=1.5, seed=7),
        "long": sw.SteerRequest(LONG, features=[sw.Feature(middle, 11, 60.0)],
                                sweep=(-2.0, 3.0), n_completion_tokens=5, temperature=0.0),
        "ortho": sw.SteerRequest("I think that", features=[sw.Feature(early, 5, 40.0)],
                                 steer_method="ORTHOGONAL_DECOMP", steer_special_tokens=False,
                                 prompt_multiplier=2.0, n_completion_tokens=7, temperature=0.7,
                                 seed=11),
        "cap": sw.SteerRequest(chat, features=[sw.Feature(late, 3, 8.0)],
                               steer_method="PROJECTION_CAP", types=("STEERED",),
                               n_completion_tokens=6, temperature=0.0),
        "eos": sw.SteerRequest(short, features=[sw.Feature(late, 3, 4.0)],
                               n_completion_tokens=24, temperature=0.0),
    }  # fmt: skip


def solo(engine, request: sw.SteerRequest) -> dict[str, sw.Completion]:
    """Each output of ``request`` generated alone (its own ``steer``, DEFAULT cache cleared)."""
    out = {}
    for label in request.types:
        engine.clear_caches()
        out.update(engine.steer(request.with_(types=(label,), sweep=())).outputs)
    for m in request.sweep:
        engine.clear_caches()
        alone = request.with_(
            types=("STEERED",), sweep=(), strength_multiplier=m * request.strength_multiplier
        )
        out[f"STEERED*{m:g}"] = engine.steer(alone).outputs["STEERED"]
    return out


@pytest.fixture(scope="module")
def solos(engine, sources) -> dict[str, dict[str, sw.Completion]]:
    return {name: solo(engine, r) for name, r in batch_requests(engine, sources).items()}


def same(a: sw.Completion, b: sw.Completion) -> bool:
    """Tokens, text, stop and every token probability equal."""
    return a == b and a.token_probs == b.token_probs


def test_a_ragged_batch_equals_each_request_alone(engine, sources, solos):
    requests = batch_requests(engine, sources)
    engine.clear_caches()
    engine.steer(requests["chat"].with_(types=("DEFAULT",)))  # cached DEFAULT beside fresh rows
    got = engine.steer_batch(requests)
    assert got["long"].stats["batch"] == 13  # 15 outputs less the two cached DEFAULTs
    for name, result in got.items():
        assert list(result.outputs) == list(solos[name]), name
        for label, completion in result.outputs.items():
            assert same(completion, solos[name][label]), (name, label)
    stops = {c.stop for r in got.values() for c in r.outputs.values()}
    assert stops == {"eos", "length"}  # rows that end at EOS leave beside rows that go on
    lengths = {len(c.token_ids) for r in got.values() for c in r.outputs.values()}
    assert len(lengths) >= 4


def test_a_ragged_batch_shares_one_default_per_prompt_and_sampling(engine, sources, solos):
    requests = batch_requests(engine, sources)
    engine.clear_caches()
    got = engine.steer_batch({k: requests[k] for k in ("chat", "chat_same", "one_token")})
    assert got["chat"].stats["batch"] == 5  # one DEFAULT for chat and chat_same
    assert got["chat"].stats is not got["chat_same"].stats  # each result its own dict
    assert got["chat"].outputs["DEFAULT"] == got["chat_same"].outputs["DEFAULT"]
    assert same(got["one_token"].outputs["STEERED"], solos["one_token"]["STEERED"])


class StopsAfter(threading.Event):
    """A cancel event that reports set from its ``n``-th check on (the decode loop checks it
    once before the prefills, once after each row's prefill and once a step), so a
    cancellation lands at a known step."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n <= 0 or super().is_set()


def test_cancelling_a_ragged_batch_stops_within_a_step_and_keeps_finished_rows(engine, sources):
    requests = batch_requests(engine, sources)
    short = requests["cap"].with_(n_completion_tokens=2)
    engine.clear_caches()
    # 4 checks before the first step (before the prefills, after each of 3 rows'), then one
    # a step: set at the 8th, the long rows have 3 tokens
    got = engine.steer_batch({"short": short, "long": requests["one_token"]}, StopsAfter(8))
    assert got["short"].outputs["STEERED"].stop == "length"
    assert len(got["short"].outputs["STEERED"].token_ids) == 2
    for completion in got["long"].outputs.values():
        assert completion.stop == "cancelled" and len(completion.token_ids) == 3
    assert engine.decoder.cached_default(engine.plan(requests["one_token"])[0].ids,
                                         requests["one_token"].sampling) is None  # fmt: skip
    again = engine.steer_batch({"long": requests["one_token"]})  # the engine still works
    assert again["long"].outputs["STEERED"].stop == "length"


def test_a_bad_request_is_refused_by_its_key_before_anything_runs(engine, sources, monkeypatch):
    requests = batch_requests(engine, sources)
    calls = []
    monkeypatch.setattr(type(engine.model.runtime), "forward", lambda *a, **k: calls.append(a))
    bad = dict(requests, broken=requests["chat"].with_(temperature=-1.0))
    with pytest.raises(sw.RequestError) as err:
        engine.steer_batch(bad)
    assert err.value.field == "requests['broken'].temperature"
    wrong = dict(requests, missing=requests["chat"].with_(features=[sw.Feature("nope", 1, 2.0)]))
    with pytest.raises(sw.SteerWidgetsError, match="nope"):
        engine.steer_batch(wrong)
    assert calls == []


class OneStartOnly:
    """The default runtime with ``ragged`` false: a runtime whose ``forward`` takes one start
    for every row, which the decode loop cannot use once a row has finished."""

    ragged = False

    def __init__(self, runtime) -> None:
        self.runtime = runtime

    def __getattr__(self, name: str):
        return getattr(self.runtime, name)


def test_decoding_refuses_a_runtime_without_rows_of_their_own(engine):
    from steer_widgets.steering import generation

    steps = generation.decode(
        OneStartOnly(engine.model.runtime), [1, 2, 3], [generation.Row()],
        generation.DEFAULT_SAMPLING, frozenset(),
    )  # fmt: skip
    with pytest.raises(ValueError, match="ragged"):
        next(steps)


def test_a_ragged_step_builds_its_row_indexes_once_per_device():
    import torch

    from steer_widgets.runtime.transformer import Ragged

    step = Ragged((2, 0), (7, 3))
    rows, positions = step.tensors(torch.device("cpu"))
    assert rows.tolist() == [2, 0] and positions.tolist() == [7, 3]
    again = step.tensors(torch.device("cpu"))
    assert again[0] is rows and again[1] is positions  # one pair for every layer of the step
    assert step == Ragged((2, 0), (7, 3))


def test_a_forward_pass_slices_each_distinct_rotary_table_once(engine, monkeypatch):
    """The default model's config is read back from a file, with an equal Rope object per
    layer: a ragged step slices the tables once, not once a layer."""
    import torch

    runtime = engine.model.runtime
    assert len({id(r) for r in runtime.cfg.ropes}) == runtime.cfg.n_layers
    calls, real = [], runtime._rotary_at
    monkeypatch.setattr(runtime, "_rotary_at", lambda *a: calls.append(a) or real(*a))
    cache = runtime.new_cache(2, 8)
    for r in range(2):
        runtime.forward(torch.tensor([[5, 6, 7]]), cache.view(r))
    cache.lengths = [3, 3]
    calls.clear()
    runtime.forward(torch.tensor([[8], [9]]), cache, rows=[0, 1])
    assert len(calls) == 1


def test_the_ragged_kernel_writes_each_rows_key_and_value_then_attends_alone():
    """``ragged_attention`` writes each row's new key and value at its own position of its
    cache row (what two index_put calls per layer did) and attends as that row alone; a
    bad row is refused before anything is written."""
    import torch

    from steer_widgets.runtime import native

    if native.extension() is None:
        pytest.skip("no native kernel on this machine")
    op, solo = native.op("ragged_attention"), native.op("causal_attention")
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(2, 5, 3, 40, 64, generator=gen)
    q = torch.randn(4, 9, 1, 64, generator=gen)
    new_k, new_v = torch.randn(2, 4, 3, 1, 64, generator=gen)
    rows, positions = torch.tensor([3, 0, 4, 1]), torch.tensor([7, 39, 0, 20])
    want_k, want_v = k.clone(), v.clone()
    want_k[rows, :, positions], want_v[rows, :, positions] = new_k[:, :, 0], new_v[:, :, 0]
    y = op(q, k, v, new_k, new_v, 0.125, rows, positions, 0)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    for b, (r, p) in enumerate(zip(rows.tolist(), positions.tolist(), strict=True)):
        alone = solo(q[b : b + 1], k[r : r + 1, :, : p + 1], v[r : r + 1, :, : p + 1], 0.125, p, 0)
        assert torch.equal(y[b : b + 1], alone), b
    before = k.clone()
    with pytest.raises(RuntimeError, match="appears twice"):
        op(q, k, v, new_k * 2, new_v, 0.125, torch.tensor([3, 0, 3, 1]), positions, 0)
    with pytest.raises(RuntimeError, match="outside k"):
        op(q, k, v, new_k * 2, new_v, 0.125, rows, torch.tensor([7, 40, 0, 20]), 0)
    assert torch.equal(k, before)


def test_rows_up_to_the_context_limit_equal_their_solo_runs(engine, tmp_path):
    """A tiny random Llama with a 48-position context: a 1-token prompt beside one that fills
    the context to its last position (prompt + new tokens = 48), greedy and sampled."""
    import torch
    import transformers as tf

    config = tf.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=48, vocab_size=len(engine.tokenizer.hf),
    )  # fmt: skip
    torch.manual_seed(0)
    tf.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(tmp_path)
    engine.tokenizer.hf.save_pretrained(tmp_path)
    tiny = sw.Engine(str(tmp_path), saes=[])
    assert tiny.model.runtime.cfg.max_context == 48
    near = " ".join(LONG.split()[:30])
    n_near = 48 - len(tiny.tokenizer.encode(near).ids)
    vector = sw.Vector(torch.randn(64, generator=torch.Generator().manual_seed(1)),
                       "blocks.1.hook_resid_pre", 3.0)  # fmt: skip
    requests = {
        "one": sw.SteerRequest("The", vectors=[vector], n_completion_tokens=20,
                               temperature=1.0, seed=5),
        "full": sw.SteerRequest(near, vectors=[vector], n_completion_tokens=n_near,
                                temperature=0.0),
        "full_sampled": sw.SteerRequest(near, vectors=[vector], n_completion_tokens=n_near,
                                        temperature=0.8, freq_penalty=1.0, seed=2),
    }  # fmt: skip
    got = tiny.steer_batch(requests)
    for name, request in requests.items():
        alone = solo(tiny, request)
        for label, completion in got[name].outputs.items():
            assert same(completion, alone[label]), (name, label)
    full = got["full"].outputs["STEERED"]
    assert full.stop == "length" and len(full.token_ids) == n_near >= 4
    with pytest.raises(sw.RequestError):  # one token past the context is refused
        tiny.steer(requests["full"].with_(n_completion_tokens=n_near + 1))


def test_a_cache_full_of_nan_changes_nothing(engine, sources, solos, monkeypatch):
    """The KV cache is allocated unfilled: every position is written before it is read, so
    a cache poisoned with NaN gives the same rows (ragged and uniform steps, shared
    prefills, sweeps)."""
    runtime = engine.model.runtime
    new_cache = type(runtime).new_cache

    def poisoned(self, rows: int, length: int):
        cache = new_cache(self, rows, length)
        for kv in (*cache.k, *cache.v):
            kv.fill_(float("nan"))
        return cache

    monkeypatch.setattr(type(runtime), "new_cache", poisoned)
    requests = batch_requests(engine, sources)
    engine.clear_caches()
    got = engine.steer_batch(requests)
    for name, result in got.items():
        for label, completion in result.outputs.items():
            assert same(completion, solos[name][label]), (name, label)
    engine.clear_caches()
    alone = engine.steer(requests["long"])  # one prompt: uniform steps
    assert all(same(c, solos["long"][k]) for k, c in alone.outputs.items())
