"""Debian's Chromium for the browser tests: where it is and the flags that work offline."""

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


@contextmanager
def offline_page(path: Path) -> Iterator[tuple]:
    """An exported page opened in headless Chromium that may read only file:// URLs: yields
    ``(page, blocked, errors)``, the refused URLs and the page's JavaScript errors."""
    from playwright.sync_api import sync_playwright

    blocked: list[str] = []
    errors: list[str] = []

    def only_files(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_playwright() as p, tempfile.TemporaryDirectory() as profile:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), headless=True, args=FLAGS
        )
        try:
            page = ctx.new_page()
            page.route("**/*", only_files)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            yield page, blocked, errors
        finally:
            ctx.close()
