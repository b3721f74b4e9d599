"""Why the text changed: steering effect, attribution and changed features on the default
model, with planted directions whose answer is known."""

from __future__ import annotations

import math

import pytest
import torch

from steer_widgets.analysis.agreement import agreement, spearman
from steer_widgets.analysis.attribution import path_points
from steer_widgets.errors import RequestError, SourceError
from steer_widgets.steering.requests import Feature, SteerRequest, Vector
from steer_widgets.steering.results import SteerResult

LATE_HOOK = "blocks.24.hook_resid_post"
SOURCE = "12-smollm2-res-4k"


@pytest.fixture(scope="module")
def planted(engine):
    """STEERED pushed along " cheese"'s unembedding (and by one SAE feature besides)."""
    token = engine.tokenizer.hf.encode(" cheese", add_special_tokens=False)[0]
    direction = engine.model.runtime.unembed_weight[token].tolist()
    strength = 0.3 * engine.typical_norm(LATE_HOOK)
    request = SteerRequest(
        prompt="My favourite food is",
        features=(Feature(SOURCE, 100, engine.default_strength(SOURCE)),),
        vectors=(Vector(direction, LATE_HOOK, strength),),
        normalize_steering=True,
        n_completion_tokens=8,
        temperature=0,
    )
    return token, engine.steer(request)


@pytest.fixture(scope="module")
def by_feature(engine):
    """STEERED by one SAE feature at its recommended strength, on a chat prompt."""
    request = SteerRequest(
        prompt=[{"role": "user", "content": "Tell me about your day."}],
        features=(Feature(SOURCE, 100, engine.default_strength(SOURCE)),),
        n_completion_tokens=10,
        temperature=0,
        prompt_multiplier=engine.default_prompt_multiplier(),
    )
    return engine.steer(request)


def _top(effect) -> int:
    return max(range(len(effect.effect)), key=lambda i: effect.effect[i])


def test_planted_token_has_the_largest_effect(engine, planted):
    token, result = planted
    effect = engine.steering_effect(result)
    assert token in effect.token_ids
    assert effect.token_ids[_top(effect)] == token
    frame = effect.frame()
    assert list(frame.columns) == ["position", "token", "p_steered", "p_unsteered", "effect"]
    assert frame["effect"].idxmax() == _top(effect)
    assert effect.describe(_top(effect)).startswith("steering raised this token from ")


def test_planted_row_takes_the_largest_share(engine, planted):
    token, result = planted
    effect = engine.steering_effect(result)
    a = engine.attribute(result, position=_top(effect), n=3)
    assert a.token == engine.tokenizer.token_strings([token])[0]
    shares = {r.name: r.attribution for r in a.rows}
    assert max(shares, key=shares.get) == f"vector 0 @ {LATE_HOOK}"
    assert max(a.rows, key=lambda r: r.removed).name == f"vector 0 @ {LATE_HOOK}"
    assert set(a.frame()["kind"]) == {"row", "feature"}


def test_two_rows_sum_to_the_measured_gain(engine, planted):
    """Integrated gradients (3 Gauss-Legendre nodes) share out the gain: measured on this
    case the sum is within 0.2% of the gain (6.69 against 6.71 nats); the test allows 3%.
    The plain gradient at the steered point (steps=1) is first order too but saturates
    (2.22)."""
    _, result = planted
    position = _top(engine.steering_effect(result))
    a = engine.attribute(result, position=position, n=0)
    assert len(a.rows) == 2 and a.gain > 1.0
    total = sum(r.attribution for r in a.rows)
    assert abs(total - a.gain) <= 0.03 * abs(a.gain)


def test_effect_is_the_unsteered_read_of_the_same_text(engine, planted):
    _, result = planted
    effect = engine.steering_effect(result)
    again = engine.token_logprobs(result.request.prompt, result.outputs["STEERED"])
    assert torch.allclose(torch.tensor(effect.logprob_unsteered).float(), again, atol=1e-5)


def test_default_tokens_have_zero_effect(engine, planted):
    """DEFAULT's effect is 0 because the explainer reuses its recorded log-probabilities as
    the unsteered read (no second forward pass). What is tested is that shortcut: a separate
    unsteered read of the same tokens gives those log-probabilities, so a real read would
    have shown no effect either."""
    _, result = planted
    effect = engine.steering_effect(result, "DEFAULT")
    read = engine.token_logprobs(result.request.prompt, result.outputs["DEFAULT"])
    shown = torch.tensor(effect.logprob_unsteered).float()
    assert len(shown) == len(read) == len(result.outputs["DEFAULT"].token_ids)
    assert (read - shown).abs().max() < 1e-4
    assert (read - torch.tensor(effect.logprob_steered).float()).abs().max() < 1e-4


def test_steering_feature_ranks_first_among_changed(engine, by_feature):
    changed = engine.steering_features(by_feature, SOURCE, n=5)
    assert changed.features[0].index == 100
    assert changed.features[0].change > 0
    frame = changed.frame()
    assert frame["index"].iloc[0] == 100 and len(frame) == 5
    assert abs(frame["change"]).is_monotonic_decreasing


def test_attribution_agrees_with_ablation(engine, by_feature):
    """The first-order feature shares against real ablations on one token."""
    effect = engine.steering_effect(by_feature)
    a = engine.attribute(by_feature, position=_top(effect), source=SOURCE, n=6, ablate=True)
    assert a.features and all(f.ablated is not None for f in a.features)
    report = agreement([a], rows=False)
    assert report.rank_corr >= 0.6, report


def test_named_errors(engine, by_feature):
    with pytest.raises(RequestError, match="label"):
        engine.steering_effect(by_feature, "STEERED*9")
    with pytest.raises(RequestError, match="position"):
        engine.attribute(by_feature, position=len(by_feature.outputs["STEERED"].token_ids))
    with pytest.raises(RequestError, match="position"):
        engine.attribute(by_feature, position=-1)
    with pytest.raises(SourceError, match="no-such-sae"):
        engine.attribute(by_feature, position=0, source="no-such-sae")
    with pytest.raises(SourceError, match="no-such-sae"):
        engine.steering_features(by_feature, "no-such-sae")
    foreign = SteerResult(
        by_feature.request, by_feature.outputs, by_feature.prompt_ids, "another/model"
    )
    with pytest.raises(RequestError, match="result"):
        engine.attribute(foreign, position=0)
    with pytest.raises(RequestError, match="label"):
        engine.attribute(by_feature, "DEFAULT", 0)  # nothing steered it


def test_path_points_and_spearman():
    for steps in (1, 2, 3, 4, 7):
        points = path_points(steps)
        assert math.isclose(sum(w for _, w in points), 1.0)
        assert all(0.0 < x <= 1.0 for x, _ in points)
    assert path_points(1) == [(1.0, 1.0)]
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_a_model_that_is_not_local_is_refused_by_name(engine, by_feature):
    from types import SimpleNamespace

    from steer_widgets.analysis.explain import Explainer

    remote_like = SimpleNamespace(model=SimpleNamespace(runtime=object(), name=engine.model.name))
    with pytest.raises(RequestError, match="engine"):
        Explainer(remote_like).effect(by_feature)


def test_the_differentiable_linear_matches_the_compiled_one(engine):
    """Forward values as generation computes them; the backward is g @ W."""
    from steer_widgets.analysis.gradients import _grad_mm, dense_weight

    lin = engine.model.runtime.layers[0].wqkv
    x = torch.randn(2, 5, lin.in_features, requires_grad=True)
    y = _grad_mm(x, lin)
    assert torch.equal(y.detach(), lin(x.detach()))
    if lin.kernel == "native":
        w = dense_weight(lin)
        assert torch.equal(
            torch.cat([dense_weight(lin, a, min(a + 37, 960)) for a in range(0, 960, 37)]), w
        )
        assert torch.allclose(y.detach(), x.detach() @ w.T, atol=1e-4)
        g = torch.randn_like(y)
        (y * g).sum().backward()
        assert torch.allclose(x.grad, g @ w, atol=1e-5)


def test_rows_of_a_packed_float_weight_are_its_rows():
    """The float32 kernel's [N/16, K, 16] blocks read back a row range at any offset."""
    from steer_widgets.analysis.gradients import dense_weight, input_gradient
    from steer_widgets.runtime.linear import Linear

    w = torch.randn(70, 48, generator=torch.Generator().manual_seed(0))
    lin = Linear(w)
    if lin.kernel != "native":
        pytest.skip("no native kernel on this machine")
    assert torch.equal(dense_weight(lin), w)
    assert torch.equal(dense_weight(lin, 5, 37), w[5:37])
    g = torch.randn(3, 70)
    assert torch.allclose(input_gradient(g, lin), g @ w, atol=1e-5)


def test_transformer_lens_runtime_gives_the_same_attribution(engine):
    """TransformerLens is plain torch: its autograd path must agree with ours."""
    from steer_widgets import Engine
    from steer_widgets.runtime.model import LoadedModel, default_model_dir
    from steer_widgets.runtime.tl_runtime import TransformerLensRuntime, hooked_llama

    folder = engine.model.source_dir or default_model_dir()  # a GGUF load has no folder
    runtime = TransformerLensRuntime(hooked_llama(folder))
    tl = Engine(
        LoadedModel("smollm2-via-transformer-lens", runtime, engine.tokenizer),
        saes={SOURCE: engine.saes.config(SOURCE).folder},
    )
    request = SteerRequest(
        prompt="My favourite food is",
        features=(Feature(SOURCE, 100, engine.default_strength(SOURCE)),),
        n_completion_tokens=4,
        temperature=0,
    )
    ours, theirs = engine.steer(request), tl.steer(request)
    assert ours.outputs["STEERED"].token_ids == theirs.outputs["STEERED"].token_ids
    a = engine.attribute(ours, position=2, source=SOURCE, n=3)
    b = tl.attribute(theirs, position=2, source=SOURCE, n=3)
    assert a.gain == pytest.approx(b.gain, abs=1e-4)
    assert a.rows[0].attribution == pytest.approx(b.rows[0].attribution, abs=1e-4)
    assert [f.index for f in a.features] == [f.index for f in b.features]


def test_what_changed_is_read_for_each_steering_not_for_an_object_id(engine, monkeypatch):
    """Two results with the same tokens and different steering get their own "what changed"
    even where the second one has the first one's id (Python reuses the ids of collected
    objects; simulated by making every id the same), as the explorer meets over a long day."""
    import steer_widgets.analysis.changed_features as changed
    import steer_widgets.analysis.explain as explain

    def run(strength: float) -> SteerResult:
        request = SteerRequest(
            prompt="The weather today is", features=(Feature("5-smollm2-res-4k", 7, strength),),
            n_completion_tokens=4, temperature=0,
        )  # fmt: skip
        return engine.steer(request)

    weak, weaker = run(2.0), run(1.0)
    assert weak.outputs["STEERED"].token_ids == weaker.outputs["STEERED"].token_ids
    for module in (explain, changed):  # where the reads' cache keys are made
        monkeypatch.setattr(module, "id", lambda obj: 1, raising=False)
    explainer = explain.Explainer(engine)
    first = explainer.changed_features(weak, SOURCE, 5, "STEERED")
    second = explainer.changed_features(weaker, SOURCE, 5, "STEERED")
    alone = explain.Explainer(engine).changed_features(weaker, SOURCE, 5, "STEERED")
    assert [(r.index, r.steered) for r in second.features] == [
        (r.index, r.steered) for r in alone.features
    ]
    assert [r.steered for r in first.features] != [r.steered for r in second.features]


def test_attribution_holds_one_float32_weight_at_a_time(engine, by_feature, monkeypatch):
    """The dense weights a backward pass needs live for one product each: kept for the
    model's lifetime they took the quantized default engine from 415 to 1,073 MB resident,
    kept for one attribution its peak to 1,015 MB."""
    import gc
    import weakref

    import steer_widgets.analysis.gradients as gradients

    made, real, most = [], gradients.dense_weight, [0]

    def tracked(lin, *rows):
        most[0] = max(most[0], sum(ref() is not None for ref in made))
        w = real(lin, *rows)
        made.append(weakref.ref(w))
        return w

    monkeypatch.setattr(gradients, "dense_weight", tracked)  # input_gradient reads it there
    why = engine.attribute(by_feature, "STEERED", position=1)
    assert why.rows and len(made) > 10
    gc.collect()
    assert most[0] == 0 and all(ref() is None for ref in made), most


def test_the_blocks_under_every_hook_run_once_per_attribution(engine, by_feature, monkeypatch):
    """Four differentiable readings (``steps=3`` and the steered point) and the exact reads
    (unsteered, the row removed) differ only at and above the steering's block (layer 12
    here): the blocks under it run once for the readings and once for the reads, not once
    for each (6 times before)."""
    from collections import Counter

    from steer_widgets.runtime.transformer import Transformer

    runs, real = Counter(), Transformer._block

    def counted(self, i, *args):
        runs[i] += 1
        return real(self, i, *args)

    monkeypatch.setattr(Transformer, "_block", counted)
    why = engine.attribute(by_feature, "STEERED", position=1, n=0)  # no SAE reads of the text
    assert why.rows and why.features == ()
    assert [runs[i] for i in range(12)] == [2] * 12, runs
    assert min(runs[i] for i in range(12, 30)) >= 6, runs


def test_moved_features_read_gradients_of_any_device_and_dtype(engine):
    """On a GPU the steered run's activations and gradients are device tensors, in bfloat16
    when the model is, while the SAEs stay in CPU memory in float32 (an H200 run of
    ``benchmarks/gpu_check.py`` found ``attribute`` mixing them); bfloat16 stands in here."""
    from steer_widgets.analysis.attribution import _moved

    cfg = engine.saes.config(SOURCE)
    g = torch.Generator().manual_seed(0)
    act = torch.randn(4, cfg.d_in, generator=g) * 3
    grad = torch.randn(4, cfg.d_in, generator=g)
    before = torch.zeros(4, cfg.d_sae)
    want = _moved(engine, SOURCE, cfg, before, act, grad, 3, False)
    got = _moved(engine, SOURCE, cfg, before, act.bfloat16(), grad.bfloat16(), 3, False)
    assert len(got) == len(want) == 3
    assert all(isinstance(m.attribution, float) and m.delta.dtype == torch.float32 for m in got)
