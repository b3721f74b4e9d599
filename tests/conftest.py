"""Shared fixtures: one engine on the offline default model for the whole session, and one
compile of each other instruction-set build of the kernel."""

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


@pytest.fixture(scope="session")
def kernel_variants(tmp_path_factory):
    """The kernel's other instruction-set builds, each compiled once for the whole session
    however many test files run it (``kernel_variants.py``). Under pytest-xdist every worker
    shares one folder beside their own (the build's lock file makes a second compile of a
    variant wait for the first and find it built)."""
    from kernel_variants import KernelVariants

    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "kernel-variants"
        root.mkdir(exist_ok=True)
        return KernelVariants(root)
    return KernelVariants(tmp_path_factory.mktemp("kernel-variants"))
