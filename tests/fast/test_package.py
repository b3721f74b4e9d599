"""Package surface without a model: the version comes from metadata, widgets load lazily."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import steer_widgets as sw


def test_version_is_the_package_metadata():
    assert sw.__version__ == version("steer_widgets")


def test_engine_users_do_not_import_widget_libraries():
    code = (
        "import sys, steer_widgets as sw\n"
        "assert 'ipywidgets' not in sys.modules and 'anywidget' not in sys.modules\n"
        "assert sw.Explorer.__name__ == 'Explorer' and 'ipywidgets' in sys.modules\n"
    )
    root = Path(sw.__file__).parent.parent
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root)


def test_typed_marker_ships():
    assert (Path(sw.__file__).parent / "py.typed").is_file()
