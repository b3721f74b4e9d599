"""Evaluation tables, best strength, judges and records, on a fixed hand-made case (no model)."""

from __future__ import annotations

import pytest

from steer_widgets.analysis.evaluation import (
    EvalRow,
    Evaluation,
    PromptDefault,
    check_strengths,
    grid,
)
from steer_widgets.analysis.judges import JudgeError, label_words, make_judge, mentions
from steer_widgets.errors import RequestError
from steer_widgets.steering.requests import SteerRequest

# (prompt, strength, success, fluency_delta)
CASE = [
    (0, 0.0, False, 0.0), (1, 0.0, False, 0.0),
    (0, 1.0, True, 0.4), (1, 1.0, False, 0.6),
    (0, 2.0, True, 0.9), (1, 2.0, True, 1.3),
    (0, 3.0, True, 2.0), (1, 3.0, True, 2.4),
]  # fmt: skip


def evaluation() -> Evaluation:
    rows = [
        EvalRow("c", p, m, f"text {p} {m}", (1, 2), "length", float(s), s, 1.0 + f, f, 0)
        for p, m, s, f in CASE
    ]
    defaults = {i: PromptDefault(f"default {i}", (1, 3), 1.0, 0.0) for i in (0, 1)}
    return Evaluation(
        {"c": SteerRequest("", prompt_multiplier=2.0)},
        ["a prompt", [{"role": "user", "content": "a chat"}]],
        (0.0, 1.0, 2.0, 3.0),
        {"temperature": 0.0, "n_completion_tokens": 2},
        {"c": "words: c"},
        {"c": ("c",)},
        defaults,
        rows,
        complete=True,
    )


def test_summary_equals_hand_computation():
    table = evaluation().summary()
    assert list(table["strength"]) == [0.0, 1.0, 2.0, 3.0]
    assert list(table["success"]) == [0.0, 0.5, 1.0, 1.0]
    assert list(table["fluency_delta"]) == pytest.approx([0.0, 0.5, 1.1, 2.2])
    assert list(table["n"]) == [2, 2, 2, 2]


def test_best_within_budget():
    ev = evaluation()
    assert ev.best() == 1.0  # x2 succeeds on both, but costs 1.1 nat > 1.0
    assert ev.best(budget=1.2) == 2.0  # x2 now fits the budget (1.1 nat); x3 (2.2) does not
    assert ev.best(budget=5.0) == 2.0  # a tie at 100%: the gentler strength
    assert ev.best(budget=-1.0) is None
    assert ev.best(budget=0.0) is None  # only x0 fits, and it turned nothing
    with pytest.raises(RequestError, match="budget"):
        ev.best(budget=float("nan"))
    with pytest.raises(RequestError, match="steering"):
        ev.best(steering="other")


def test_frame_and_grid():
    ev = evaluation()
    frame = ev.frame()
    assert list(frame["kind"]) == ["completion", "chat"] * 4
    assert list(frame["prompt"][:2]) == ["a prompt", "a chat"]
    assert list(frame["hit"]) == [s for _, _, s, _ in CASE]
    cells = grid(ev)
    assert [c["prompt"] for c in cells] == ["a prompt", "a chat"]
    assert [cell["success"] for cell in cells[1]["cells"]] == [False, False, True, True]


def test_record_round_trip():
    ev = evaluation()
    again = Evaluation.from_dict(ev.to_dict())
    assert again.to_dict() == ev.to_dict()
    assert again.rows == ev.rows and again.defaults == ev.defaults
    for bad in (None, [], {"steerings": {}}, {**ev.to_dict(), "rows": [{"nope": 1}]}):
        with pytest.raises(RequestError):
            Evaluation.from_dict(bad)


def test_svg_marks_points_and_current():
    svg = evaluation().svg(current=2.0)
    assert svg.count('class="sw-point"') == 4
    assert 'data-strength="2.0"' in svg and "current x2" in svg and "recommended x1" in svg


def test_judges_score_known_texts():
    words = make_judge(["ocean"], None)
    assert words.score("The oceans are deep.", "p") == 1.0  # plain inflection
    assert words.score("Oceanic trenches.", "p") == 0.0  # not a whole word or inflection
    default = make_judge(None, ["tree"])
    assert default.score("Trees grow.", "p") == 1.0 and default.score("Street", "p") == 0.0
    fn = make_judge(lambda t: len(t) / 10, None)
    assert fn.score("hello", "p") == 0.5
    assert mentions("I cooked dinner", ["cook"]) and not mentions("a cookie", ["cook"])
    assert label_words("vessels, vessel -> boat of") == ["vessels", "vessel", "boat"]


def test_an_explanation_label_judges_on_its_topic_words_not_on_and():
    """A Neuronpedia explanation is a phrase: its function and explanation words would make
    nearly every text a success (any "and") or none (a "references")."""
    assert label_words("references to cats and kittens") == ["cats", "kittens"]
    assert label_words("mentions of rivers, especially in the context of travel") == [
        "rivers", "travel",
    ]  # fmt: skip
    judge = make_judge(None, label_words("references to cats and kittens"))
    assert judge.score("Salt and pepper.", "p") == 0.0 and judge.score("Two cats.", "p") == 1.0


def test_judge_errors_are_named():
    for bad in (5, "ocean", b"x", [], [""], [3]):
        with pytest.raises(RequestError, match="judge"):
            make_judge(bad, None)
    with pytest.raises(RequestError, match="judge"):
        make_judge(None, None)

    def broken(text):
        raise KeyError("k")

    with pytest.raises(JudgeError, match="broken.*my prompt.*KeyError"):
        make_judge(broken, None).score("t", "my prompt")
    with pytest.raises(JudgeError, match="returned"):
        make_judge(lambda t: "yes", None).score("t", "p")


def test_strength_ladder_checks():
    assert check_strengths([0, 0.5, 2]) == (0.0, 0.5, 2.0)
    for bad, field in (([], "strengths"), ([1, 1.0], "strengths[1]"), ([True], "strengths[0]"),
                       ((float("inf"),), "strengths[0]"), ("12", "strengths"), (None, "strengths")):  # fmt: skip
        with pytest.raises(RequestError) as err:
            check_strengths(bad)
        assert err.value.field == field
