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
