"""Where steer_widgets keeps files it builds: converted models and downloaded SAEs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$STEER_WIDGETS_CACHE or ~/.cache/steer_widgets (read at every call, so tests can move it)."""
    root = os.environ.get("STEER_WIDGETS_CACHE") or Path.home() / ".cache" / "steer_widgets"
    return Path(root)
