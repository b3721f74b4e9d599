"""Debian's Chromium for the browser tests: where it is and the flags that work offline."""

import shutil
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium keeps trying hosts this machine cannot
# reach; playwright adds --headless itself when headless=True.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def require_chromium() -> None:
    """Skip where Chromium cannot be had (no apt-get); fail loudly where ``make install``
    could have installed it and did not, so a broken install step never reads as a pass."""
    if CHROMIUM.exists():
        return
    if shutil.which("apt-get"):
        pytest.fail(f"{CHROMIUM} is missing on a machine with apt-get: `make install` failed")
    pytest.skip(f"no {CHROMIUM} and no apt-get to install it")
