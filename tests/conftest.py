"""Shared fixtures: one engine on the offline default model for the whole session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def engine():
    import steer_widgets as sw

    return sw.Engine.default()


@pytest.fixture(scope="session")
def sources(engine):
    """The default SAEs shipped with the package (early, middle, late layers)."""
    names = engine.saes.sources()
    assert len(names) >= 3, f"default SAEs missing from the package: {names}"
    return names
