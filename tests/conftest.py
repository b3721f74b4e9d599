"""Shared fixtures: one engine on the offline default model for the whole session, and one
compile of each other instruction-set build of the kernel."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]

# The files that take one test worker longest, longest first (each file's seconds in a
# fresh-clone run, docs/install.md#test-time). ``make test`` runs with ``--dist loadfile
# --no-loadscope-reorder``: a file stays on one worker, and files are handed out in this
# order, so the long ones start first and the many short files fill the two workers' tails
# evenly. By default xdist hands out the files with the most tests first, which left the
# soak, one long test, running alone at the end. Files not named here follow in the order
# they are collected. The order changes when tests run, never what they check.
LONGEST_FIRST = [
    "tests/test_concepts.py",
    "tests/test_properties.py",
    "tests/test_quantized.py",
    "tests/test_remote.py",
    "tests/test_wheel.py",
    "tests/test_soak.py",
    "tests/test_conditions.py",
    "tests/test_evaluate.py",
    "tests/test_browser.py",
    "tests/test_build_paths.py",
    "tests/test_kernel_threads.py",
    "notebooks/quickstart.ipynb",
    "tests/test_export.py",
    "tests/test_kquants.py",
    "tests/test_thread_counts.py",
    "tests/test_native_linear.py",
    "tests/test_explain.py",
    "notebooks/bring_your_own.ipynb",
    "tests/test_tl_runtime.py",
    "tests/test_explain_widgets.py",
    "tests/test_gpu_check.py",
    "tests/test_no_compiler.py",
    "tests/test_ragged.py",
    "tests/test_browser_explain.py",
]


def pytest_collection_modifyitems(config, items) -> None:
    """Files in ``LONGEST_FIRST`` order, each file's own tests in their written order (a
    notebook's cells run in order; the sort is stable)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def place(item) -> int:
        path = Path(str(item.path)).resolve()
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else ""
        return rank.get(name, len(rank))

    items.sort(key=place)


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
