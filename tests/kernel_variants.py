"""The native kernel built for instruction sets other than this CPU's, each build compiled once
per test session and shared by every test that runs it.

Three test files run the other builds in fresh processes (``test_build_paths.py``,
``test_native_linear.py``, ``test_quantized.py``). Each compile takes 10-60 s; with a scratch
cache per test they compiled six builds of four code paths (AVX2 with F16C and the scalar one
twice each). Here every variant has one cache folder for the session: the first process that
loads it compiles it, later ones find it built (torch's extension loader runs ninja, which
finds nothing to do, as it does for this CPU's build in the user cache). One flag order per
variant, so a build is never redone for a reordered command line. The ``kernel_variants`` fixture in ``conftest.py`` hands out one
``KernelVariants`` for the session.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from steer_widgets.runtime import native
from steer_widgets.runtime.paths import cache_dir

ROOT = Path(__file__).resolve().parents[1]
CPU = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""

# What a CPU without AVX-512 compiles: AVX2, FMA and F16C's half conversions.
AVX2 = ("-march=x86-64-v3",)
# AVX2 and FMA without F16C: the half conversions in plain C++.
AVX2_NO_F16C = ("-mavx2", "-mfma")
# AVX2 with AVX-VNNI's 256-bit integer dot products (a CPU without AVX-512 that has them).
AVX2_VNNI = ("-march=x86-64-v3", "-mavxvnni")
# AVX-512 without VNNI: the float32 AVX-512 tiles, the int8 products' AVX2 path.
AVX512_NO_VNNI = ("-march=skylake-avx512",)
# The portable C++ code with FMA in hardware, as ARM has it.
PORTABLE = ("-march=x86-64", "-mfma")
# The portable C++ code, no FMA instruction at all.
SCALAR = ("-march=x86-64",)


def runs_here(*features: str) -> bool:
    """True when this CPU has every named feature (``avx2``, ``fma``, ``f16c``): a build
    for it can run here."""
    return all(f" {name} " in CPU for name in features)


class KernelVariants:
    """One scratch cache per variant under ``root``, for the processes that run it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def flags(variant: tuple[str, ...]) -> str:
        """``native.FLAGS`` with its ``-march`` replaced by ``variant``, as one argument (the
        scripts set ``native.FLAGS[:] = argv[1].split()``): one order for every test."""
        return " ".join([f for f in native.FLAGS if not f.startswith("-march")] + list(variant))

    def folder(self, variant: tuple[str, ...]) -> Path:
        return self.root / "_".join(f.lstrip("-").replace("=", "-") for f in variant)

    def env(self, variant: tuple[str, ...]) -> dict[str, str]:
        """The environment of a process that runs ``variant``'s build: its cache (the GGUF's
        converted metadata linked in, a cache the product keeps) and ``tests`` importable."""
        folder = self.folder(variant)
        folder.mkdir(parents=True, exist_ok=True)  # two test workers may ask at once
        if (cache_dir() / "gguf").is_dir() and not (folder / "gguf").is_symlink():
            with contextlib.suppress(FileExistsError):
                (folder / "gguf").symlink_to(cache_dir() / "gguf")
        path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
        return dict(os.environ, STEER_WIDGETS_CACHE=str(folder), PYTHONPATH=path)
