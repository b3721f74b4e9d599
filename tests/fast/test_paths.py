"""A user's path means the same in every call that takes one (``files.user_path``): ``~`` is
the home folder for vector files, saved views and the export alike (issue 67, item 12: views
and the export wrote into a folder named ``~``), and a value that is no path is refused by
name before any file is touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from unittest.mock import MagicMock

import pytest
import torch

import steer_widgets as sw
from steer_widgets.files import user_path
from steer_widgets.widgets import views


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """``HOME`` in a fresh folder and the working folder in another: a path kept as typed
    would land in the second, as a folder named ``~``."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    yield home
    assert list(cwd.iterdir()) == [], "something was written into the working folder"


def test_a_user_path_expands_the_home_folder(home):
    assert user_path("~/a/v.json") == home / "a" / "v.json"
    assert user_path(Path("~")) == home
    assert user_path("x/~/v.json") == Path("x/~/v.json")  # only a leading ~ is a home


@pytest.mark.parametrize("value", [None, 7, True, b"v.json", "", "  ", "v\x00.json", "\ud800"])
def test_what_is_no_path_is_refused_by_name(value):
    with pytest.raises(sw.RequestError, match="must be a file path") as err:
        user_path(value, "out")
    assert err.value.field == "out"
    with pytest.raises(sw.VectorError) as named:  # the caller's own error family
        user_path(value, "path", sw.VectorError)
    assert named.value.source == "path"


def test_a_home_that_does_not_exist_is_refused_by_name():
    with pytest.raises(sw.RequestError, match="no home folder for '~nosuchuser-sw'") as err:
        user_path("~nosuchuser-sw/v.json")
    assert err.value.field == "path"


def test_vector_files_save_and_load_under_the_home_folder(home):
    vector = sw.Vector(torch.randn(8, generator=torch.Generator().manual_seed(0)),
                       "blocks.1.hook_resid_post")  # fmt: skip
    assert sw.save_vectors([vector], "~/v.gguf") == home / "v.gguf"
    (back,) = sw.load_vectors("~/v.gguf")
    assert torch.equal(back.vector, vector.vector)


def explorer(prompt: str) -> SimpleNamespace:
    """What ``save_view`` reads of an explorer, without a model."""
    req = sw.SteerRequest(prompt)
    return SimpleNamespace(
        request=lambda: req,
        features_ui=SimpleNamespace(rows=[]),
        condition_row=SimpleNamespace(state=lambda: None),
        view=SimpleNamespace(
            mode=SimpleNamespace(value="text"), prompt=SimpleNamespace(value=prompt)
        ),
        live=SimpleNamespace(value=False),
        outputs={},
        request_done=None,
        engine=SimpleNamespace(products="float32"),
    )


def test_a_view_saves_and_loads_under_the_home_folder(home):
    saved = sw.Explorer.save_view(explorer("Hello"), "~/v.json")
    assert json.loads((home / "v.json").read_text()) == saved
    assert views.read_view("~/v.json") == saved
    loaded = MagicMock(features_ui=SimpleNamespace(rows=[]), engine=explorer("").engine)
    again = sw.Explorer.load_view.__func__(lambda engine, **kw: loaded, "~/v.json")
    assert again is loaded and loaded.run.called
    loaded.set.assert_any_call(prompt="Hello", chat=False, sweep=())


def test_a_view_path_that_is_no_path_is_refused_by_name(home):
    with pytest.raises(sw.RequestError) as err:
        sw.Explorer.save_view(explorer("Hello"), 7)
    assert err.value.field == "path"
    assert os.listdir(home) == []
