"""The wheel installs anywhere: build it from a copy of the source, install it into a clean
venv (no source tree, no editable install on its path) and run the quickstart notebook there.
That proves the package data ships: SAEs, feature indexes, concept data, widget JavaScript,
py.typed. The notebook is the quickstart's first two cells (the Colab install cell, the
default engine), one explorer run with a feature and the checks below: the whole quickstart
runs from the source tree under nbval, and running it again here read the same files twice."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import version
from pathlib import Path

import pytest

from steer_widgets.runtime import native

ROOT = Path(__file__).resolve().parents[1]
WHEEL = f"steer_widgets-{version('steer_widgets')}-py3-none-any.whl"
DATA = [
    "steer_widgets/py.typed",
    "steer_widgets/data/saes/quality.json",
    "steer_widgets/data/neutral.json",
    "steer_widgets/data/contrast.json",
    "steer_widgets/data/eval_prompts.json",
    "steer_widgets/data/saes/10-smollm2-res-4k/cfg.json",
    "steer_widgets/data/saes/10-smollm2-res-4k/sae_weights.safetensors",
    "steer_widgets/data/saes/10-smollm2-res-4k/feature_index.json.gz",
    "steer_widgets/widgets/completions.js",
    "steer_widgets/widgets/heatmap.js",
    "steer_widgets/widgets/tip.js",
    "steer_widgets/widgets/presets/music-weekend.json",
    "steer_widgets/widgets/static/embed-amd.js",
    "steer_widgets/widgets/static/LICENSES.txt",
    # every source and header the kernel builds from (the installed package compiles it)
    *(f"steer_widgets/runtime/csrc/{p.name}" for p in (*native.SOURCES, *native.HEADERS)),
]
EXPLORE = """
ex = sw.Explorer(prompt="Give me some advice for a good morning.", chat=True,
                 n_completion_tokens=8, temperature=0)
ex.add_feature(source, 11, 80.0)
ex.wait()
assert ex.status.startswith("done") and ex.outputs["STEERED"].token_ids, ex.status
"""
CHECK_INSTALLED = """
import sys, importlib.resources as res, steer_widgets as sw
from pathlib import Path
pkg = Path(sw.__file__).parent
assert pkg.is_relative_to(Path(sys.prefix)), (pkg, sys.prefix)
assert all(Path(engine.saes.config(s).folder).is_relative_to(pkg) for s in engine.saes.sources())
assert engine.feature_index(source)[0].contexts, "the shipped index has contexts"
assert (res.files("steer_widgets") / "widgets" / "heatmap.js").is_file()
print("installed:", sys.prefix, sw.__version__)
"""


def clean_env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "JUPYTER"))}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONNOUSERSITE": "1"}
    env |= {"JUPYTER_DATA_DIR": str(tmp / "jupyter"), "JUPYTER_CONFIG_DIR": str(tmp / "jupyter")}
    return env | {"IPYTHONDIR": str(tmp / "ipython"), "MPLCONFIGDIR": str(tmp / "mpl")}


def copy_source(dest: Path) -> None:
    """What git tracks (and new files it does not ignore): never build inside the work tree."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
        text=True, check=True,
    ).stdout.split("\n")  # fmt: skip
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)


@pytest.mark.slow
def test_wheel_installs_into_a_clean_venv_and_runs_the_quickstart(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout to copy the source from")
    src, dist, venv = tmp_path / "src", tmp_path / "dist", tmp_path / "venv"
    copy_source(src)
    env = clean_env(tmp_path)
    build = [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(src)]
    subprocess.run(build, check=True, env=env, cwd=tmp_path, capture_output=True)
    built = sorted(p.name for p in dist.iterdir())
    assert WHEEL in built and any(n.endswith(".tar.gz") for n in built), built
    assert set(DATA) <= set(zipfile.ZipFile(dist / WHEEL).namelist())

    # A venv that sees the installed dependencies (torch pinned, no download) through a plain
    # path entry, not the editable install (whose finder lives in a .pth file not run here).
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout.strip()  # fmt: skip
    Path(site, "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps"]
    subprocess.run([*pip, "--no-index", str(dist / WHEEL)], check=True, env=env, cwd=tmp_path)

    notebook = tmp_path / "quickstart.ipynb"
    shutil.copy(ROOT / "notebooks" / "quickstart.ipynb", notebook)
    runner = f"""
import nbformat, nbclient
nb = nbformat.read({str(notebook)!r}, as_version=4)
code = [c for c in nb.cells if c.cell_type == "code"][:2]  # the install cell, the engine
nb.cells = code + [nbformat.v4.new_code_cell(s) for s in ({EXPLORE!r}, {CHECK_INSTALLED!r})]
nbclient.NotebookClient(nb, timeout=600, kernel_name="python3").execute()
print(nb.cells[-1].outputs[0]["text"], end="")
"""
    out = subprocess.run(
        [python, "-c", runner], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"installed: {venv}"), out.stdout
    assert not list(ROOT.glob("build")) and not list(ROOT.glob("dist"))  # nothing in the tree
