"""Plans: one row per output, labels and multipliers carried as data, sweeps checked."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

import steer_widgets as sw
from steer_widgets.sae.store import SAEStore
from steer_widgets.steering.requests import (
    Direction,
    build_plan,
    output_multipliers,
    resolve_directions,
    sweep_label,
)
from steer_widgets.steering.results import Completion, SteerResult

HOOK = "blocks.0.hook_resid_post"
REQ = sw.SteerRequest("hi", features=[sw.Feature("s", 0, 2.0)], strength_multiplier=1.5)
DIRS = [Direction(HOOK, torch.ones(8), 2.0, "features[0]")]


def test_rows_carry_label_and_multiplier():
    plan = build_plan(REQ.with_(sweep=(-2, 0.25)), DIRS, [True, False])
    assert plan.labels == ["DEFAULT", "STEERED", "STEERED*-2", "STEERED*0.25"]
    assert [o.multiplier for o in plan.outputs] == [None, 1.5, -2.0, 0.25]
    assert plan.outputs[0].row.ops == {} and all(HOOK in r.ops for r in plan.rows[1:])
    x = torch.zeros(1, 1, 8)
    for out in plan.outputs[1:]:  # the multiplier in the data is the one in the maths
        torch.testing.assert_close(out.row.ops[HOOK](x, 5), x + 2.0 * out.multiplier)


def test_types_choose_rows():
    assert build_plan(REQ.with_(types=("STEERED",)), DIRS, [False]).labels == ["STEERED"]
    assert build_plan(REQ.with_(types=("DEFAULT",)), [], [False]).labels == ["DEFAULT"]


def test_sweep_labels_are_distinct_for_distinct_values():
    close = (1.0, 1.0000001, 1.0000002, -0.5, 1e-9, 2)
    labels = [sweep_label(m) for m in close]
    assert len(set(labels)) == len(close)
    assert sweep_label(-2) == "STEERED*-2" and sweep_label(0.5) == "STEERED*0.5"
    assert list(output_multipliers(REQ.with_(sweep=close)).values())[2:] == [
        float(m) for m in close
    ]


def test_result_frame_reads_multipliers_as_data():
    request = REQ.with_(sweep=(1.0000001,))
    outputs = {k: Completion("x", (1, 2), "length") for k in output_multipliers(request)}
    frame = SteerResult(request, outputs, (1,), "m").to_frame()
    assert frame["strength_multiplier"].tolist()[1:] == [1.5, 1.0000001]
    assert frame["type"].tolist()[0] == "DEFAULT"


def test_record_round_trip():
    vec = sw.Vector(torch.linspace(-1, 1, 8), HOOK, 3.0)
    request = REQ.with_(
        prompt=[{"role": "user", "content": "hi"}], vectors=[vec], sweep=(2.0,), seed=2**63
    )
    outputs = {"DEFAULT": Completion("a", (5,), "eos"), "STEERED": Completion("b", (6,), "length")}
    record = json.loads(json.dumps(SteerResult(request, outputs, (1, 2), "m").to_dict()))
    back = sw.SteerRequest.from_dict(record["request"])
    assert back.to_dict() == request.to_dict()
    assert torch.equal(back.vectors[0].vector, vec.vector) and back.sweep == (2.0,)
    assert record["outputs"]["STEERED"] == {"text": "b", "token_ids": [6], "stop": "length"}
    assert record["versions"]["steer_widgets"] == sw.__version__


def tiny_sae(folder, w_dec):
    """A real SAE Lens folder (standard architecture) with the given decoder rows."""
    folder.mkdir()
    d_sae, d_in = w_dec.shape
    cfg = {
        "d_in": d_in,
        "d_sae": d_sae,
        "architecture": "standard",
        "metadata": {"hook_name": HOOK},
    }
    (folder / "cfg.json").write_text(json.dumps(cfg))
    tensors = {
        "W_enc": torch.zeros(d_in, d_sae), "b_enc": torch.zeros(d_sae),
        "W_dec": w_dec, "b_dec": torch.zeros(d_in),
    }  # fmt: skip
    safetensors.torch.save_file(tensors, folder / "sae_weights.safetensors")
    return folder


def test_zero_norm_feature_row_names_the_feature(tmp_path):
    w_dec = torch.eye(4, 8)
    w_dec[2] = 0
    store = SAEStore({HOOK: 8})
    source = store.add(tiny_sae(tmp_path / "tiny", w_dec), "tiny")
    feats = [sw.Feature(source, 1, 1.0), sw.Feature(source, 2, 1.0)]
    ok = resolve_directions(
        REQ.with_(features=feats[:1], normalize_steering=True), store, {HOOK: 8}
    )
    assert ok[0].field == "features[0]" and torch.equal(ok[0].vector, w_dec[1])
    for changes in ({"normalize_steering": True}, {"steer_method": "PROJECTION_CAP"}):
        request = REQ.with_(features=[feats[1]] if "steer_method" in changes else feats)
        request = request.with_(**changes)
        with pytest.raises(sw.RequestError) as info:
            build_plan(request, resolve_directions(request, store, {HOOK: 8}), [False])
        want = "features[0]" if "steer_method" in changes else "features[1]"
        assert info.value.field == want and "zero" in info.value.problem
    with pytest.raises(sw.RequestError) as info:
        resolve_directions(REQ.with_(features=[sw.Feature(source, 9, 1.0)]), store, {HOOK: 8})
    assert info.value.field == "features[0]" and "out of range" in str(info.value)
