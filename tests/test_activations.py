"""Activations over text agree with a direct computation; the residual cache avoids reruns."""

from __future__ import annotations

import pytest
import torch

import steer_widgets as sw

TEXT = "The Eiffel Tower in Paris is visited by millions of tourists every year."
CHAT = [{"role": "user", "content": "Name three rivers in France."}]


def direct(engine, prompt, source) -> torch.Tensor:
    """Model forward to the hook, then the SAE's own encode: all features, [T, d_sae]."""
    cfg = engine.saes.config(source)
    ids = torch.tensor([engine.tokenizer.encode(prompt).ids])
    seen = {}
    engine.model.runtime.forward(
        ids,
        hooks={cfg.hook_name: lambda x, s: seen.setdefault("x", x[0])},
        stop_at_layer=cfg.layer + 1,
    )
    return engine.saes.get(source).encode(seen["x"])


@pytest.mark.parametrize("prompt", [TEXT, CHAT])
def test_feature_values_match_direct_encode(engine, sources, prompt):
    source = sources[1]
    want = direct(engine, prompt, source)
    index = int(want[1:].max(0).values.argmax())  # a feature that fires here
    acts = engine.activations(prompt, source, index)
    torch.testing.assert_close(torch.tensor(acts.values)[1:], want[1:, index], atol=1e-4, rtol=1e-4)
    nonspecial = [i for i, s in enumerate(acts.special) if not s]
    best = max(nonspecial, key=lambda i: acts.values[i])
    assert acts.max_position == best and acts.max_value == acts.values[best]
    assert len(acts.tokens) == len(acts.values) == len(acts.special)
    frame = acts.to_frame()
    assert list(frame.columns) == ["token", "special", "value"] and len(frame) == len(acts.tokens)


def test_chat_scaffolding_is_flagged_and_bos_zeroed(engine, sources):
    acts = engine.activations(CHAT, sources[0], 3)
    assert acts.special[0] and acts.values[0] == 0.0
    assert (
        "".join(t for t, s in zip(acts.tokens, acts.special, strict=True) if not s)
        == CHAT[0]["content"]
    )


def test_topk_per_token_and_top_n_agree_with_brute_force(engine, sources):
    source = sources[2]
    want = direct(engine, TEXT, source)
    per_token = engine.top_features_per_token(TEXT, source, k=4)
    for pos in range(1, want.shape[0]):
        values, _ = want[pos].topk(4)
        torch.testing.assert_close(
            torch.tensor(per_token.values[pos]), values, atol=1e-4, rtol=1e-4
        )
    text = engine.text(TEXT)
    keep = [i for i, s in enumerate(text.special) if not s]
    for rank_by, score in (("max", want[keep].max(0).values), ("sum", want[keep].sum(0))):
        top = engine.top_features(TEXT, source, n=6, rank_by=rank_by)
        torch.testing.assert_close(
            torch.tensor(top.scores), score.topk(6).values, atol=1e-3, rtol=1e-4
        )
        assert set(top.indices) <= set(score.topk(8).indices.tolist())
    chosen = engine.top_features(TEXT, source, n=3, positions=[2, 3], rank_by="sum")
    torch.testing.assert_close(
        torch.tensor(chosen.scores), want[[2, 3]].sum(0).topk(3).values, atol=1e-3, rtol=1e-4
    )
    assert len(engine.top_features_per_token(TEXT, source, k=2).to_frame()) == 2 * want.shape[0]


def test_second_query_on_same_text_hits_the_cache(engine, sources):
    engine.clear_caches()
    a, b = engine.top_features(TEXT, sources[2], n=2).indices  # the one forward pass
    first = engine.activations(TEXT, sources[2], a)
    again = engine.activations(TEXT, sources[2], a)
    other = engine.activations(TEXT, sources[2], b)
    shallower = engine.activations(TEXT, sources[0], 6)  # captured in the same deep pass
    engine.top_features_per_token(TEXT, sources[1], k=3)
    stats = engine.residual_cache.stats()
    assert stats["forwards"] == 1 and stats["hits"] >= 4
    assert first.values == again.values and other.values != first.values
    assert shallower.tokens == first.tokens


def test_activations_over_a_steered_completion(engine, sources):
    request = sw.SteerRequest(
        CHAT, features=[sw.Feature(sources[1], 11, 80.0)], n_completion_tokens=6
    )
    result = engine.steer(request)
    steered = result.outputs["STEERED"]
    acts = engine.activations(CHAT, sources[1], 11, completion=steered)
    n_prompt = len(engine.tokenizer.encode(CHAT).ids)
    ids = list(engine.tokenizer.encode(CHAT).ids) + list(steered.token_ids)
    assert len(acts.values) == n_prompt + len(steered.token_ids)
    # the same values from one plain forward over prompt + completion and the SAE's encoder,
    # past the engine's residual cache
    cfg = engine.saes.config(sources[1])
    captured = {}

    def grab(x, start):
        captured["resid"] = x[0].float().cpu().clone()

    with torch.no_grad():
        engine.model.runtime.forward(
            torch.tensor([ids]), hooks={cfg.hook_name: grab}, stop_at_layer=cfg.layer + 1
        )
    with engine.saes.using(sources[1]) as (sae,):
        want = sae.encode(captured["resid"])[:, 11]
    want[0] = 0.0  # BOS is zeroed
    assert torch.allclose(torch.tensor(acts.values), want, atol=1e-4)


def test_neighbours_agree_with_brute_force(engine, sources):
    w = torch.nn.functional.normalize(engine.saes.get(sources[1]).W_dec, dim=1)
    cos = w @ w[42]
    cos[42] = -2
    want = cos.topk(5)
    got = engine.neighbours(sources[1], 42, n=5)
    assert [i for i, _ in got] == want.indices.tolist()


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (("", "__src__", 1), sw.RequestError, "prompt: is empty"),
        (("word " * 9000, "__src__", 1), sw.RequestError, "prompt"),
        ((TEXT, "no-such", 1), sw.SourceError, "'no-such'"),
        ((TEXT, "__src__", 99999), sw.SourceError, "index 99999 out of range"),
    ],
)
def test_bad_input_names_it(engine, sources, args, error, match):
    args = tuple(sources[0] if a == "__src__" else a for a in args)
    with pytest.raises(error, match=match):
        engine.activations(*args)
    assert engine.activations(TEXT, sources[0], 1).tokens


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda e, s: e.activations(None, s, 1), "prompt"),
        (lambda e, s: e.activations(TEXT, s, None), "source"),
        (lambda e, s: e.activations(TEXT, s, True), "source"),
        (lambda e, s: e.top_features_per_token(TEXT, s, k=0), "k"),
        (lambda e, s: e.top_features_per_token(TEXT, s, k=True), "k"),
        (lambda e, s: e.top_features(TEXT, s, n=None), "n"),
        (lambda e, s: e.top_features(TEXT, s, positions=[True]), "positions"),
        (lambda e, s: e.top_features(TEXT, s, positions=5), "positions"),
        (lambda e, s: e.top_features(TEXT, s, rank_by=None), "rank_by"),
        (lambda e, s: e.neighbours(s, 1, n=-1), "n"),
        (lambda e, s: e.neighbours(s, 4096), "source"),
    ],
)
def test_bad_analysis_arguments_are_named(engine, sources, call, field):
    with pytest.raises((sw.RequestError, sw.SourceError)) as info:
        call(engine, sources[0])
    err = info.value
    assert (err.source == sources[0]) if field == "source" else (err.field == field), err
