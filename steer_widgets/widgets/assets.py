"""A widget's front-end files: its own ``.js``/``.css`` after the shared hover box's.

anywidget takes one ES module and one stylesheet per widget; the hover box (``tip.js``,
``tip.css``) is shared by the panes and the heatmap, so it is prepended to each rather than
copied into both.
"""

from __future__ import annotations

from pathlib import Path

_HERE = Path(__file__).parent


def esm(name: str) -> str:
    return (_HERE / "tip.js").read_text() + (_HERE / f"{name}.js").read_text()


def css(name: str) -> str:
    return (_HERE / "tip.css").read_text() + (_HERE / f"{name}.css").read_text()
