"""The TransformerLens runtime: the same engine on a HookedTransformer, rows still exact.

TransformerLens models other than Llama need the network here, so the test runs SmolLM2
itself through TransformerLens (``hooked_llama``) and compares with the fast runtime.
"""

from __future__ import annotations

import pytest

import steer_widgets as sw
from steer_widgets.runtime.model import LoadedModel, default_model_dir
from steer_widgets.runtime.tl_runtime import TransformerLensRuntime, hooked_llama
from steer_widgets.steering.requests import output_multipliers


@pytest.fixture(scope="module")
def tl_engine(engine, sources):
    runtime = TransformerLensRuntime(hooked_llama(engine.model.source_dir or default_model_dir()))
    model = LoadedModel("smollm2-via-transformer-lens", runtime, engine.tokenizer)
    return sw.Engine(model, saes={s: engine.saes.config(s).folder for s in sources})


def test_hook_points_are_transformer_lens_names(tl_engine, engine):
    names = set(tl_engine.hook_names)
    assert {"blocks.10.hook_resid_post", "blocks.3.attn.hook_z", "blocks.0.hook_mlp_out"} <= names
    assert names == set(engine.hook_names)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rows_equal_solo_and_text_matches_fast_runtime(tl_engine, engine, sources, temperature):
    request = sw.SteerRequest(
        "I think that", features=[sw.Feature(sources[1], 11, 80.0)], sweep=(2.0,),
        n_completion_tokens=5, temperature=temperature, seed=4,
    )  # fmt: skip
    together = tl_engine.steer(request)
    for label, completion in together.outputs.items():
        tl_engine.clear_caches()
        mult = output_multipliers(request)[label]
        if mult is None:
            alone = request.with_(types=("DEFAULT",), sweep=())
        else:
            alone = request.with_(types=("STEERED",), sweep=(), strength_multiplier=mult)
        solo = tl_engine.steer(alone).outputs["DEFAULT" if label == "DEFAULT" else "STEERED"]
        assert solo.token_ids == completion.token_ids, label
        assert solo.token_probs == completion.token_probs, label  # probabilities too
    assert together.outputs["STEERED"].token_ids != together.outputs["DEFAULT"].token_ids
    fast = engine.steer(request)  # the same model on our runtime: the same text here
    assert {k: c.text for k, c in fast.outputs.items()} == {
        k: c.text for k, c in together.outputs.items()
    }
    for label, completion in fast.outputs.items():  # the same distribution, both runtimes
        theirs = together.outputs[label].logprobs
        assert max(abs(a - b) for a, b in zip(completion.logprobs, theirs, strict=True)) < 1e-3


def test_activations_agree_with_fast_runtime(tl_engine, engine, sources):
    text = "The Eiffel Tower in Paris"
    top = engine.top_features(text, sources[1], n=1)
    ours = engine.activations(text, sources[1], top.indices[0])
    theirs = tl_engine.activations(text, sources[1], top.indices[0])
    assert max(abs(a - b) for a, b in zip(ours.values, theirs.values, strict=True)) < 1e-2
    assert ours.max_position == theirs.max_position


def test_the_last_of_many_rows_equals_its_solo_run(tl_engine, sources):
    """Each row decodes alone, so no row limit and no dependence on a row's place in the
    batch (a padded batch of 8 broke this on an AVX-512 AMD CPU: rows 1-3 differed)."""
    request = sw.SteerRequest(
        "Hi", features=[sw.Feature(sources[1], 11, 80.0)], sweep=tuple(range(2, 9)),
        n_completion_tokens=3, temperature=0.0,
    )  # fmt: skip
    together = tl_engine.steer(request)  # DEFAULT, STEERED and 7 sweep rows
    assert len(together.outputs) == 9
    tl_engine.clear_caches()
    alone = request.with_(types=("STEERED",), sweep=(), strength_multiplier=8.0)
    solo = tl_engine.steer(alone).outputs["STEERED"]
    last = together.outputs["STEERED*8"]
    assert solo.token_ids == last.token_ids and solo.token_probs == last.token_probs


def test_a_ragged_batch_equals_each_request_alone(tl_engine, sources):
    """Rows of different prompts and lengths decode side by side, each on its own cache at
    its own position (hooks get each row's position: ``prompt_multiplier`` depends on it)."""
    requests = {
        "chat": sw.SteerRequest([{"role": "user", "content": "Hi there!"}], types=("STEERED",),
                                features=[sw.Feature(sources[1], 11, 80.0)], prompt_multiplier=2.0,
                                n_completion_tokens=4, temperature=0.8, seed=2),
        "text": sw.SteerRequest("The old lighthouse keeper said", n_completion_tokens=6,
                                features=[sw.Feature(sources[0], 5, 40.0)], temperature=0.0),
    }  # fmt: skip
    tl_engine.clear_caches()
    together = tl_engine.steer_batch(requests)
    for name, request in requests.items():
        for label, completion in together[name].outputs.items():
            tl_engine.clear_caches()
            solo = tl_engine.steer(request.with_(types=(label,))).outputs[label]
            assert solo.token_ids == completion.token_ids, (name, label)
            assert solo.token_probs == completion.token_probs, (name, label)


def test_conditions_gate_on_transformer_lens_too(tl_engine, sources):
    """Conditions are hooks like any steering: nowhere is DEFAULT, everywhere is the
    unconditional steering, and a token gate follows the feature's values."""
    base = sw.SteerRequest(
        "I think that", features=[sw.Feature(sources[1], 11, 80.0)], n_completion_tokens=5,
        temperature=0.0,
    )  # fmt: skip
    tl_engine.clear_caches()
    plain = tl_engine.steer(base).outputs
    never = sw.When(sw.Feature(sources[0], 3187), above=1e6)
    for when, want in ((never, plain["DEFAULT"]), (~never, plain["STEERED"])):
        got = tl_engine.steer(base.with_(when=when, types=("STEERED",))).outputs["STEERED"]
        assert got == want and got.token_probs == want.token_probs
    real = sw.When(sw.Feature(sources[0], 3187), above=5.0)
    out = tl_engine.steer(base.with_(when=real, types=("STEERED",))).outputs["STEERED"]
    values = tl_engine.feature_values(tl_engine.text(base.prompt, out), sources[0], 3187)
    gate = out.gates["features[0]"]
    near = [abs(float(v) - 5.0) < 1e-4 for v in values[: len(gate)]]
    assert all(g == (float(v) > 5.0) or n for g, v, n in zip(gate, values, near, strict=False))
    assert 0 < sum(gate) < len(gate)
