"""A machine without a C++ compiler, end to end: the kernel cannot be built, so the default
engine loads the float32 copy of the model on oneDNN with one warning, steers it with exact
rows, and explains a token. The compiler is hidden (``CXX`` names a file that does not
exist) in fresh processes with a scratch build folder; a second start remembers the failed
build instead of trying again (it loads the engine on oneDNN and checks no more: the steering
and the explanation are the first start's, the same code once the build is known to fail)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from steer_widgets.runtime.model import default_model_dir
from steer_widgets.runtime.paths import cache_dir

SCRIPT = """
import json, resource, time, warnings
warnings.simplefilter("always")
import steer_widgets as sw
from steer_widgets.runtime import native, quant
from tests.test_build_paths import requests, rows_and_solo
start = time.perf_counter()
engine = sw.Engine.default()
load_s = time.perf_counter() - start
runtime = engine.model.runtime
assert native.extension() is None
kernels = {lin.kernel for layer in runtime.layers for lin in (layer.wqkv, layer.wo)}
rows = rows_and_solo(engine)
result = engine.steer(requests(engine.saes.sources())[0])
start = time.perf_counter()
why = engine.attribute(result, "STEERED", position=2)
attribute_s = time.perf_counter() - start
print(json.dumps({
    "quantized": isinstance(runtime.embed, quant.QuantLinear), "kernels": sorted(kernels),
    "rows": rows, "attribution_rows": len(why.rows), "attribution_features": len(why.features),
    "load_s": load_s, "attribute_s": attribute_s,
    "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""
AGAIN = """
import json, warnings
warnings.simplefilter("always")
import steer_widgets as sw
from steer_widgets.runtime import native, quant
engine = sw.Engine.default()
runtime = engine.model.runtime
assert native.extension() is None
kernels = {lin.kernel for layer in runtime.layers for lin in (layer.wqkv, layer.wo)}
print(json.dumps({"quantized": isinstance(runtime.embed, quant.QuantLinear),
                  "kernels": sorted(kernels)}))
"""


def start(tmp_path: Path, script: str) -> subprocess.CompletedProcess:
    root = Path(__file__).resolve().parents[1]
    env = dict(
        os.environ, STEER_WIDGETS_CACHE=str(tmp_path), CXX=str(tmp_path / "no-compiler"),
        PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]),
    )  # fmt: skip
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=1200,
        cwd=root,
    )  # fmt: skip


def test_without_a_compiler_the_default_engine_steers_exactly_and_explains(tmp_path):
    # the float32 copy and the GGUF's metadata are caches the product keeps: shared, not rebuilt
    (tmp_path / default_model_dir().name).symlink_to(default_model_dir())
    if (cache_dir() / "gguf").is_dir():
        (tmp_path / "gguf").symlink_to(cache_dir() / "gguf")
    runs = [start(tmp_path, SCRIPT), start(tmp_path, AGAIN)]
    for proc in runs:
        assert proc.returncode == 0, proc.stderr[-3000:]
        warned = [ln for ln in proc.stderr.splitlines() if 'kernel="native" unavailable' in ln]
        assert len(warned) == 1, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["quantized"] is False and got["kernels"] == ["onednn"]
    tried = ["compiling the native matrix kernel" in proc.stderr for proc in runs]
    assert tried == [True, False]  # the second start remembers the failed build
    got = json.loads(runs[0].stdout.strip().splitlines()[-1])
    for request in got["rows"]:
        assert request["together"] == request["solo"]  # rows equal solo rows
    assert got["attribution_rows"] == 1 and got["attribution_features"] > 0
    print({k: round(v, 2) for k, v in got.items() if isinstance(v, float)})


if __name__ == "__main__":
    pytest.main([__file__, "-s"])
