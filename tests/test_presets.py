"""The presets gallery: shipped saved views for the default model that visibly steer.

Each preset loads into a fresh explorer (``Explorer.from_preset`` or the explorer's preset
menu), runs, and reproduces the tokens stored in it; its STEERED text differs from DEFAULT.
"""

from __future__ import annotations

import pytest

import steer_widgets as sw
from steer_widgets.widgets import Explorer
from steer_widgets.widgets.presets import preset_view
from steer_widgets.widgets.views import same_tokens

NAMES = list(sw.presets())


def test_presets_are_listed_with_one_line_descriptions(engine):
    assert 4 <= len(NAMES) <= 6
    for name, description in sw.presets().items():
        assert description and "\n" not in description, name
    assert sw.presets(engine.model.name) == sw.presets()
    assert sw.presets("some/other-model") == {}


@pytest.mark.parametrize("name", NAMES)
def test_a_preset_reproduces_its_tokens_and_visibly_steers(engine, name):
    ex = Explorer.from_preset(name, engine)
    assert ex.wait(300), ex.status
    assert not ex.error, ex.status
    assert same_tokens(ex), name
    assert ex.outputs["STEERED"].text != ex.outputs["DEFAULT"].text
    view = preset_view(name)
    assert [r.name for r in ex.features_ui.rows] == view["concepts"]
    assert ex.request().to_dict() == view["request"]


def test_the_preset_menu_replaces_what_the_explorer_showed(engine, sources):
    ex = Explorer(engine, prompt="Hello", features=[(sources[0], 3, 50.0)], live=False)
    ex.run()
    assert ex.wait(300), ex.status
    name = NAMES[-1]
    ex.presets.ui.value = name  # what picking it in the menu does
    assert ex.wait(300), ex.status
    assert same_tokens(ex) and not ex.features  # the picked feature row was replaced
    assert ex.view.prompt.value == preset_view(name)["prompt"]


def test_unknown_or_foreign_presets_are_refused(engine):
    with pytest.raises(sw.RequestError, match="not a preset"):
        Explorer.from_preset("no-such-preset", engine)

    class Other:
        class model:  # noqa: N801 - stands in for an engine on another model
            name = "some/other-model"

    with pytest.raises(sw.RequestError, match="made for"):
        preset_view(NAMES[0], Other())
