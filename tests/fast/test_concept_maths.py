"""Concept maths without a model: difference in means, matching pursuit, content means."""

from __future__ import annotations

import torch

from steer_widgets.analysis import concepts


def test_direction_recovers_a_planted_direction():
    g = torch.Generator().manual_seed(0)
    planted = torch.nn.functional.normalize(torch.randn(64, generator=g), dim=0)
    neg = torch.randn(200, 64, generator=g)
    pos = torch.randn(200, 64, generator=g) + 3.0 * planted
    d = concepts.direction(pos, neg)
    assert torch.nn.functional.cosine_similarity(d, planted, dim=0) > 0.95
    shuffled = concepts.direction(torch.randn(200, 64, generator=g), neg)
    assert torch.nn.functional.cosine_similarity(shuffled, planted, dim=0) < 0.5


def test_matching_pursuit_names_both_planted_rows():
    g = torch.Generator().manual_seed(1)
    w_dec = torch.nn.functional.normalize(torch.randn(512, 64, generator=g), dim=1)
    v = 3.0 * w_dec[17] + 1.5 * w_dec[301]
    picked = concepts.matching_pursuit(w_dec, v, 3)
    assert {picked[0][0], picked[1][0]} == {17, 301}
    assert picked[0][0] == 17 and picked[0][1] > picked[1][1] > 0


def test_content_mean_skips_position_zero_and_special_tokens():
    resid = torch.arange(12.0).reshape(4, 3)
    mean = concepts.content_rows(resid, [False, True, False, False]).mean(0)
    assert torch.equal(mean, resid[[2, 3]].mean(0))


def test_feature_matches_frame():
    m = concepts.FeatureMatches([concepts.FeatureMatch("s", 3, 0.5, "music", 12.0)])
    frame = m.to_frame()
    assert list(frame.columns) == ["source", "index", "score", "label", "strength"]
    assert frame.iloc[0]["index"] == 3


def test_contrast_baseline_leaves_out_the_concepts_own_subject():
    chats, subjects = concepts.contrast_examples()
    assert len(chats) == len(subjects) and len(set(subjects)) >= 40
    assert all(c[-1]["role"] == "assistant" and c[-1]["content"] for c in chats)
    everything = concepts.baseline()
    assert len(everything) == len(chats)
    fruit = concepts.baseline("Fruit ")
    dropped = [s for s in subjects if "fruit" in s.lower()]
    assert dropped and len(fruit) == len(chats) - len(dropped)
    assert concepts.baseline("tango") == everything  # no subject names it


def test_contrast_requests_are_the_contrast_sets_requests_once_each():
    chats, subjects = concepts.contrast_examples()
    for chat in (True, False):
        prompts, about = concepts.contrast_requests(chat)
        assert len(set(map(str, prompts))) == len(prompts)  # each request once
        assert set(about) == set(subjects)
        assert len(prompts) == len(set(subjects)) * len(concepts.example_prompts("x", chat))
    asked = {str(c[:-1]) for c in chats}  # what the shipped answers answered
    assert {str(p) for p in concepts.contrast_requests(True)[0]} == asked
    fruit = concepts.request_baseline("fruit", chat=True)
    named = [s for s in set(subjects) if "fruit" in s.lower()]
    assert named and len(fruit) == len(concepts.contrast_requests(True)[0]) - len(
        concepts.EXAMPLE_TEMPLATES
    ) * len(named)
    assert not any("fruit" in p[0]["content"].lower() for p in fruit)


def test_request_rows_drop_only_the_attention_sink():
    resid = torch.arange(12.0).view(4, 3)
    assert torch.equal(concepts.request_rows(resid, [True, True, False, True]), resid[1:])
    assert torch.equal(concepts.request_rows(resid[:1], [True]), resid[:1])


def test_recommended_strengths_follow_the_engines_prompt_multiplier():
    """Each recommendation belongs to the multiplier it was measured with; an engine that
    recommends another multiplier gets the nearest measured one's."""
    shares, x2 = concepts.SHARES, concepts.PROMPT_MULTIPLIER

    class FakeEngine:
        def __init__(self, pm: float) -> None:
            self.pm = pm

        def default_prompt_multiplier(self) -> float:
            return self.pm

    assert shares[1.0] != shares[x2]
    for pm, want in ((1.0, 1.0), (x2, x2), (1.2, 1.0), (4.0, x2)):
        assert concepts.Concepts(FakeEngine(pm)).shares() == shares[want]
