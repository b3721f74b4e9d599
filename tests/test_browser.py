"""The explorer in a real browser: JupyterLab + Debian Chromium driven by Python playwright.

Starts JupyterLab on 127.0.0.1 with every Jupyter/IPython/XDG folder inside ``tmp_path``,
opens a notebook that shows the explorer, runs it, moves a strength slider with the keyboard
and checks that the STEERED pane's text changes in the page. Saves a screenshot.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from chromium import CHROMIUM, FLAGS

REPO = Path(__file__).resolve().parents[1]
STEERED = '.sw-pane[data-label="STEERED"]'

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="no /usr/bin/chromium (apt-get install -y chromium chromium-driver)",
    ),
    pytest.mark.skipif(
        not any((REPO / "steer_widgets" / "saes").glob("*/cfg.json"))
        and not os.environ.get("SW_DEV_SAE"),
        reason="the default engine has no SAEs yet (steer_widgets/saes/ not trained)",
    ),
]

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


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on 127.0.0.1 serving ``tmp_path``; yields (base url, token)."""
    token, port = secrets.token_hex(16), free_port()
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
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "explorer.ipynb").write_text(json.dumps(notebook([SETUP, SHOW])))
    cmd = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
        f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0",
        "--ip=127.0.0.1", f"--port={port}", "--LabApp.expose_app_in_browser=True",
        f"--ServerApp.root_dir={tmp_path / 'work'}",
    ]  # fmt: skip
    log = open(tmp_path / "lab.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, (tmp_path / "lab.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "JupyterLab did not start in 60 s"
                time.sleep(0.5)
        yield url, token
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


KERNEL_READY = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.connectionStatus === 'connected' && k.status === 'idle';
}"""


def steered_text(page) -> str:
    return page.inner_text(f"{STEERED} .sw-text")


def steered_done(page) -> bool:
    head = page.inner_text(f"{STEERED} .sw-head")
    return "(length)" in head or "(eos)" in head


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


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
            before = steered_text(page)

            handle = page.locator(".sw-strength .noUi-handle").first
            handle.focus()
            for _ in range(3):
                page.keyboard.press("PageUp")  # 5 steps each
            page.keyboard.press("End")  # to +300
            wait_until(lambda: steered_done(page) and steered_text(page) != before, 120, "rerun")
            after = steered_text(page)
            assert after and after != before
            heat = page.locator(".sw-heatmap .sw-tok")  # drawn on a thread after the text
            wait_until(lambda: heat.count() > 0, 60, "heatmap")
            shot = tmp_path / "explorer.png"
            page.screenshot(path=str(tmp_path / "lab.png"), full_page=True)
            page.locator(".jp-OutputArea-output", has=page.locator(STEERED)).screenshot(
                path=str(shot)
            )
            assert shot.stat().st_size > 10_000
            (REPO / "docs").mkdir(exist_ok=True)
            shutil.copy(shot, REPO / "docs" / "explorer.png")
        finally:
            browser.close()
