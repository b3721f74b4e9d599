"""Public API that no other test covers: cancel_all, remove_feature (and the heatmap menu
after it), last_traceback, SAEs given as a list of folders, and load_model's backends."""

from __future__ import annotations

import threading

import pytest
import torch

import steer_widgets as sw
from steer_widgets.widgets import Explorer


def test_cancel_all_stops_every_running_generation(engine, sources):
    request = sw.SteerRequest("Once upon a time", types=("DEFAULT",), n_completion_tokens=200)
    first_frames = [threading.Event(), threading.Event()]
    results: dict[int, sw.Frame] = {}

    def run(i: int) -> None:
        for frame in engine.steer_stream(request.with_(seed=i)):
            first_frames[i].set()
            results[i] = frame

    engine.clear_caches()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    assert first_frames[0].wait(120)  # one decodes, the other waits for the engine's lock
    engine.cancel_all()
    threads[0].join(120)
    assert not threads[0].is_alive()
    assert results[0].done and results[0].outputs["DEFAULT"].stop == "cancelled"
    assert results[0].step < 200
    engine.cancel_all()  # the second one, once it started
    threads[1].join(300)
    assert not threads[1].is_alive() and results[1].done
    # nothing cancelled is remembered: the same request runs again to its end
    done = engine.steer(request.with_(n_completion_tokens=3, seed=0)).outputs["DEFAULT"]
    assert done.stop in ("eos", "length") and len(done.token_ids) >= 1


def test_remove_feature_drops_its_row_and_the_heatmap_menu_follows(engine, sources):
    ex = Explorer(engine, live=False, n_completion_tokens=2)
    for index in (3, 7, 11):
        assert ex.add_feature(sources[0], index, 5.0) >= 0
    ex.show_activations(2)
    assert ex.view.heat_feature.value == 2
    ex.remove_feature(1)
    assert [f.index for f in ex.features] == [3, 11]
    options = list(ex.view.heat_feature.options)
    assert options == [(f"{sources[0]} #3", 0), (f"{sources[0]} #11", 1)]
    assert ex.view.heat_feature.value in (0, 1)
    ex.remove_feature(5)  # no such row: refused in the status line, nothing removed
    assert "row" in ex.error and len(ex.features) == 2
    ex.remove_feature(0)
    ex.remove_feature(0)
    assert ex.features == [] and list(ex.view.heat_feature.options) == []


class _Broken(sw.Engine):
    """An engine whose generation fails with a bug (not a named error)."""

    def steer_stream(self, request, cancel=None):
        raise ZeroDivisionError("planted")


def test_last_traceback_keeps_an_unexpected_failure(engine):
    broken = _Broken(engine.model, saes=[])
    ex = Explorer(broken, live=False, n_completion_tokens=2)
    assert ex.last_traceback == ""
    ex.run()
    assert ex.wait(60)
    assert "ZeroDivisionError: planted" in ex.last_traceback
    assert "ZeroDivisionError" in ex.error and ex.status_line.state == "error"


def test_saes_as_a_list_of_folders(engine, sources):
    folders = [engine.saes.config(s).folder for s in sources[:2]]
    mine = sw.Engine(engine.model, saes=folders)
    assert mine.saes.sources() == sources[:2]
    got = mine.activations("I think that", sources[1], 11).values
    assert got == engine.activations("I think that", sources[1], 11).values
    with pytest.raises(sw.RequestError, match=r"saes\[0\]"):
        sw.Engine(engine.model, saes=[None])


def test_a_bad_backend_is_a_named_error_before_any_load():
    with pytest.raises(sw.RequestError) as err:
        sw.load_model(backend="tensorflow")
    assert err.value.field == "backend"


def test_the_transformer_lens_backend_loads_the_default_model(engine):
    tl = sw.load_model(backend="transformer_lens")
    assert type(tl.runtime).__name__ == "TransformerLensRuntime"
    assert "blocks.10.hook_resid_post" in tl.runtime.hook_names
    ids = torch.tensor([engine.text("The ocean is").ids])
    fast, slow = engine.model.runtime.forward(ids)[0, -1], tl.runtime.forward(ids)[0, -1]
    assert int(fast.argmax()) == int(slow.argmax())
    assert float((fast - slow).abs().max()) < 1e-3
