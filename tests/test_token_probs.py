"""Token probabilities recorded while decoding, on the real default model.

Each completion carries, per generated token, its log-probability and the top alternatives
under the row's own distribution before temperature and frequency penalty. They must agree
with a separate forward pass (``token_logprobs``), follow greedy decoding, and be the same
for a row decoded alone or beside others (recording them changes nothing).
"""

from __future__ import annotations

import math

import pytest
import torch

import steer_widgets as sw
from steer_widgets.steering.generation import TOP_K

PROMPT = "The best thing about the weekend is"
N = 8


def check_shape(completion: sw.Completion) -> None:
    probs = completion.token_probs
    assert probs is not None and len(probs) == len(completion.token_ids)
    for p in probs:
        assert len(p.top) == TOP_K
        values = [lp for _, lp in p.top]
        assert values == sorted(values, reverse=True)
        assert all(lp <= 0 for lp in values) and p.logprob <= 0
        assert p.prob == pytest.approx(math.exp(p.logprob))


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.9, "seed": 5}])
def test_default_logprobs_equal_a_separate_forward_pass(engine, sampling):
    out = engine.generate(PROMPT, n_completion_tokens=N, **sampling)
    check_shape(out)
    want = engine.token_logprobs(PROMPT, out)
    got = [p.logprob for p in out.token_probs]
    # before temperature and penalty: the same numbers whatever the sampling settings
    assert got == pytest.approx(want.tolist(), abs=1e-4)
    assert out.logprobs == tuple(got)
    if sampling["temperature"] == 0:  # greedy: the chosen token is the most likely one
        for token, p in zip(out.token_ids, out.token_probs, strict=True):
            assert p.top[0][0] == token and p.top[0][1] == p.logprob


def test_steered_and_sweep_rows_record_their_own_distribution(engine, sources):
    source = sources[1]
    feature = sw.Feature(source, 12, 3 * engine.default_strength(source))
    req = sw.SteerRequest(
        prompt=PROMPT, features=(feature,), temperature=0.0, sweep=(2.0,), n_completion_tokens=N
    )
    res = engine.steer(req)
    steered = res.outputs["STEERED"]
    assert steered.token_ids != res.outputs["DEFAULT"].token_ids, "pick a feature that steers"
    for label, out in res.outputs.items():
        check_shape(out)
        for token, p in zip(out.token_ids, out.token_probs, strict=True):
            assert p.top[0][0] == token, label  # greedy under the steered distribution
    # the unsteered model disagrees with the steered row's numbers: they are its own
    plain = engine.token_logprobs(PROMPT, steered).tolist()
    assert max(abs(a - b) for a, b in zip(plain, steered.logprobs, strict=True)) > 0.1


def test_batched_rows_record_what_solo_rows_record(engine, sources):
    source = sources[0]
    feature = sw.Feature(source, 7, 2 * engine.default_strength(source))
    common = {"prompt": PROMPT, "features": (feature,), "n_completion_tokens": N, "seed": 3}
    engine.clear_caches()
    batch = engine.steer(sw.SteerRequest(**common, sweep=(-1.0, 2.0)))
    alone = engine.steer(sw.SteerRequest(**common, types=("STEERED",)))
    assert alone.outputs["STEERED"].token_probs == batch.outputs["STEERED"].token_probs
    x2 = engine.steer(sw.SteerRequest(**{**common, "strength_multiplier": 2.0}, types=("STEERED",)))
    assert x2.outputs["STEERED"].token_probs == batch.outputs["STEERED*2"].token_probs
    samples = engine.samples(PROMPT, 3, n_completion_tokens=N, seed=3)
    engine.clear_caches()
    for i, sample in enumerate(samples):
        solo = engine.generate(PROMPT, n_completion_tokens=N, seed=3 + i)
        assert solo.token_ids == sample.token_ids
        assert solo.token_probs == sample.token_probs


def test_streamed_frames_carry_probabilities_for_every_token(engine):
    req = sw.SteerRequest(prompt=PROMPT, types=("DEFAULT",), n_completion_tokens=4, seed=11)
    engine.clear_caches()
    frames = list(engine.steer_stream(req))
    for frame in frames:
        out = frame.outputs["DEFAULT"]
        assert out.token_probs is not None and len(out.token_probs) == len(out.token_ids)
    (whole,) = engine.samples(PROMPT, 1, n_completion_tokens=4, seed=11)  # no cache, no stream
    assert frames[-1].outputs["DEFAULT"].token_probs == whole.token_probs


# -- what the explorer's panes show on hover ---------------------------------------------------


def test_hover_probabilities_reach_the_panes(engine, sources):
    from steer_widgets.widgets import Explorer

    source = sources[0]
    ex = Explorer(
        engine,
        prompt=PROMPT,
        features=[(source, 7, 2 * engine.default_strength(source))],
        sweep=(2.0,),
        n_completion_tokens=6,
        temperature=0.0,
    )
    assert ex.wait(120), ex.status
    assert set(ex.outputs) == {"DEFAULT", "STEERED", "STEERED*2"}
    for label, out in ex.outputs.items():
        pane = ex.completions.pane(label)
        assert len(pane["probs"]) == len(pane["tokens"]) == len(out.token_ids)
        for i, p in enumerate(out.token_probs):
            info = ex.completions.token_info(label, i)
            assert info["probability"] == pytest.approx(p.prob, abs=1e-5)
            want = list(engine.text(PROMPT, [t for t, _ in p.top]).tokens[-TOP_K:])
            assert [t for t, _ in info["top"]] == want
            assert info["top"][0] == (info["token"], info["probability"])  # greedy


def test_panes_say_when_a_backend_has_no_probabilities():
    from steer_widgets.widgets.completions import Completions, build_panes

    outputs = {"DEFAULT": sw.Completion("ab", (1, 2), "length")}  # a remote engine's kind
    panes = build_panes(outputs, lambda i: (f"t{i}", False), streaming=False)
    widget = Completions(panes=panes)
    assert widget.pane("DEFAULT")["probs"] is None
    assert widget.token_info("DEFAULT", 1) == {"token": "t2", "probability": None, "top": []}
    assert "probabilities not available" in widget._esm


def test_top_tokens_equal_torch_topk_and_order_minus_infinity_by_id():
    from steer_widgets.steering.generation import _top

    logp = torch.log_softmax(torch.randn(5000, generator=torch.Generator().manual_seed(3)), -1)
    values, ids = logp.topk(5)
    assert _top(logp.numpy(), 5) == tuple(zip(ids.tolist(), values.tolist(), strict=True))
    inf = float("inf")
    got = _top(torch.tensor([0.0, -inf, 1.0, -inf]).numpy(), 4)
    assert got == ((2, 1.0), (0, 0.0), (1, -inf), (3, -inf))
