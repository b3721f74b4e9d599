"""The explorer on a model and SAE loaded by name (GPT-2 small with ``gpt2-small-res-jb``,
from the tests' hub cache), exported to static HTML as a user would and opened offline in
Chromium: its heatmap, completions and the SAE's feature rows draw from the saved state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from chromium import offline_page, require_chromium

ROOT = Path(__file__).resolve().parents[1]
CELLS = [
    """\
import steer_widgets as sw

engine = sw.Engine("gpt2-small", saes={"8-res-jb": "gpt2-small-res-jb/blocks.8.hook_resid_pre"})
assert type(engine.model.runtime).__name__ == "Transformer"
prompt = "The quick brown fox jumps over the lazy dog"
index = engine.top_features(prompt, "8-res-jb", n=1).indices[0]  # colour for the heatmap
""",
    """\
ex = sw.Explorer(
    engine, prompt=prompt, n_completion_tokens=6, temperature=0,
    features=[("8-res-jb", index, 40.0)],
)
ex
""",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """``python -m steer_widgets export`` with ``HF_HUB_CACHE`` on the tests' hub cache."""
    from hub_cache import build

    root = tmp_path_factory.mktemp("hub-browser")
    cache = build(root)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in CELLS]
    path = root / "by_name.ipynb"
    nbformat.write(nb, str(path))
    out = root / "by_name.html"
    sw_cache = root / "sw-cache"  # not "steer_widgets": the kernel runs beside it
    sw_cache.mkdir()
    from steer_widgets.runtime.paths import cache_dir

    if (cache_dir() / "ext").exists():  # the compiled kernel, read only: not rebuilt here
        (sw_cache / "ext").symlink_to(cache_dir() / "ext")
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "STEER_WIDGETS_CACHE": str(sw_cache),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "steer_widgets", "export", str(path), str(out)],
        capture_output=True, text=True, env=env, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (sw_cache / "saes" / "gpt2-small-res-jb").is_dir()
    return out


@pytest.mark.browser
def test_explorer_on_a_release_sae_renders_offline(exported):
    pytest.importorskip("playwright.sync_api")
    require_chromium()
    with offline_page(exported) as (page, blocked, errors):
        page.wait_for_selector(".sw-heatmap .sw-tok", timeout=60_000)
        page.wait_for_selector(".sw-completions .sw-pane", timeout=60_000)
        drawn = page.evaluate(
            """() => ({
              rows: [...document.querySelectorAll('.sw-heatmap .sw-row')]
                .map(r => r.dataset.label),
              tokens: [...document.querySelectorAll('.sw-heatmap .sw-tok')]
                .map(t => t.textContent).join(''),
              title: document.querySelector('.sw-heatmap .sw-title').textContent,
              panes: [...document.querySelectorAll('.sw-completions .sw-pane')]
                .map(p => p.dataset.label),
              text: document.body.innerText,
            })"""
        )
    assert not errors, errors
    assert drawn["rows"] == ["prompt", "DEFAULT", "STEERED"], drawn["rows"]
    assert "quick brown fox" in drawn["tokens"]
    assert "8-res-jb" in drawn["title"], drawn["title"]
    assert drawn["panes"] == ["DEFAULT", "STEERED"]
    assert blocked == [], blocked
