"""Property: any call of the public API (requests, engine methods, the explorer, views,
presets, records) returns a result or raises a named error, and the engine is exactly as it
was afterwards (a reference request gives the same tokens).

``SW_PROPERTY_EXAMPLES`` scales the number of examples (default: 400 calls of the whole API
plus 40 requests per run); ``SW_PROPERTY_SEED`` draws them from another seed (a fuzz run)
instead of the fixed derandomized sequence."""

from __future__ import annotations

import math
import os
import tempfile

import torch
from api_calls import calls, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import steer_widgets as sw
from steer_widgets.steering.requests import output_multipliers

# Hypothesis keeps a cache in ./.hypothesis unless told otherwise: never in the work tree.
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "steer_widgets-hypothesis")
)
HOOK = "blocks.3.hook_resid_post"
NAN = math.nan


def requests(sources: list[str]) -> st.SearchStrategy:
    """Valid requests, each with up to two fields swapped for a bad value."""
    early, middle, late = sources[0], sources[len(sources) // 2], sources[-1]
    direction = torch.randn(576, generator=torch.Generator().manual_seed(0))
    good_feature = st.sampled_from(
        [sw.Feature(middle, 11, 40.0), sw.Feature(late, 3, -25.0), sw.Feature(early, 4095, 10.0)]
    )
    good_vector = st.sampled_from(
        [
            sw.Vector(direction, HOOK, 4.0),
            sw.Vector(direction.tolist(), "blocks.20.attn.hook_z", -2.0),
        ]
    )
    valid = st.builds(
        sw.SteerRequest,
        prompt=st.sampled_from(["I think that", [{"role": "user", "content": "Hi there"}]]),
        features=st.lists(good_feature, min_size=1, max_size=3, unique_by=lambda f: f.source),
        vectors=st.lists(good_vector, max_size=1),
        types=st.sampled_from([("DEFAULT", "STEERED"), ("DEFAULT",), ("STEERED",)]),
        steer_method=st.sampled_from(sw.METHODS),
        strength_multiplier=st.floats(-4, 4),
        normalize_steering=st.booleans(),
        steer_special_tokens=st.booleans(),
        prompt_multiplier=st.sampled_from([1.0, 2.0, 0.0, -1.0]),
        n_completion_tokens=st.integers(1, 3),
        temperature=st.sampled_from([0.0, 0.7, 1.0]),
        freq_penalty=st.sampled_from([0.0, 1.0, 2.0]),
        seed=st.integers(0, 2**64 - 1),
        sweep=st.sampled_from([(), (2.0,), (-1.0, 0.5)]),
    )
    bad = {
        "prompt": ["", " ", None, 7, [], [{"role": "robot", "content": "x"}], "word " * 9000],
        "features": [None, "features", [None], [sw.Feature(middle, 4096, 1.0)],
                     [sw.Feature("no-such-sae", 1, 1.0)], [sw.Feature(middle, -1, 1.0)],
                     [sw.Feature(middle, 1, NAN)], [sw.Feature(middle, True, 1.0)]],
        "vectors": [None, [None], [sw.Vector(torch.zeros(576), HOOK, 1.0)],
                    [sw.Vector(torch.ones(7), HOOK, 1.0)], [sw.Vector(None, HOOK, 1.0)],
                    [sw.Vector(direction, "blocks.99.hook_resid_post", 1.0)]],
        "types": [(), ("X",), None, "DEFAULT", ("DEFAULT", "DEFAULT")],
        "steer_method": ["BAD", None],
        "strength_multiplier": [NAN, True, None, "1"],
        "normalize_steering": [None, 1],
        "steer_special_tokens": [None, "no"],
        "prompt_multiplier": [NAN, None, "2", True],
        "n_completion_tokens": [0, -1, None, 2.5, 10**6],
        "temperature": [-1.0, NAN, True, None],
        "freq_penalty": [-0.5, None],
        "seed": [2**64, -(2**63) - 1, 1.5, None],
        "sweep": [(1.0, 1.0), (NAN,), None, tuple(range(9))],
    }  # fmt: skip
    corruption = st.sampled_from(sorted(bad)).flatmap(
        lambda k: st.tuples(st.just(k), st.sampled_from(bad[k]))
    )
    return st.tuples(valid, st.lists(corruption, max_size=2)).map(
        lambda pair: (pair[0].with_(**dict(pair[1])), bool(pair[1]))
    )


def test_any_request_gives_outputs_or_a_named_error(engine, sources):
    reference = sw.SteerRequest(
        "The ocean is", features=[sw.Feature(sources[1], 11, 60.0)], sweep=(2.0,),
        n_completion_tokens=6, temperature=0.8, seed=5,
    )  # fmt: skip
    engine.clear_caches()
    before = {k: c.token_ids for k, c in engine.steer(reference).outputs.items()}
    seen = {"ok": 0, "error": 0}

    @settings(
        max_examples=40, deadline=None, derandomize=True, database=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(requests(sources))
    def check(pair):
        request, swapped = pair
        try:
            result = engine.steer(request)
        except (sw.RequestError, sw.SourceError) as err:
            assert str(err) and (getattr(err, "field", None) or getattr(err, "source", None))
            assert swapped, f"a valid request was refused: {err}"
            seen["error"] += 1
            return
        assert list(result.outputs) == list(output_multipliers(request))
        for completion in result.outputs.values():
            assert 1 <= len(completion.token_ids) <= request.n_completion_tokens
            assert completion.stop in ("eos", "length")
        seen["ok"] += 1

    check()
    assert seen["ok"] >= 3 and seen["error"] >= 3, seen  # both branches were exercised
    again = {k: c.token_ids for k, c in engine.steer(reference).outputs.items()}  # DEFAULT cached
    engine.clear_caches()
    fresh = {k: c.token_ids for k, c in engine.steer(reference).outputs.items()}
    assert again == before and fresh == before


EXAMPLES = int(os.environ.get("SW_PROPERTY_EXAMPLES", "400"))
SEED = os.environ.get("SW_PROPERTY_SEED")


def _settings(n: int):
    """Fixed examples in the normal run; a fresh draw from ``SW_PROPERTY_SEED`` when set."""
    from hypothesis import seed

    base = settings(
        max_examples=n, deadline=None, derandomize=SEED is None, database=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    return (lambda f: seed(int(SEED))(base(f))) if SEED else base


def _named(err: sw.SteerWidgetsError) -> str | None:
    """What a named error names: a field, an SAE source, a model, a server."""
    for attr in ("field", "source", "model", "url"):
        if getattr(err, attr, None) is not None:
            return str(getattr(err, attr))
    return None


def test_any_call_of_the_public_api_gives_a_result_or_a_named_error(
    engine, sources, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)  # an odd string as a path ("nope") is written here, not the tree
    reference = sw.SteerRequest("The ocean is", types=("DEFAULT",), n_completion_tokens=5, seed=2)
    engine.clear_caches()
    before = engine.steer(reference).outputs["DEFAULT"].token_ids
    explorer = sw.Explorer(engine, live=False)
    table = calls(engine, sources, tmp_path)
    seen = {"ok": 0, "named": 0, "status": 0}

    @_settings(EXAMPLES)
    @given(examples(table))
    def check(example):
        call, kwargs, swapped = example
        explorer.status_line.error = ""
        try:
            call.run(engine, explorer, **kwargs)
        except sw.SteerWidgetsError as err:
            assert _named(err) is not None, f"{call.name}: {err!r} names nothing"
            assert swapped, f"{call.name}({kwargs}) is valid but was refused: {err}"
            seen["named"] += 1
            return
        if call.explorer and explorer.error:
            assert swapped, f"{call.name}({kwargs}) is valid but was refused: {explorer.error}"
            seen["status"] += 1  # refused in the status line, the explorer still usable
        else:
            seen["ok"] += 1

    check()
    assert min(seen.values()) >= 1, seen  # every outcome was exercised
    engine.clear_caches()
    assert engine.steer(reference).outputs["DEFAULT"].token_ids == before
    explorer.set(n_completion_tokens=3, temperature=0, seed=1, prompt="The ocean is")
    explorer.run()
    assert explorer.wait(60) and "DEFAULT" in explorer.outputs, explorer.status
    shown = explorer.outputs["DEFAULT"].token_ids
    engine.clear_caches()  # the explorer still shows what the engine makes of its request
    assert engine.steer(explorer.request_done).outputs["DEFAULT"].token_ids == shown
