"""Shared fixtures: one engine on the offline default model for the whole session."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def engine():
    import steer_widgets as sw

    return sw.Engine.default()
