"""The package version, read once from the installed package's metadata (pyproject.toml)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("steer_widgets")
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
