"""The explorer with conditional steering, as a new user meets it: a conditional run ends
without an error and is explained like any other, and the heatmap menu names the feature
its colours show after rows come and go. ``ex.error`` is read after every run."""

from __future__ import annotations

import steer_widgets as sw
from steer_widgets.widgets import Explorer

SOURCE = "10-smollm2-res-4k"


def _done(ex: Explorer) -> None:
    assert ex.wait(120), ex.status
    assert ex.error == "", ex.error


def test_a_conditional_run_ends_without_error_and_explains(engine):
    ex = Explorer(engine, prompt="I think that", n_completion_tokens=8, temperature=0.0,
                  features=[(SOURCE, 100, 60.0)])  # fmt: skip
    _done(ex)
    plain_changed = list(ex.heatmap.changed)
    assert plain_changed
    ex.set(when=sw.When.tokens(2, 10))
    ex.run()
    _done(ex)
    steered = ex.outputs["STEERED"]
    assert steered.gates is not None and ex.status.startswith("done"), ex.status
    result = engine.result(ex.request_done, ex.outputs)
    want = engine.steering_features(result, SOURCE, len(ex.heatmap.changed))
    assert [r["index"] for r in ex.heatmap.changed] == [f.index for f in want.features]
    assert ex.heatmap.changed != plain_changed  # this run's list, not the last one's
    ex.completions.effect_on = True  # the effect colouring of the conditional run
    _done(ex)
    effects = ex.completions.effects["STEERED"]
    assert effects and ex.error == ""
    table = ex.explain.attribute("STEERED", 5)
    assert table is not None and "error" not in ex.completions.attribution
    ex.close()


def test_the_heatmap_menu_renames_rows_whose_place_did_not_change(engine):
    """✕ on the first of two rows, then a new row: the menu's values (row places) are the
    same as before, but its labels must name the features now in those places."""
    ex = Explorer(engine, prompt="Hi", n_completion_tokens=2, live=False)
    ex.add_feature(SOURCE, 11, 20.0)
    ex.add_feature(SOURCE, 12, 20.0)
    close = [b for b in ex.features_ui.rows[0].box.children if getattr(b, "description", "") == "✕"]
    close[0].click()  # the row's ✕ button, as a user removes it
    assert [label for label, _ in ex.view.heat_feature.options] == [f"{SOURCE} #12"]
    ex.add_feature(SOURCE, 13, 20.0)
    labels = [label for label, _ in ex.view.heat_feature.options]
    assert labels == [f"{SOURCE} #12", f"{SOURCE} #13"], labels
    ex.show_activations(1)
    ex.run()
    _done(ex)
    assert f"#{13}" in ex.heatmap.title, ex.heatmap.title
    ex.close()


def test_a_row_steers_under_its_own_condition_and_a_view_loads_it_back(
    engine, tmp_path, monkeypatch
):
    """Row 0 gated by its own "when" controls, row 1 by a condition set from Python, the
    request's row by a concept: the request carries each, the run is the engine's, and a
    saved view loads every condition back (row-built ones editable, the concept's vector
    as saved, with no model work)."""
    import torch

    made = []

    def concept_vector(name, *args, **kwargs):  # one direction per name, counted
        made.append(name)
        return sw.Vector(torch.randn(576, generator=torch.Generator().manual_seed(1)),
                         "blocks.5.hook_resid_post")  # fmt: skip

    monkeypatch.setattr(engine, "concept_vector", concept_vector)
    ex = Explorer(engine, prompt="My favourite thing to do on a Sunday is",
                  n_completion_tokens=8, temperature=0.0, live=False,
                  features=[(SOURCE, 100, 30.0), (SOURCE, 200, 30.0)])  # fmt: skip
    own = ex.features_ui.condition_of(0)
    with ex.batch():
        own.kind.value = "feature"
        own.what.value = "5-smollm2-res-4k #3187"
        own.threshold.value = 8.0
        ex.condition_row.kind.value = "concept"
        ex.condition_row.what.value = "cooking"
    ex.set_when(1, sw.When.tokens(2))
    ex.run()
    _done(ex)
    req = ex.request()
    assert req.features[0].when == sw.When(sw.Feature("5-smollm2-res-4k", 3187), above=8.0)
    assert req.features[1].when == sw.When.tokens(2) and req.when.on.hook.startswith("blocks.5")
    assert ex.features_ui.rows[0].when_button.description == "when ●"
    alone = engine.steer(req).outputs["STEERED"]
    assert ex.outputs["STEERED"] == alone and ex.outputs["STEERED"].gates == alone.gates
    assert set(alone.gates) == {"features[0]", "features[1]"}
    path = tmp_path / "view.json"
    ex.save_view(path)
    loaded = Explorer.load_view(path, engine)
    _done(loaded)
    rows = loaded.features_ui.rows
    assert (rows[0].condition.kind.value, rows[0].condition.threshold.value) == ("feature", 8.0)
    assert rows[1].condition.kind.value == "custom"
    assert loaded.condition_row.kind.value == "concept" and made == ["cooking"]
    assert loaded.request().to_dict() == req.to_dict()
    assert [list(c.token_ids) for c in loaded.outputs.values()] == [
        list(c.token_ids) for c in ex.outputs.values()
    ]
    loaded.set_when(0, None)  # back to the row's "always"
    assert loaded.request().features[0].when is None
    loaded.set_when(7, sw.When.tokens(1))  # no such row: refused in the status line
    assert "row" in loaded.error
    ex.close()
    loaded.close()
