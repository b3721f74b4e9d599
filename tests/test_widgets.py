"""The explorer driven from Python, on the real default model: no browser needed.

Each test moves controls the way a user would (pick a feature, move a slider) and checks
what the panes show, what the engine was asked to do, and that errors stay in the widget.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

import steer_widgets as sw
from steer_widgets.widgets import Explorer, Runner

TOKENS = 10


@pytest.fixture(scope="module")
def source(engine) -> str:
    """The engine's first SAE (``SW_DEV_SAE=folder`` registers one while SAEs are training)."""
    if not engine.saes.sources() and os.environ.get("SW_DEV_SAE"):
        engine.saes.add(os.environ["SW_DEV_SAE"], "10-dev")
    if not engine.saes.sources():
        pytest.skip("the default engine has no SAEs yet (steer_widgets/data/saes/ not trained)")
    return engine.saes.sources()[0]


def make(engine, **kw) -> Explorer:
    kw.setdefault("n_completion_tokens", TOKENS)
    ex = Explorer(engine, **kw)
    assert ex.wait(120), ex.status
    return ex


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_pick_feature_move_slider_steered_changes_default_does_not_regenerate(engine, source):
    ex = make(engine, prompt="My favourite food is", seed=3)
    assert list(ex.outputs) == ["DEFAULT"] and ex.default_generations == 1
    assert ex.completions.pane("STEERED")["note"]  # "pick a feature to steer"
    default = ex.outputs["DEFAULT"]

    # pick through the picker: index search, then the result's "+" button
    infos = ex.picker.search("7")
    assert [i.index for i in infos] == [7]
    add_button = ex.picker.results.children[0].children[0]
    add_button.click()
    strength = engine.default_strength(source)  # a fraction of the hook's typical norm
    assert ex.features == [sw.Feature(source, 7, strength)]
    slider = ex.features_ui.rows[0].slider
    norm = engine.typical_norm(engine.saes.config(source).hook_name)
    assert 0 < strength < norm and slider.max == pytest.approx(2 * norm) == -slider.min
    assert ex.wait(120), ex.status
    assert set(ex.outputs) == {"DEFAULT", "STEERED"}

    # strength 0 adds nothing: STEERED is the DEFAULT text, no divergence marked
    ex.set_strength(0, 0.0)
    assert ex.wait(120), ex.status
    assert ex.outputs["STEERED"].token_ids == default.token_ids
    assert ex.completions.pane("STEERED")["diverge"] == -1
    before_generations, before_text = ex.default_generations, ex.completions.text("STEERED")

    ex.set_strength(0, 250.0)
    assert ex.wait(120), ex.status
    steered = ex.outputs["STEERED"]
    assert steered.token_ids != default.token_ids
    assert ex.completions.text("STEERED") != before_text
    assert ex.completions.text("STEERED") == "".join(
        engine.text("My favourite food is", steered).tokens[-len(steered.token_ids) :]
    )
    # the default pane kept its text and was not decoded again
    assert ex.outputs["DEFAULT"] == default
    assert ex.default_generations == before_generations == 1
    assert ex.last_run["default_cached"]
    diverge = ex.completions.pane("STEERED")["diverge"]
    assert diverge == next(
        i
        for i, (a, b) in enumerate(zip(steered.token_ids, default.token_ids, strict=False))
        if a != b
    )
    assert ex.completions.pane("DEFAULT")["diverge"] == -1  # only steered panes mark a split
    assert "done" in ex.status and not ex.error


LONG = 2000  # tokens: a run no test waits out


def long_run(ex, strength: float) -> None:
    """One change (feature 0's strength) that starts a run far longer than any test waits
    (2,000 tokens), so the next change always finds it going: counts, not clocks (16 tokens
    took 0.05 s on a fast machine, less than the debounce of the change meant to cancel
    them)."""
    with ex.batch():
        ex.set(n_completion_tokens=LONG)
        ex.set_strength(0, strength)


def test_second_change_cancels_first_and_record_replays(engine, source):
    ex = make(engine, features=[(source, 3, 60.0)], n_completion_tokens=16, seed=5)
    runs = ex.runner.started
    long_run(ex, 120.0)  # a lone change starts at once; the next one must cancel it
    wait_for(lambda: ex.runner.started > runs and ex.last_run.get("first_frame_at"))
    first = ex.last_run
    assert first["request"].features[0].strength == 120.0
    with ex.batch():
        ex.set_strength(0, -120.0)
        ex.set(n_completion_tokens=16)
    assert ex.wait(120), ex.status
    assert first["cancelled"] and first["request"].features[0].strength == 120.0
    assert first["outputs"]["STEERED"].stop == "cancelled"
    final = ex.history[-1]
    assert not final["cancelled"] and final["request"].features[0].strength == -120.0
    assert len(ex.outputs["STEERED"].token_ids) == 16

    record = ex.record()
    assert record["request"]["features"][0]["strength"] == -120.0
    replay = engine.steer(record)
    for label, completion in ex.outputs.items():
        assert replay.outputs[label].token_ids == completion.token_ids


# Counts, not clocks: how long the debounce waits is measured in benchmarks/widget_latency.
def _counting_runner(**kw) -> tuple[Runner, list[int], list[int]]:
    """A runner whose job records how many changes had been scheduled when it ran."""
    changes, seen = [0], []
    runner = Runner(lambda cancel: seen.append(changes[0]), **kw)
    return runner, changes, seen


def _burst(runner: Runner, changes: list[int], n: int = 5) -> None:
    for _ in range(n):
        changes[0] += 1
        runner.schedule()


def test_debounce_collapses_a_burst_into_one_run():
    runner, changes, seen = _counting_runner(debounce_s=0.2, leading=False)
    _burst(runner, changes)
    assert runner.wait(30)
    assert runner.started == 1 and seen == [5]  # one run, after the last change


def test_leading_edge_starts_a_lone_change_at_once_and_a_burst_once_more():
    lone, changes, seen = _counting_runner(debounce_s=600)
    lone.schedule()
    assert lone.wait(60) and lone.started == 1  # a trailing run would wait 600 s
    burst, changes, seen = _counting_runner(debounce_s=0.2)
    _burst(burst, changes)
    assert burst.wait(30)
    # the leading run (unless the next change superseded it first) and one trailing run
    assert 1 <= burst.started <= 2 and seen[-1] == 5


def test_errors_show_in_status_and_explorer_stays_usable(engine, source):
    ex = make(engine, features=[(source, 1, 30.0)], temperature=0.0)
    d_sae = engine.saes.config(source).d_sae
    assert ex.add_feature(source, d_sae + 5) == -1
    assert "out of range" in ex.status and str(d_sae + 5) in ex.status
    assert "out of range" in ex.status_line.error
    assert ex.add_feature("no-such-sae", 1) == -1
    assert "no-such-sae" in ex.status

    shown = ex.completions.text("STEERED")
    ex.set(prompt="")
    assert ex.wait(120)
    assert "prompt" in ex.error and "empty" in ex.error
    # the error replaces the run's state (no "generating"/"loading" line left on top of it)
    assert ex.status_line.state == "error" and not ex.status_line.message
    # the panes keep the previous run's text and say so
    assert ex.completions.text("STEERED") == shown and "last good run" in ex.completions.stale

    ex.set(prompt="The weather today")
    assert ex.wait(120), ex.status
    assert not ex.error and ex.outputs["DEFAULT"].token_ids
    assert ex.request_done.prompt == "The weather today"
    assert ex.completions.stale == "" and ex.status_line.state == "done"


def test_sweep_view_and_frame(engine, source):
    # x1 repeats STEERED itself (multiplier 1): it is not a row of its own
    ex = make(engine, features=[(source, 2, 50.0)], sweep=(-1, 1, 2, 2), n_completion_tokens=6)
    labels = ["DEFAULT", "STEERED", "STEERED*-1", "STEERED*2"]
    assert list(ex.outputs) == labels
    assert [p["label"] for p in ex.completions.panes] == labels
    frame = ex.sweep_frame()
    assert list(frame["type"]) == labels
    assert list(frame["strength_multiplier"])[1:] == [1.0, -1.0, 2.0]
    replay = engine.steer(ex.record())
    assert replay.outputs["STEERED*2"].token_ids == ex.outputs["STEERED*2"].token_ids


def test_heatmap_matches_engine_and_recolors_without_regenerating(engine, source):
    ex = make(engine, features=[(source, 4, 40.0), (source, 5, 40.0)], chat=True)
    req = ex.request_done
    rows = {r["label"]: r for r in ex.heatmap.rows}
    assert list(rows) == ["prompt", "DEFAULT", "STEERED"]
    want = engine.activations(req.prompt, source, 4, ex.outputs["STEERED"])
    n = len(ex.outputs["STEERED"].token_ids)
    assert rows["STEERED"]["tokens"] == list(want.tokens[-n:])
    assert rows["STEERED"]["values"] == pytest.approx(want.values[-n:], abs=1e-3)
    assert rows["prompt"]["special"][0]  # chat scaffolding is marked special
    info = ex.heatmap.token_info(2, 0)
    assert len(info["top"]) == 5 and info["token"] == rows["STEERED"]["tokens"][0]

    runs, generations = ex.runner.started, ex.default_generations
    ex.show_activations(1)
    assert ex.wait(60)
    assert ex.heatmap.title.endswith(f"#{5}")
    want5 = engine.activations(req.prompt, source, 5, ex.outputs["DEFAULT"])
    got5 = ex.heatmap.rows[1]["values"]
    assert got5 == pytest.approx(want5.values[-len(got5) :], abs=1e-3)
    assert (ex.runner.started, ex.default_generations) == (runs, generations)


# ipywidgets 7.7 (Colab) has these models; nothing ipywidgets-8-only may appear.
IPYWIDGETS_7_MODELS = {
    "VBoxModel",
    "HBoxModel",
    "BoxModel",
    "ButtonModel",
    "CheckboxModel",
    "DropdownModel",
    "FloatSliderModel",
    "IntSliderModel",
    "IntTextModel",
    "HTMLModel",
    "TextModel",
    "TextareaModel",
    "ToggleButtonsModel",
    "LayoutModel",
    "DescriptionStyleModel",
    "ButtonStyleModel",
    "SliderStyleModel",
    "ToggleButtonsStyleModel",
    "HTMLStyleModel",
    "TextStyleModel",
    "CheckboxStyleModel",
    "AnyModel",
}


def test_static_export_has_panes_and_heatmap_state(engine, source, tmp_path):
    from ipywidgets.embed import embed_minimal_html

    ex = make(engine, features=[(source, 6, 80.0)])
    path = tmp_path / "explorer.html"
    embed_minimal_html(path, views=[ex.ui], drop_defaults=False, title="explorer")
    page = path.read_text()
    assert "export default { render }" in page  # both ES modules travel inline
    assert page.count("sw-heatmap") >= 1 and page.count("sw-completions") >= 1
    import json

    steered_tokens = json.dumps(ex.completions.pane("STEERED")["tokens"][0])[1:-1]
    assert steered_tokens in page
    models = {w.get_state().get("_model_name") for w in _descendants(ex.ui)}
    assert models <= IPYWIDGETS_7_MODELS, models - IPYWIDGETS_7_MODELS


def _descendants(widget):
    """Every widget reachable from ``widget`` through its traits (children, layout, style)."""
    import ipywidgets

    seen, todo = [], [widget]
    while todo:
        w = todo.pop()
        seen.append(w)
        for name in w.keys:
            value = getattr(w, name)
            items = value if isinstance(value, (list, tuple)) else [value]
            todo += [v for v in items if isinstance(v, ipywidgets.Widget)]
    return seen


def test_values_set_from_python_are_honoured_or_refused_never_clamped(engine, source):
    ex = make(engine, features=[(source, 1, 30.0)], live=False)
    tokens = ex.controls.widgets["n_completion_tokens"]
    multiplier = ex.controls.widgets["strength_multiplier"]
    ex.set(n_completion_tokens=500, strength_multiplier=-2.5, temperature=3.5)
    assert ex.request().n_completion_tokens == 500 and tokens.value == 500
    assert multiplier.value == -2.5 and multiplier.min <= -2.5  # the slider widened
    assert ex.controls.widgets["temperature"].value == 3.5
    assert ex.request().strength_multiplier == -2.5 and not ex.error

    ex.set(n_completion_tokens=0, temperature=-1, seed=1.5, steer_method="NOPE")
    assert tokens.value == 500 and ex.controls.widgets["temperature"].value == 3.5
    assert "n_completion_tokens" in ex.error or "steer_method" in ex.error  # the last refusal
    for name in ("n_completion_tokens", "temperature", "seed", "steer_method"):
        with pytest.raises(sw.RequestError, match=name):
            ex.controls.set(name, {"n_completion_tokens": 0, "temperature": -1}.get(name, 1.5))

    ex.set_strength(0, 1000.0)
    slider = ex.features_ui.rows[0].slider
    assert slider.value == 1000.0 and slider.max >= 1000.0
    assert ex.features[0].strength == 1000.0
    ex.set_strength(0, float("nan"))
    assert slider.value == 1000.0 and "strength" in ex.error
    with pytest.raises(TypeError, match="is not a setting"):
        ex.set(no_such_setting=1)


def test_stop_says_stopped_and_a_new_change_says_replaced(engine, source):
    ex = make(engine, features=[(source, 3, 60.0)], n_completion_tokens=48)
    long_run(ex, 90.0)
    wait_for(lambda: ex.status_line.state == "generating" and f"/{LONG}" in ex.status)
    ex.stop()
    assert ex.wait(120), ex.status
    assert ex.status_line.state == "stopped" and "stopped by you" in ex.status
    assert ex.history[-1]["cancel_reason"] == "stopped"
    steered = ex.completions.pane("STEERED")
    assert steered["stop"] == "cancelled" and len(steered["tokens"]) < LONG

    long_run(ex, 100.0)
    wait_for(lambda: ex.status_line.state == "generating" and f"/{LONG}" in ex.status)
    first = ex.last_run
    with ex.batch():
        ex.set_strength(0, -100.0)
        ex.set(n_completion_tokens=48)
    assert ex.wait(120), ex.status
    assert first["cancel_reason"] == "replaced"
    assert ex.status_line.state == "done"
    # the heatmap follows the panes: it shows the final STEERED tokens
    rows = {r["label"]: r for r in ex.heatmap.rows}
    assert "".join(rows["STEERED"]["tokens"]) == ex.completions.text("STEERED")


def test_record_view_closes_on_change_and_panes_go_stale_when_not_live(engine, source):
    ex = make(engine, features=[(source, 4, 40.0)], live=False)
    ex.run()
    assert ex.wait(120), ex.status
    ex._toggle_record()
    assert ex.record_box.layout.display is None and '"request"' in ex.record_box.value
    ex.set(seed=99)
    assert ex.record_box.layout.display == "none"
    assert "press Run" in ex.completions.stale and "press Run" in ex.heatmap.stale
    ex.run()
    assert ex.wait(120)
    assert ex.completions.stale == "" and ex.heatmap.stale == ""
    assert ex.request_done.seed == 99


def test_search_by_hash_index_and_hints_for_nothing_found(engine, source):
    ex = make(engine, live=False)
    assert [i.index for i in ex.picker.search("#12")] == [12]
    d_sae = engine.saes.config(source).d_sae
    assert ex.picker.search(f"#{d_sae + 1}") == []
    assert f"#0..#{d_sae - 1}" in ex.picker.message.value
    assert ex.picker.search("qqzzxxv") == []
    assert "no feature mentions" in ex.picker.message.value
    if ex.picker.steering_thread is not None:  # features that steer toward it, ranked anyway
        ex.picker.steering_thread.join(300)
    # another SAE reruns the same query (Enter keeps working on the same text)
    ex.picker.query.value = "#12"
    other = [s for s in engine.saes.sources() if s != ex.picker.source.value]
    if other:
        ex.picker.source.value = other[0]
        assert "#12" in ex.picker.message.value and other[0] in ex.picker.message.value
        assert len(ex.picker.results.children) == 1


def test_heatmap_runs_beside_the_runner_and_its_lag_is_recorded(engine, source):
    ex = make(engine, features=[(source, 5, 40.0)], n_completion_tokens=12)
    run = ex.last_run
    assert run["heat_at"] >= run["last_token_at"]
    threads = []
    original = ex.heat._compute
    ex.heat._compute = lambda job, epoch: (
        threads.append(threading.current_thread()),
        original(job, epoch),
    )
    ex.set_strength(0, 70.0)
    assert ex.wait(120), ex.status
    assert threads and all(t.name != ex.runner._thread.name for t in threads)


def test_saved_view_loads_into_a_new_explorer_with_the_same_tokens(engine, source, tmp_path):
    from steer_widgets.widgets.views import same_tokens

    ex = make(engine, features=[(source, 6, 70.0)], sweep=(2,), temperature=0.8, seed=7, chat=True)
    path = tmp_path / "view.json"
    view = ex.save_view(path)
    assert view["outputs_match_request"] and set(view["outputs"]) == set(ex.outputs)
    loaded = Explorer.load_view(path, engine)
    assert loaded.wait(120), loaded.status
    assert same_tokens(loaded)
    assert loaded.request() == ex.request()


def test_prompt_multiplier_starts_at_the_engines_recommendation_and_views_keep_it(
    engine, source, tmp_path
):
    from steer_widgets.widgets.views import same_tokens

    ex = make(engine, features=[(source, 6, 70.0)], chat=True, temperature=0.0)
    assert ex.request().prompt_multiplier == engine.default_prompt_multiplier() == 2.0
    alike = engine.steer(ex.request().with_(prompt_multiplier=1.0)).outputs["STEERED"]
    assert (
        ex.outputs["STEERED"].token_ids == engine.steer(ex.request()).outputs["STEERED"].token_ids
    )
    assert ex.outputs["STEERED"].token_ids != alike.token_ids  # the prompt push changes the text
    ex.set(prompt_multiplier=0.5)
    assert ex.wait(120), ex.status
    assert ex.request().prompt_multiplier == 0.5
    view = ex.save_view(tmp_path / "v.json")
    loaded = Explorer.load_view(tmp_path / "v.json", engine)
    assert loaded.wait(120) and same_tokens(loaded)
    assert loaded.request().prompt_multiplier == 0.5
    # a view saved before the field existed steers every position alike, as it did then
    del view["request"]["prompt_multiplier"]
    old = Explorer.load_view(view, engine)
    assert old.wait(120), old.status
    assert old.request().prompt_multiplier == 1.0
    assert (
        old.outputs["STEERED"].token_ids
        == engine.steer(ex.request().with_(prompt_multiplier=1.0)).outputs["STEERED"].token_ids
    )


def test_feature_card_shows_tokens_contexts_neighbours_and_steers(engine, source):
    import html

    ex = make(engine, live=False)
    ex.picker.search("#12")
    ex.picker.results.children[0].children[2].click()  # the result's "card" button
    card = ex.picker.card
    info = engine.feature_index(source)[12]
    assert card.shown == (source, 12) and card.ui.layout.display is None
    assert html.escape(repr(info.top_tokens[0])) in card.body.value
    assert html.escape(engine.feature_index(source).label(12)) in card.body.value
    if info.bottom_tokens:  # indexes built with the final-norm logit lens carry them
        assert html.escape(repr(info.bottom_tokens[0])) in card.body.value
    if info.contexts:  # shipped index: contexts with the max token outlined
        assert card.body.value.count("outline") == min(3, len(info.contexts))
    near = engine.neighbours(source, 12, n=6)
    buttons = card.neighbours.children[1:]
    assert [b.description for b in buttons] == [f"#{i} ({c:.2f})" for i, c in near]
    buttons[0].click()  # a neighbour opens its own card
    assert card.shown == (source, near[0][0])
    card.steer.click()
    assert ex.features == [sw.Feature(source, near[0][0], engine.default_strength(source))]
    ex.features_ui.rows[0].box.children[3].click()  # the row's own "card" button
    assert card.shown == (source, near[0][0])


@pytest.fixture
def gated_neuronpedia(engine, source, monkeypatch, tmp_path):
    """``source``'s features under a Neuronpedia id, with no explanation on disk, and
    Neuronpedia's fetch replaced by one that waits until the test opens the feature's gate
    (no network: a hanging DNS lookup, as the card meets it); yields (gates, asked)."""
    from collections import defaultdict

    from steer_widgets.sae.feature_index import FeatureIndex
    from steer_widgets.sae.neuronpedia import Explanations

    monkeypatch.setenv("STEER_WIDGETS_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("STEER_WIDGETS_OFFLINE", raising=False)
    real = engine.feature_index
    fi = FeatureIndex(source, list(real(source).infos), neuronpedia_id="test-model/test-sae")
    monkeypatch.setattr(engine, "feature_index", lambda s: fi if s == source else real(s))
    gates: defaultdict[int, threading.Event] = defaultdict(threading.Event)
    asked: list[int] = []

    def fetch(self, indices) -> dict[int, str]:
        wanted = [int(i) for i in indices]
        asked.extend(wanted)
        for i in wanted:
            gates[i].wait(30)
        return {i: f"explained #{i}" for i in wanted}

    monkeypatch.setattr(Explanations, "fetch", fetch)
    yield gates, asked
    for gate in list(gates.values()):
        gate.set()


def show_within(card, source: str, index: int, timeout: float = 10.0) -> None:
    """``card.show`` from another thread (the kernel's message thread), which must return
    within ``timeout`` whatever Neuronpedia does (the patched fetch blocks until the test
    releases it, so a show that waits for it never returns; the timeout only leaves room
    for a slow machine's first SAE load)."""
    shower = threading.Thread(target=card.show, args=(source, index), daemon=True)
    shower.start()
    shower.join(timeout)
    assert not shower.is_alive(), "show() waited for Neuronpedia"


FETCHING = "fetching the Neuronpedia explanation"


def workers(prefix: str) -> set[threading.Thread]:
    """The widget worker threads alive now whose name starts with ``prefix`` (``sw-card``,
    ``sw-explain``)."""
    return {t for t in threading.enumerate() if t.name.startswith(prefix)}


def test_feature_card_shows_at_once_and_the_explanation_when_fetched(
    engine, source, gated_neuronpedia
):
    import html

    from steer_widgets.widgets.card import FeatureCard

    gates, asked = gated_neuronpedia
    errors: list[str] = []
    card = FeatureCard(engine, on_steer=lambda *a: None, on_error=errors.append)
    local = html.escape(engine.feature_index(source).label(12))
    show_within(card, source, 12)
    assert card.shown == (source, 12) and card.ui.layout.display is None
    assert local in card.body.value and FETCHING in card.body.value
    assert len(card.neighbours.children) > 1  # decoder neighbours are local: shown at once
    gates[12].set()
    wait_for(lambda: "explained #12" in card.body.value, 10)
    assert FETCHING not in card.body.value and errors == [] and asked == [12]
    card.close()


def test_feature_card_drops_a_fetch_for_a_card_no_longer_shown(engine, source, gated_neuronpedia):
    from steer_widgets.widgets.card import FeatureCard

    gates, asked = gated_neuronpedia
    card = FeatureCard(engine, on_steer=lambda *a: None, on_error=lambda m: None)
    show_within(card, source, 12)
    show_within(card, source, 13)  # another card while #12's fetch hangs
    gates[12].set()
    wait_for(lambda: asked == [12, 13], 10)  # one worker: #12's fetch and render are over
    assert card.shown == (source, 13)
    assert "#13" in card.body.value and FETCHING in card.body.value
    assert "explained #12" not in card.body.value
    assert engine.feature_index(source).label(12) == "explained #12"  # kept for later
    gates[13].set()
    wait_for(lambda: "explained #13" in card.body.value, 10)
    card.close()


def test_explorer_close_returns_while_a_card_fetch_hangs(engine, source, gated_neuronpedia):
    gates, _ = gated_neuronpedia
    ex = make(engine, live=False)
    before = workers("sw-card")
    show_within(ex.picker.card, source, 12)
    closer = threading.Thread(target=ex.close, daemon=True)
    closer.start()
    closer.join(5)
    assert not closer.is_alive(), "close() waited for the hanging fetch"
    gates[12].set()
    wait_for(lambda: workers("sw-card") <= before, 10)  # the card's worker ended


def test_concept_row_steers_like_the_same_direction_as_a_feature(engine, source, tmp_path):
    hook = engine.saes.config(source).hook_name
    row = engine.saes.decoder_row(source, 7)
    ex = make(engine, live=False, temperature=0.0)
    assert ex.add_concept("row 7", sw.Vector(row, hook, 60.0)) == 0
    ex.run()
    assert ex.wait(120), ex.status
    assert ex.request().vectors[0].strength == 60.0 and not ex.request().features
    want = engine.steer(ex.request().with_(vectors=(), features=(sw.Feature(source, 7, 60.0),)))
    assert ex.outputs["STEERED"].token_ids == want.outputs["STEERED"].token_ids
    # a saved view carries the concept and reproduces the tokens
    from steer_widgets.widgets.views import same_tokens

    ex.save_view(tmp_path / "v.json")
    loaded = Explorer.load_view(tmp_path / "v.json", engine)
    assert loaded.wait(120) and same_tokens(loaded)
    assert loaded.features_ui.rows[0].name == "row 7"


def test_picker_finds_steering_features_and_adds_a_concept(engine, source):
    ex = make(engine, live=False, n_completion_tokens=6)
    ex.picker.query.value = "music"  # what typing and Enter do
    ex.picker.steering_thread.join(300)
    want = engine.search_features("music", sources=[source], n=ex.picker.limit)
    rows = ex.picker.steering_results.children
    assert [r.children[0].description for r in rows] == [f"+ #{m.index}" for m in want]
    assert "steer toward &#x27;music&#x27;" in ex.picker.steering_message.value
    rows[0].children[0].click()  # "+": the feature at its recommended strength
    assert ex.features == [sw.Feature(source, want[0].index, want[0].strength)]

    ex.picker.concept.value = "music"
    ex.picker.concept_button.click()
    vector = engine.concept_vector("music")
    concept = ex.request().vectors[0]
    assert concept.hook == vector.hook and concept.strength == vector.strength
    assert ex.features_ui.rows[1].name == "music"
    ex.run()
    assert ex.wait(120) and not ex.error, ex.status
    assert "STEERED" in ex.outputs


def test_close_ends_the_explorers_worker_and_widgets_and_the_engine_stays_usable(engine, source):
    others = workers("sw-explain")  # other explorers' (this test's process is shared)
    ex = make(engine)
    ex.add_feature(source, 3, strength=30.0)
    ex.run()
    assert ex.wait(120) and ex.explain.wait(120)
    explaining = workers("sw-explain") - others  # this explain panel's thread
    assert explaining
    widgets = [ex.ui, *ex.ui.children]
    ex.close()
    for t in explaining:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in explaining), "the explain worker outlived close()"
    assert all(w.comm is None for w in widgets)  # closed: the front end drops them
    ex.explain.shown(None, {})  # a late run finishing after close is ignored, not an error
    request = sw.SteerRequest("Hello", types=("DEFAULT",), n_completion_tokens=2, temperature=0)
    assert engine.steer(request).outputs["DEFAULT"].token_ids


def test_batch_makes_several_changes_one_run(engine, source):
    """``ex.batch()``: changes inside schedule nothing; one run at the end has them all
    (``run=False``: none); a bad ``run`` is a named error and leaves the explorer usable."""
    ex = make(engine)
    runs = ex.runner.started
    with ex.batch():
        ex.set(temperature=0.0, seed=3)
        ex.add_feature(source, 4, 30.0)
        ex.set_strength(0, 20.0)
        time.sleep(0.3)  # longer than the debounce: a change here would have started a run
        assert ex.runner.started == runs
    assert ex.wait(120), ex.status
    assert ex.runner.started == runs + 1
    req = ex.request_done
    assert (req.temperature, req.seed) == (0.0, 3)
    assert [(f.index, f.strength) for f in req.features] == [(4, 20.0)]
    with ex.batch(run=False):
        ex.set(seed=4)
    time.sleep(0.3)
    assert ex.runner.started == runs + 1
    with pytest.raises(sw.SteerWidgetsError) as err:
        with ex.batch(run="yes"):
            pass
    assert err.value.field == "run"
    ex.close()


def test_a_condition_gates_the_explorers_steering_and_the_panes_mark_it(engine, tmp_path):
    from steer_widgets.widgets.views import same_tokens

    when = sw.When(sw.Feature("5-smollm2-res-4k", 3187), above=8.0, off_below=2.0)
    ex = make(engine, prompt="My favourite thing to do on a Sunday is", temperature=0.0,
              features=[("10-smollm2-res-4k", 100, 30.0)])  # fmt: skip
    ex.set(when=when)
    assert ex.wait(120), ex.status
    assert ex.when == when and ex.request().when == when
    steered = ex.outputs["STEERED"]
    alone = engine.steer(ex.request()).outputs["STEERED"]
    assert steered == alone and steered.gates == alone.gates
    log, n = steered.gates["features[0]"], len(steered.token_ids)
    marks = ex.completions.pane("STEERED")["gated"]
    assert marks == [log[len(log) - n + k] for k in range(n)]  # the predicting position's gate
    assert any(marks) and ex.completions.pane("DEFAULT")["gated"] is None
    path = tmp_path / "view.json"
    ex.save_view(path)
    loaded = Explorer.load_view(path, engine)
    assert loaded.wait(120), loaded.status
    assert loaded.when == when and same_tokens(loaded)
    ex.set(when=sw.When.tokens(5, 1))  # refused in the status line, nothing changed
    assert "when.stop" in ex.error and ex.when == when
    ex.set(when=None)
    assert ex.wait(120), ex.status
    assert ex.request().when is None and ex.completions.pane("STEERED")["gated"] is None


def test_the_steer_row_gates_on_a_feature_a_concept_or_a_python_condition(engine):
    ex = make(engine, prompt="My favourite thing to do on a Sunday is", temperature=0.0,
              features=[("10-smollm2-res-4k", 100, 30.0)])  # fmt: skip
    row = ex.condition_row
    assert ex.request().when is None and row.what.layout.display == "none"
    with ex.batch():
        row.kind.value = "feature"
        row.what.value = "5-smollm2-res-4k #3187"
        row.threshold.value = 8.0
    assert ex.wait(120), ex.status
    top = engine.feature_index("5-smollm2-res-4k")[3187].max_act
    assert row.threshold.max == pytest.approx(top) and row.what.layout.display == ""
    want = sw.When(sw.Feature("5-smollm2-res-4k", 3187), above=8.0, scope="token")
    assert ex.request().when == want
    alone = engine.steer(ex.request()).outputs["STEERED"]
    assert ex.outputs["STEERED"] == alone and ex.outputs["STEERED"].gates == alone.gates
    # the heatmap of the condition's score, with its threshold (no new run)
    assert ("the condition's score", "condition") in list(ex.view.heat_feature.options)
    ex.view.heat_feature.value = "condition"
    assert ex.wait(120), ex.status
    assert ex.heatmap.bounds == [8.0, None] and "score of the condition" in ex.heatmap.title
    _, scores, threshold = engine.condition_scores(want, ex.request().prompt, alone)
    steered_row = [r for r in ex.heatmap.rows if r["label"] == "STEERED"][0]
    n = len(alone.token_ids)
    assert threshold == 8.0 and steered_row["values"] == [round(v, 4) for v in scores[-n:]]
    with ex.batch():
        row.kind.value = "concept"
        row.what.value = "food"
        row.scope.value = "prompt"
    assert ex.wait(120), ex.status
    when = ex.request().when
    assert isinstance(when.on, sw.Vector) and (when.above, when.scope) == (0.05, "prompt")
    assert set(ex.outputs["STEERED"].gates["features[0]"]) in ({True}, {False})
    ex.set(when=sw.When.tokens(2))  # from Python: listed, not editable
    assert ex.wait(120), ex.status
    assert row.kind.value == "custom" and "completion tokens 2.." in row.summary.value
    row.kind.value = "always"  # the row replaces it
    assert ex.wait(120), ex.status
    assert ex.request().when is None and "custom" not in [v for _, v in row.kind.options]
    assert "condition" not in [v for _, v in ex.view.heat_feature.options]
    assert ex.heatmap.bounds == [None, None]
    with ex.batch():
        row.kind.value = "feature"
        row.what.value = "no-such-sae #1"
    assert ex.wait(120)
    assert "no-such-sae" in ex.error  # the refusal itself, nothing else in the status line
