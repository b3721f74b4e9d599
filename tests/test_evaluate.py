"""engine.evaluate: every row equals its solo steer run, fluency is the unsteered model's
score, bad input is refused before decoding, and cancel keeps finished rows."""

from __future__ import annotations

import math
import threading

import pytest
import torch

import steer_widgets as sw
from steer_widgets.analysis.evaluation import Evaluation
from steer_widgets.analysis.judges import JudgeError, mentions

CHAT = [{"role": "user", "content": "Tell me a fact about the weather in two sentences."}]
SHORT_CHAT = [{"role": "user", "content": "Answer with one word: is water wet?"}]
PROMPTS = [CHAT, "My favourite food is", SHORT_CHAT]  # lengths differ; the last stops early


def solo(engine, ev: Evaluation, row) -> sw.Completion:
    """The row generated alone: one STEERED row at the row's multiplier."""
    x1 = ev.steerings[row.steering]
    req = x1.with_(
        prompt=ev.prompts[row.prompt_index],
        types=("STEERED",),
        strength_multiplier=x1.strength_multiplier * row.strength,
        **ev.sampling,
    )
    return engine.steer(req).outputs["STEERED"]


@pytest.fixture(scope="module")
def direction(engine):
    return engine.concept_vector("weather")


def check_rows_exact(engine, ev: Evaluation) -> None:
    assert ev.complete and len(ev.rows) == ev.total
    for row in ev.rows:
        alone = solo(engine, ev, row)
        assert alone.token_ids == row.token_ids, (row.steering, row.prompt_index, row.strength)
        assert alone.text == row.text
        # fluency: the unsteered model's score of the steered tokens, as token_logprobs gives it
        lp = engine.token_logprobs(ev.prompts[row.prompt_index], alone)
        nll = float(-lp.mean()) if len(lp) else 0.0
        assert row.nll == pytest.approx(nll, abs=2e-4)
        default = ev.defaults[row.prompt_index]
        assert row.fluency_delta == pytest.approx(row.nll - default.nll)


@pytest.mark.parametrize(
    "method,temperature",
    [("SIMPLE_ADDITIVE", 0.0), ("SIMPLE_ADDITIVE", 0.9), ("ORTHOGONAL_DECOMP", 0.0),
     ("PROJECTION_CAP", 0.7)],
)  # fmt: skip
def test_rows_equal_solo_runs(engine, direction, method, temperature):
    strength = 40.0 if method == "PROJECTION_CAP" else direction.strength
    req = sw.SteerRequest(
        "", vectors=[sw.Vector(direction.vector, direction.hook, strength)],
        steer_method=method, prompt_multiplier=2.0,
    )  # fmt: skip
    ev = engine.evaluate(
        req, PROMPTS, strengths=(0, 1, 2.5), judge=["weather", "rain"], progress=False,
        temperature=temperature, n_completion_tokens=20, seed=5,
    )  # fmt: skip
    check_rows_exact(engine, ev)
    stops = {r.stop for r in ev.rows} | {
        "eos" if d.token_ids[-1:] == (engine.tokenizer.eos_id,) else "length"
        for d in ev.defaults.values()
    }
    assert "eos" in stops and "length" in stops  # early EOS is among the cases


def test_concept_default_judge_and_x0(engine):
    ev = engine.evaluate("weather", PROMPTS[:2], strengths=(0, 1), progress=False)
    assert ev.judges["weather"] == "words: weather"
    assert ev.steerings["weather"].prompt_multiplier == engine.default_prompt_multiplier()
    x0 = [r for r in ev.rows if r.strength == 0]
    for r in x0:  # additive steering at x0 is DEFAULT itself, scored by the same shadow row
        d = ev.defaults[r.prompt_index]
        assert r.token_ids == d.token_ids and r.fluency_delta == 0.0 and not r.success
        assert r.shared == len(d.token_ids)
    for r in ev.rows:
        hit = mentions(r.text, ["weather"])
        base = mentions(ev.defaults[r.prompt_index].text, ["weather"])
        assert r.score == float(hit) and r.success == (hit and not base)


def test_several_steerings_feature_and_replay(engine, sources, direction):
    match = engine.search_features("weather", n=1)[0]
    ev = engine.evaluate(
        {"vector": direction, "feature": match, "picked": sw.Feature(sources[0], 3)},
        PROMPTS[1:2],
        strengths=(1, 2),
        judge=lambda text: text.count("e") / max(1, len(text)),
        progress=False,
    )
    assert set(ev.summary()["steering"]) == {"vector", "feature", "picked"}
    assert ev.steerings["picked"].features[0].strength == engine.default_strength(sources[0])
    assert ev.steerings["feature"].features[0].strength == match.strength
    check_rows_exact(engine, ev)
    again = engine.evaluate(
        Evaluation.from_dict(ev.to_dict()), judge=lambda t: 0.0, progress=False
    )  # the record replays token for token (a callable judge is given again)
    assert [r.token_ids for r in again.rows] == [r.token_ids for r in ev.rows]


def test_word_judge_record_replays_without_judge(engine, direction):
    ev = engine.evaluate(direction, PROMPTS[1:2], strengths=(1,), judge=["sun"], progress=False)
    record = ev.to_dict()
    again = engine.evaluate(record, progress=False)
    assert again.to_dict()["rows"] == record["rows"]


def test_bad_input_is_named_before_decoding(engine, direction):
    before = engine.generate("I think that", temperature=0, n_completion_tokens=8)
    bad = [
        (dict(prompts=[]), "prompts"),
        (dict(prompts=["ok", ""]), "prompts[1]"),
        (dict(prompts="just a string"), "prompts"),
        (dict(prompts=[[{"role": "robot", "content": "hi"}]]), "prompts[0][0].role"),
        (dict(strengths=[1, 1]), "strengths[1]"),
        (dict(strengths=[float("nan")]), "strengths[0]"),
        (dict(strengths=[]), "strengths"),
        (dict(judge=5), "judge"),
        (dict(judge=[""]), "judge[0]"),
        (dict(judge=None), "judge"),  # a custom vector has no words to judge by
        (dict(nope=1), "nope"),
        (dict(n_completion_tokens=0), "n_completion_tokens"),
    ]
    for kwargs, field in bad:
        args = {"prompts": ["I think that"], "judge": ["x"], **kwargs}
        with pytest.raises(sw.RequestError) as err:
            engine.evaluate(direction, progress=False, **args)
        assert err.value.field == field, (kwargs, err.value)
    with pytest.raises(sw.RequestError, match="steering"):
        engine.evaluate(sw.Feature("no-such-sae", 1), ["hi"], progress=False)
    with pytest.raises(sw.RequestError, match="steering"):
        engine.evaluate(object(), ["hi"], progress=False)
    after = engine.generate("I think that", temperature=0, n_completion_tokens=8)
    assert after.token_ids == before.token_ids


def test_judge_raising_keeps_finished_rows(engine, direction):
    seen = []

    def picky(text: str) -> bool:
        seen.append(text)
        if len(seen) > 3:
            raise ZeroDivisionError("judge gave up")
        return False

    with pytest.raises(JudgeError) as err:
        engine.evaluate(direction, PROMPTS[:2], strengths=(0, 1), judge=picky, progress=False)
    assert "picky" in str(err.value) and "ZeroDivisionError" in str(err.value)
    partial = err.value.evaluation
    assert partial is not None and not partial.complete and 0 < len(partial.rows) < 4
    ok = engine.evaluate(direction, PROMPTS[:1], strengths=(1,), judge=["x"], progress=False)
    assert ok.complete


def test_cancel_keeps_finished_rows(engine, direction):
    cancel = threading.Event()
    stream = engine.evaluate_stream(direction, PROMPTS, (0, 1), ["x"], cancel)
    assert stream.total == 6
    for ev in stream:  # snapshots of rows still decoding come first, then finished rows
        if ev.rows:
            cancel.set()
    final = ev
    assert final.cancelled and not final.complete
    assert 0 < len(final.rows) < 6
    assert {r.prompt_index for r in final.rows} <= set(final.defaults)  # each beside its DEFAULT
    assert all(d.nll >= 0 for d in final.defaults.values())


def test_summary_best_plot_svg(engine, direction):
    ev = engine.evaluate(
        direction, PROMPTS[:2], strengths=(0, 1, 3), judge=["weather"], progress=False
    )
    table = ev.summary()
    for m in (0, 1, 3):
        rows = [r for r in ev.rows if r.strength == m]
        got = table[table["strength"] == m].iloc[0]
        assert got["success"] == sum(r.success for r in rows) / len(rows)
        assert math.isclose(got["fluency_delta"], sum(r.fluency_delta for r in rows) / len(rows))
    svg = ev.svg(current=1.0)
    assert svg.startswith("<svg") and svg.count('class="sw-point"') == 3
    assert torch.isfinite(torch.tensor(table["fluency_delta"].tolist())).all()


def test_the_first_prompt_decodes_alone_then_the_rest_together(engine, direction, monkeypatch):
    """The first cells come after one prompt's prefill; the other prompts share a batch."""
    prompts_per_batch = []
    rows = type(engine.decoder).rows

    def spy(self, prompt_ids, batch, sampling, cancel=None):
        prompts_per_batch.append(len({row.prompt_ids for row in batch}))
        return rows(self, prompt_ids, batch, sampling, cancel)

    monkeypatch.setattr(type(engine.decoder), "rows", spy)
    ev = engine.evaluate(
        direction, PROMPTS, strengths=(0, 1), judge=["weather"], progress=False,
        n_completion_tokens=4,
    )  # fmt: skip
    assert ev.complete and len(ev.rows) == 6
    assert prompts_per_batch == [1, 2]
