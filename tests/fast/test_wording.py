"""scripts/check_wording.py: a numbered work period fails the lint step; a Colab session does not.

The planted phrases are assembled from pieces so that this file itself passes the check.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "check_wording.py"
SESSION, WAVE = "ses" + "sion", "wa" + "ve"


def load_check():
    spec = importlib.util.spec_from_file_location("check_wording", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = load_check()


@pytest.mark.parametrize(
    "phrase",
    [
        f"Figures of the seventh {SESSION}, dev half.",
        f"a fifth-{SESSION} run",
        f"# measured in the 3rd {WAVE}",
        "(b) over all five SAEs since the " + "seventh, with",
        f"What moved in this {SESSION} is where the push goes.",
        f"as in the previous {SESSION}",
        f"No GPU was available to this project's {SESSION}s.",
        f"the sixth and second {SESSION}s' figures",
    ],
)
def test_a_numbered_work_period_fails_naming_file_and_line(tmp_path, capsys, phrase):
    page = tmp_path / "page.md"
    page.write_text(f"# A page\n\nA line that is fine.\n{phrase}\n", encoding="utf-8")
    assert check.main([str(page)]) == 1
    out = capsys.readouterr().out
    assert f"{page}:4: {phrase}" in out


@pytest.mark.parametrize(
    "text",
    [
        f"Upload the wheel to a Colab {SESSION}, then run the first cell.",
        f"# On Colab: install the wheel.\n# Upload it from dist/\n# to this {SESSION} first.",
        f"the kernel {SESSION} stays open; this {SESSION} of JupyterLab",
        f'@pytest.fixture(scope="{SESSION}")\n# one engine for this {SESSION} of pytest',
        "the first pass over the weights; in the first, GPT-2 came to 1.297",
        f"since the second run; an ocean {WAVE}; the {WAVE}s against the shore",
        "measured on 2026-12-01 (commit 3fea35f)",
    ],
)
def test_dates_and_notebook_sessions_pass(tmp_path, capsys, text):
    page = tmp_path / "page.md"
    page.write_text(text + "\n", encoding="utf-8")
    assert check.main([str(page)]) == 0
    assert capsys.readouterr().out == ""


def test_this_session_far_from_any_notebook_word_fails():
    lines = ["On Colab: install.", "one", "two", f"In this {SESSION} we tuned the layer."]
    assert check.scan_text("\n".join(lines)) == [(4, lines[3])]


def test_repository_files_skip_vendored_and_hidden_folders(tmp_path):
    for name in (
        "a.md",
        "steer_widgets/widgets/static/embed.js",
        ".venv/x.py",
        "b.png",
        "Makefile",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x", encoding="utf-8")
    found = {p.relative_to(tmp_path).as_posix() for p in check.repository_files(tmp_path)}
    assert found == {"a.md", "Makefile"}
