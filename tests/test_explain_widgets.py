"""Why the text changed, in the explorer: effect colouring, a clicked token's attribution,
"what changed" beside the heatmap and concept heatmaps, all in the saved widget state."""

from __future__ import annotations

import json

import pytest

from steer_widgets.widgets import Explorer

SOURCE = "12-smollm2-res-4k"
TOKENS = 10


@pytest.fixture(scope="module")
def ex(engine):
    explorer = Explorer(engine, features=[(SOURCE, 100)], n_completion_tokens=TOKENS, temperature=0)
    assert explorer.wait(120), explorer.status
    return explorer


def _state(widget) -> dict:
    return widget.get_state()


def test_effect_colouring_toggles_and_lands_in_the_state(engine, ex):
    panes = ex.completions
    assert panes.effects == {}  # off: nothing computed
    panes.effect_on = True
    steered = panes.effects["STEERED"]
    assert len(steered["effect"]) == len(ex.outputs["STEERED"].token_ids)
    effect = engine.steering_effect(ex._result())
    assert steered["effect"] == [round(x, 4) for x in effect.effect]
    top = max(range(len(steered["effect"])), key=steered["effect"].__getitem__)
    line = panes.effect_text("STEERED", top)
    assert line == effect.describe(top)
    assert line.startswith(("steering raised this token from ", "steering lowered"))
    state = _state(panes)
    assert state["effect_on"] is True and state["effects"]["STEERED"] == steered
    panes.effect_on = False
    assert _state(panes)["effect_on"] is False


def test_clicking_a_token_opens_its_attribution(engine, ex):
    panes = ex.completions
    panes.select("STEERED", 2)
    att = panes.attribution
    assert att["label"] == "STEERED" and att["position"] == 2
    assert att["token"] == panes.pane("STEERED")["tokens"][2]
    assert [r["name"] for r in att["rows"]] == [f"{SOURCE} #100"]
    assert att["features"] and all("attribution" in f for f in att["features"])
    direct = engine.attribute(ex._result(), "STEERED", 2, n=8)
    assert att["gain"] == pytest.approx(direct.gain, abs=1e-6)
    state = _state(panes)
    assert state["selected"] == {"label": "STEERED", "position": 2}
    assert state["attribution"]["token"] == att["token"]
    json.dumps(state["attribution"])  # JSON-able: it travels to the browser


def test_a_feature_in_the_table_opens_its_card_or_steers(engine, ex):
    ex.completions.select("STEERED", 1)
    feature = ex.completions.attribution["features"][0]
    source, index = feature["source"], feature["index"]
    ex.completions.act("card", source, index)
    assert f"#{index}" in ex.picker.card.body.value
    before = len(ex.features)
    ex.completions.act("steer", source, index)
    assert ex.wait(120), ex.status
    assert len(ex.features) == before + 1 and ex.features[-1].index == index
    ex.remove_feature(len(ex.features) - 1)
    assert ex.wait(120), ex.status


def test_a_bad_click_shows_the_error_in_the_table(ex):
    ex.completions.select("STEERED", 999)
    assert "position" in ex.completions.attribution["error"]


def test_what_changed_lists_features_and_opens_their_heatmap(engine, ex):
    heat = ex.heatmap
    rows = heat.changed
    assert rows and rows[0]["source"] == SOURCE and rows[0]["index"] == 100
    assert "what changed" in heat.changed_title
    direct = engine.steering_features(ex._result(), SOURCE, len(rows))
    assert [r["index"] for r in rows] == [f.index for f in direct.features]
    other = rows[1]
    heat.pick(other["source"], other["index"])
    assert ex.wait(60)
    assert heat.title == f"activation of {SOURCE} #{other['index']}"
    assert _state(heat)["changed"] == rows
    assert _state(heat)["picked"] == {"source": SOURCE, "index": other["index"]}


def test_a_concept_row_can_be_picked_for_the_heatmap(engine):
    vector = engine.concept_vector(["I love the sea and the waves.", "Sailing on the ocean."])
    explorer = Explorer(engine, n_completion_tokens=6, temperature=0, live=False)
    explorer.add_concept("ocean", vector)
    menu = explorer.view.heat_feature
    assert ("concept ocean", ("concept", 0)) in list(menu.options)
    menu.value = ("concept", 0)
    explorer.run()
    assert explorer.wait(120), explorer.status
    heat = explorer.heatmap
    assert heat.title.startswith("projection on concept ocean")
    from steer_widgets.analysis.projection import projection

    text, values = projection(
        engine, explorer.request().prompt, explorer.outputs["STEERED"], vector
    )
    assert heat.rows[-1]["values"] == [round(v, 4) for v in values[-len(heat.rows[-1]["values"]) :]]
