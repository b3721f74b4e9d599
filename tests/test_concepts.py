"""Concept vectors, concept search, decomposition, batched samples and token log-probs."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import steer_widgets as sw
from steer_widgets.analysis import concepts

POS = [
    "The orchestra played a symphony; violins and cellos filled the concert hall with music.",
    "She practised piano scales every morning before her music lesson.",
    "The band tuned their guitars and the drummer counted in the first song.",
]
NEG = [
    "He put the keys on the table and closed the door behind him.",
    "The meeting was moved to Thursday afternoon at three o'clock.",
    "They walked to the corner shop and bought a loaf of bread.",
]
HOOK = "blocks.8.hook_resid_post"


# -- on the real model ------------------------------------------------------------------------
def _manual_means(engine, texts, hook=HOOK):
    """Per-text content means at ``hook``, captured by our own hook on the runtime."""
    out = []
    for t in texts:
        text = engine.text(t)
        got = {}

        def grab(x, start, got=got):
            got["x"] = x[0].clone()

        ids = torch.tensor([list(text.ids)])
        layer = int(hook.split(".")[1])
        engine.model.runtime.forward(ids, hooks={hook: grab}, stop_at_layer=layer + 1)
        keep = [i for i, s in enumerate(text.special) if not s and i > 0]
        out.append(got["x"][keep].mean(0))
    return torch.stack(out)


def test_concept_vector_is_the_difference_in_means(engine):
    vec = engine.concept_vector(POS, negative=NEG, hook=HOOK)
    assert isinstance(vec, sw.Vector) and vec.hook == HOOK
    expected = _manual_means(engine, POS).mean(0) - _manual_means(engine, NEG).mean(0)
    assert torch.allclose(vec.vector, expected / expected.norm(), atol=1e-5)
    assert vec.strength == pytest.approx(
        concepts.SHARES[concepts.PROMPT_MULTIPLIER].texts * engine.typical_norm(HOOK), abs=0.01
    )
    assert engine.typical_norm(HOOK) > 0


def _manual_request_means(engine, prompts, hook):
    """Per-request means over every position but the first, from our own hook."""
    out = []
    for p in prompts:
        got = {}

        def grab(x, start, got=got):
            got["x"] = x[0].clone()

        ids = torch.tensor([list(engine.text(p).ids)])
        engine.model.runtime.forward(ids, hooks={hook: grab}, stop_at_layer=_layer(hook) + 1)
        out.append(got["x"][1:].mean(0))
    return torch.stack(out)


def _layer(hook):
    return int(hook.split(".")[1])


def test_a_concept_name_contrasts_requests_about_it_with_requests_about_other_subjects(engine):
    """No sampling: the requests themselves, read where the model has just been asked."""
    hook = "blocks.6.hook_resid_post"
    sampled_before = list(engine.concepts._examples)
    vec = engine.concept_vector("music", hook=hook)
    asked = concepts.example_prompts("music", chat=True)
    others = concepts.request_baseline("music", chat=True)
    subjects = {s for s in concepts.contrast_examples()[1] if "music" not in s.lower()}
    assert len(others) == len(subjects) * len(concepts.EXAMPLE_TEMPLATES)
    assert all(len(p) == 1 and p[0]["role"] == "user" for p in others)
    expected = _manual_request_means(engine, asked, hook).mean(0) - _manual_request_means(
        engine, others, hook
    ).mean(0)
    assert torch.allclose(vec.vector, expected / expected.norm(), atol=1e-5)
    assert vec.strength == pytest.approx(
        concepts.SHARES[concepts.PROMPT_MULTIPLIER].request * engine.typical_norm(hook), abs=0.01
    )
    assert list(engine.concepts._examples) == sampled_before  # nothing was written
    with pytest.raises(sw.RequestError) as err:
        engine.concept_vector("   ")
    assert err.value.field == "positive"


def test_a_concept_name_with_own_negatives_uses_the_models_own_examples(engine):
    vec = engine.concept_vector("music", negative=NEG, hook=HOOK)
    written = engine.concepts.examples("music")  # cached: the texts the vector was built from
    assert len(written) == len(concepts.EXAMPLE_TEMPLATES) * concepts.SAMPLES_PER_TEMPLATE
    expected = _manual_means(engine, written).mean(0) - _manual_means(engine, NEG).mean(0)
    assert torch.allclose(vec.vector, expected / expected.norm(), atol=1e-5)
    assert vec.strength == pytest.approx(
        concepts.SHARES[concepts.PROMPT_MULTIPLIER].texts * engine.typical_norm(HOOK), abs=0.01
    )


def test_concept_vector_default_hook_and_bad_input(engine):
    vec = engine.concept_vector(POS)  # contrast set as negatives, measured default layer
    assert vec.hook == engine.concepts.default_hook()
    with pytest.raises(sw.RequestError) as err:
        engine.concept_vector(POS, hook="blocks.99.hook_resid_post")
    assert err.value.field == "hook"
    with pytest.raises(sw.RequestError) as err:
        engine.concept_vector([])
    assert err.value.field == "positive"
    with pytest.raises(sw.RequestError) as err:
        engine.concept_vector(POS, negative=[3])
    assert err.value.field == "negative[0]"


def test_default_negatives_are_the_contrast_set_less_the_concept(engine):
    hook = engine.concepts.default_hook()
    vec = engine.concept_vector(POS)  # texts: the whole contrast set is the baseline
    neg = engine.concepts.means(concepts.baseline(), [hook])[hook]
    expected = _manual_means(engine, POS, hook).mean(0) - neg.mean(0)
    assert torch.allclose(vec.vector, expected / expected.norm(), atol=1e-5)
    assert len(concepts.baseline("fruit")) < len(concepts.baseline())


def test_one_pass_captures_every_concept_hook_it_reaches(engine, sources):
    texts = ["A quiet harbour at dawn, gulls over the boats.", "Snow fell on the old bridge."]
    hooks = {engine.saes.config(s).hook_name for s in sources}
    deepest = max(hooks, key=lambda h: int(h.split(".")[1]))
    before = engine.residual_cache.stats()["forwards"]
    engine.concepts.means(texts, [deepest])
    assert engine.residual_cache.stats()["forwards"] == before + len(texts)
    engine.residual_cache.clear()  # the means, not the residual cache, must answer now
    engine.concepts.means(texts, [*sorted(hooks), engine.concepts.default_hook()])
    assert engine.residual_cache.stats()["forwards"] == 0


def test_engines_over_one_model_share_its_baselines(engine, sources):
    """A second Engine over the same model (other SAEs) reads a baseline the first has read
    without running the model: the statistics depend on the weights and tokenizer alone."""
    hook = engine.saes.config(sources[0]).hook_name
    norm = engine.typical_norm(hook)
    other = sw.Engine(engine.model, saes={"one": engine.saes.config(sources[0]).folder})
    assert other.typical_norm(hook) == norm
    assert other.residual_cache.stats()["forwards"] == 0


def test_decompose_finds_the_rows_a_vector_was_built_from(engine, sources):
    source = sources[1]
    rows = [engine.saes.decoder_row(source, i) for i in (123, 2048)]
    found = engine.decompose(3.0 * rows[0] + 1.0 * rows[1], source, n=5)
    assert [m.index for m in found[:2]] == [123, 2048]
    assert all(m.source == source and m.label for m in found)
    with pytest.raises(sw.RequestError):
        engine.decompose(torch.zeros(rows[0].numel()), source)


def test_search_features_ranks_a_planted_feature_first(engine, sources, tmp_path):
    """Plant the concept's direction as one decoder row of a copy of a shipped SAE."""
    source = sources[1]
    cfg = engine.saes.config(source)
    folder = tmp_path / "planted"
    shutil.copytree(cfg.folder, folder)
    weights = load_file(folder / "sae_weights.safetensors")
    vec = engine.concept_vector(POS, hook=cfg.hook_name)
    weights["W_dec"][777] = vec.vector.to(weights["W_dec"].dtype)
    save_file(weights, folder / "sae_weights.safetensors")
    (folder / "feature_index.json.gz").unlink(missing_ok=True)
    planted = sw.Engine(engine.model, saes={"planted": folder})  # same model, one SAE
    found = planted.search_features("music", n=3, examples=POS)
    assert found[0].index == 777 and found[0].score > 0.99
    assert found[0].strength > 0 and found[0].source == "planted"
    assert found.to_frame().iloc[0]["index"] == 777
    assert found[1].score < 0.9  # the real features are not the planted direction


def test_default_search_sources_are_the_saes_nearest_the_concept_layer(engine):
    """Cosines are not comparable across layers, so ``sources=None`` searches only the SAEs
    nearest the concept layer (for the shipped set: both layer-12 SAEs)."""
    hook = engine.concepts.default_hook()
    near = engine.concepts.default_sources()
    assert len(near) == 2 and {engine.saes.config(s).hook_name for s in near} == {hook}
    found = engine.search_features("music", n=30, examples=POS)
    assert {m.source for m in found} <= set(near) and len({m.source for m in found}) == 2
    folders = {s: engine.saes.config(s).folder for s in engine.saes.sources()}
    early = {s: f for s, f in folders.items() if s.split("-")[0] in ("5", "22")}
    other = sw.Engine(engine.model, saes=early)  # layers 5 and 22: 5 is nearer to 12
    assert other.concepts.default_sources() == ["5-smollm2-res-4k"]


def test_search_features_bad_input(engine):
    for kwargs, field in (
        ({"query": ""}, "query"),
        ({"query": "music", "n": 0}, "n"),
        ({"query": "music", "examples": []}, "examples"),
    ):
        with pytest.raises(sw.RequestError) as err:
            engine.search_features(**kwargs)
        assert err.value.field == field
    with pytest.raises(sw.SourceError):
        engine.search_features("music", sources=["no-such-sae"], examples=POS)


def test_samples_equal_solo_generations(engine):
    prompt = [{"role": "user", "content": "Name a colour."}]
    got = engine.samples(prompt, 3, temperature=0.9, seed=5, n_completion_tokens=8)
    for i, s in enumerate(got):
        solo = engine.generate(prompt, temperature=0.9, seed=5 + i, n_completion_tokens=8)
        assert s.token_ids == solo.token_ids
    assert len({s.token_ids for s in got}) > 1  # different seeds, different samples
    with pytest.raises(sw.RequestError):
        engine.samples(prompt, 0)
    with pytest.raises(sw.RequestError) as err:  # the last sample's seed would overflow
        engine.samples(prompt, 2, seed=2**64 - 1)
    assert err.value.field == "seed"


def test_steer_batch_rows_equal_solo_runs(engine, sources):
    base = sw.SteerRequest(
        "I think that", types=("STEERED",), temperature=0.5, seed=3, n_completion_tokens=8
    )
    reqs = {
        "a": base.with_(features=[sw.Feature(sources[1], 11, 30.0)]),
        "b": base.with_(
            vectors=[
                sw.Vector(engine.saes.decoder_row(sources[0], 5), "blocks.5.hook_resid_post", 20.0)
            ]
        ),
    }
    batch = engine.steer_batch(reqs)
    for name, req in reqs.items():
        assert batch[name].outputs == engine.steer(req).outputs
    other = engine.steer_batch({"a": reqs["a"], "c": reqs["a"].with_(prompt="Other")})
    assert other["c"].outputs == engine.steer(reqs["a"].with_(prompt="Other")).outputs


def test_token_logprobs_of_a_greedy_completion_are_each_steps_maximum(engine):
    prompt = "The capital of France is"
    out = engine.generate(prompt, temperature=0.0, n_completion_tokens=6)
    lp = engine.token_logprobs(prompt, out)
    assert lp.shape == (len(out.token_ids),) and (lp <= 0).all()
    full = engine.text(prompt, out)
    ids = torch.tensor([list(full.ids)])
    logits = engine.model.runtime.forward(ids)[0].float()
    n = len(out.token_ids)
    best = torch.log_softmax(logits[-n - 1 : -1], -1).max(-1).values
    assert torch.allclose(lp, best, atol=1e-5)


def test_a_hook_captured_on_the_way_to_a_deeper_one_has_one_row_per_example(engine):
    """Three shipped SAEs read blocks.12: a set's statistics taken for blocks.22 capture
    blocks.12 on the way, once (before, once per SAE: its means had 3 rows per example, and
    a concept vector there depended on which hook had been asked first)."""
    concepts = engine.concepts
    hooks = [engine.saes.config(s).hook_name for s in engine.saes.sources()]
    assert hooks.count("blocks.12.hook_resid_post") > 1  # what made the duplicates
    examples = ["The cat sat on the mat.", "Rain fell all night long."]
    concepts.means(examples, ["blocks.22.hook_resid_post"])
    cached = concepts.means(examples, ["blocks.12.hook_resid_post"])["blocks.12.hook_resid_post"]
    # the same texts, another set: blocks.12 asked for first, so computed for itself
    alone = concepts.means(examples[::-1], ["blocks.12.hook_resid_post"])
    assert cached.shape == (2, 576)
    assert torch.equal(cached, alone["blocks.12.hook_resid_post"].flip(0))
