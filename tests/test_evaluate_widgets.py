"""The explorer's evaluate panel: fills as rows finish, says its true state, a strength click
sets the sliders, and chart and grid are saved widget state (what a static export shows)."""

from __future__ import annotations

import threading

import pytest
from ipywidgets.embed import embed_data

import steer_widgets as sw
from steer_widgets.widgets.evaluate_panel import EvaluatePanel

PROMPTS = ["I went to the", [{"role": "user", "content": "What should I cook tonight?"}]]


def has_running(grid: list) -> bool:
    """Whether a drawn grid shows the text of a row still decoding."""
    return any(c and c.get("running") for row in grid for c in row["cells"])


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
    running: list[bool] = []  # per grid drawn: whether it showed a row still decoding
    panel.observe(lambda change: running.append(has_running(change["new"])), names="grid")
    assert ex.evaluate(PROMPTS, strengths=(0, 1, 2))
    assert ex.wait_evaluation(300)
    assert panel.state == "done", (panel.state, panel.error)
    assert seen == sorted(seen) and seen[-1] == panel.total_rows == 6
    assert any(running) and not running[-1]  # texts drawn while decoding, then the finished grid
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
    first_rows = threading.Event()  # the first texts drawn, rows still decoding
    panel.observe(lambda change: has_running(change["new"]) and first_rows.set(), names="grid")
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


# Input given from Python goes to the evaluation as given; the boxes only show it.
MULTILINE = "Dear Sir,\nI went to the"
CHAT = [
    {"role": "system", "content": "You answer in one sentence."},
    {"role": "user", "content": "What should I cook tonight?"},
]


def evaluated(ex, prompts, strengths=(1,)):
    """The finished evaluation of ``prompts`` x ``strengths`` (one row each: fast)."""
    assert ex.evaluate(prompts, strengths=strengths)
    assert ex.wait_evaluation(300)
    assert ex.view.evaluation.state == "done", ex.view.evaluation.error
    return ex.evaluation


def test_a_multi_line_prompt_from_python_stays_one_prompt(ex):
    evaluation = evaluated(ex, [MULTILINE])
    assert evaluation.prompts == [MULTILINE] and len(evaluation.rows) == 1
    panel = ex.view.evaluation
    assert len(panel.prompts_text.splitlines()) == 1 and "Dear Sir," in panel.prompts_text
    assert panel.prompts() == [MULTILINE]  # what the evaluate button runs next


def test_a_chat_from_python_keeps_every_message(ex):
    evaluation = evaluated(ex, [CHAT])
    assert evaluation.prompts == [CHAT]
    panel = ex.view.evaluation
    assert "one sentence" in panel.prompts_text and "cook tonight" in panel.prompts_text
    assert panel.prompts() == [CHAT]


def test_strengths_from_python_are_exact(ex, ocean):
    evaluation = evaluated(ex, PROMPTS[:1], strengths=(1.23456789,))
    assert evaluation.strengths == (1.23456789,)
    assert [r.strength for r in evaluation.rows] == [1.23456789]
    panel = ex.view.evaluation
    assert panel.strengths == [1.23456789] and panel.ladder() == [1.23456789]
    assert panel.ladder_text == "1.23456789"
    panel._message(panel, {"event": "pick", "strength": 1.23456789}, [])  # a grid click
    assert ex.features_ui.rows[0].slider.value == pytest.approx(1.23456789 * ocean.strength)


def test_box_edits_are_read_back_and_lines_left_alone_stay_as_given():
    panel = EvaluatePanel()
    panel.set_inputs((MULTILINE, CHAT), (0, 1.23456789))
    assert panel.prompts() == [MULTILINE, CHAT] and panel.ladder() == [0, 1.23456789]
    edit = {"prompts_text": panel.prompts_text + "\nchat: Tell me a story.", "ladder_text": "0 2.5"}
    panel.set_state(edit)  # what an edit in the front end does
    told = [{"role": "user", "content": "Tell me a story."}]
    assert panel.prompts() == [MULTILINE, CHAT, told] and panel.ladder() == [0.0, 2.5]
    panel.set_state({"ladder_text": "0, x"})
    with pytest.raises(sw.RequestError, match="strengths"):
        panel.ladder()


def test_a_refused_evaluation_leaves_the_running_one_running(ex):
    panel = ex.view.evaluation
    states: list[str] = []
    panel.observe(lambda change: states.append(change["new"]), names="state")
    release = threading.Event()

    def gate(text):  # holds the first evaluation open until the refused one was tried
        release.wait(30)
        return "ocean" in text

    try:
        assert ex.evaluate(PROMPTS[:1], strengths=(0, 1), judge=gate)
        assert not ex.evaluate([MULTILINE], strengths=(1, 1))
        assert panel.state == "running" and "strengths[1]" in panel.error
        assert not ex.evaluate([MULTILINE, 7], strengths=(1,))
        assert panel.state == "running" and "prompts[1]" in panel.error
        assert panel.prompts() == PROMPTS[:1] and panel.ladder() == [0, 1]  # boxes kept
    finally:
        release.set()
    assert ex.wait_evaluation(300)
    assert states == ["running", "done"], (states, panel.error)
    assert ex.evaluation.complete and ex.evaluation.prompts == PROMPTS[:1]
    assert ex.evaluation.strengths == (0.0, 1.0) and len(ex.evaluation.rows) == 2
    assert panel.done_rows == 2 and not panel.error
