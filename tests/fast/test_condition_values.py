"""Conditions as values: the checks that need no model name the field at fault, records
turn back into the same condition, and the order of hook points is the forward pass's."""

from __future__ import annotations

import math

import pytest
import torch

import steer_widgets as sw
from steer_widgets.steering.conditions import from_record, point, read_hook
from steer_widgets.steering.requests import validate_shape

SRC = "5-smollm2-res-4k"
FOOD = sw.When(sw.Feature(SRC, 3187), above=5.0)
DIR = sw.Vector(torch.ones(576), "blocks.5.hook_resid_post")


def _refused(field: str, **changes) -> str:
    request = sw.SteerRequest("Hi", features=[sw.Feature(SRC, 1)], **changes)
    with pytest.raises(sw.RequestError) as err:
        validate_shape(request)
    assert err.value.field == field, err.value
    return err.value.problem


@pytest.mark.parametrize(
    "when, field",
    [
        (sw.When(sw.Feature(SRC, 1)), "when"),  # no threshold
        (sw.When(sw.Feature(SRC, 1), above=math.nan), "when.above"),
        (sw.When(sw.Feature(SRC, 1), below=math.inf), "when.below"),
        (sw.When(sw.Feature(SRC, 1), above=2, below=1), "when"),
        (sw.When(sw.Feature(SRC, -1), above=1), "when.on.index"),
        (sw.When("food", above=1), "when.on"),
        (sw.When(DIR, above=0.1, relative=True), "when.relative"),
        (sw.When(sw.Feature(SRC, 1), above=1, measure="projection"), "when.measure"),
        (sw.When(DIR, above=0.1, measure="dot"), "when.measure"),
        (sw.When(DIR, above=0.1, scope="sentence"), "when.scope"),
        (sw.When(DIR, above=0.1, scope="prompt", reduce="median"), "when.reduce"),
        (sw.When(DIR, above=0.1, off_below=0.2), "when.off_below"),
        (sw.When(DIR, below=0.1, off_below=0.0), "when.off_below"),
        (sw.When(DIR, above=0.1, scope="prompt", off_below=0.0), "when.off_below"),
        (sw.When.tokens(5, 2), "when.stop"),
        (sw.When.tokens(-1), "when.start"),
        (sw.When.tokens(of="reply"), "when.of"),
        (FOOD & sw.When.tokens(3, 1), "when.conditions[1].stop"),
        (~(FOOD | sw.When(DIR)), "when.condition.conditions[1]"),
        ("food", "when"),
    ],
)
def test_a_bad_condition_is_named_before_any_work(when, field):
    _refused(field, when=when)


def test_an_entry_condition_is_named_under_its_entry():
    request = sw.SteerRequest(
        "Hi",
        features=[sw.Feature(SRC, 1), sw.Feature(SRC, 2, when=sw.When.tokens(3, 1))],
        vectors=[sw.Vector(torch.ones(576), "blocks.6.hook_resid_pre", when=sw.When(DIR))],
    )
    with pytest.raises(sw.RequestError) as err:
        validate_shape(request)
    assert err.value.field == "features[1].when.stop"
    with pytest.raises(sw.RequestError) as err:
        validate_shape(request.with_(features=[sw.Feature(SRC, 1)]))
    assert err.value.field == "vectors[0].when"


def test_combining_with_something_else_is_a_named_error():
    with pytest.raises(sw.RequestError, match="combines conditions"):
        FOOD & True  # noqa: B018


CONDITIONS = [
    FOOD,
    sw.When(DIR, above=0.2, off_below=0.1),
    sw.When(DIR, below=-0.1, measure="projection", scope="prompt", reduce="last"),
    sw.When(sw.Feature(SRC, 7), above=0.5, relative=True, scope="prompt", reduce="mean"),
    sw.When.tokens(2, 9, of="prompt"),
    (FOOD | sw.When.tokens(stop=4)) & ~sw.When(DIR, above=0.0, below=0.5),
]


@pytest.mark.parametrize("when", CONDITIONS, ids=range(len(CONDITIONS)))
def test_a_condition_record_turns_back_into_the_same_condition(when):
    request = sw.SteerRequest(
        "Hi", features=[sw.Feature(SRC, 1, 9.0, when=when)], vectors=[sw.Vector([0.5] * 576,
        "blocks.9.hook_resid_post", when=when)], when=when,
    )  # fmt: skip
    record = request.to_dict()
    again = sw.SteerRequest.from_dict(record)
    assert again.to_dict() == record
    assert from_record(when.to_dict()).to_dict() == when.to_dict()
    validate_shape(again)


def test_records_without_conditions_read_as_before():
    record = sw.SteerRequest("Hi", features=[sw.Feature(SRC, 1)]).to_dict()
    assert "when" not in record["features"][0] and "when" not in record
    assert sw.SteerRequest.from_dict(record).when is None


@pytest.mark.parametrize(
    "record, field",
    [
        ({"kind": "sometimes"}, "when.kind"),
        ({"source": SRC}, "when"),
        ({"kind": "feature", "source": SRC}, "when"),
        ({"kind": "all", "parts": [{"kind": "tokens", "from": 2}]}, "when.parts[0]"),
        ({"kind": "vector", "vector": "abc", "hook": "blocks.1.hook_resid_post"}, "when.vector"),
    ],
)
def test_a_malformed_condition_record_names_its_key(record, field):
    with pytest.raises(sw.RequestError) as err:
        sw.SteerRequest.from_dict({"prompt": "Hi", "when": record})
    assert err.value.field == field


def test_hook_points_sort_in_execution_order():
    order = [
        "blocks.0.hook_resid_pre",
        "blocks.0.attn.hook_z",
        "blocks.0.hook_attn_out",
        "blocks.0.hook_resid_mid",
        "blocks.0.hook_mlp_out",
        "blocks.0.hook_resid_post",
        "blocks.1.attn.hook_z",
    ]
    assert [point(h) for h in order] == sorted(point(h) for h in order)
    assert point("blocks.1.hook_resid_pre") == point("blocks.0.hook_resid_post")
    assert read_hook("blocks.1.hook_resid_pre") == "blocks.0.hook_resid_post"
    assert read_hook("blocks.0.hook_resid_pre") == "blocks.0.hook_resid_pre"


def test_token_windows_count_from_where_they_say():
    positions = torch.arange(10)  # a prompt of 4 tokens, then 6 completion positions
    on = {
        of: sw.When.tokens(1, 3, of=of).holds(positions, 4).nonzero().flatten().tolist()
        for of in ("completion", "prompt", "all")
    }
    assert on == {"completion": [5, 6], "prompt": [1, 2], "all": [1, 2]}
    assert sw.When.tokens(2, of="prompt").holds(positions, 4).nonzero().flatten().tolist() == [2, 3]
