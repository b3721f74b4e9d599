"""The explorer under the ipywidgets 7 front end (the classic notebook with ipywidgets 7.7,
the nearest this machine gets to Colab), in headless Chromium as ``test_browser.py``.

Runs only in ``.venv/ipywidgets7`` (``scripts/ipywidgets7.sh`` builds it and runs this): one
notebook server, one kernel, one page. The explorer on the default model streams DEFAULT and
STEERED to the end, its anywidget parts (completions, heatmap, status, evaluate panel) draw,
the effect colouring and a token's attribution table work, a small evaluation fills its grid
and chart, and the page logs no JavaScript error.
"""

from __future__ import annotations

import json
import secrets
import sys
import urllib.request

import ipywidgets
import pytest
import test_browser
from chromium import CHROMIUM, FLAGS, require_chromium
from test_browser import (
    SETUP,
    STEERED,
    evaluate,
    free_port,
    jupyter_env,
    notebook,
    serve,
    state,
    steered_done,
    steered_text,
    wait_until,
)
from test_browser_explain import CHANGED_ROWS, explain_a_token

pytestmark = [
    *test_browser.pytestmark,
    pytest.mark.skipif(
        not ipywidgets.__version__.startswith("7.7."),
        reason=f"ipywidgets {ipywidgets.__version__}, not 7.7: scripts/ipywidgets7.sh runs this",
    ),
]

VERSION = 'import ipywidgets\nprint("kernel ipywidgets", ipywidgets.__version__)\n'
SHOW = """\
ex = sw.Explorer(prompt="I think that", n_completion_tokens=6, temperature=0,
                 features=[(source, 3, 40.0)])
ex
"""
DEFAULT = '.sw-pane[data-label="DEFAULT"]'
# the classic notebook's own objects: the kernel connected and idle, ipywidgets 7's manager on it
KERNEL_READY = """() => {
  const k = window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel;
  return !!k && k.is_connected() && !!k.widget_manager
    && document.querySelector('#kernel_indicator_icon.kernel_idle_icon') !== null;
}"""
# the nbextensions that draw the widgets: ipywidgets 7's and anywidget's
EXTENSIONS = {
    "jupyter-js-widgets/extension": "/nbextensions/jupyter-js-widgets/extension.js",
    "anywidget/extension": "/nbextensions/anywidget/extension.js",
}


@pytest.fixture
def classic(tmp_path):
    """A classic notebook server on 127.0.0.1 serving ``tmp_path / "work"`` (an explorer
    notebook in it); yields (base url, token)."""
    require_chromium()
    token, port = secrets.token_hex(16), free_port()
    env = jupyter_env(tmp_path)
    (tmp_path / "work").mkdir()
    nb = notebook([VERSION + SETUP, SHOW])
    (tmp_path / "work" / "explorer.ipynb").write_text(json.dumps(nb))
    cmd = [
        sys.executable, "-m", "notebook", "--no-browser", "--allow-root",
        f"--NotebookApp.token={token}", "--NotebookApp.port_retries=0",
        "--ip=127.0.0.1", f"--port={port}", f"--notebook-dir={tmp_path / 'work'}",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with serve(cmd, env, url, token, tmp_path / "notebook.log"):
        yield url, token


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200, url
        return r.read()


def test_explorer_in_the_classic_notebook(classic, tmp_path):
    from playwright.sync_api import sync_playwright

    url, token = classic
    # the server enables and serves both nbextensions
    config = json.loads(get(f"{url}/api/config/notebook?token={token}"))
    for name, path in EXTENSIONS.items():
        assert config.get("load_extensions", {}).get(name) is True, (name, config)
        assert get(f"{url}{path}?token={token}"), path

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium"), executable_path=str(CHROMIUM), headless=True,
            args=FLAGS, viewport={"width": 1400, "height": 2400},  # the whole explorer
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
            page.on(
                "console",
                lambda m: m.type == "error" and errors.append(f"console: {m.text} {m.location}"),
            )
            page.goto(f"{url}/notebooks/explorer.ipynb?token={token}")
            # One cell at a time: ipywidgets 7's manager asks the kernel for its widgets when
            # the page opens and, once answered, draws every widget output already shown
            # again, which blanks it. Run-all queues the explorer behind the slow setup cell,
            # before that question, so the explorer would be drawn first; run after the setup
            # cell, it comes after the answer (the kernel takes its messages in order).
            page.wait_for_function(KERNEL_READY, timeout=90_000)
            page.evaluate("Jupyter.notebook.execute_cells([0])")
            # the kernel is this venv's (ipywidgets 7.7)
            page.wait_for_selector("text=kernel ipywidgets 7.7.", timeout=120_000)
            page.wait_for_function(KERNEL_READY, timeout=60_000)
            page.evaluate("Jupyter.notebook.execute_cells([1])")

            # the explorer streams both columns to the end through ipywidgets 7's front end
            # (its jQuery UI sliders)
            page.wait_for_selector(STEERED, timeout=120_000)
            done = lambda label: page.get_attribute(label, "data-stop") in ("length", "eos")  # noqa: E731
            wait_until(lambda: done(DEFAULT) and steered_done(page), 120, "first run")
            assert page.inner_text(f"{DEFAULT} .sw-text").strip() and steered_text(page).strip()
            assert page.locator(".sw-explorer .ui-slider").count() > 0
            wait_until(lambda: state(page) == "done", 60, "status line: done")
            wait_until(lambda: page.locator(".sw-heatmap .sw-tok").count() > 0, 60, "heatmap")
            wait_until(lambda: page.locator(CHANGED_ROWS).count() > 0, 60, "what changed")

            # explain: effect colouring, a token's attribution table
            explain_a_token(page)

            # evaluate: one prompt over the default strength ladder fills the grid and the chart
            evaluate(page, ["I went to the"])

            page.locator(".output_area", has=page.locator(".sw-explorer")).screenshot(
                path=str(tmp_path / "explorer-ipywidgets7.png")
            )
            # no Python error in a cell, no JavaScript error in the page
            assert page.locator(".output_error").count() == 0, page.inner_text(".output_error")
            assert not errors, errors
        except Exception:
            page.screenshot(path=str(tmp_path / "failed.png"), full_page=True)
            print("page errors:", errors)  # shown with the failure
            raise
        finally:
            browser.close()
