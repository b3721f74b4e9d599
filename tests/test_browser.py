"""The explorer in a real browser: JupyterLab + Debian Chromium driven by Python playwright.

Starts JupyterLab on 127.0.0.1 with every Jupyter/IPython/XDG folder inside ``tmp_path``,
opens a notebook that shows the explorer and uses it as a person would: moves a strength
slider with the keyboard, hovers a heatmap token and a STEERED token (its probability and
alternatives), stops a long run, empties the prompt, gates the steering on a feature (the
tokens written under it marked), evaluates the steering over two prompts
and sets the slider from the grid, picks a preset, and checks the layout
at 1400 px and 800 px, light and dark (no horizontal scrollbar inside the explorer, no
control cut off or outside it, slider tracks wide enough to use).

Screenshots go to ``tmp_path`` only; ``make screenshots`` sets ``SW_SCREENSHOT_DIR=docs`` to
regenerate the explorer images in docs/ on purpose.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from chromium import CHROMIUM, FLAGS, require_chromium

REPO = Path(__file__).resolve().parents[1]
STEERED = '.sw-pane[data-label="STEERED"]'

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not any((REPO / "steer_widgets" / "data" / "saes").glob("*/cfg.json"))
        and not os.environ.get("SW_DEV_SAE"),
        reason="the default engine has no SAEs yet (steer_widgets/data/saes/ not trained)",
    ),
]


@pytest.fixture(autouse=True)
def chromium_present():
    require_chromium()


SETUP = """\
import os
os.environ["HF_HUB_OFFLINE"] = "1"
import steer_widgets as sw
engine = sw.Engine.default()
if not engine.saes.sources() and os.environ.get("SW_DEV_SAE"):
    engine.saes.add(os.environ["SW_DEV_SAE"], "10-dev")
source = engine.saes.sources()[0]
"""
SHOW = """\
ex = sw.Explorer(prompt="I think that", n_completion_tokens=12, features=[(source, 3, 40.0)])
ex
"""


def notebook(cells: list[str]) -> dict:
    return {
        "cells": [
            {
                "cell_type": "code",
                "metadata": {},
                "source": c,
                "outputs": [],
                "execution_count": None,
            }
            for c in cells
        ],
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def jupyter_env(tmp_path: Path) -> dict:
    """``os.environ`` offline, with every Jupyter/IPython/XDG folder made inside ``tmp_path``."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    for name, sub in [
        ("JUPYTER_CONFIG_DIR", "jupyter/config"),
        ("JUPYTER_DATA_DIR", "jupyter/data"),
        ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
        ("JUPYTERLAB_SETTINGS_DIR", "jupyter/lab-settings"),
        ("JUPYTERLAB_WORKSPACES_DIR", "jupyter/lab-workspaces"),
        ("IPYTHONDIR", "ipython"),
        ("XDG_CONFIG_HOME", "xdg/config"),
        ("XDG_DATA_HOME", "xdg/data"),
        ("XDG_CACHE_HOME", "xdg/cache"),
        ("XDG_RUNTIME_DIR", "xdg/runtime"),
    ]:
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(tmp_path / sub)
    return env


@contextmanager
def serve(cmd: list[str], env: dict, url: str, token: str, log_path: Path) -> Iterator[None]:
    """Run a Jupyter server (``cmd``, listening on ``url``) with its output in ``log_path``:
    yields once ``/api/status`` answers (at most 60 s), stops the server after."""
    log = open(log_path, "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, f"{cmd[2]} did not start in 60 s"
                time.sleep(0.5)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving ``tmp_path``; yields (base url, token)."""
    token, port = secrets.token_hex(16), free_port()
    env = jupyter_env(tmp_path)
    # no "get notified about Jupyter news?" popup over the explorer
    news = tmp_path / "jupyter/lab-settings/@jupyterlab/apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "explorer.ipynb").write_text(json.dumps(notebook([SETUP, SHOW])))
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
        f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0",
        "--ip=127.0.0.1", f"--port={port}", "--LabApp.expose_app_in_browser=True",
        f"--ServerApp.root_dir={tmp_path / 'work'}",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with serve(cmd, env, url, token, tmp_path / "lab.log"):
        yield url, token


KERNEL_READY = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""


def steered_text(page) -> str:
    return page.inner_text(f"{STEERED} .sw-text")


def steered_done(page) -> bool:
    return page.get_attribute(STEERED, "data-stop") in ("length", "eos")


def state(page) -> str:
    return page.get_attribute(".sw-status", "data-state") or ""


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def hover_until_tip(page, tokens, tip, what: str) -> None:
    """Hover the first of ``tokens`` until ``tip`` shows. A widget may redraw after its run
    is done (the heatmap catches up beside the run), moving the tokens from under a still
    pointer, so each try moves the pointer away and onto the token now first."""

    def hovered() -> bool:
        page.mouse.move(0, 0)
        tokens.first.hover()
        return tip.is_visible()

    wait_until(hovered, 30, what)


# Everything wrong with the explorer's layout, as a list of strings (empty = fine).
LAYOUT_PROBLEMS = """() => {
  const root = document.querySelector('.sw-explorer');
  const rb = root.getBoundingClientRect();
  const out = [];
  const name = (el) => (el.textContent || el.className || el.tagName).trim().slice(0, 40);
  if (root.scrollWidth > root.clientWidth + 1) out.push(`explorer scrolls: ${root.scrollWidth} > ${root.clientWidth}`);
  for (const el of root.querySelectorAll('*')) {
    const cs = getComputedStyle(el);
    if (['auto', 'scroll'].includes(cs.overflowX) && el.scrollWidth > el.clientWidth + 1)
      out.push(`horizontal scrollbar in ${el.className}`);
  }
  const controls = root.querySelectorAll(
    'button, .widget-label, .widget-label-basic, .widget-readout, .sw-badge, .sw-head, input, textarea, select');
  for (const el of controls) {
    const b = el.getBoundingClientRect();
    if (b.width === 0 && b.height === 0) continue;  // hidden
    if (b.right > rb.right + 1 || b.left < rb.left - 1) out.push(`outside the explorer: ${name(el)}`);
    if (!['INPUT', 'TEXTAREA', 'SELECT'].includes(el.tagName) && el.scrollWidth > el.clientWidth + 1)
      out.push(`cut off: ${name(el)} (${el.scrollWidth} > ${el.clientWidth})`);
  }
  for (const el of root.querySelectorAll('.noUi-target, .slider')) {
    const b = el.getBoundingClientRect();
    if (b.width > 0 && b.width < 100) out.push(`slider track only ${Math.round(b.width)} px`);
  }
  return out;
}"""

PANE_COLUMNS = """() => {
  const panes = [...document.querySelectorAll('.sw-pane')].map(p => p.getBoundingClientRect().left);
  return new Set(panes.map(Math.round)).size;
}"""

TEXT_LIGHTNESS = """(sel) => {
  const [r, g, b] = getComputedStyle(document.querySelector(sel)).color.match(/[0-9.]+/g).map(Number);
  return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}"""


def check_layout(page, what: str) -> None:
    problems = page.evaluate(LAYOUT_PROBLEMS)
    assert not problems, f"{what}: {problems}"


def shoot(page, tmp_path: Path, name: str) -> Path:
    """Screenshot the explorer's output area into tmp_path (and SW_SCREENSHOT_DIR if set)."""
    shot = tmp_path / f"{name}.png"
    page.locator(".jp-OutputArea-output", has=page.locator(".sw-explorer")).screenshot(
        path=str(shot)
    )
    assert shot.stat().st_size > 10_000
    target = os.environ.get("SW_SCREENSHOT_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / shot.name)
    return shot


def commit(page, selector: str, text: str) -> None:
    """Type into a box whose widget commits on blur (continuous_update=False)."""
    box = page.locator(selector).first
    box.fill(text)
    box.press("Tab")


def evaluate(page, prompts: list[str], ladder: list[float] | None = None) -> None:
    """Run the evaluate panel over ``prompts`` x ``ladder`` (``None``: the box left as it is,
    the default ladder): every cell of the grid filled and judged, a point in the chart for
    each strength.

    Typing into both boxes can race the click: ipywidgets holds a widget's second update
    until the kernel has answered its first, while the click's message goes at once, so a
    busy kernel may start on the ladder it had. One box typed, the order holds."""
    from steer_widgets.analysis.evaluator import LADDER

    page.locator(".sw-eval details summary").click()
    commit(page, ".sw-eval-prompts", "\n".join(prompts))
    if ladder is not None:
        commit(page, ".sw-eval-ladder", ", ".join(map(str, ladder)))
    ladder = LADDER if ladder is None else ladder
    page.locator(".sw-eval-run").click()
    badge = page.locator(".sw-eval .sw-badge")
    wait_until(lambda: badge.inner_text() == "done", 180, "evaluation")
    cells = len(prompts) * len(ladder)
    assert page.locator(".sw-eval-grid .sw-eval-cell").count() == cells
    judged = page.locator(".sw-eval-grid .sw-eval-hit, .sw-eval-grid .sw-eval-miss")
    assert judged.count() == cells
    assert page.locator(".sw-eval-chart svg .sw-point").count() == len(ladder)


PRESET_MENU = ".sw-explorer .widget-dropdown:has(.widget-label:text-is('preset')) select"
HEAT_MENU = ".sw-explorer .widget-dropdown:has(.widget-label:text-is('heatmap of')) select"
TOKENS_BOX = ".sw-explorer .widget-text:has(.widget-label:text-is('tokens')) input"


SET_REPLAY = """\
import json, tempfile
from pathlib import Path
ex.wait(300)
found = engine.concept_features("music")
view = Path(tempfile.mkdtemp()) / "view.json"
ex.save_view(view)
again = sw.Explorer.load_view(view, engine, live=False)
again.run()
again.wait(300)
print(json.dumps({
    "rows": [[f.source, f.index, f.strength] for f in ex.features[-len(found):]],
    "set": [[f.source, f.index, f.strength] for f in found],
    "steps": [r.slider.step for r in ex.features_ui.rows[-len(found):]],
    "steered": list(ex.outputs["STEERED"].token_ids),
    "replayed": list(again.outputs["STEERED"].token_ids),
}))
"""


def kernel_run(page, code: str) -> str:
    """Run ``code`` in the notebook's kernel (as a cell would) and return what it printed."""
    return page.evaluate(
        """async (code) => {
          const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
          let out = "";
          const future = k.requestExecute({ code });
          future.onIOPub = (msg) => {
            if (msg.header.msg_type === "stream") out += msg.content.text;
            if (msg.header.msg_type === "error") out += "error: " + msg.content.evalue;
          };
          await future.done;
          return out;
        }""",
        code,
    )


def test_explorer_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    url, token = lab
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium"),  # a fresh --user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=FLAGS,
            viewport={"width": 1400, "height": 1400},
        )
        try:
            page = browser.new_page()
            page.goto(f"{url}/lab/tree/explorer.ipynb?token={token}")
            page.wait_for_function(KERNEL_READY, timeout=90_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_selector(STEERED, timeout=120_000)
            wait_until(lambda: steered_done(page) and steered_text(page), 120, "first run")
            wait_until(lambda: page.locator(".sw-heatmap .sw-tok").count() > 0, 60, "heatmap")
            check_layout(page, "1400 px")
            assert page.evaluate(PANE_COLUMNS) == 2  # DEFAULT | STEERED side by side
            shoot(page, tmp_path, "explorer")
            before = steered_text(page)

            # a slider move reruns STEERED
            handle = page.locator(".sw-strength .noUi-handle").first
            handle.focus()
            for _ in range(3):
                page.keyboard.press("PageUp")  # 5 steps each
            page.keyboard.press("End")  # to +300
            wait_until(lambda: steered_done(page) and steered_text(page) != before, 120, "rerun")
            assert steered_text(page) and state(page) in ("done", "generating")

            # hovering a heatmap token shows its value and top features inside the widget
            wait_until(lambda: state(page) == "done", 60, "done")
            toks = page.locator(".sw-heatmap .sw-row[data-label='STEERED'] .sw-tok")
            tip = page.locator(".sw-heatmap .sw-tip")
            hover_until_tip(page, toks.filter(has_text=re.compile(r"\w")), tip, "hover tip")
            assert "value" in tip.inner_text() and "top features" in tip.inner_text()

            # hovering a STEERED token shows its probability and the top alternatives
            words = page.locator(f"{STEERED} .sw-text span").filter(has_text=re.compile(r"\w"))
            prob_tip = page.locator(".sw-completions .sw-tip")
            hover_until_tip(page, words, prob_tip, "probability tip")
            shown = prob_tip.inner_text()
            assert re.search(r"probability \d+(\.\d+)?%", shown), shown
            assert "alternatives:" in shown and shown.count("%") >= 6, shown  # token + top 5
            shoot(page, tmp_path, "explorer-probabilities")

            # Stop says stopped
            commit(page, TOKENS_BOX, "2000")  # far longer than a click takes, on any machine
            wait_until(lambda: state(page) == "generating", 60, "a long run")
            page.get_by_role("button", name="Stop").click()
            wait_until(lambda: state(page) == "stopped", 30, "stopped")
            assert "stopped by you" in page.inner_text(".sw-status .sw-badge")
            commit(page, TOKENS_BOX, "12")
            wait_until(lambda: state(page) == "done", 120, "back to 12 tokens")

            # an empty prompt: an error, no "generating" left over, panes marked stale
            commit(page, ".sw-explorer textarea", "")
            wait_until(lambda: state(page) == "error", 60, "empty-prompt error")
            assert "prompt" in page.inner_text(".sw-status .sw-error")
            assert page.locator(".sw-completions .sw-stale-note").is_visible()
            commit(page, ".sw-explorer textarea", "I think that")
            wait_until(lambda: state(page) == "done", 120, "prompt back")
            assert not page.locator(".sw-completions .sw-stale-note").is_visible()

            # the "steer" row gates the steering on a feature; the STEERED pane marks the
            # tokens written while it held, and says how many
            legend = page.locator(f"{STEERED} .sw-gate-legend")
            page.locator(".sw-condition select").select_option(label="while a feature is active")
            commit(page, ".sw-condition input[type='text']", "5-smollm2-res-4k #3187")
            wait_until(lambda: state(page) == "done" and legend.count() == 1, 120, "gated run")
            marked = page.locator(f"{STEERED} .sw-gated")
            # the status line can say done before the pane's last frame lands (a fast run's
            # frames arrive together): the legend and the marks must agree once it has
            wait_until(
                lambda: f"held ({marked.count()} of " in legend.inner_text(), 30,
                f"the legend counting the marked tokens: {legend.inner_text()}",
            )  # fmt: skip
            # the heatmap of the condition's score draws its threshold on the colour scale
            page.locator(HEAT_MENU).select_option(label="the condition's score")
            line = page.locator(".sw-heatmap .sw-threshold")
            wait_until(lambda: line.count() == 1, 60, "the threshold line")
            assert "outlined tokens score > 0.000" in page.inner_text(".sw-heatmap .sw-title")
            page.locator(".sw-condition select").select_option(label="always")
            wait_until(lambda: state(page) == "done" and legend.count() == 0, 120, "ungated")

            # a row's own condition: its "when" button opens the same controls under the row
            page.locator(".sw-when").first.click()
            row_when = page.locator(".sw-row-condition")
            wait_until(lambda: row_when.count() == 1, 30, "the row's condition controls")
            row_when.locator("select").select_option(label="while a feature is active")
            commit(page, ".sw-row-condition input[type='text']", "5-smollm2-res-4k #3187")
            wait_until(lambda: state(page) == "done" and legend.count() == 1, 120, "a gated row")
            assert page.locator(".sw-when").first.inner_text().strip() == "when ●"
            row_when.locator("select").select_option(label="always")
            wait_until(lambda: state(page) == "done" and legend.count() == 0, 120, "row ungated")
            page.locator(".sw-when").first.click()  # closed again: one condition row on screen
            wait_until(lambda: row_when.count() == 0, 30, "the row's controls closed")

            # the evaluate panel: two prompts x two strengths fill the grid and the chart; a
            # strength in the grid sets the slider (x0: strength 0)
            evaluate(page, ["I went to the", "chat: Tell me a story."], [0, 1])
            page.locator(".sw-eval").screenshot(path=str(tmp_path / "evaluate-in-lab.png"))
            readout = page.locator(".sw-strength .widget-readout").first
            shown = lambda: float(readout.inner_text().replace("\u2212", "-"))  # noqa: E731
            x1 = shown()
            page.locator(".sw-eval-strength[data-strength='0']").click()
            # 0 up to the slider's step grid (the front end snaps to min + k * step)
            wait_until(lambda: abs(shown()) < max(0.5, abs(x1) / 100), 30, "slider at x0")
            wait_until(lambda: state(page) == "done", 120, "rerun at x0")

            # narrow (a Colab-like width, no file browser open): wraps, nothing cut off
            page.evaluate("window.jupyterapp.shell.collapseLeft()")
            page.set_viewport_size({"width": 800, "height": 1600})
            page.wait_for_timeout(1000)
            check_layout(page, "800 px")
            width = page.evaluate("document.querySelector('.sw-explorer').clientWidth")
            if width < 680:  # below about 700 px the panes stack in one column
                assert page.evaluate(PANE_COLUMNS) == 1, width
            shoot(page, tmp_path, "explorer-narrow")

            # dark theme: the theme's colours reach the widgets
            light = page.evaluate(TEXT_LIGHTNESS, f"{STEERED} .sw-text")
            page.set_viewport_size({"width": 1400, "height": 1400})
            page.evaluate(
                "window.jupyterapp.commands.execute('apputils:change-theme',"
                " {theme: 'JupyterLab Dark'})"
            )
            wait_until(
                lambda: page.evaluate(TEXT_LIGHTNESS, f"{STEERED} .sw-text") > 0.6, 30, "dark"
            )
            assert light < 0.4
            check_layout(page, "1400 px dark")
            shoot(page, tmp_path, "explorer-dark")
            page.screenshot(path=str(tmp_path / "lab.png"), full_page=True)

            # the preset menu loads a preset that reproduces its stored STEERED text
            from steer_widgets.widgets.presets import preset_view

            name = "music-weekend"
            want = preset_view(name)["outputs"]["STEERED"]["text"]
            page.locator(PRESET_MENU).select_option(label=name)
            wait_until(lambda: state(page) == "done" and want[:40] in steered_text(page), 180, name)

            # "add as features": the concept's set lands as one slider row per feature, and
            # a view saved from the explorer as the browser left it replays the same tokens
            sliders = page.locator(".sw-strength").count()
            commit(page, "input[placeholder^='a concept to steer toward']", "music")
            page.get_by_role("button", name="add as features").click()
            wait_until(lambda: page.locator(".sw-strength").count() > sliders, 300, "the set")
            wait_until(lambda: state(page) == "done", 180, "a run with the set")
            assert "features of" in page.inner_text(".sw-explorer")
            got = json.loads(kernel_run(page, SET_REPLAY))
            # the front end holds a slider's value on its grid (one 300th of its range), so a
            # fitted strength moves by at most half a step there; the view records what it holds
            assert len(got["rows"]) == len(got["set"]) >= 1, got
            for (*row, held), (*fitted, strength), step in zip(
                got["rows"], got["set"], got["steps"], strict=True
            ):
                assert row == fitted and abs(held - strength) <= step / 2 + 1e-9, got
            assert page.locator(".sw-strength").count() == sliders + len(got["set"])
            assert got["replayed"] == got["steered"], got
        finally:
            browser.close()
