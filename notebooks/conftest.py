"""nbval runs the example notebooks (``pytest notebooks --nbval-lax``). The network cells of
``bring_your_own.ipynb`` run too, unchanged, against a hub cache written for the purpose
(``tests/hub_cache.py``: tiny models under the real repo ids, SAE files in each release's own
layout): its kernel starts with ``HF_HUB_CACHE`` pointing there, ``HF_HUB_OFFLINE=1`` and a
temporary steer_widgets cache, so nothing is downloaded and nothing lands in the user's
caches. ``STEER_WIDGETS_NOTEBOOK_HUB=network`` leaves the environment alone (a machine with
network access and the real models).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import pytest

NOTEBOOK = "bring_your_own.ipynb"
TESTS = Path(__file__).resolve().parents[1] / "tests"
# Read-only things of the user cache the kernel may reuse: the converted default model and
# the compiled kernel (both are rebuilt, slowly, where missing).
SHARED = ("SmolLM2-135M-Instruct", "ext")
_env: dict[str, str] = {}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    """nbval starts the notebook's kernel in its first cell's setup: start it in the hub
    cache's environment, then put the test process' own environment back."""
    if (
        Path(str(item.fspath)).name != NOTEBOOK
        or os.environ.get("STEER_WIDGETS_NOTEBOOK_HUB") == "network"
    ):
        yield
        return
    env = _environment(item.config)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _environment(config) -> dict[str, str]:
    if not _env:
        root = Path(tempfile.mkdtemp(prefix="sw-notebook-hub-"))
        config.add_cleanup(lambda: shutil.rmtree(root, ignore_errors=True))
        spec = importlib.util.spec_from_file_location("hub_cache", TESTS / "hub_cache.py")
        hub_cache = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(hub_cache)
        cache = hub_cache.build(root)
        sw_cache = root / "steer_widgets"
        sw_cache.mkdir()
        from steer_widgets.runtime.paths import cache_dir

        for name in SHARED:
            if (cache_dir() / name).exists():
                (sw_cache / name).symlink_to(cache_dir() / name)
        _env.update(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1", STEER_WIDGETS_CACHE=str(sw_cache))
    return _env
