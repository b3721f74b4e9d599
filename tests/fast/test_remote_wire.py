"""What goes over the wire to an interp-engine server, checked without a server or model."""

from __future__ import annotations

import httpx
import pytest
import torch

from steer_widgets.errors import RemoteUnsupported
from steer_widgets.remote.client import decode_tensor, encode_tensor, retry_after
from steer_widgets.remote.engine import point_of, steering_wire
from steer_widgets.steering.requests import Direction
from steer_widgets.steering.results import final_stop


def test_hook_names_map_to_points_and_the_rest_are_refused():
    assert point_of("blocks.10.hook_resid_post") == ("resid_post", 10)
    assert point_of("blocks.3.attn.hook_z") == ("z", 3)
    assert point_of("blocks.0.hook_resid_pre") == ("resid_pre", 0)
    for hook in ("blocks.2.ln1.hook_normalized", "hook_embed", "blocks.x.hook_resid_post"):
        with pytest.raises(RemoteUnsupported) as info:
            point_of(hook)
        assert info.value.field == "hook"


def test_steering_goes_out_by_point_and_layer_with_exact_vectors():
    v = [torch.randn(576) for _ in range(3)]
    directions = [
        Direction("blocks.5.hook_resid_post", v[0], 2.0),
        Direction("blocks.10.hook_resid_post", v[1], 3.0),
        Direction("blocks.5.hook_resid_post", v[2], -1.0),
    ]
    wire = steering_wire("SIMPLE_ADDITIVE", directions, 2.0)
    assert [w["point"] for w in wire] == ["resid_post"]
    layers = wire[0]["layers"]
    assert [op["scale"] for op in layers["5"]] == [4.0, -2.0] and layers["10"][0]["scale"] == 6.0
    assert torch.equal(decode_tensor(layers["5"][1]["vector"]), v[2])  # bit for bit
    capped = steering_wire("PROJECTION_CAP", [Direction("blocks.2.attn.hook_z", v[0], 5.0)], 1.5)
    op = capped[0]["layers"]["2"][0]
    assert capped[0]["point"] == "z" and op["method"] == "projection_cap" and op["max"] == 7.5
    ortho = steering_wire("ORTHOGONAL_DECOMP", directions[:1], 0.5)
    assert ortho[0]["layers"]["5"][0]["coeff"] == 1.0


def test_tensors_round_trip_and_retry_after_is_bounded():
    t = torch.randn(3, 4)
    assert torch.equal(decode_tensor(encode_tensor(t)), t)
    busy = httpx.Response(503, headers={"Retry-After": "2"})
    assert retry_after(busy) == 2.0
    assert retry_after(httpx.Response(503)) == 1.0  # none given
    assert retry_after(httpx.Response(503, headers={"Retry-After": "9999"})) == 30.0
    assert retry_after(httpx.Response(503, headers={"Retry-After": "soon"})) == 1.0


def test_a_refusal_named_under_a_batch_key_keeps_its_class_and_fields():
    """``steer_batch`` names a bad request by its key; it used to re-raise a plain
    RequestError, so ``except RemoteUnsupported`` missed a batch's refusal."""
    from steer_widgets.analysis.judges import JudgeError
    from steer_widgets.errors import ArgumentError, RequestError

    keyed = RemoteUnsupported("hook", "has no point").under("requests['b']")
    assert type(keyed) is RemoteUnsupported
    assert keyed.field == "requests['b'].hook" and keyed.problem == "has no point"
    assert str(keyed) == "requests['b'].hook: has no point"
    typed = ArgumentError("nope", "is not a field").under("requests[1]")
    assert isinstance(typed, TypeError) and typed.field == "requests[1].nope"
    judged = JudgeError("words", "p0", "returned nan").under("requests['c']")
    assert (judged.judge, judged.prompt, judged.field) == ("words", "p0", "requests['c'].judge")
    assert type(RequestError("seed", "x").under("requests['a']")) is RequestError


def test_a_row_its_producer_ended_is_complete_on_any_last_token():
    """Issue 67 item 8: a server's 'done' line ends a row, possibly on a stop token our
    stop ids lack; only a row nobody said had ended, cut off short, is "cancelled"."""
    stops = {0}
    assert final_stop([5, 6], 3, stops, finished=True) == "eos"  # the server's own stop token
    assert final_stop([5, 0], 3, stops, finished=True) == "eos"
    assert final_stop([5, 6, 7], 3, stops, finished=True) == "length"
    assert final_stop([5, 6], 3, stops) == "cancelled"  # the producer never said: cut off
