"""Every bad value of every public request field is a named RequestError, before any work."""

from __future__ import annotations

import json
import math

import pytest
import torch

import steer_widgets as sw
from steer_widgets.errors import ModelNotFound
from steer_widgets.steering.requests import validate_shape

SOURCE = "10-smollm2-res-4k"
BASE = sw.SteerRequest("Hello", features=[sw.Feature(SOURCE, 1, 5.0)], n_completion_tokens=2)
VEC = sw.Vector(torch.ones(576), "blocks.3.hook_resid_post", 1.0)
NAN, INF = math.nan, math.inf

# (field name the error must carry, changes to BASE)
BAD = [
    ("prompt", {"prompt": None}),
    ("prompt", {"prompt": 5}),
    ("prompt", {"prompt": b"bytes"}),
    ("prompt", {"prompt": []}),
    ("prompt[0]", {"prompt": [None]}),
    ("prompt[0]", {"prompt": [{"role": "user"}]}),
    ("prompt[0].role", {"prompt": [{"role": "robot", "content": "hi"}]}),
    ("prompt[0].content", {"prompt": [{"role": "user", "content": None}]}),
    ("features", {"features": None}),
    ("features", {"features": "10-smollm2-res-4k"}),
    ("features[0]", {"features": [None]}),
    ("features[0]", {"features": [(SOURCE, 1, 1.0)]}),
    ("features[0].source", {"features": [sw.Feature(None, 1, 1.0)]}),
    ("features[0].index", {"features": [sw.Feature(SOURCE, None, 1.0)]}),
    ("features[0].index", {"features": [sw.Feature(SOURCE, -1, 1.0)]}),
    ("features[0].index", {"features": [sw.Feature(SOURCE, True, 1.0)]}),
    ("features[0].index", {"features": [sw.Feature(SOURCE, 1.5, 1.0)]}),
    ("features[0].strength", {"features": [sw.Feature(SOURCE, 1, None)]}),
    ("features[0].strength", {"features": [sw.Feature(SOURCE, 1, True)]}),
    ("features[0].strength", {"features": [sw.Feature(SOURCE, 1, NAN)]}),
    ("features[0].strength", {"features": [sw.Feature(SOURCE, 1, "40")]}),
    ("features[1].strength", {"features": [sw.Feature(SOURCE, 1), sw.Feature(SOURCE, 2, INF)]}),
    ("vectors", {"vectors": None}),
    ("vectors[0]", {"vectors": [None]}),
    ("vectors[0].hook", {"vectors": [sw.Vector(torch.ones(576), None)]}),
    ("vectors[0].vector", {"vectors": [sw.Vector(None, "blocks.3.hook_resid_post")]}),
    ("vectors[0].vector", {"vectors": [sw.Vector("abc", "blocks.3.hook_resid_post")]}),
    ("vectors[0].strength", {"vectors": [sw.Vector(torch.ones(576), VEC.hook, None)]}),
    ("vectors[0].strength", {"vectors": [sw.Vector(torch.ones(576), VEC.hook, False)]}),
    ("types", {"types": None}),
    ("types", {"types": "DEFAULT"}),
    ("types", {"types": ()}),
    ("types", {"types": ("DEFAULT", "BOGUS")}),
    ("types", {"types": ("DEFAULT", None)}),
    ("types", {"types": ("STEERED", "STEERED")}),
    ("steer_method", {"steer_method": None}),
    ("steer_method", {"steer_method": "MULTIPLY"}),
    ("steer_method", {"steer_method": ["SIMPLE_ADDITIVE"]}),
    ("strength_multiplier", {"strength_multiplier": None}),
    ("strength_multiplier", {"strength_multiplier": True}),
    ("strength_multiplier", {"strength_multiplier": NAN}),
    ("strength_multiplier", {"strength_multiplier": "2"}),
    ("normalize_steering", {"normalize_steering": None}),
    ("normalize_steering", {"normalize_steering": 1}),
    ("steer_special_tokens", {"steer_special_tokens": None}),
    ("steer_special_tokens", {"steer_special_tokens": "no"}),
    ("prompt_multiplier", {"prompt_multiplier": None}),
    ("prompt_multiplier", {"prompt_multiplier": INF}),
    ("prompt_multiplier", {"prompt_multiplier": "2"}),
    ("n_completion_tokens", {"n_completion_tokens": None}),
    ("n_completion_tokens", {"n_completion_tokens": 0}),
    ("n_completion_tokens", {"n_completion_tokens": -3}),
    ("n_completion_tokens", {"n_completion_tokens": True}),
    ("n_completion_tokens", {"n_completion_tokens": 2.5}),
    ("temperature", {"temperature": None}),
    ("temperature", {"temperature": True}),
    ("temperature", {"temperature": -0.1}),
    ("temperature", {"temperature": INF}),
    ("temperature", {"temperature": NAN}),
    ("freq_penalty", {"freq_penalty": None}),
    ("freq_penalty", {"freq_penalty": False}),
    ("freq_penalty", {"freq_penalty": -1}),
    ("seed", {"seed": None}),
    ("seed", {"seed": True}),
    ("seed", {"seed": 1.5}),
    ("seed", {"seed": 2**64}),
    ("seed", {"seed": -(2**63) - 1}),
    ("sweep", {"sweep": None}),
    ("sweep", {"sweep": "12"}),
    ("sweep[0]", {"sweep": [None]}),
    ("sweep[0]", {"sweep": [True]}),
    ("sweep[1]", {"sweep": [1.0, NAN]}),
    ("sweep[1]", {"sweep": [2, 2.0]}),
    ("sweep[2]", {"sweep": [-1, 0.0, -0.0]}),
    ("features", {"features": [], "types": ("DEFAULT",), "sweep": (2.0,)}),
]


@pytest.mark.parametrize(("field", "changes"), BAD, ids=[f"{f}={c}"[:60] for f, c in BAD])
def test_bad_field_is_named(field, changes):
    with pytest.raises(sw.RequestError) as info:
        validate_shape(BASE.with_(**changes))
    assert info.value.field == field, info.value


def test_good_request_and_edge_values_pass():
    validate_shape(BASE)
    validate_shape(BASE.with_(seed=2**64 - 1, temperature=0, freq_penalty=0, sweep=(-2, 0.5)))
    validate_shape(BASE.with_(prompt=[{"role": "user", "content": "hi"}], vectors=[VEC]))
    validate_shape(BASE.with_(features=[], types=("DEFAULT",)))


def test_not_a_request():
    for bad in (None, "Hello", 5):
        with pytest.raises(sw.RequestError) as info:
            validate_shape(bad)
        assert info.value.field == "request"


RECORD = json.loads(json.dumps(BASE.with_(vectors=[VEC]).to_dict()))
BAD_RECORDS = [
    ("request", None),
    ("request", ["prompt"]),
    ("prompt", {k: v for k, v in RECORD.items() if k != "prompt"}),
    ("temprature", RECORD | {"temprature": 0.5}),
    ("features", RECORD | {"features": None}),
    ("features[0]", RECORD | {"features": [5]}),
    ("features[0]", RECORD | {"features": [{"source": SOURCE}]}),
    ("features[0]", RECORD | {"features": [{"source": SOURCE, "index": 1, "scale": 2}]}),
    ("vectors", RECORD | {"vectors": 3}),
    ("vectors[0]", RECORD | {"vectors": [{"vector": [1.0]}]}),
    (
        "vectors[0].vector",
        RECORD | {"vectors": [{"vector": ["a"], "hook": "blocks.1.hook_resid_post"}]},
    ),
    (
        "vectors[0].vector",
        RECORD | {"vectors": [{"vector": None, "hook": "blocks.1.hook_resid_post"}]},
    ),
    ("types", RECORD | {"types": None}),
    ("sweep", RECORD | {"sweep": 2.0}),
    ("seed", RECORD | {"seed": "16"}),
]


@pytest.mark.parametrize(("field", "record"), BAD_RECORDS, ids=[f for f, _ in BAD_RECORDS])
def test_malformed_record_is_named(field, record):
    with pytest.raises(sw.RequestError) as info:
        validate_shape(sw.SteerRequest.from_dict(record))
    assert info.value.field == field, info.value


@pytest.mark.parametrize("name", ["word " * 9000, "x" * 5000 + ".gguf"])
def test_a_model_name_no_file_system_holds_is_refused_by_name(name):
    """A name too long for a path was an ``OSError`` from ``Path.is_dir``; it is a model
    that is not found (no model is loaded, no hub is asked: offline)."""
    with pytest.raises(ModelNotFound) as err:
        sw.load_model(name)
    assert err.value.model == name


@pytest.mark.parametrize("products", ["", 0, False, "Float32", "int4", b"int8", ["int8"]])
def test_products_other_than_its_names_are_refused_before_a_load(products, monkeypatch):
    """Issue 67 item 15: ``Engine(products="")`` (any falsy value) was read as "float32";
    ``None`` alone means the default. Refused by name before any model is read: a load
    reached here would be a test failure, not a slow pass."""

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("steer_widgets.engine.load_model", no_load)
    with pytest.raises(sw.RequestError, match="must be one of") as err:
        sw.Engine(products=products)
    assert err.value.field == "products"
    with pytest.raises(sw.RequestError, match="must be one of") as err:
        sw.load_model("no-such-folder-or-hub-id", products=products)
    assert err.value.field == "products"
