"""A gallery of saved views for the default model that visibly steer, shipped as package data.

Why: a new user's first question is "what does steering look like when it works?". Each
preset is a saved view (``views.py``: prompt, concept or feature rows, settings and the
tokens they produced) plus a ``name``, a one-line ``description`` and the ``model`` it was
made for. ``scripts/make_presets.py`` regenerates the files by running each one on the
engine and keeps only those whose STEERED text differs from DEFAULT; loading one runs it
again and reproduces the stored tokens (the engine is exact).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from pathlib import Path

import ipywidgets as widgets

from .. import checks
from ..checks import public
from ..errors import RequestError
from .fields import LABEL_WIDTH
from .views import read_view

PRESET_DIR = Path(__file__).parent / "presets"
CHOOSE = "choose a preset…"


@cache
def _all() -> dict[str, dict]:
    views = [read_view(p) for p in sorted(PRESET_DIR.glob("*.json"))]
    return {v["name"]: v for v in views}


@public
def presets(model: str | None = None) -> dict[str, str]:
    """The shipped presets as name -> one-line description (only ``model``'s if given).

    Load one with ``Explorer.from_preset(name)``, or pick it in the explorer's preset menu.
    """
    if model is not None:
        checks.text("model", model)
    return {n: v["description"] for n, v in _all().items() if model in (None, v["model"])}


@public
def preset_view(name: str, engine=None) -> dict:
    """The saved view of preset ``name``; checks it was made for ``engine``'s model."""
    views = _all()
    if not isinstance(name, str) or name not in views:
        raise RequestError("preset", f"{name!r} is not a preset; presets: {sorted(views)}")
    view = views[name]
    model = getattr(getattr(engine, "model", None), "name", None)
    if engine is not None and model is None:
        raise RequestError("engine", f"must be an Engine, got {engine!r}")
    if engine is not None and model != view["model"]:
        raise RequestError("preset", f"{name!r} was made for {view['model']}, not {model}")
    return json.loads(json.dumps(view))  # a copy: callers may change it


class PresetMenu:
    """The explorer's preset menu: picking a name applies that preset (``apply(view)``)."""

    def __init__(self, model: str, apply: Callable[[dict], None], fail: Callable) -> None:
        self.model = model
        names = list(presets(model))
        self.ui = widgets.Dropdown(
            options=[CHOOSE, *names],
            value=CHOOSE,
            description="preset",
            style={"description_width": LABEL_WIDTH},
        )
        if not names:  # presets exist for the default model only
            self.ui.layout.display = "none"
        self.ui.observe(lambda change: self._picked(change["new"], apply, fail), names="value")

    def _picked(self, name: str, apply: Callable[[dict], None], fail: Callable) -> None:
        if name == CHOOSE:
            return
        try:
            apply(preset_view(name))
        except RequestError as err:
            fail(err)
