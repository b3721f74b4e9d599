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
    assert got["chat"].outputs["DEFAULT"] == got["chat_same"].outputs["DEFAULT"]
    assert same(got["one_token"].outputs["STEERED"], solos["one_token"]["STEERED"])


class StopsAfter(threading.Event):
    """A cancel event that reports set from its ``n``-th check on (the decode loop checks it
    once a step), so a cancellation lands at a known step."""

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
    got = engine.steer_batch({"short": short, "long": requests["one_token"]}, StopsAfter(4))
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
