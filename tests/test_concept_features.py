"""A concept as a few SAE features that steer together: ``engine.concept_features``."""

from __future__ import annotations

import html
import warnings

import pytest
import torch

import steer_widgets as sw
from steer_widgets.analysis.concept_features import fit_rows

SOURCE = "12-smollm2-res-8k"
PLANTED = {4383: 3.0, 1559: 2.0, 6375: 1.0}  # decoder rows of SOURCE and their weights
CHAT = [{"role": "user", "content": "Tell me about your day."}]


def _planted(engine) -> sw.Vector:
    rows = {i: engine.saes.decoder_row(SOURCE, i) for i in PLANTED}
    v = sum(w * rows[i] for i, w in PLANTED.items())
    return sw.Vector(v, engine.saes.config(SOURCE).hook_name, strength=12.0)


def test_a_planted_sum_of_three_decoder_rows_comes_back_with_its_weights(engine):
    """Tolerance: weights to 1e-4 (a least-squares refit in float64 of float32 rows)."""
    found = engine.concept_features(_planted(engine), sources=[SOURCE])
    assert {f.index for f in found} == set(PLANTED) and len(found) == 3
    total = sum(PLANTED.values())
    for f, w in zip(found, found.weights, strict=True):
        assert f.source == SOURCE
        assert w == pytest.approx(PLANTED[f.index] / total, abs=1e-4)
    ratio = found[0].strength / PLANTED[found[0].index]
    for f in found:  # strengths keep the planted proportions
        assert f.strength / PLANTED[f.index] == pytest.approx(ratio, rel=1e-4)
    assert found.cosine == pytest.approx(1.0, abs=1e-5)
    assert found.concept is None and len(found.labels) == 3
    again = engine.concept_features(_planted(engine), sources=[SOURCE])
    assert list(again) == list(found) and again.weights == found.weights


def test_fit_rows_keeps_only_rows_that_push_toward_the_target():
    """A row that would enter with a negative coefficient is dropped: a set's features all
    add their rows, as a picked feature does."""
    rows = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.0, 0.0, 1.0]])
    fit = fit_rows(rows, torch.tensor([1.0, -0.5, 0.0]), k=3)
    assert fit.indices == [0] and fit.coefs[0] == pytest.approx(1.0)
    fit = fit_rows(rows, torch.tensor([2.0, 0.6, 0.5]), k=1)
    assert len(fit.indices) == 1  # k caps the set


def test_the_refit_drops_a_row_that_turned_negative_and_never_keeps_a_zero():
    """Two cases found by search over small integer problems: in the first, the third pick
    makes an earlier row's least-squares coefficient negative, so it is dropped and the
    others refitted; in the second, a row's refitted coefficient is exactly 0, which a
    clamp kept in the set as a feature at strength 0. Every kept row pushes (> 0)."""
    rows = torch.tensor([[-3.0, 3, -1], [-2, 0, 0], [0, 2, -1], [-3, 2, 1]])
    fit = fit_rows(rows, torch.tensor([-2.0, 1, -2]), k=3)
    assert fit.indices == [1, 2] and fit.coefs == pytest.approx([1.0, 0.8])
    rows = torch.tensor([[-2.0, -1, -2], [-2, 1, -3], [3, 0, -2], [1, 0, 0], [-1, -3, 2]])
    fit = fit_rows(rows, torch.tensor([3.0, 1, -3]), k=4)
    assert fit.indices and all(c > 0 for c in fit.coefs), fit
    assert len(set(fit.indices)) == len(fit.indices)


def test_a_named_concept_steers_as_a_set_and_its_record_replays(engine):
    found = engine.concept_features("music", k=8)
    assert isinstance(found, sw.ConceptFeatures) and isinstance(found, list)
    assert 1 <= len(found) <= 8 and found.concept == "music"
    assert all(isinstance(f, sw.Feature) and f.strength > 0 for f in found)
    assert len({(f.source, f.index) for f in found}) == len(found)
    assert {f.source for f in found} <= set(engine.concepts.default_sources())
    assert sum(found.weights) == pytest.approx(1.0)
    assert found.to_frame()["strength"].tolist() == [f.strength for f in found]
    pm = engine.default_prompt_multiplier()
    req = sw.SteerRequest(CHAT, features=found, prompt_multiplier=pm, n_completion_tokens=6)
    result = engine.steer(req)
    assert [f["strength"] for f in result.to_dict()["request"]["features"]] == [
        f.strength for f in found
    ]
    replay = engine.steer(result.to_dict())
    assert replay.outputs["STEERED"].token_ids == result.outputs["STEERED"].token_ids
    assert result.outputs["STEERED"].token_ids != result.outputs["DEFAULT"].token_ids


def test_a_set_exports_as_its_features_decoder_rows(engine, tmp_path):
    found = engine.concept_features(_planted(engine), sources=[SOURCE])
    vectors = engine.vectors(sw.SteerRequest("", features=found))
    hook = engine.saes.config(SOURCE).hook_name
    want = sum(f.strength * engine.saes.decoder_row(SOURCE, f.index) for f in found)
    assert torch.allclose(sum(torch.as_tensor(v.vector) * v.strength for v in vectors), want)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sw.VectorWarning)
        path = sw.save_vectors(vectors, tmp_path / "set.gguf", model=engine)
    (loaded,) = sw.load_vectors(path, model=engine)
    assert loaded.hook == hook
    got = torch.as_tensor(loaded.vector) * loaded.strength
    assert torch.allclose(got, want, atol=1e-4)


def test_evaluate_takes_a_set_with_its_strengths_and_the_concepts_words(engine):
    found = engine.concept_features("music", k=4)
    ev = engine.evaluate(found, [CHAT], strengths=(0.0, 2.0), progress=False, n_completion_tokens=4)
    (name,) = ev.steerings
    assert list(ev.judge_forms[name]) == ["music"]
    x1 = ev.steerings[name]
    assert [f.strength for f in x1.features] == [f.strength for f in found]
    assert x1.prompt_multiplier == engine.default_prompt_multiplier()
    rows = {r.strength: r for r in ev.rows}
    direct = engine.steer(
        x1.with_(
            prompt=CHAT,
            strength_multiplier=2.0,
            types=("STEERED",),
            temperature=0.0,
            n_completion_tokens=4,
        )  # fmt: skip
    )
    assert rows[2.0].text == direct.outputs["STEERED"].text  # the ladder scales them together


def test_bad_input_is_a_named_error_before_any_work(engine):
    forwards = engine.residual_cache.stats()["forwards"]
    for kwargs, field in (
        ({"concept": ""}, "concept"),
        ({"concept": 42}, "concept"),
        ({"concept": []}, "concept"),
        ({"concept": "music", "k": 0}, "k"),
        ({"concept": "music", "k": 2.5}, "k"),
        ({"concept": "music", "sources": []}, "sources"),
        ({"concept": "music", "sources": ["5-smollm2-res-4k"]}, "sources[0]"),
        ({"concept": sw.Vector(torch.zeros(576), "blocks.12.hook_resid_post")}, "concept.vector"),
        ({"concept": sw.Vector(torch.ones(576), "blocks.99.hook_resid_post")}, "concept.hook"),
        ({"concept": ["a text"], "examples": ["another"]}, "examples"),
    ):
        with pytest.raises(sw.RequestError) as err:
            engine.concept_features(**kwargs)
        assert err.value.field == field, kwargs
    with pytest.raises(sw.SourceError):
        engine.concept_features("music", sources=["no-such-sae"])
    assert engine.residual_cache.stats()["forwards"] == forwards


def test_a_set_under_a_non_additive_method_is_refused_by_name(engine):
    """Several directions at one hook combine only additively: ORTHOGONAL_DECOMP and
    PROJECTION_CAP act on one direction's component, so a set is refused, not reordered."""
    found = engine.concept_features(_planted(engine), sources=[SOURCE])
    for method in ("ORTHOGONAL_DECOMP", "PROJECTION_CAP"):
        with pytest.raises(sw.RequestError) as err:
            engine.steer(sw.SteerRequest("Hi", features=found, steer_method=method))
        assert err.value.field == "features" and method in str(err.value)


def test_the_explorer_adds_a_set_as_feature_rows_and_a_view_replays_it(engine, tmp_path):
    ex = sw.Explorer(engine, live=False, temperature=0, n_completion_tokens=6)
    try:
        assert ex.add_concept_features("") == [] and "concept" in ex.status
        rows = ex.add_concept_features("music", k=4)
        found = engine.concept_features("music", k=4)
        assert rows == list(range(len(found)))
        assert ex.features == list(found)
        assert "features of 'music'" in html.unescape(ex.picker.concept_message.value)
        ex.run()
        assert ex.wait(120)
        steered = ex.outputs["STEERED"].token_ids
        ex.save_view(tmp_path / "view.json")
    finally:
        ex.close()
    again = sw.Explorer.load_view(tmp_path / "view.json", engine, live=False)
    try:
        assert again.features == list(found)
        again.run()
        assert again.wait(120)
        assert again.outputs["STEERED"].token_ids == steered
    finally:
        again.close()
