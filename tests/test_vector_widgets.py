"""The explorer's vector file controls: save the steering as vectors, load a multi-layer
vector as one row with one slider, and both through saved views and refusals."""

from __future__ import annotations

import pytest
import torch
from disk_full import fill_disk_halfway

import steer_widgets as sw
from steer_widgets.widgets import Explorer

HOOKS = ("blocks.3.hook_resid_post", "blocks.6.hook_resid_post", "blocks.9.hook_resid_post")


def make(engine) -> Explorer:
    return Explorer(engine, live=False, n_completion_tokens=4, temperature=0.0, seed=1)


def layers(engine) -> list[sw.Vector]:
    width = engine.model.runtime.cfg.d_model
    g = torch.Generator().manual_seed(3)
    return [sw.Vector(torch.randn(width, generator=g), h, 1.0) for h in HOOKS]


def test_save_vectors_writes_what_the_steering_adds(engine, sources, tmp_path):
    ex = make(engine)
    ex.add_feature(sources[0], 11, 5.0)
    with pytest.warns(sw.VectorWarning, match="prompt_multiplier"):  # the explorer's default
        path = ex.save_vectors(tmp_path / "mine.gguf")
    assert path is not None and path.exists() and ex.error == ""
    (back,) = sw.load_vectors(path, model=engine)
    (want,) = engine.vectors(ex.request())
    assert back.hook == want.hook
    assert torch.equal(float(back.strength) * back.vector, float(want.strength) * want.vector)


def test_a_multi_layer_file_is_one_row_with_one_slider(engine, tmp_path):
    path = sw.save_vectors(layers(engine), tmp_path / "three.gguf", model=engine)
    ex = make(engine)
    assert ex.load_vectors(path) == 0 and len(ex.features_ui.rows) == 1
    ex.set_strength(0, 2.5)
    got = ex.request().vectors
    assert [v.hook for v in got] == list(HOOKS) and {v.strength for v in got} == {2.5}
    by_hand = [sw.Vector(v.vector, v.hook, 2.5) for v in layers(engine)]
    request = ex.request()
    steered = engine.steer(request).outputs["STEERED"].token_ids
    assert engine.steer(request.with_(vectors=by_hand)).outputs["STEERED"].token_ids == steered
    view = tmp_path / "view.json"
    ex.save_view(view)
    again = Explorer.load_view(view, engine=engine, live=False)
    assert len(again.features_ui.rows) == 1
    assert again.request().to_dict() == request.to_dict()


def test_unequal_strengths_start_the_slider_at_one(engine, tmp_path):
    mixed = [
        sw.Vector(v.vector, v.hook, s)
        for v, s in zip(layers(engine), (1.0, -2.0, 4.0), strict=True)
    ]
    ex = make(engine)
    ex.add_vectors("mixed", mixed)
    got = ex.request().vectors
    assert {v.strength for v in got} == {1.0}
    for a, b in zip(got, mixed, strict=True):
        assert torch.equal(a.vector, float(b.strength) * b.vector)


def test_vector_controls_refuse_in_the_status_line(engine, sources, tmp_path):
    ex = make(engine)
    assert ex.load_vectors(tmp_path / "missing.gguf") == -1 and "no such file" in ex.error
    ex.add_feature(sources[0], 11, 5.0)
    ex.view.vector_path.value = "~nosuchuser-steer-widgets/v.gguf"  # expanduser's RuntimeError
    ex.view.load_vectors_button.click()
    assert "~nosuchuser" in ex.error and "no such file" in ex.error
    ex.view.save_vectors_button.click()  # refused before any VectorWarning
    assert "~nosuchuser" in ex.error and "not a usable path" in ex.error
    ex.set(steer_method="PROJECTION_CAP")
    assert ex.save_vectors(tmp_path / "v.gguf") is None and "steer_method" in ex.error
    assert not (tmp_path / "v.gguf").exists()
    wide = sw.save_vectors([sw.Vector(torch.ones(7), HOOKS[0])], tmp_path / "w.gguf")
    assert ex.load_vectors(wide) == -1 and "7 wide" in ex.error
    assert len(ex.features_ui.rows) == 1


def test_a_view_cut_short_is_named_and_leaves_the_old_one(engine, tmp_path, monkeypatch):
    """A full disk part way through a saved view: a ``RequestError`` naming the path, and the
    view saved before keeps its bytes (it was truncated and left half written)."""

    ex = make(engine)
    path = tmp_path / "view.json"
    ex.save_view(path)
    before = path.read_bytes()
    ex.set(prompt="Another prompt")

    fill_disk_halfway(monkeypatch)
    with pytest.raises(sw.RequestError, match="No space left") as err:
        ex.save_view(path)
    assert err.value.field == "path" and str(path) in str(err.value)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["view.json"]
