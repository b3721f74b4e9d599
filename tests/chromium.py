"""Debian's Chromium for the browser tests: where it is and the flags that work offline."""

from pathlib import Path

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
