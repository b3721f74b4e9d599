"""Why the text changed, in a real browser (JupyterLab + Chromium, as ``test_browser.py``):
tick the effect colouring, hover a coloured token, click it for its attribution table, and
open a "what changed" feature in the heatmap."""

from __future__ import annotations

import json
import re

import pytest
from chromium import CHROMIUM, FLAGS
from test_browser import (
    KERNEL_READY,
    SETUP,
    STEERED,
    chromium_present,
    hover_until_tip,
    lab,
    notebook,
    steered_done,
    wait_until,
)

# missing Chromium: a failure where apt-get could have installed it, else a skip
pytestmark = [pytest.mark.browser]
__all__ = ["chromium_present", "lab"]  # fixtures shared with test_browser.py
CHANGED_ROWS = ".sw-heatmap .sw-changed-row"  # "what changed", beside the heatmap

SHOW = """\
ex = sw.Explorer(prompt="I think that", n_completion_tokens=8, temperature=0,
                 features=[("12-smollm2-res-4k", 100)])
ex
"""


def explain_a_token(page) -> None:
    """Tick the effect colouring, hover a coloured STEERED token (the tip says what steering
    did to it) and click it: its attribution table opens, one row for the one steering."""
    page.locator(".sw-completions .sw-effect-toggle input").check()
    coloured = page.locator(f"{STEERED} .sw-text span[data-effect]")
    wait_until(lambda: coloured.count() > 0, 60, "effect colouring")
    words = coloured.filter(has_text=re.compile(r"\w"))
    tip = page.locator(".sw-completions .sw-tip")
    hover_until_tip(page, words, tip, "effect tip")
    assert re.search(r"steering (raised|lowered|left) this token", tip.inner_text())

    words.first.click()
    table = page.locator(".sw-completions .sw-attribution table")
    wait_until(lambda: table.count() > 0, 60, "attribution table")
    assert page.locator(".sw-att-row").count() == 1  # one steering row
    assert page.locator(".sw-att-feature").count() > 0
    assert "why" in page.inner_text(".sw-att-head")


def test_click_a_token_for_its_attribution(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    url, token = lab
    (tmp_path / "work" / "explain.ipynb").write_text(json.dumps(notebook([SETUP, SHOW])))
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium"), executable_path=str(CHROMIUM), headless=True,
            args=FLAGS, viewport={"width": 1400, "height": 1400},
        )  # fmt: skip
        try:
            page = browser.new_page()
            page.goto(f"{url}/lab/tree/explain.ipynb?token={token}")
            page.wait_for_function(KERNEL_READY, timeout=90_000)
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.wait_for_selector(STEERED, timeout=120_000)
            wait_until(lambda: steered_done(page), 120, "first run")

            # "what changed" is listed beside the heatmap
            changed = page.locator(CHANGED_ROWS)
            wait_until(lambda: changed.count() > 0, 60, "what changed")

            # the effect colouring: tokens get an effect and the hover says what it did;
            # clicking it opens its attribution table
            explain_a_token(page)

            # a "what changed" row opens that feature's heatmap
            index = re.match(r"#(\d+)", changed.nth(1).inner_text()).group(1)
            changed.nth(1).click()
            title = page.locator(".sw-heatmap .sw-title").first
            wait_until(lambda: f"#{index}" in title.inner_text(), 60, "picked feature heatmap")
        finally:
            browser.close()
