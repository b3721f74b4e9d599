"""Conditional steering on the default model: exact where it should be, and as documented.

* The properties, over 250 random conditional requests on 100 random steerings (features
  and vectors at several hooks, both scopes, windows counted from the completion, the
  prompt or position 0, ``relative`` and ``projection`` scores, every steer method,
  ``prompt_multiplier`` 1 and 2, ``steer_special_tokens`` on and off, chat and completion,
  greedy and sampled), each condition on the whole request, on every entry or on some
  entries with the others ungated: a condition that holds nowhere gives exactly the
  tokens and probabilities of the request without its gated entries (DEFAULT's where
  none is left), one that holds everywhere exactly the unconditional steering's, and
  conditions that switch (50) decode in ragged batches each equal to its solo run, and
  replay from their records (17 of them re-run). ``SW_CONDITION_STEERINGS`` scales the 100.
* The references: a token-scope gate equals ``feature_values`` (as a fraction of the top
  activation under ``relative``), the cosine or the projection of the text generated,
  thresholded in Python (positions within 1e-4 of the threshold skipped), with and without
  hysteresis; a prompt-scope decision equals the reduced values of the prompt.
* Refusals before any work: an unknown source, a token-scope condition read after its
  steering or after any other entry's, a vector file asked to carry a condition.
* Explanations of a conditional result read each entry where its gate was on.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

import steer_widgets as sw
from steer_widgets.steering.requests import output_multipliers

COND = "5-smollm2-res-4k"  # conditions are read here, steering comes after
FREQUENT = [3187, 3707, 2208]  # features of COND that fire on some tokens of most texts
STEER_SOURCES = ["10-smollm2-res-4k", "12-smollm2-res-4k", "22-smollm2-res-4k"]
DIR5 = torch.randn(576, generator=torch.Generator().manual_seed(5))
PROMPTS = [
    "I think that",
    "The best thing about the city is",
    [{"role": "user", "content": "What should I cook tonight?"}],
    [{"role": "user", "content": "Tell me about the ocean."}],
]
N_STEERINGS = int(os.environ.get("SW_CONDITION_STEERINGS", "100"))


def _leaf(rng: random.Random) -> sw.Condition:
    """A condition that holds at some positions of some texts."""
    kind = rng.randrange(7)
    if kind == 6:  # a fraction of the feature's top activation in its index
        return sw.When(sw.Feature(COND, rng.choice(FREQUENT)), above=rng.choice([0.1, 0.3]),
                       relative=True, scope=rng.choice(["token", "prompt"]))  # fmt: skip
    if kind == 0:
        off = {"off_below": 1.0} if rng.random() < 0.5 else {}
        return sw.When(sw.Feature(COND, rng.choice(FREQUENT)), above=rng.choice([2.0, 5.0]), **off)
    if kind == 1:
        return sw.When(
            sw.Feature(STEER_SOURCES[-1], rng.randrange(4096)), above=0.5, scope="prompt",
            reduce=rng.choice(["max", "mean", "last"]),
        )  # fmt: skip
    if kind == 2:
        return sw.When(sw.Vector(DIR5, "blocks.5.hook_resid_post"), above=rng.choice([-0.02, 0.02]))
    if kind == 3:
        return sw.When(
            sw.Vector(DIR5, "blocks.6.hook_resid_pre"), below=0.5, measure="projection",
            scope=rng.choice(["token", "prompt"]),
        )  # fmt: skip
    start = rng.randrange(4)
    of = rng.choice(["completion", "prompt", "all"])
    return sw.When.tokens(start, start + rng.randrange(1, 6), of=of)


def _real(rng: random.Random, depth: int = 0) -> sw.Condition:
    if depth >= 2 or rng.random() < 0.5:
        return _leaf(rng)
    a, b = _real(rng, depth + 1), _real(rng, depth + 1)
    return rng.choice([a & b, a | b, ~a])


def _never(rng: random.Random) -> sw.Condition:
    """A condition that holds at no position of any text, in one of several shapes."""
    kind = rng.randrange(6)
    if kind == 0:
        return sw.When(sw.Feature(COND, rng.choice(FREQUENT)), above=1e6)
    if kind == 1:
        return sw.When(sw.Vector(DIR5, "blocks.5.hook_resid_post"), above=1.5)  # a cosine
    if kind == 2:
        return sw.When.tokens(0, 0, of="all")
    if kind == 3:
        return _real(rng) & _never(rng)
    if kind == 4:
        return sw.When(sw.Feature(STEER_SOURCES[-1], 3), above=1e6, scope="prompt")
    return ~_always(rng)


def _always(rng: random.Random) -> sw.Condition:
    kind = rng.randrange(4)
    if kind == 0:
        return sw.When(sw.Feature(COND, rng.choice(FREQUENT)), below=1e6)
    if kind == 1:
        return sw.When.tokens(of="all")
    if kind == 2:
        return _real(rng) | _always(rng)
    return ~_never(rng)


def _base(rng: random.Random, i: int) -> sw.SteerRequest:
    """A random unconditional request steering at layers 6 and up."""
    method = rng.choice(sw.METHODS)
    sources = rng.sample(STEER_SOURCES, rng.randint(1, 2))
    features = [sw.Feature(s, rng.randrange(4096), rng.choice([30.0, 60.0])) for s in sources]
    hooks = ["blocks.6.hook_resid_pre", "blocks.15.hook_resid_post"]
    vectors = [
        sw.Vector(torch.randn(576, generator=torch.Generator().manual_seed(i)), h, 8.0)
        for h in rng.sample(hooks, rng.randint(0, 1))
    ]
    return sw.SteerRequest(
        rng.choice(PROMPTS[:3] * 2 + PROMPTS[2:]), features=features, vectors=vectors, steer_method=method,
        strength_multiplier=rng.choice([1.0, 2.0]), normalize_steering=rng.random() < 0.3,
        steer_special_tokens=rng.random() < 0.5, prompt_multiplier=rng.choice([1.0, 2.0]),
        n_completion_tokens=rng.randint(3, 4), temperature=rng.choice([0.0, 0.8]),
        freq_penalty=rng.choice([0.0, 1.0]), seed=rng.randrange(1000),
        sweep=(2.0,) if rng.random() < 0.25 else (),
    )  # fmt: skip


def _attach(rng: random.Random, request: sw.SteerRequest, cond: sw.Condition):
    """``cond`` on the whole request, on every entry (then it gates each alone) or on some
    of them, the others left ungated: the request and the request without the gated
    entries (``None`` where none would be left)."""
    n_features, n = len(request.features), len(request.features) + len(request.vectors)
    place = rng.random()
    if place < 0.3:
        return request.with_(when=cond), None
    gated = (
        set(range(n))
        if place < 0.55 or n == 1
        else set(rng.sample(range(n), rng.randint(1, n - 1)))
    )
    features = [sw.Feature(f.source, f.index, f.strength, when=cond if i in gated else None)
                for i, f in enumerate(request.features)]  # fmt: skip
    vectors = [sw.Vector(v.vector, v.hook, v.strength, when=cond if n_features + i in gated else None)
               for i, v in enumerate(request.vectors)]  # fmt: skip
    kept_f = [f for i, f in enumerate(request.features) if i not in gated]
    kept_v = [v for i, v in enumerate(request.vectors) if n_features + i not in gated]
    without = request.with_(features=kept_f, vectors=kept_v) if kept_f or kept_v else None
    return request.with_(features=features, vectors=vectors), without


def _same(a: sw.Completion, b: sw.Completion) -> bool:
    """Tokens, stop and every probability recorded, bit for bit."""
    return a == b and a.token_probs == b.token_probs


def _steered(result: sw.SteerResult) -> list[str]:
    return [k for k, m in output_multipliers(result.request).items() if m is not None]


def test_conditions_hold_nowhere_everywhere_batch_solo_replay(engine):
    rng = random.Random(50)
    bases = [_base(rng, i) for i in range(N_STEERINGS)]
    batch: dict[str, sw.SteerRequest] = {}
    for i, base in enumerate(bases):
        batch[f"{i}"] = base
        batch[f"{i}-never"], without = _attach(rng, base, _never(rng))
        if without is not None:  # the ungated entries still steer: compare with them alone
            batch[f"{i}-without"] = without
        batch[f"{i}-always"], _ = _attach(rng, base, _always(rng))
        if i % 2 == 0:  # conditions that switch, for batch = solo and replay
            batch[f"{i}-real"], _ = _attach(rng, base, _real(rng))
    engine.clear_caches()
    results = {}
    for part in range(0, len(bases), 25):  # 100 requests a batch
        names = [k for k in batch if int(k.split("-")[0]) in range(part, part + 25)]
        results.update(engine.steer_batch({k: batch[k] for k in names}))
    changed = mixed = partly = 0
    for i in range(len(bases)):
        plain = results[f"{i}"].outputs
        partly += f"{i}-without" in results
        for label in _steered(results[f"{i}"]):
            changed += plain[label] != plain["DEFAULT"]
            left = results[f"{i}-without"].outputs[label] if f"{i}-without" in results else None
            assert _same(results[f"{i}-never"].outputs[label], left or plain["DEFAULT"]), (i, label)
            assert _same(results[f"{i}-always"].outputs[label], plain[label]), (i, label)
            assert not any(any(g) for g in results[f"{i}-never"].outputs[label].gates.values())
            if f"{i}-real" in results:
                logs = results[f"{i}-real"].outputs[label].gates.values()
                mixed += any(0 < sum(g) < len(g) for g in logs)
    print(f"steered differently: {changed}; gates that switched: {mixed}")
    assert changed > N_STEERINGS * 0.4, changed  # steering that did nothing would prove nothing
    assert mixed > N_STEERINGS * 0.15, mixed  # conditions that never switch would prove little
    assert partly > N_STEERINGS * 0.1, partly  # gated and ungated entries in one request
    for i in range(0, len(bases), 6):  # batch = solo and replay = original: every third
        key = f"{i}-real"
        solo = engine.steer(batch[key])
        replay = engine.steer(results[key].to_dict())
        for label, out in results[key].outputs.items():
            assert _same(solo.outputs[label], out) and solo.outputs[label].gates == out.gates
            assert _same(replay.outputs[label], out) and replay.outputs[label].gates == out.gates


def _gated_run(engine, when, n=24, prompt=PROMPTS[2], entries=1):
    features = [sw.Feature(STEER_SOURCES[0], 100 + k, 30.0) for k in range(entries)]
    request = sw.SteerRequest(
        prompt, features=features, when=when, types=("STEERED",),
        n_completion_tokens=n, temperature=0.8, seed=7,
    )  # fmt: skip
    out = engine.steer(request).outputs["STEERED"]
    return out, engine.text(prompt, out)


def _agree(gate, values, above, off_below=None) -> int:
    """Check ``gate`` against ``values`` thresholded here (hysteresis if ``off_below``);
    positions within 1e-4 of a threshold are skipped. Returns the positions compared."""
    compared, was = 0, False
    for p, on in enumerate(gate):
        v = float(values[p])
        want = (v >= off_below if was else v > above) if off_below is not None else v > above
        near = [t for t in (above, off_below) if t is not None and abs(v - t) < 1e-4]
        if not near:
            assert on == want, (p, v, on)
            compared += 1
        was = on if off_below is not None else was
    return compared


def test_a_token_gate_equals_feature_values_thresholded(engine):
    for index, above in [(3187, 5.0), (3707, 2.0)]:
        out, text = _gated_run(engine, sw.When(sw.Feature(COND, index), above=above), entries=2)
        gates = out.gates
        assert gates["features[0]"] == gates["features[1]"]  # one request condition
        gate = gates["features[0]"]
        assert len(gate) == len(text.ids) - 1  # the last token is never run
        values = engine.feature_values(text, COND, index)
        assert _agree(gate, values, above) >= len(gate) - 2
        assert 0 < sum(gate) < len(gate)


def test_hysteresis_holds_the_gate_until_the_score_falls(engine):
    when = sw.When(sw.Feature(COND, 3187), above=8.0, off_below=2.0)
    out, text = _gated_run(engine, when)
    gate = out.gates["features[0]"]
    values = engine.feature_values(text, COND, 3187)
    assert _agree(gate, values, 8.0, 2.0) >= len(gate) - 2
    plain = [float(v) > 8.0 for v in values[: len(gate)]]
    assert sum(gate) > sum(plain)  # it did hold on past the threshold


@pytest.mark.parametrize("measure,above", [("cosine", 0.02), ("projection", 0.1)])
def test_a_direction_gate_equals_the_cosine_or_projection_thresholded(engine, measure, above):
    hook = "blocks.5.hook_resid_post"
    when = sw.When(sw.Vector(DIR5, hook), above=above, measure=measure)
    out, text = _gated_run(engine, when)
    captured = {}
    tokens = torch.tensor([list(text.ids)])
    engine.model.runtime.forward(
        tokens, hooks={hook: lambda x, start: captured.setdefault("x", x[0].clone())},
        stop_at_layer=6,
    )  # fmt: skip
    x = captured["x"].double()
    score = x @ DIR5.double() / DIR5.double().norm()
    if measure == "cosine":
        score = score / x.norm(dim=-1)
    score[0] = 0.0  # BOS scores 0
    gate = out.gates["features[0]"]
    assert _agree(gate, score, above) >= len(gate) - 2
    assert 0 < sum(gate) < len(gate)
    _, values, threshold = engine.condition_scores(when, PROMPTS[2], out)
    assert threshold == above and values == pytest.approx(score.tolist(), abs=1e-4)


def test_a_relative_gate_is_the_activation_over_its_top_thresholded(engine):
    top = engine.feature_index(COND)[3187].max_act
    out, text = _gated_run(engine, sw.When(sw.Feature(COND, 3187), above=0.3, relative=True))
    gate = out.gates["features[0]"]
    values = engine.feature_values(text, COND, 3187)
    assert _agree(gate, values, 0.3 * top) >= len(gate) - 2
    assert 0 < sum(gate) < len(gate)


@pytest.mark.parametrize("reduce", ["max", "mean", "last"])
def test_a_prompt_decision_is_the_prompt_values_reduced(engine, reduce):
    prompt = PROMPTS[3]
    text = engine.text(prompt)
    values = engine.feature_values(text, COND, 3187)
    keep = values[~torch.tensor(text.special)]
    value = {"max": keep.max(), "mean": keep.mean(), "last": keep[-1]}[reduce]
    for above in (float(value) - 0.01, float(value) + 0.01):
        when = sw.When(sw.Feature(COND, 3187), above=above, scope="prompt", reduce=reduce)
        out, _ = _gated_run(engine, when, n=4, prompt=prompt)
        gate = out.gates["features[0]"]
        assert set(gate) == {float(value) > above}


def test_steering_before_a_token_condition_is_refused_before_any_work(engine):
    late = sw.When(sw.Feature("12-smollm2-res-4k", 1), above=1.0)
    request = sw.SteerRequest(
        "Hi", features=[sw.Feature(STEER_SOURCES[0], 1), sw.Feature(COND, 2, when=late)]
    )
    forwards = engine.residual_cache.forwards
    with pytest.raises(sw.RequestError, match="after features") as err:
        engine.steer(request)
    assert err.value.field == "features[1].when"
    with pytest.raises(sw.RequestError) as err:  # the request's condition gates every entry
        engine.steer(request.with_(features=request.features[:1], when=late))
    assert err.value.field == "when"
    # the same point under its two names is allowed; a prompt-scope one may come later
    same = sw.When(sw.Vector(DIR5, "blocks.11.hook_resid_pre"), above=0.0)
    engine.steer(request.with_(features=request.features[:1], when=same, n_completion_tokens=2))
    prompt_scope = sw.When(sw.Feature("22-smollm2-res-4k", 1), above=1.0, scope="prompt")
    engine.steer(request.with_(when=prompt_scope, features=request.features[:1],
                               n_completion_tokens=2))  # fmt: skip
    assert engine.residual_cache.forwards == forwards + 1  # only the prompt decision's pass


def test_unknown_sources_and_hooks_are_named(engine):
    cases = [
        (sw.When(sw.Feature("no-such-sae", 1), above=1.0), "when.on"),
        (sw.When(sw.Feature(COND, 4096), above=1.0), "when.on"),
        (sw.When(sw.Vector(DIR5, "blocks.99.hook_resid_post"), above=0.1), "when.on.hook"),
        (sw.When(sw.Vector(torch.zeros(576), "blocks.2.hook_resid_post"), above=0.1),
         "when.on.vector"),
        (sw.When.tokens(2) & sw.When(sw.Vector(DIR5[:7], "blocks.2.hook_resid_post"), above=0.1),
         "when.conditions[1].on.vector"),
    ]  # fmt: skip
    request = sw.SteerRequest("Hi", features=[sw.Feature(STEER_SOURCES[0], 1)])
    for when, field in cases:
        with pytest.raises(sw.RequestError) as err:
            engine.steer(request.with_(when=when))
        assert err.value.field == field
    assert engine.steer(request.with_(n_completion_tokens=2)).outputs["STEERED"].complete


def test_a_vector_file_cannot_carry_a_condition(engine, tmp_path):
    when = sw.When.tokens(1)
    request = sw.SteerRequest("Hi", features=[sw.Feature(STEER_SOURCES[0], 1, when=when)])
    with pytest.raises(sw.VectorUnsupported) as err:
        engine.vectors(request)
    assert err.value.source == "features[0].when"
    with pytest.raises(sw.VectorUnsupported) as err:
        engine.vectors(request.with_(features=[sw.Feature(STEER_SOURCES[0], 1)], when=when))
    assert err.value.source == "when"
    assert not list(tmp_path.iterdir())


def test_evaluate_counts_off_topic_prompts_left_as_default(engine):
    on, off = PROMPTS[2], PROMPTS[3]
    means = []
    for prompt in (on, off):
        text = engine.text(prompt)
        values = engine.feature_values(text, COND, 3187)[~torch.tensor(text.special)]
        means.append(float(values.mean()))
    assert means[0] != means[1]
    cut = sum(means) / 2
    when = sw.When(sw.Feature(COND, 3187), scope="prompt", reduce="mean",
                   **({"above": cut} if means[0] > cut else {"below": cut}))  # fmt: skip
    steering = sw.SteerRequest("", features=[sw.Feature(STEER_SOURCES[0], 100, 30.0)], when=when)
    ev = engine.evaluate(
        steering, prompts=[on], off_topic=[off], strengths=(1.0, 2.0), judge=["cook"],
        progress=False, n_completion_tokens=6,
    )  # fmt: skip
    table = ev.summary()
    assert list(table["n"]) == [1, 1] and list(table["n_off"]) == [1, 1]
    assert list(table["untouched"]) == [1.0, 1.0] and list(table["false_triggers"]) == [0.0, 0.0]
    frame = ev.frame()
    assert list(frame["off_topic"]) == [False, False, True, True]
    assert list(frame["gate_opened"]) == [True, True, False, False]
    for row in ev.rows:  # each row is its solo run
        prompt = (on, off)[row.prompt_index]
        solo = engine.steer(steering.with_(prompt=prompt, strength_multiplier=row.strength,
                                           types=("STEERED",), n_completion_tokens=6,
                                           temperature=0.0))  # fmt: skip
        assert solo.outputs["STEERED"].token_ids == row.token_ids
    again = engine.evaluate(ev.to_dict(), progress=False)
    assert again.rows == ev.rows and again.off_topic_from == 1
    with pytest.raises(sw.RequestError) as err:
        engine.evaluate(steering, prompts=[on], off_topic=[on, ""], progress=False)
    assert err.value.field == "off_topic[1]"


def test_condition_threshold_separates_the_texts_it_is_given(engine):
    positive, negative = ["The weather today", "The ocean is"], ["Hello", "Hi"]
    for scope in ("prompt", "token"):
        when = sw.When(sw.Feature(COND, 3187), above=0.0, scope=scope, reduce="mean")
        fit = engine.condition_threshold(when, positive, negative)
        assert (fit.precision, fit.recall, fit.f1) == (1.0, 1.0, 1.0)
        assert max(fit.negative_scores) < fit.threshold < min(fit.positive_scores)
        assert fit.when.above == fit.threshold and fit.when.scope == scope
    prompt_when = engine.condition_threshold(
        sw.When(sw.Feature(COND, 3187), above=0.0, scope="prompt", reduce="mean"),
        positive, negative,
    ).when  # fmt: skip
    steering = sw.SteerRequest("", features=[sw.Feature(STEER_SOURCES[0], 100, 30.0)],
                               when=prompt_when, types=("STEERED",), n_completion_tokens=2)  # fmt: skip
    for prompt, on in [(p, True) for p in positive] + [(p, False) for p in negative]:
        gates = engine.steer(steering.with_(prompt=prompt)).outputs["STEERED"].gates
        assert set(gates["features[0]"]) == {on}, prompt  # the fitted decision, applied
    below = engine.condition_threshold(sw.When(sw.Feature(COND, 3187), below=0.0,
                                               scope="prompt"), negative, positive)  # fmt: skip
    assert below.f1 == 1.0 and below.when.below == below.threshold
    bad = [
        (sw.When(sw.Feature(COND, 3187), above=0.0, below=9.0), positive, negative, "when"),
        (sw.When.tokens(2), positive, negative, "when"),
        (sw.When(sw.Feature(COND, 3187), above=0.0), [], negative, "positive"),
        (sw.When(sw.Feature(COND, 3187), above=0.0), positive, [""], "negative[0]"),
    ]
    for when, pos, neg, field in bad:
        with pytest.raises(sw.RequestError) as err:
            engine.condition_threshold(when, pos, neg)
        assert err.value.field == field


def test_gated_and_ungated_entries_mix_at_different_hooks(engine):
    """An entry without a condition beside one with its own steers everywhere; the gated one
    steers only where its condition holds: never gives the request without it, always the
    unconditional one (and the ungated entry has no gate log)."""
    plain = sw.SteerRequest(
        PROMPTS[0], features=[sw.Feature(STEER_SOURCES[0], 100, 30.0)],
        vectors=[sw.Vector(DIR5, "blocks.15.hook_resid_post", 8.0)], n_completion_tokens=6,
        temperature=0.8, seed=3,
    )  # fmt: skip
    gated = lambda cond: plain.with_(  # noqa: E731
        vectors=[sw.Vector(DIR5, "blocks.15.hook_resid_post", 8.0, when=cond)]
    )
    window = engine.steer(gated(sw.When.tokens(2))).outputs["STEERED"]
    assert set(window.gates) == {"vectors[0]"} and 0 < sum(window.gates["vectors[0]"])
    never = engine.steer(gated(sw.When.tokens(0, 0, of="all"))).outputs["STEERED"]
    without = engine.steer(plain.with_(vectors=[])).outputs["STEERED"]
    assert _same(never, without) and not any(never.gates["vectors[0]"])
    always = engine.steer(gated(sw.When.tokens(of="all"))).outputs["STEERED"]
    assert _same(always, engine.steer(plain).outputs["STEERED"])
    token = sw.When(sw.Feature(COND, 3187), above=5.0)  # read at 5, before both entries
    mixed = engine.steer(
        plain.with_(
            when=None,
            features=[sw.Feature(STEER_SOURCES[0], 100, 30.0, when=token)],
            vectors=plain.vectors,
        )
    ).outputs
    assert set(mixed["STEERED"].gates) == {"features[0]"}


def test_a_token_condition_after_other_steering_is_refused_naming_both(engine):
    """Rule 1: a token-scope score is what the unsteered model computes, so no entry may
    steer before the point it is read at, gated or not."""
    early = sw.Vector(DIR5, "blocks.2.hook_resid_post", 4.0)
    token = sw.When(sw.Feature(COND, 3187), above=5.0)
    late = sw.Feature(STEER_SOURCES[0], 100, 30.0, when=token)
    forwards = engine.residual_cache.forwards
    for vector in (early, sw.Vector(DIR5, early.hook, 4.0, when=sw.When.tokens(2))):
        with pytest.raises(sw.RequestError, match="vectors\\[0\\] steers earlier") as err:
            engine.steer(sw.SteerRequest("Hi", features=[late], vectors=[vector]))
        assert err.value.field == "features[0].when" and "features[0]" in str(err.value)
    assert engine.residual_cache.forwards == forwards  # refused before any work
    # a window or a prompt-scope decision does not read the gated run: allowed
    for cond in (sw.When.tokens(1), sw.When(sw.Feature(COND, 3187), above=5.0, scope="prompt")):
        request = sw.SteerRequest("Hi", features=[sw.Feature(STEER_SOURCES[0], 100, 30.0,
                                  when=cond)], vectors=[early], n_completion_tokens=2)  # fmt: skip
        assert engine.steer(request).outputs["STEERED"].complete


def test_special_tokens_left_unsteered_are_not_logged_as_steered(engine):
    """With ``steer_special_tokens=False`` the chat template's tokens are never steered, so
    the gate log says so, and ``evaluate`` counts no gate opened there."""
    always = sw.When.tokens(of="all")
    request = sw.SteerRequest(
        PROMPTS[2], features=[sw.Feature(STEER_SOURCES[0], 100, 30.0)], when=always,
        types=("STEERED",), n_completion_tokens=2, steer_special_tokens=False,
    )  # fmt: skip
    special = engine.text(PROMPTS[2]).special
    log = engine.steer(request).outputs["STEERED"].gates["features[0]"]
    assert list(log[: len(special)]) == [not s for s in special] and any(special)
    assert all(log[len(special) :])
    log_on = engine.steer(request.with_(steer_special_tokens=True)).outputs["STEERED"].gates
    assert all(log_on["features[0]"])
    first = request.with_(prompt="", when=sw.When.tokens(0, 1, of="all"))  # <|im_start|>
    ev = engine.evaluate(first, prompts=[PROMPTS[2]], off_topic=[PROMPTS[3]], strengths=(1.0,),
                         judge=["x"], progress=False, n_completion_tokens=2)  # fmt: skip
    assert list(ev.frame()["gate_opened"]) == [False, False]


def test_a_token_threshold_fit_agrees_with_the_gates_on_chat_prompts(engine):
    """A token-scope fit reads every position its gate reads, chat template tokens included:
    feature 2204 at layer 5 fires on the template only, so chats and plain texts separate,
    and the fitted gate opens on exactly the texts the fit says it does."""
    when = sw.When(sw.Feature(COND, 2204), above=0.0)
    positive, negative = PROMPTS[2:], PROMPTS[:2]
    fit = engine.condition_threshold(when, positive, negative)
    for texts, scores in ((positive, fit.positive_scores), (negative, fit.negative_scores)):
        for prompt, score in zip(texts, scores, strict=True):
            _, values, _ = engine.condition_scores(when, prompt)
            assert score == pytest.approx(max(values))
    steering = sw.SteerRequest("", features=[sw.Feature(STEER_SOURCES[0], 100, 30.0)],
                               when=fit.when, types=("STEERED",), n_completion_tokens=1)  # fmt: skip
    opened = []
    for prompt in positive + negative:
        gates = engine.steer(steering.with_(prompt=prompt)).outputs["STEERED"].gates
        n = len(engine.text(prompt).ids)
        opened.append(any(gates["features[0]"][:n]))
    predicted = [s > fit.threshold for s in fit.positive_scores + fit.negative_scores]
    assert opened == predicted and (fit.precision, fit.recall) == (1.0, 1.0)


def test_a_conditional_result_is_explained_with_its_gates(engine):
    """Effects, attribution and "what changed" read each gated entry where it steered:
    tokens predicted before the window opened have exactly no effect and no share."""
    request = sw.SteerRequest(
        PROMPTS[0], features=[sw.Feature(STEER_SOURCES[0], 100, 60.0)],
        when=sw.When.tokens(3), n_completion_tokens=8, temperature=0.0,
    )  # fmt: skip
    result = engine.steer(request)
    out = result.outputs["STEERED"]
    assert out.gated_tokens() == (False,) * 4 + (True,) * 4
    effect = engine.steering_effect(result)
    assert effect.gated == out.gated_tokens() and effect.frame()["gated"].tolist()[3] is False
    assert all(e == 0.0 for e in effect.effect[:4]), effect.effect
    assert any(e != 0.0 for e in effect.effect[4:])
    early = engine.attribute(result, "STEERED", 2, n=2)
    assert [r.attribution for r in early.rows] == [0.0]  # nothing added: no share, exactly
    assert early.gated is False and early.to_dict()["gated"] is False
    assert abs(early.gain) < 1e-4  # two forward paths of one unsteered text
    late = engine.attribute(result, "STEERED", 6, n=2)
    assert late.rows[0].attribution != 0.0 and late.gated is True
    changed = engine.steering_features(result, STEER_SOURCES[0], 4)
    unconditional = engine.steering_features(engine.steer(request.with_(when=None)),
                                             STEER_SOURCES[0], 4)  # fmt: skip
    assert changed.features and changed != unconditional
