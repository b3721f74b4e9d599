"""The oldest Python pyproject admits, read from the package's source.

CI runs Python 3.11 and 3.10 cannot be installed on these machines, so a 3.11-only name
(``tomllib``, ``typing.Self``, ``ExceptionGroup``, ...) would pass every other test and break
a 3.10 user at import. vermin reads every module for syntax and standard-library names newer
than ``requires-python``. The one 3.10 difference in behaviour we know of is tested where it
lives: ``concurrent.futures.TimeoutError`` is not the builtin before 3.11 (``test_worker.py``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def floor() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    return re.search(r'requires-python = ">=(\d+\.\d+)"', text).group(1)


def vermin(target: str, path: Path) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "vermin"  # the console script: no ``python -m``
    cmd = [str(script), f"-t={target}-", "--violations", "--no-tips", str(path)]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_the_package_uses_nothing_newer_than_the_python_it_admits():
    assert floor() == "3.10"
    out = vermin(floor(), ROOT / "steer_widgets")
    assert out.returncode == 0, out.stdout[-3000:]


def test_the_check_finds_a_name_newer_than_the_floor(tmp_path):
    (tmp_path / "newer.py").write_text("import tomllib\nfrom typing import Self\n")
    out = vermin(floor(), tmp_path)
    assert out.returncode != 0 and "tomllib" in out.stdout, out.stdout
