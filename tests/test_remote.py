"""Engine.remote against a real interp-engine server on 127.0.0.1 (the default model on CPU).

The remote engine must give the local engine's tokens and activations, refuse what the server
cannot serve before sending anything, and turn every fault (wrong token, nothing listening,
422, a full queue, a killed server mid-stream) into a named error without losing what was
already streamed.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest
import torch

pytest.importorskip("interp_engine", reason="the remote extra: pip install -e '.[remote]'")

from interp_server import TOKEN, Server, free_port  # noqa: E402

import steer_widgets as sw  # noqa: E402
from steer_widgets.errors import RemoteUnsupported  # noqa: E402
from steer_widgets.remote import client as remote_client  # noqa: E402
from steer_widgets.remote.client import RemoteClient  # noqa: E402
from steer_widgets.runtime.model import default_model_dir  # noqa: E402

CHAT = [{"role": "user", "content": "Write a long story about a dragon who learns to paint."}]
MAX_NEW = 64  # the main server's --max-new-tokens, to test that limit


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(default_model_dir(), tmp_path_factory.mktemp("ie"), ("--max-new-tokens", "64"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote(server):
    return sw.Engine.remote(server.url, TOKEN, model=sw.DEFAULT_MODEL)


def _rows(remote, engine, request):
    """(label, remote ids, local ids) for every output, both engines' caches cleared."""
    remote.clear_caches()
    engine.clear_caches()
    got, want = remote.steer(request).outputs, engine.steer(request).outputs
    assert list(got) == list(want)
    return [(label, got[label].token_ids, want[label].token_ids) for label in want]


def test_greedy_default_and_steered_equal_the_local_engine(remote, engine, sources):
    mid = sources[1]
    cases = [
        sw.SteerRequest("I think that", features=[sw.Feature(mid, 123, 40.0)], sweep=(-2.0, 3.0)),
        sw.SteerRequest(
            CHAT,
            features=[sw.Feature(sources[0], 7, 30.0), sw.Feature(sources[2], 99, 60.0)],
        ),
        sw.SteerRequest(
            "The capital of France is",
            features=[sw.Feature(mid, 1619, 8.0)],
            steer_method="ORTHOGONAL_DECOMP",
            types=("STEERED",),
        ),
        sw.SteerRequest(
            CHAT,
            features=[sw.Feature(mid, 1619, 2.0)],
            steer_method="PROJECTION_CAP",
            types=("STEERED",),
        ),
        sw.SteerRequest(  # a custom vector at another hook kind, normalized
            "Once upon a time",
            vectors=[sw.Vector(torch.linspace(-1, 1, 576), "blocks.4.hook_resid_pre", 30.0)],
            normalize_steering=True,
            types=("STEERED",),
        ),
    ]
    rows, steered_differ = [], []
    for request in cases:
        request = request.with_(temperature=0, n_completion_tokens=12)
        case = _rows(remote, engine, request)
        # each steered row against its own prompt's unsteered text, not another case's
        own_default = engine.steer(request.with_(types=("DEFAULT",))).outputs["DEFAULT"]
        steered_differ += [got != own_default.token_ids for lbl, got, _ in case if lbl != "DEFAULT"]
        rows += case
    equal = [label for label, got, want in rows if got == want]
    assert any(steered_differ), "no steering changed its prompt's text: the check proves nothing"
    assert len(equal) == len(rows), f"equal rows {len(equal)}/{len(rows)}: {rows}"


def test_each_output_is_its_own_solo_request(remote):
    """DEFAULT and STEERED streamed concurrently equal each requested alone."""
    request = sw.SteerRequest(
        CHAT, features=[sw.Feature("10-smollm2-res-4k", 123, 40.0)], n_completion_tokens=10
    )
    request = request.with_(temperature=0.8, freq_penalty=0.0, seed=5)
    remote.clear_caches()
    pair = remote.steer(request).outputs
    remote.clear_caches()
    alone = {t: remote.steer(request.with_(types=(t,))).outputs[t] for t in request.types}
    assert pair == alone
    assert pair["DEFAULT"] != pair["STEERED"]


def test_default_is_cached_and_records_say_where_they_ran(remote, engine):
    request = sw.SteerRequest("I think that", features=[sw.Feature("10-smollm2-res-4k", 5, 30.0)])
    request = request.with_(temperature=0, n_completion_tokens=8)
    remote.clear_caches()
    first = remote.steer(request)
    sent = remote.client.stats["requests"]
    again = remote.steer(request.with_(features=[sw.Feature("10-smollm2-res-4k", 5, 60.0)]))
    assert remote.client.stats["requests"] == sent + 1  # only STEERED went out
    assert again.outputs["DEFAULT"] == first.outputs["DEFAULT"]
    record = first.to_dict()
    assert record["served_by"]["guarantee"].startswith("exact-solo")
    assert record["served_by"]["backend"] == "eager"
    engine.clear_caches()
    assert engine.steer(record).outputs == first.outputs  # a remote record replays locally
    assert first.outputs["DEFAULT"].token_probs is None  # the server sends no probabilities


def test_activations_match_the_local_engine(remote, engine, sources):
    prompt = "The painter mixed blue and yellow to paint the dragon's wings."
    completion = engine.generate(prompt, temperature=0, n_completion_tokens=6)
    worst = {}
    for source in sources:
        text = engine.text(prompt, completion)
        got = remote.feature_values(remote.text(prompt, completion), source)
        want = engine.feature_values(text, source)
        # the server runs transformers' kernels, we run ours: agreement relative to scale
        worst[source] = float((got - want).abs().max())
        assert worst[source] <= 1e-4 * max(1.0, float(want.abs().max())), worst
        top_r = remote.top_features(prompt, source, n=5, completion=completion)
        top_l = engine.top_features(prompt, source, n=5, completion=completion)
        assert top_r.indices == top_l.indices
        feature = top_l.indices[0]
        acts_r = remote.activations(prompt, source, feature, completion)
        acts_l = engine.activations(prompt, source, feature, completion)
        assert acts_r.max_position == acts_l.max_position and acts_l.max_value > 0
        assert acts_r.tokens == acts_l.tokens
    # the shallow layer absolutely as well: 4e-5 on the 2-core machines of 2026-11-30, 1.07e-4
    # on an AVX-512 AMD EPYC (2026-12-01), where the two sides' float32 kernels round apart
    assert worst[sources[0]] <= 2e-4
    assert remote.neighbours(sources[1], 3) == engine.neighbours(sources[1], 3)
    found = [m.index for m in remote.feature_index(sources[1]).search("the")]
    assert found and found == [m.index for m in engine.feature_index(sources[1]).search("the")]


def test_samples_batches_and_logprobs_over_the_server(remote, engine):
    sampling = {"temperature": 0.8, "freq_penalty": 0.0, "n_completion_tokens": 6}
    samples = remote.samples("Once upon a time", 2, seed=4, **sampling)
    remote.clear_caches()
    alone = [remote.generate("Once upon a time", seed=4 + i, **sampling) for i in range(2)]
    assert samples == alone and samples[0] != samples[1]
    got = remote.token_logprobs("Once upon a time", samples[0])
    want = engine.token_logprobs("Once upon a time", samples[0])
    assert got.shape == want.shape == (6,) and float((got - want).abs().max()) < 1e-3
    request = sw.SteerRequest("Hi", features=[sw.Feature("10-smollm2-res-4k", 1, 9.0)])
    a = request.with_(temperature=0, n_completion_tokens=3)
    b = a.with_(prompt="Once upon a time", temperature=0.8, freq_penalty=0.0, seed=2)
    batch = remote.steer_batch({"a": a, "b": b})
    assert batch["a"].to_dict()["served_by"]["backend"] == "eager"
    assert batch["b"].outputs == remote.steer(b).outputs
    with pytest.raises(sw.RequestError) as err:  # refused by its key before any request
        remote.steer_batch({"a": a, "bad": b.with_(temperature=-1.0)})
    assert err.value.field == "requests['bad'].temperature"


def test_samples_check_the_last_seed_before_any_request(remote):
    sent = remote.client.stats["requests"]
    with pytest.raises(sw.RequestError) as err:  # the last sample's seed would overflow
        remote.samples("Hi", 2, temperature=0, seed=2**64 - 1)
    assert err.value.field == "seed" and remote.client.stats["requests"] == sent


def test_cancel_all_stops_samples_and_labels_them_cancelled(remote, monkeypatch):
    """``samples`` registers its one cancel token as every other run does: ``cancel_all``,
    called as the first token arrives, stops both streams short of their 40 tokens."""
    real = remote.client.stream

    def stream(path, body, halt=lambda: False, what=""):
        for item in real(path, body, halt, what):
            yield item
            if item["type"] == "token":
                remote.cancel_all()

    monkeypatch.setattr(remote.client, "stream", stream)
    sampling = {"temperature": 0.8, "freq_penalty": 0.0, "n_completion_tokens": 40}
    got = remote.samples("Once upon a time", 2, seed=4, **sampling)
    assert [s.stop for s in got] == ["cancelled"] * 2
    assert all(len(s.token_ids) < 40 for s in got)


def test_every_hook_kind_maps_to_the_same_tensor(remote, engine):
    ids = engine.text("Hello there, painter.").ids
    kinds = ("hook_resid_pre", "attn.hook_z", "hook_attn_out", "hook_resid_mid")
    hooks = [f"blocks.3.{k}" for k in (*kinds, "hook_mlp_out", "hook_resid_post")]
    got = remote.model.runtime.capture(ids, hooks)
    want = {}
    engine.model.runtime.forward(
        torch.tensor([list(ids)]),
        hooks={
            h: (lambda x, s, h=h: want.__setitem__(h, x[0].reshape(x.shape[1], -1))) for h in hooks
        },
        stop_at_layer=4,
    )
    for h in hooks:
        scale = max(1.0, float(want[h].abs().max()))
        assert float((got[h] - want[h]).abs().max()) <= 1e-4 * scale, h
    assert set(remote.hook_names) == set(engine.hook_names)


def test_what_the_server_cannot_serve_is_refused_before_any_request(remote):
    base = sw.SteerRequest("Hi", features=[sw.Feature("10-smollm2-res-4k", 1, 10.0)], temperature=0)
    sent = remote.client.stats["requests"]
    refused = {
        "steer_special_tokens": base.with_(steer_special_tokens=False),
        "prompt_multiplier": base.with_(prompt_multiplier=2.0),
        "freq_penalty": base.with_(temperature=0.5, freq_penalty=1.0),
        "n_completion_tokens": base.with_(n_completion_tokens=MAX_NEW + 1),
        "vectors[0].hook": base.with_(
            vectors=[sw.Vector(torch.ones(576), "blocks.2.ln1.hook_normalized")]
        ),
        "when": base.with_(when=sw.When.tokens(2)),  # windows and token scope: refused
        "features[0].when": base.with_(
            features=[sw.Feature("10-smollm2-res-4k", 1, 10.0, when=sw.When.tokens(2))]
        ),
        "vectors[0].when": base.with_(
            vectors=[
                sw.Vector(
                    torch.ones(576),
                    "blocks.12.hook_resid_post",
                    when=sw.When(sw.Feature("5-smollm2-res-4k", 1), above=1.0, scope="prompt")
                    & sw.When(sw.Feature("5-smollm2-res-4k", 2), above=1.0),
                )
            ]
        ),
    }
    for field, request in refused.items():
        with pytest.raises(sw.RequestError) as info:
            remote.steer(request)
        assert info.value.field == field
    with pytest.raises(RemoteUnsupported) as info:  # in a batch too, of its own class
        remote.steer_batch({"ok": base, "bad": refused["steer_special_tokens"]})
    assert info.value.field == "requests['bad'].steer_special_tokens"
    assert remote.default_prompt_multiplier() == 1.0  # what the explorer starts with there
    assert remote.client.stats["requests"] == sent
    assert remote.steer(base.with_(n_completion_tokens=2)).outputs  # still usable


def test_engine_vectors_over_the_server_are_the_local_engines(remote, engine, tmp_path):
    """The SAEs live on this machine, so a request's decoder rows are the local engine's,
    with no request sent; a file of them names the model and steers the server as the
    request does."""
    feature = sw.Feature("10-smollm2-res-4k", 5, 30.0)
    custom = sw.Vector(torch.linspace(-1, 1, 576), "blocks.3.hook_resid_post", 2.0)
    request = sw.SteerRequest(
        "I think that", features=[feature], vectors=[custom], types=("STEERED",),
        temperature=0, n_completion_tokens=8, strength_multiplier=1.5,
    )  # fmt: skip
    sent = remote.client.stats["requests"]
    got, want = remote.vectors(request), engine.vectors(request)
    assert remote.client.stats["requests"] == sent
    assert [(v.hook, v.strength) for v in got] == [(v.hook, v.strength) for v in want]
    assert all(torch.equal(a.vector, b.vector) for a, b in zip(got, want, strict=True))
    path = sw.save_vectors(got, tmp_path / "v.json", format="neuronpedia", model=remote)
    assert json.loads(path.read_text())["modelId"] == "SmolLM2-135M-Instruct"
    back = sw.load_vectors(path, model=remote)
    steered = remote.steer(request).outputs["STEERED"].token_ids
    again = remote.steer(request.with_(features=[], vectors=back, strength_multiplier=1.0))
    assert again.outputs["STEERED"].token_ids == steered


def test_explorer_runs_over_the_remote_engine(remote):
    ex = sw.Explorer(
        remote,
        live=False,
        temperature=0,
        freq_penalty=0,
        n_completion_tokens=8,
        features=[("10-smollm2-res-4k", 123, 40.0)],
    )
    remote.clear_caches()
    ex.run()
    assert ex.wait(300)
    assert ex.error == "", ex.status
    request = ex.request()
    remote.clear_caches()
    assert ex.outputs == remote.steer(request).outputs
    assert ex.record()["served_by"]["url"] == remote.client.url
    assert ex.heatmap.rows and ex.completions.panes[1]["tokens"]
    assert ex.completions.pane("STEERED")["probs"] is None  # hover: "not available"
    ex.set_strength(0, 80.0)
    ex.run()
    assert ex.wait(300) and ex.error == ""
    assert ex.default_generations == 1  # DEFAULT came from the cache the second time
    ex.set(freq_penalty=1.0, temperature=0.5)
    ex.run()
    assert ex.wait(60)
    assert "freq_penalty" in ex.status  # refused, shown, and the explorer stays usable
    ex.set(freq_penalty=0.0)
    ex.run()
    assert ex.wait(300) and ex.error == ""


# -- faults ------------------------------------------------------------------------------
def test_wrong_missing_token_and_nothing_listening(server, monkeypatch):
    monkeypatch.delenv("INTERP_ENGINE_SERVER_TOKEN", raising=False)
    with pytest.raises(sw.errors.RemoteAuthError, match="token"):
        sw.Engine.remote(server.url, "wrong", model=sw.DEFAULT_MODEL)
    with pytest.raises(sw.errors.RemoteAuthError):
        sw.Engine.remote(server.url, model=sw.DEFAULT_MODEL)
    with pytest.raises(sw.errors.RemoteUnreachable, match="no answer"):
        sw.Engine.remote(f"http://127.0.0.1:{free_port()}", TOKEN, model=sw.DEFAULT_MODEL)


def test_a_refused_request_is_named(remote):
    with pytest.raises(sw.errors.RemoteRefused, match="vocabulary"):
        remote.model.runtime.capture([1, 10**7], ["blocks.9.hook_resid_post"])


@pytest.fixture(scope="module")
def queue0(tmp_path_factory):
    """A server that queues nothing: a second heavy request while one runs gets 503."""
    s = Server(default_model_dir(), tmp_path_factory.mktemp("ie0"), ("--max-queue", "0"))
    yield s
    s.stop()


def _long_stream(client: RemoteClient, started: threading.Event, halt: threading.Event):
    body = {"prompt_token_ids": [1, 57, 1510, 338], "max_tokens": 2000, "stop_at_eos": False}
    body.update(temperature=0.0, stream=True)
    for item in client.stream("/v1/generate", body, halt.is_set):
        if item["type"] == "token":
            started.set()


def test_a_full_queue_is_retried_then_named_and_cancel_frees_the_slot(queue0, monkeypatch):
    waits: list[float] = []
    real_sleep = remote_client._sleep

    def sleep(seconds, halt):  # record each wait the client takes, then take it
        waits.append(seconds)
        return real_sleep(seconds, halt)

    monkeypatch.setattr(remote_client, "_sleep", sleep)
    started, halt = threading.Event(), threading.Event()
    runner = threading.Thread(
        target=_long_stream, args=(RemoteClient(queue0.url, TOKEN), started, halt), daemon=True
    )
    runner.start()
    assert started.wait(120)
    body = {"prompt_token_ids": [1, 2], "points": ["resid_post.0"]}
    with pytest.raises(sw.errors.RemoteBusy) as info:
        RemoteClient(queue0.url, TOKEN, retries=0).post("/v1/capture", body)
    assert info.value.attempts == 1 and info.value.retry_after == 1.0
    with pytest.raises(sw.errors.RemoteBusy) as info:
        RemoteClient(queue0.url, TOKEN, retries=2).post("/v1/capture", body)
    assert info.value.attempts == 3
    assert waits == [1.0, 1.0]  # it waited the server's Retry-After between attempts
    waits.clear()
    halt.set()  # the long stream closes within one token; 2000 tokens would take minutes
    patient = RemoteClient(queue0.url, TOKEN, retries=60)
    assert patient.post("/v1/capture", body)["activations"]
    runner.join(60)
    assert not runner.is_alive()


def test_concurrent_outputs_on_a_full_queue_retry_and_stay_exact(queue0):
    remote = sw.Engine.remote(queue0.url, TOKEN, model=sw.DEFAULT_MODEL, retries=30)
    request = sw.SteerRequest(
        "I think that", features=[sw.Feature("10-smollm2-res-4k", 123, 40.0)], temperature=0
    )
    pair = remote.steer(request.with_(n_completion_tokens=6))
    assert remote.client.stats["retries_503"] >= 1  # one output waited for the other
    remote.clear_caches()
    alone = remote.steer(request.with_(n_completion_tokens=6, types=("STEERED",)))
    assert pair.outputs["STEERED"] == alone.outputs["STEERED"]


def test_cancel_closes_the_stream_within_a_token(queue0):
    remote = sw.Engine.remote(queue0.url, TOKEN, model=sw.DEFAULT_MODEL, retries=0)
    request = sw.SteerRequest(CHAT, types=("DEFAULT",), temperature=0, n_completion_tokens=2000)
    cancel = threading.Event()
    frames = []
    for frame in remote.steer_stream(request, cancel):
        frames.append(frame)
        if len(frames) == 3:
            cancel.set()
    assert frames[-1].done and frames[-1].outputs["DEFAULT"].stop == "cancelled"
    assert len(frames[-1].outputs["DEFAULT"].token_ids) == 3
    patient = RemoteClient(queue0.url, TOKEN, retries=60)  # the slot frees within one token
    assert patient.post("/v1/capture", {"prompt_token_ids": [1], "points": ["resid_post.0"]})


def test_a_server_killed_mid_stream_loses_nothing_already_streamed(tmp_path):
    server = Server(default_model_dir(), tmp_path)
    try:
        remote = sw.Engine.remote(server.url, TOKEN, model=sw.DEFAULT_MODEL)
        request = sw.SteerRequest(CHAT, types=("DEFAULT",), temperature=0, n_completion_tokens=300)
        seen: tuple[int, ...] = ()
        with pytest.raises(sw.errors.RemoteStreamBroken) as info:
            for frame in remote.steer_stream(request):
                seen = frame.outputs["DEFAULT"].token_ids
                if len(seen) == 4:
                    server.kill()
        kept = info.value.outputs["DEFAULT"]
        assert len(seen) >= 4 and kept.token_ids[: len(seen)] == seen and kept.stop == "error"
        assert "DEFAULT stream broke" in str(info.value)
        ex = sw.Explorer(remote, live=False, temperature=0, freq_penalty=0, n_completion_tokens=4)
        ex.run()
        assert ex.wait(60)
        assert "unreachable" in ex.status or "no answer" in ex.status, ex.status
    finally:
        server.stop()


def test_remote_recommends_the_strengths_measured_without_a_prompt_multiplier(
    remote, engine, sources
):
    """The server steers every position alike, so its recommended strengths are the ones
    measured that way (x1), not the local engine's (measured with the prompt pushed x2)."""
    from steer_widgets.analysis.concepts import SHARES

    hook = engine.saes.config(sources[1]).hook_name
    norm = remote.typical_norm(hook)
    assert norm == pytest.approx(engine.typical_norm(hook), rel=1e-3)
    assert remote.default_strength(sources[1]) == round(SHARES[1.0].feature * norm, 2)
    local = engine.default_strength(sources[1])
    assert local == round(SHARES[engine.default_prompt_multiplier()].feature * norm, 2)
    assert remote.default_strength(sources[1]) > local


def test_evaluate_over_the_server_equals_the_local_engine(remote, engine, sources):
    """engine.evaluate on a remote engine: one request per output, the same rows as local."""
    feature = sw.SteerRequest("", features=[sw.Feature(sources[1], 123, 40.0)])
    args = (["I think that", CHAT], (0.0, 1.0), ["the"])
    got = remote.evaluate(feature, *args, progress=False, n_completion_tokens=8)
    want = engine.evaluate(feature, *args, progress=False, n_completion_tokens=8)
    assert got.complete and len(got.rows) == len(want.rows) == 4
    for a, b in zip(got.rows, want.rows, strict=True):
        assert (a.prompt_index, a.strength, a.token_ids) == (
            b.prompt_index,
            b.strength,
            b.token_ids,
        )
        assert a.success == b.success and abs(a.fluency_delta - b.fluency_delta) < 1e-3


def test_prompt_scope_conditions_are_decided_here_and_served(remote, engine):
    """A prompt-scope condition is decided from the server's /v1/capture before the request:
    off, STEERED is DEFAULT's generation; on, it is the unconditional steering's."""
    source, index = CONDITION
    prompts = list(CONDITION_PROMPTS)
    means, cut = _prompt_means(engine)
    base = sw.SteerRequest(
        prompts[0], features=[sw.Feature("10-smollm2-res-4k", 100, 30.0)], n_completion_tokens=4,
        temperature=0.0,
    )  # fmt: skip
    when = sw.When(sw.Feature(source, index), above=cut, scope="prompt", reduce="mean")
    for prompt, mean in zip(prompts, means, strict=True):
        on = mean > cut
        plain = remote.steer(base.with_(prompt=prompt)).outputs
        got = remote.steer(base.with_(prompt=prompt, when=when)).outputs["STEERED"]
        want = plain["STEERED"] if on else plain["DEFAULT"]
        assert got.token_ids == want.token_ids, prompt
        assert set(got.gates["features[0]"]) == {on}
    assert plain["STEERED"].token_ids != plain["DEFAULT"].token_ids  # the steering does steer


CONDITION = ("5-smollm2-res-4k", 3187)  # a feature whose prompt mean parts the two prompts
CONDITION_PROMPTS = ("The weather today", "Hello")  # above the cut, below it


def _prompt_means(engine) -> tuple[list[float], float]:
    """``CONDITION``'s mean over each of ``CONDITION_PROMPTS`` (special tokens left out, as a
    prompt-scope condition reads it) and a cut halfway between them."""
    source, index = CONDITION
    means = []
    for prompt in CONDITION_PROMPTS:
        text = engine.text(prompt)
        values = engine.feature_values(text, source, index)[~torch.tensor(text.special)]
        means.append(float(values.mean()))
    cut = sum(means) / 2
    assert min(abs(m - cut) for m in means) > 0.5  # far from the threshold on either runtime
    return means, cut


def _wire(remote, monkeypatch) -> dict[str, list[tuple[str, int]]]:
    """Filled with what each ``/v1/generate`` asked the server to steer, by output label:
    the (point, layer) of every op in its body."""
    sent: dict[str, list[tuple[str, int]]] = {}
    real = remote.client.stream

    def stream(path, body, halt=lambda: False, what=""):
        if path == "/v1/generate":
            ops = [(w["point"], int(k)) for w in body.get("steering", ()) for k in w["layers"]]
            sent[what] = sorted(ops)
        yield from real(path, body, halt, what)

    monkeypatch.setattr(remote.client, "stream", stream)
    return sent


def test_gated_and_ungated_entries_together_over_the_server(remote, engine, monkeypatch):
    """Issue 67 item 1: an entry without a condition steers always beside a prompt-scope
    gated one (it used to get an empty gate, which failed in ``_decided``); a request-level
    condition gates every entry, and where an entry has its own as well both must hold."""
    means, cut = _prompt_means(engine)
    source, index = CONDITION

    def when(**bound):
        return sw.When(sw.Feature(source, index), scope="prompt", reduce="mean", **bound)

    hi, lo, always = when(above=cut), when(below=cut), when(above=min(means) - 1.0)
    f10, f5 = sw.Feature("10-smollm2-res-4k", 100, 30.0), sw.Feature("5-smollm2-res-4k", 9, 20.0)
    vector = sw.Vector(torch.linspace(-1, 1, 576), "blocks.4.hook_resid_pre", 5.0)
    F10, F5, V4 = ("resid_post", 10), ("resid_post", 5), ("resid_pre", 4)
    gated_f10 = replace(f10, when=hi)
    # entries -> per prompt (hi holds on the first, lo on the second): wire ops, gates
    cases = {
        "feature gated, feature not": (
            {"features": [gated_f10, f5]},
            [([F5, F10], {"features[0]": True}), ([F5], {"features[0]": False})],
        ),
        "vector gated, feature not": (
            {"features": [f10], "vectors": [replace(vector, when=hi)]},
            [([V4, F10], {"vectors[0]": True}), ([F10], {"vectors[0]": False})],
        ),
        "request and entry conditions": (
            {"features": [gated_f10, f5], "when": lo},  # features[0]: hi and lo, never
            [
                ([], {"features[0]": False, "features[1]": False}),
                ([F5], {"features[0]": False, "features[1]": True}),
            ],
        ),
        "request condition that always holds": (
            {"features": [gated_f10, f5], "when": always},
            [
                ([F5, F10], {"features[0]": True, "features[1]": True}),
                ([F5], {"features[0]": False, "features[1]": True}),
            ],
        ),
    }
    sent = _wire(remote, monkeypatch)
    base = sw.SteerRequest("", types=("STEERED",), temperature=0, n_completion_tokens=3)
    got, want = {}, {}
    for name, (fields, expected) in cases.items():
        for prompt, (ops, gates) in zip(CONDITION_PROMPTS, expected, strict=True):
            sent.clear()
            out = remote.steer(base.with_(prompt=prompt, **fields)).outputs["STEERED"]
            got[name, prompt] = (sent["STEERED"], {k: set(v) for k, v in out.gates.items()})
            want[name, prompt] = (sorted(ops), {k: {on} for k, on in gates.items()})
    assert got == want


def test_a_stream_the_server_ended_early_is_complete(remote, monkeypatch):
    """Issue 67 item 8: a server may stop on a token our stop ids lack; its 'done' line says
    the row ended, so the output is "eos". It used to be "cancelled": the remote DEFAULT was
    never cached and evaluate dropped the prompt's rows."""
    monkeypatch.setattr(remote.decoder, "stop_ids", frozenset())  # the server's eos unknown here
    ask = [{"role": "user", "content": "What is 2+2?"}]  # greedy: a dozen tokens, then eos
    feature = sw.Feature("10-smollm2-res-4k", 5, 4.0)
    request = sw.SteerRequest(ask, features=[feature], temperature=0, n_completion_tokens=40)
    remote.clear_caches()
    try:
        first = remote.steer(request).outputs["DEFAULT"]
        sent = remote.client.stats["requests"]
        remote.steer(request.with_(features=[replace(feature, strength=8.0)]))
        again = remote.client.stats["requests"] - sent
        ev = remote.evaluate(request, [ask], (0.0,), ["4"], progress=False, n_completion_tokens=40)
    finally:
        remote.clear_caches()  # DEFAULTs decoded without the stop ids
    got = {
        "DEFAULT": (first.stop, len(first.token_ids) < 40),
        "requests of the second steer": again,
        "evaluation": (ev.complete, [(r.strength, r.stop) for r in ev.rows]),
    }
    assert got == {
        "DEFAULT": ("eos", True),
        "requests of the second steer": 1,  # STEERED only: DEFAULT came from the cache
        "evaluation": (True, [(0.0, "eos")]),
    }


def test_a_chat_over_the_server_is_the_local_engines_turn_by_turn(remote, engine, sources):
    """Histories travel as token ids, so each side's reply over the server is the local
    engine's, turn by turn (greedy: the server's sampler is not ours)."""
    settings = dict(features=[sw.Feature(sources[1], 123, 40.0)], temperature=0.0,
                    freq_penalty=0.0, n_completion_tokens=8)  # fmt: skip
    chats = [remote.chat(**settings), engine.chat(**settings)]
    for message in ("What should I cook tonight?", "Something quicker, please."):
        got, want = (chat.say(message) for chat in chats)
        assert {s: c.token_ids for s, c in got.items()} == {s: c.token_ids for s, c in want.items()}
    assert chats[0].history("STEERED") == chats[1].history("STEERED")
    frames = list(chats[0].say_stream("And a dessert?"))
    assert frames[-1].done and len(chats[0].turns) == 3
    assert frames[-1].outputs == chats[1].say("And a dessert?")
