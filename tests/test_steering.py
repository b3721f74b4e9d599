"""Steering: every row of a parallel request equals the same type generated alone."""

from __future__ import annotations

import threading

import pytest
import torch

import steer_widgets as sw
from steer_widgets.steering.requests import (
    Direction,
    PromptPositions,
    output_multipliers,
    row_op,
    sweep_label,
)

CHAT = [{"role": "user", "content": "Tell me about the ocean."}]
PROMPTS = {"completion": "I think that", "chat": CHAT}
DIMENSIONS = {
    "prompt": ["completion", "chat"],
    "seed": [16, 7],
    "temperature": [0.0, 0.5, 1.0],
    "freq_penalty": [0.0, 1.0, 2.0],
    "steering": ["one", "two_same_layer", "three_layers", "vector", "feature_and_vector"],
    "steer_method": ["SIMPLE_ADDITIVE", "ORTHOGONAL_DECOMP", "PROJECTION_CAP"],
    "steer_special_tokens": [True, False],
    "sweep": [(), (-1.0, 2.0)],
    "prompt_multiplier": [1.0, 2.0, 0.0],
}
STEPS = [1, 5, 7, 11, 13, 3, 17, 19, 23]  # co-prime strides give a spread-out covering design


def cases(n: int = 15) -> list[dict]:
    """A deterministic covering subset of the full grid: every value of every dimension
    appears, in varied combinations; invalid combinations are nudged to valid ones."""
    out = []
    for i in range(n):
        case = {
            k: v[(i * s + i // len(v)) % len(v)]
            for (k, v), s in zip(DIMENSIONS.items(), STEPS, strict=False)
        }
        if case["steer_method"] != "SIMPLE_ADDITIVE" and case["steering"] == "two_same_layer":
            case["steering"] = "three_layers"
        out.append(case)
    return out


def test_covering_design_covers_every_value():
    seen = {k: {repr(c[k]) for c in cases()} for k in DIMENSIONS}
    for key, values in DIMENSIONS.items():
        assert seen[key] >= {repr(v) for v in values} - {"'two_same_layer'"}, key


def steering_for(kind: str, sources: list[str], engine) -> dict:
    early, middle, late = sources[0], sources[len(sources) // 2], sources[-1]
    gen = torch.Generator().manual_seed(0)
    vector = sw.Vector(torch.randn(576, generator=gen), "blocks.7.hook_resid_post", 6.0)
    return {
        "one": {"features": [sw.Feature(middle, 11, 60.0)]},
        "two_same_layer": {
            "features": [sw.Feature(middle, 11, 40.0), sw.Feature(middle, 12, 40.0)]
        },
        "three_layers": {
            "features": [sw.Feature(s, i, 30.0) for s, i in ((early, 1), (middle, 2), (late, 3))]
        },
        "vector": {"vectors": [vector]},
        "feature_and_vector": {"features": [sw.Feature(late, 5, 50.0)], "vectors": [vector]},
    }[kind]


def solo(engine, request: sw.SteerRequest, label: str) -> tuple[int, ...]:
    engine.clear_caches()  # a solo DEFAULT must really be generated alone
    mult = output_multipliers(request)[label]
    if mult is None:
        alone = request.with_(types=("DEFAULT",), sweep=())
    else:
        alone = request.with_(types=("STEERED",), sweep=(), strength_multiplier=mult)
    return engine.steer(alone).outputs["STEERED" if label != "DEFAULT" else "DEFAULT"].token_ids


@pytest.mark.parametrize("case", cases(), ids=lambda c: "-".join(map(str, c.values())))
def test_parallel_rows_equal_solo_rows(engine, sources, case):
    request = sw.SteerRequest(
        prompt=PROMPTS[case["prompt"]],
        seed=case["seed"],
        temperature=case["temperature"],
        freq_penalty=case["freq_penalty"],
        steer_method=case["steer_method"],
        steer_special_tokens=case["steer_special_tokens"],
        prompt_multiplier=case["prompt_multiplier"],
        sweep=case["sweep"],
        n_completion_tokens=8,
        **steering_for(case["steering"], sources, engine),
    )
    engine.clear_caches()
    together = engine.steer(request)
    assert list(together.outputs) == ["DEFAULT", "STEERED"] + [
        sweep_label(m) for m in case["sweep"]
    ]
    for label, completion in together.outputs.items():
        assert completion.token_ids == solo(engine, request, label), label


def test_same_request_twice_gives_same_tokens(engine, sources):
    request = sw.SteerRequest("I think that", features=[sw.Feature(sources[1], 7, 80.0)], seed=3)
    request = request.with_(n_completion_tokens=10, temperature=1.0)
    first = engine.steer(request)
    engine.clear_caches()
    again = engine.steer(request)
    assert {k: c.token_ids for k, c in first.outputs.items()} == {
        k: c.token_ids for k, c in again.outputs.items()
    }


@pytest.mark.parametrize("method", ["SIMPLE_ADDITIVE", "PROJECTION_CAP", "ORTHOGONAL_DECOMP"])
def test_strong_steering_changes_text_and_zero_does_not(engine, sources, method):
    strength = {"SIMPLE_ADDITIVE": 150.0, "PROJECTION_CAP": -150.0, "ORTHOGONAL_DECOMP": 40.0}
    base = sw.SteerRequest(CHAT, steer_method=method, n_completion_tokens=10, temperature=0)
    strong = engine.steer(base.with_(features=[sw.Feature(sources[1], 11, strength[method])]))
    assert strong.outputs["STEERED"].token_ids != strong.outputs["DEFAULT"].token_ids
    if method == "SIMPLE_ADDITIVE":
        zero = engine.steer(base.with_(features=[sw.Feature(sources[1], 11, 0.0)]))
        assert zero.outputs["STEERED"].token_ids == zero.outputs["DEFAULT"].token_ids


def residual_at(engine, prompt_ids, hook: str, op=None) -> torch.Tensor:
    """The residual right after ``hook``, with ``op`` applied there if given."""
    seen = {}

    def fn(x, start):
        out = op(x, start) if op else x
        seen["x"] = out.clone()
        return out

    layer = int(hook.split(".")[1])
    engine.model.runtime.forward(
        torch.tensor([prompt_ids]), hooks={hook: fn}, stop_at_layer=layer + 1
    )
    assert "x" in seen, f"hook {hook} never ran"
    return seen["x"]


def direction(engine, source: str, index: int, strength: float) -> Direction:
    cfg = engine.saes.config(source)
    return Direction(cfg.hook_name, engine.saes.decoder_row(source, index), strength)


def test_orthogonal_decomp_with_multiplier_one_leaves_residual_unchanged(engine, sources):
    d = direction(engine, sources[1], 11, 1.0)
    ids = list(engine.tokenizer.encode(CHAT).ids)
    clean = residual_at(engine, ids, d.hook)
    steered = residual_at(engine, ids, d.hook, row_op("ORTHOGONAL_DECOMP", [d], 1.0, None))
    assert torch.equal(clean, steered)


def test_each_method_matches_its_formula_at_the_hook(engine, sources):
    ids = list(engine.tokenizer.encode(CHAT).ids)
    d = direction(engine, sources[1], 11, 3.0)
    h = residual_at(engine, ids, d.hook)
    u = d.vector / d.vector.norm()
    comp = h @ u
    expected = {
        "SIMPLE_ADDITIVE": h + 6.0 * d.vector,
        "ORTHOGONAL_DECOMP": h - comp[..., None] * u + 6.0 * comp[..., None] * u,
        "PROJECTION_CAP": h + (comp.clamp(max=6.0) - comp)[..., None] * u,
    }
    for method, want in expected.items():
        got = residual_at(engine, ids, d.hook, row_op(method, [d], 2.0, None))
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)


def test_a_feature_is_added_once_at_its_own_layer(engine, sources):
    ids = list(engine.tokenizer.encode("The weather today").ids)
    request = sw.SteerRequest("x", features=[sw.Feature(sources[0], 4, 10.0)])
    _, plan = engine.plan(request)
    steered_row = plan.rows[1]
    assert list(steered_row.ops) == [engine.saes.config(sources[0]).hook_name]
    hook = engine.saes.config(sources[0]).hook_name
    clean = residual_at(engine, ids, hook)
    got = residual_at(engine, ids, hook, steered_row.ops[hook])
    added = (10.0 * engine.saes.decoder_row(sources[0], 4)).expand_as(clean)
    torch.testing.assert_close(got - clean, added, atol=1e-3, rtol=0)  # residuals reach ~1e3


def test_special_tokens_unsteered_only_in_the_prompt(engine, sources):
    enc = engine.tokenizer.encode(CHAT)
    mask = torch.tensor(enc.special)
    d = direction(engine, sources[1], 11, 50.0)
    op = row_op("SIMPLE_ADDITIVE", [d], 1.0, PromptPositions(1.0, mask))
    h = residual_at(engine, list(enc.ids), d.hook)
    out = op(h, 0)
    changed = (out != h).any(-1)[0]
    assert torch.equal(changed, ~mask)
    # with a KV cache a decode step sees one new position past the prompt: always steered
    step = op(h[:, -1:], len(enc.ids))
    assert (step != h[:, -1:]).any()
    # a chunk straddling the end of the prompt is masked by absolute position
    tail = op(h[:, -3:], len(enc.ids) - 3)
    assert torch.equal((tail != h[:, -3:]).any(-1)[0], ~mask[-3:])


def test_default_is_reused_when_only_steering_changes(engine, sources):
    engine.clear_caches()
    base = sw.SteerRequest(CHAT, n_completion_tokens=8, features=[sw.Feature(sources[1], 3, 40.0)])
    first = engine.steer(base)
    frames = list(engine.steer_stream(base.with_(features=[sw.Feature(sources[1], 3, 90.0)])))
    assert frames[0].outputs["DEFAULT"] == first.outputs["DEFAULT"]  # complete in frame one
    assert len(frames[0].outputs["STEERED"].token_ids) <= 1


def test_cancel_stops_within_one_step(engine, sources):
    request = sw.SteerRequest(
        "Once upon a time", features=[sw.Feature(sources[1], 3, 40.0)], n_completion_tokens=200
    )
    cancel = threading.Event()
    engine.clear_caches()
    frames = []
    for frame in engine.steer_stream(request, cancel):
        frames.append(frame)
        if frame.step == 3:  # cancelled from another thread, set before the next step
            setter = threading.Thread(target=cancel.set)
            setter.start()
            setter.join()
    steps = [f.step for f in frames if not f.done]
    assert max(steps) <= 4 and frames[-1].done
    assert all(c.stop == "cancelled" for c in frames[-1].outputs.values())
    assert engine.generate("still works", n_completion_tokens=2).token_ids  # engine usable


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"types": ()}, "types"),
        ({"types": ("DEFAULT", "BOGUS")}, "types"),
        ({"features": [sw.Feature("no-such-sae", 1, 1.0)]}, "features[0]"),
        ({"features": [sw.Feature("__first__", 10**6, 1.0)]}, "features[0]"),
        ({"features": [sw.Feature("__first__", 1, float("nan"))]}, "features[0].strength"),
        ({"features": [sw.Feature("__first__", 1, float("inf"))]}, "features[0].strength"),
        ({"vectors": [sw.Vector(torch.ones(7), "blocks.3.hook_resid_post")]}, "vectors[0].vector"),
        ({"vectors": [sw.Vector(torch.ones(576), "blocks.77.hook_resid_post")]}, "vectors[0].hook"),
        (
            {
                "vectors": [sw.Vector(torch.zeros(576), "blocks.3.hook_resid_post")],
                "normalize_steering": True,
            },
            "vectors[0].vector",
        ),
        ({"steer_method": "MULTIPLY"}, "steer_method"),
        ({"strength_multiplier": float("nan")}, "strength_multiplier"),
        ({"features": [], "vectors": []}, "features"),
        (
            {
                "steer_method": "PROJECTION_CAP",
                "features": [sw.Feature("__first__", 1, 1.0), sw.Feature("__first__", 2, 1.0)],
            },
            "features",
        ),
    ],
)
def test_bad_requests_fail_before_generation(engine, sources, changes, field):
    fix = lambda f: sw.Feature(sources[0], f.index, f.strength) if f.source == "__first__" else f  # noqa: E731
    if "features" in changes:
        changes = changes | {"features": [fix(f) for f in changes["features"]]}
    request = sw.SteerRequest(
        "Hello", features=[sw.Feature(sources[0], 1, 5.0)], n_completion_tokens=2
    )
    with pytest.raises(sw.RequestError) as info:
        engine.steer_stream(request.with_(**changes))  # raises on the call, before any frame
    assert info.value.field == field
    assert engine.steer(request).outputs["STEERED"].token_ids  # engine still usable


def test_record_replays_same_tokens(engine, sources):
    vector = sw.Vector(torch.linspace(-1, 1, 576), "blocks.4.hook_resid_post", 3.0)
    request = sw.SteerRequest(
        CHAT,
        features=[sw.Feature(sources[2], 9, 50.0)],
        vectors=[vector],
        sweep=(2.0,),
        n_completion_tokens=6,
        temperature=1.0,
        seed=99,
    )
    result = engine.steer(request)
    import json

    record = json.loads(json.dumps(result.to_dict()))
    engine.clear_caches()
    replay = engine.steer(record)
    assert {k: c.token_ids for k, c in replay.outputs.items()} == {
        k: c.token_ids for k, c in result.outputs.items()
    }
    frame = result.to_frame()
    assert list(frame["type"]) == ["DEFAULT", "STEERED", "STEERED*2"]


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda e: e.steer(None), "request"),
        (lambda e: e.steer({"prompt": None}), "prompt"),
        (
            lambda e: e.steer({"request": {"prompt": "x", "features": [{"source": "a"}]}}),
            "features[0]",
        ),
        (lambda e: e.steer({"request": {"prompt": "x", "seed": 2**64}}), "seed"),
        (lambda e: e.steer({"prompt": "x", "temperature": True}), "temperature"),
        (lambda e: e.steer_stream({"prompt": "x", "sweep": [1, 1], "features": []}), "sweep[1]"),
        (lambda e: e.generate("x", temprature=1.0), "temprature"),
        (lambda e: e.generate(None), "prompt"),
    ],
)
def test_malformed_records_and_calls_are_named(engine, call, field):
    with pytest.raises(sw.RequestError) as info:
        call(engine)
    assert info.value.field == field


def test_a_generation_runs_one_forward_pass_per_token_after_the_prompt(engine, sources):
    """n tokens take the prefill and n - 1 decode steps: none after the last token (a run
    once paid one more, 12% of an 8-token run)."""
    runtime = engine.model.runtime
    steps = []
    real = type(runtime).forward

    def counted(self, tokens, *args, **kwargs):
        if tokens.shape[1] == 1:
            steps.append(tokens.shape[0])
        return real(self, tokens, *args, **kwargs)

    request = sw.SteerRequest(
        "The lighthouse keeper said", features=[sw.Feature(sources[1], 11, 60.0)],
        n_completion_tokens=8, temperature=0.0, freq_penalty=0.0,
    )  # fmt: skip
    engine.clear_caches()
    try:
        type(runtime).forward = counted
        result = engine.steer(request)
    finally:
        type(runtime).forward = real
    n = max(len(c.token_ids) for c in result.outputs.values())
    assert n == 8 and len(steps) == n - 1, (n, steps)


def test_steer_decodes_each_output_text_once(engine, sources):
    """``steer`` waits for the end, so it turns each output's tokens into text once, not
    after every token as a stream must (docs/benchmarks.md has what that cost), and its
    texts equal the stream's last frame."""
    tokenizer = engine.decoder.tokenizer
    real, calls = tokenizer.decode, []

    def counted(ids, *args, **kwargs):
        calls.append(len(ids))
        return real(ids, *args, **kwargs)

    request = sw.SteerRequest(
        "The lighthouse keeper said", features=[sw.Feature(sources[1], 11, 60.0)],
        n_completion_tokens=8, temperature=0.0, freq_penalty=0.0, sweep=(2.0,),
    )  # fmt: skip
    engine.clear_caches()
    tokenizer.decode = counted
    try:
        result = engine.steer(request)
    finally:
        del tokenizer.decode
    assert len(calls) == len(result.outputs) == 3, calls
    engine.clear_caches()
    *_, last = engine.steer_stream(request)
    assert {k: (c.text, c.token_ids) for k, c in last.outputs.items()} == {
        k: (c.text, c.token_ids) for k, c in result.outputs.items()
    }


def test_a_stream_left_open_blocks_no_other_decode(engine, sources):
    """A caller that takes a frame and keeps the stream without iterating it (or looks at a
    frame for long) holds no lock: another decode on another thread finishes meanwhile, and
    the stream then resumes exactly where it was."""
    request = sw.SteerRequest(
        "Rivers of France", features=[sw.Feature(sources[1], 11, 60.0)],
        n_completion_tokens=6, temperature=0.7, seed=2,
    )  # fmt: skip
    other = request.with_(prompt="The Eiffel Tower", seed=9)
    engine.clear_caches()
    want = tokens_of(engine.steer(request))
    want_other = tokens_of(engine.steer(other))
    engine.clear_caches()
    stream = engine.steer_stream(request)
    next(stream)
    got_other: list = []
    thread = threading.Thread(
        target=lambda: got_other.append(tokens_of(engine.steer(other))), daemon=True
    )
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "a decode waited on a stream nobody was iterating"
    assert got_other == [want_other]
    frames = list(stream)
    assert frames[-1].done and {k: c.token_ids for k, c in frames[-1].outputs.items()} == want


def tokens_of(result) -> dict:
    return {label: c.token_ids for label, c in result.outputs.items()}
