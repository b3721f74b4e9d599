"""The explorer's evaluate panel: fills as rows finish, says its true state, a strength click
sets the sliders, and chart and grid are saved widget state (what a static export shows)."""

from __future__ import annotations

import threading

import pytest
from ipywidgets.embed import embed_data

import steer_widgets as sw

PROMPTS = ["I went to the", [{"role": "user", "content": "What should I cook tonight?"}]]


@pytest.fixture(scope="module")
def ocean(engine):
    return engine.concept_vector("ocean")


@pytest.fixture
def ex(engine, ocean):
    explorer = sw.Explorer(engine, live=False, prompt="I went to the")
    explorer.add_concept("ocean", ocean)
    return explorer


def test_panel_fills_as_rows_finish_and_matches_the_engine(engine, ex, ocean):
    panel = ex.view.evaluation
    seen: list[int] = []
    panel.observe(lambda change: seen.append(change["new"]), names="done_rows")
    assert ex.evaluate(PROMPTS, strengths=(0, 1, 2))
    assert ex.wait_evaluation(300)
    assert panel.state == "done", (panel.state, panel.error)
    assert seen[-1] == panel.total_rows == 6
    assert 3 in seen  # the first prompt's rows were drawn before the second prompt ran
    drawn = [[c["text"] for c in row["cells"]] for row in panel.grid]
    direct = engine.evaluate(
        {"ocean": sw.SteerRequest("", vectors=[ocean], prompt_multiplier=2.0)},
        PROMPTS, (0, 1, 2), ["ocean"], progress=False,
    )  # fmt: skip
    by_cell = {(r.prompt_index, r.strength): r.text for r in direct.rows}
    assert drawn == [[by_cell[i, m] for m in (0, 1, 2)] for i in range(2)]
    assert [c["success"] for c in panel.grid[0]["cells"]] == [
        next(r.success for r in direct.rows if (r.prompt_index, r.strength) == (0, m))
        for m in (0, 1, 2)
    ]
    assert panel.svg.count('class="sw-point"') == 3 and "current x1" in panel.svg


def test_strength_click_sets_sliders_and_moves_the_mark(ex, ocean):
    assert ex.evaluate(PROMPTS[:1], strengths=(0.5, 1))
    assert ex.wait_evaluation(300)
    panel = ex.view.evaluation
    panel._message(panel, {"event": "pick", "strength": 0.5}, [])  # what a click sends
    assert ex.features_ui.rows[0].slider.value == pytest.approx(0.5 * ocean.strength)
    assert "current x0.5" in panel.svg
    ex.set_strength(0, 123.0)  # moved apart from the ladder: no mark
    assert "current x" not in panel.svg


def test_saved_widget_state_holds_chart_and_grid(ex):
    assert ex.evaluate(PROMPTS[:1], strengths=(1,))
    assert ex.wait_evaluation(300)
    state = embed_data(views=[ex.ui], drop_defaults=False)["manager_state"]["state"]
    saved = state[ex.view.evaluation.model_id]["state"]
    assert saved["svg"].startswith("<svg") and saved["grid"][0]["cells"][0]["text"]
    assert saved["state"] == "done" and saved["done_rows"] == 1


def test_stop_replace_and_errors_leave_the_explorer_usable(ex, engine):
    panel = ex.view.evaluation
    states: list[str] = []
    panel.observe(lambda change: states.append(change["new"]), names="state")
    first_rows = threading.Event()
    panel.observe(lambda change: change["new"] and first_rows.set(), names="done_rows")
    assert ex.evaluate(PROMPTS * 3, strengths=(0, 1))
    assert first_rows.wait(120)
    assert ex.evaluate(PROMPTS, strengths=(1,))  # a newer evaluation replaces the running one
    assert "replaced" in states
    ex.stop_evaluation()
    assert ex.wait_evaluation(300)
    assert panel.state in ("stopped", "done")
    assert not ex.evaluate(strengths=(1, 1))  # refused before anything runs
    assert panel.state == "error" and "strengths[1]" in panel.error

    def broken(text):
        raise ValueError("no")

    assert ex.evaluate(PROMPTS, strengths=(1,), judge=broken)
    assert ex.wait_evaluation(300)
    assert panel.state == "error" and "broken" in panel.error
    ex.set(temperature=0, n_completion_tokens=4)
    ex.run()
    assert ex.wait(120) and ex.outputs["STEERED"].token_ids
    nothing = sw.Explorer(engine, live=False)
    assert not nothing.evaluate() and "pick a feature" in nothing.view.evaluation.error
