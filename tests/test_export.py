"""Static HTML export: run a small explorer notebook, export it, open it offline in Chromium.

The exported page must draw the explorer's completions and its heatmap from the saved widget
state alone: no kernel, and every request that is not a file:// read is blocked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from chromium import offline_page, require_chromium
from disk_full import fill_disk_halfway

from steer_widgets import export as sw_export
from steer_widgets.errors import RequestError

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "The capital of France is"

SETUP = """\
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import steer_widgets as sw

engine = sw.Engine.default()
if not engine.saes.sources() and os.environ.get("SW_DEV_SAE"):
    engine.saes.add(os.environ["SW_DEV_SAE"], "10-dev")
source = engine.saes.sources()[0]
# the feature that fires most on the prompt, so the heatmap has color to draw
index = engine.top_features(PROMPT, source, n=1).indices[0]
"""

EXPLORER = """\
ex = sw.Explorer(
    engine, prompt=PROMPT, n_completion_tokens=8, temperature=0, features=[(source, index, 60.0)]
)
ex
"""


# a small evaluation in the same explorer: its chart and grid must render from disk too
EVALUATE = """\
ex.set_strength(0, 0.0)  # the feature stays for the heatmap; the concept alone steers
ex.add_concept("ocean", engine.concept_vector("ocean"))
chats = [[{"role": "user", "content": c}] for c in ("Write a short story.", "What should I do?")]
ex.evaluate(["I went to the", "Let me tell you about", *chats], strengths=(0, 0.5, 1, 1.5, 2),
            judge=["ocean"])
"""


def _have_saes() -> bool:
    return bool(os.environ.get("SW_DEV_SAE")) or any(
        (ROOT / "steer_widgets" / "data" / "saes").glob("*/cfg.json")
    )


needs_saes = pytest.mark.skipif(
    not _have_saes(),
    reason="no SAEs yet: steer_widgets/data/saes/ not trained and SW_DEV_SAE unset",
)


@pytest.fixture(scope="module")
def notebook(tmp_path_factory) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Explorer export"),
        nbformat.v4.new_code_cell(f"PROMPT = {PROMPT!r}\n" + SETUP),
        nbformat.v4.new_code_cell(EXPLORER),
        nbformat.v4.new_code_cell(EVALUATE),
        # no ex.wait() here on purpose: the exporter must wait for the background run itself
    ]
    path = tmp_path_factory.mktemp("nb") / "explorer.ipynb"
    nbformat.write(nb, str(path))
    return path


@pytest.fixture(scope="module")
def exported(notebook, tmp_path_factory) -> Path:
    """``python -m steer_widgets export`` run as a user would run it."""
    out = tmp_path_factory.mktemp("html") / "explorer.html"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "steer_widgets", "export", str(notebook), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"wrote {out}" in proc.stdout
    return out


def test_inline_scripts_cannot_close_their_tag():
    js = 'a = "</script><!-- x"; b = "</SCRIPT>"'
    safe = sw_export._inline_script(js)
    assert "</script" not in safe.lower() and "<!--" not in safe
    assert safe == 'a = "<\\/script><\\!-- x"; b = "<\\/SCRIPT>"'  # same JS string values


def test_anywidget_front_end_becomes_a_named_amd_module():
    amd = sw_export.anywidget_amd()
    assert 'define("anywidget", ["@jupyter-widgets/base"]' in amd
    assert amd.count("define(") == 1


def test_cli_reports_a_missing_notebook(tmp_path):
    from steer_widgets.__main__ import main

    assert main(["export", str(tmp_path / "nope.ipynb"), str(tmp_path / "out.html")]) == 1
    assert not (tmp_path / "out.html").exists()


@needs_saes
def test_export_is_self_contained(exported):
    page = exported.read_text(encoding="utf-8")
    # no script or stylesheet is fetched from anywhere
    assert not re.search(r"<script[^>]*\bsrc=", page), "external script left in the page"
    assert not re.search(r"<link[^>]*\bhref=\"https?:", page), "external stylesheet"
    assert "cdn.jsdelivr.net/npm/@jupyter-widgets" not in page.split("libembed-amd")[0]
    # the renderer, require.js, anywidget and both widgets' ES modules are inline
    assert 'define("@jupyter-widgets/html-manager/dist/libembed-amd"' in page
    assert 'define("anywidget"' in page and "RequireJS" in page
    assert "sw-heatmap" in page and "sw-completions" in page
    assert "application/vnd.jupyter.widget-state+json" in page
    assert "application/vnd.jupyter.widget-view+json" in page
    # the exporter's own state-dump cell does not appear in the page
    assert "dump_kernel_state" not in page


@needs_saes
@pytest.mark.browser
def test_exported_explorer_renders_offline_in_chromium(exported):
    pytest.importorskip("playwright.sync_api")
    require_chromium()
    with offline_page(exported) as (page, blocked, errors):
        page.wait_for_selector(".sw-heatmap .sw-tok", timeout=60_000)
        page.wait_for_selector(".sw-completions .sw-pane", timeout=60_000)
        page.wait_for_selector(".sw-eval-grid .sw-eval-cell", timeout=60_000)
        drawn = page.evaluate(
            """() => {
              const toks = [...document.querySelectorAll('.sw-heatmap .sw-tok')];
              return {
                rows: [...document.querySelectorAll('.sw-heatmap .sw-row')]
                  .map(r => r.dataset.label),
                tokens: toks.map(t => t.textContent),
                colored: toks.filter(t => t.style.background.startsWith('rgba')).length,
                title: document.querySelector('.sw-heatmap .sw-title').textContent,
                panes: Object.fromEntries(
                  [...document.querySelectorAll('.sw-completions .sw-pane')]
                    .map(p => [p.dataset.label, p.querySelector('.sw-text').textContent])),
                sliders: document.querySelectorAll('.widget-slider').length,
                points: document.querySelectorAll('.sw-eval-chart svg .sw-point').length,
                cells: [...document.querySelectorAll('.sw-eval-grid .sw-eval-cell')]
                  .map(c => c.className),
                evalState: document.querySelector('.sw-eval .sw-badge').textContent,
              };
            }"""
        )
        shot = Path(tempfile.gettempdir()) / "sw-explorer-evaluate.png"
        page.locator(".sw-eval").screenshot(path=str(shot))
        if os.environ.get("SW_SCREENSHOT_DIR"):  # make screenshots: the README's image
            shutil.copy(shot, Path(os.environ["SW_SCREENSHOT_DIR"]) / "explorer-evaluate.png")
        shot.unlink()

    assert not errors, errors
    assert drawn["rows"] == ["prompt", "DEFAULT", "STEERED"], drawn
    assert "France" in "".join(drawn["tokens"])  # the prompt row is there, token by token
    assert drawn["colored"] >= 1, drawn  # the feature that fires most on the prompt is colored
    assert drawn["title"].startswith("activation of ")
    # the panes show exactly the completions the kernel computed (the saved widget state)
    assert drawn["panes"] == saved_pane_texts(exported.read_text(encoding="utf-8"))
    assert all(text.strip() for text in drawn["panes"].values()), drawn["panes"]
    assert drawn["sliders"] >= 1  # the standard ipywidgets render too (strength slider...)
    # the evaluate panel: chart (one point per strength) and a finished 4 x 5 grid
    assert drawn["points"] == 5 and drawn["evalState"] == "done", drawn
    assert len(drawn["cells"]) == 20, drawn["cells"]
    assert any("sw-eval-hit" in c for c in drawn["cells"]), drawn["cells"]
    assert all("sw-eval-hit" in c or "sw-eval-miss" in c for c in drawn["cells"]), drawn["cells"]
    # nothing needed the network (a blocked request would also show up as a missing piece)
    assert blocked == [], blocked


def saved_pane_texts(page: str) -> dict[str, str]:
    """Pane texts as the kernel left them, read from the page's widget-state script."""
    found = re.search(
        r'<script type="application/vnd.jupyter.widget-state\+json">(.*?)</script>', page, re.S
    )
    state = json.loads(found.group(1))["state"]
    panes = [m["state"]["panes"] for m in state.values() if "panes" in m["state"]]
    assert len(panes) == 1, "expected one completions widget"
    return {p["label"]: "".join(p["tokens"]) for p in panes[0]}


def test_export_without_running_uses_stored_state(tmp_path):
    """``--no-execute`` renders what the notebook already holds (here: no widgets at all)."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Notes only\n\nNothing to run.")]
    src = tmp_path / "notes.ipynb"
    nbformat.write(nb, str(src))
    out = sw_export.export(src, tmp_path / "notes.html", run=False)
    page = out.read_text(encoding="utf-8")
    assert "Notes only" in page and "RequireJS" in page
    assert "libembed-amd" not in page  # no widget state: the renderer is not inlined


def test_export_paths_start_at_the_home_folder(tmp_path, monkeypatch):
    """``~`` is the home folder for the notebook and the page, as for every file the package
    takes (``files.user_path``): the export made a folder named ``~`` in the working one."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Notes at home")]
    nbformat.write(nb, str(home / "notes.ipynb"))
    out = sw_export.export("~/notes.ipynb", "~/pages/notes.html", run=False)
    assert out == home / "pages" / "notes.html"
    assert "Notes at home" in out.read_text(encoding="utf-8")
    assert list(cwd.iterdir()) == []
    with pytest.raises(RequestError) as err:  # no path: refused by name, as a view's is
        sw_export.export("~/notes.ipynb", 7, run=False)
    assert err.value.field == "out"


def test_an_export_cut_short_is_named_and_leaves_the_old_page(tmp_path, monkeypatch):
    """A full disk part way through the page: ``ExportError`` naming it, and the page
    exported before keeps its bytes (it was truncated and left half written)."""

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# Notes only")]
    src, out = tmp_path / "notes.ipynb", tmp_path / "notes.html"
    nbformat.write(nb, str(src))
    out.write_text("the page before")

    fill_disk_halfway(monkeypatch)
    with pytest.raises(sw_export.ExportError, match="No space left") as err:
        sw_export.export(src, out, run=False)
    assert str(out) in str(err.value)
    monkeypatch.undo()
    assert out.read_text() == "the page before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.html", "notes.ipynb"]


CONDITIONAL = """\
ex = sw.Explorer(engine, prompt="My favourite thing to do on a Sunday is", n_completion_tokens=10,
                 temperature=0, features=[("10-smollm2-res-4k", 100, 30.0)], live=False)
ex.set(when=sw.When(sw.Feature("5-smollm2-res-4k", 3187), above=4.0, below=15.0))
ex.view.heat_feature.value = "condition"
ex.run()
ex.wait()
gated = sum(ex.outputs["STEERED"].gated_tokens())
ex
"""


@needs_saes
def test_a_conditional_run_exports_with_its_gate_marks_and_bounds(tmp_path):
    """The page of a conditional run shows, from the saved state alone, the tokens written
    while the gate held and the condition's heatmap with a line at each bound of its band,
    outlining exactly the tokens between them."""
    pytest.importorskip("playwright.sync_api")
    require_chromium()
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(f"PROMPT = {PROMPT!r}\n" + SETUP),
        nbformat.v4.new_code_cell(CONDITIONAL),
    ]
    src = tmp_path / "conditional.ipynb"
    nbformat.write(nb, str(src))
    out = sw_export.export(src, tmp_path / "conditional.html")
    with offline_page(out) as (page, blocked, errors):
        page.wait_for_selector(".sw-heatmap .sw-threshold", timeout=60_000)
        drawn = page.evaluate(
            """() => {
              const toks = [...document.querySelectorAll('.sw-heatmap .sw-tok')];
              return {
                lines: document.querySelectorAll('.sw-heatmap .sw-threshold').length,
                title: document.querySelector('.sw-heatmap .sw-title').textContent,
                values: toks.map(t => Number(t.dataset.value)),
                over: toks.map(t => t.classList.contains('sw-over')),
                gated: document.querySelectorAll('.sw-completions .sw-gated').length,
              };
            }"""
        )
    assert not errors and blocked == [], (errors, blocked)
    assert drawn["lines"] == 2 and "> 4.000 and < 15.000" in drawn["title"], drawn["title"]
    assert drawn["over"] == [4.0 < v < 15.0 for v in drawn["values"]]
    assert any(drawn["over"]) and not all(drawn["over"])
    assert drawn["gated"] >= 1
