"""The explorer's widgets and their order on the page.

Reading order: a preset menu, prompt and mode; features (search, strength rows, a vector file
to save the steering to or load vectors from, steering settings, when to steer);
generation settings; Run / Stop / live / Record; the status line; the panes; the heatmap;
the evaluate panel.
Rows wrap instead of scrolling (flex ``row wrap``), sliders never shrink below a usable
track and every other control keeps its label: widths are Layout traits, which win over
ipywidgets' defaults in both 7.7 and 8; ``explorer.css`` (loaded with the status line)
adds the rest.
"""

from __future__ import annotations

import ipywidgets as widgets

from ..steering.vector_files import FORMATS
from .completions import Completions
from .evaluate_panel import EvaluatePanel
from .fields import LABEL_WIDTH, TOOLTIP, Controls
from .heatmap import Heatmap
from .status import StatusLine

DEFAULT_SWEEP = "-2, -1, 2, 4"
WRAP = {"flex_flow": "row wrap", "width": "100%"}


def section(title: str) -> widgets.HTML:
    heading = widgets.HTML(title)
    heading.add_class("sw-heading")
    return heading


def row(children: list, *classes: str) -> widgets.HBox:
    box = widgets.HBox(children, layout=WRAP)
    for c in ("sw-wrap", *classes):
        box.add_class(c)
    return box


def size(w: widgets.Widget) -> None:
    """Sliders grow but never below a usable track; boxes and menus keep their text."""
    if isinstance(w, (widgets.FloatSlider, widgets.IntSlider)):
        w.layout = widgets.Layout(flex="1 1 24em", min_width="24em", width="auto")
    elif isinstance(w, widgets.Checkbox):
        w.layout = widgets.Layout(width="auto", flex="0 0 auto")
    elif isinstance(w, widgets.Dropdown):  # the longest option must stay readable
        w.layout = widgets.Layout(flex="0 1 24em", min_width="22em", width="auto")
    else:
        w.layout = widgets.Layout(flex="0 1 17em", min_width="15em", width="auto")


def _button(text: str, **kw) -> widgets.Button:
    return widgets.Button(description=text, layout={"width": "auto", "min_width": "5.5em"}, **kw)


class Layout:
    """Builds the explorer's own widgets and ``ui``, the box that shows them all."""

    def __init__(
        self,
        prompt: str,
        chat: bool,
        controls: Controls,
        picker: widgets.Widget,
        rows: widgets.Widget,
        preset: widgets.Widget,
        condition: widgets.Widget,
    ) -> None:
        self.mode = widgets.ToggleButtons(
            options=["completion", "chat"],
            value="chat" if chat else "completion",
            tooltips=["continue the text", "the text is a user message (chat template)"],
            style={"button_width": "7em"},
        )
        self.prompt = widgets.Textarea(
            value=prompt,
            rows=2,
            continuous_update=False,
            placeholder="a prompt to complete",
            layout={"flex": "1 1 20em", "min_width": "15em", "width": "auto"},
        )
        for w in [*controls.widgets.values(), preset]:
            size(w)
        self.sweep_on = widgets.Checkbox(value=False, description="sweep", indent=False)
        self.sweep_on.layout = widgets.Layout(width="auto", flex="0 0 auto")
        self.sweep_text = widgets.Text(
            value=DEFAULT_SWEEP,
            continuous_update=False,
            description="multipliers",
            **{TOOLTIP: "extra STEERED panes at these multipliers (x-2, x4, ...)"},
            style={"description_width": "6em"},
            layout={"flex": "0 1 16em", "min_width": "14em", "width": "auto"},
        )
        self.live = widgets.Checkbox(value=True, description="live", indent=False)
        self.live.layout = widgets.Layout(width="auto")
        self.run_button = _button("Run", button_style="primary")
        self.stop_button = _button("Stop")
        self.record_button = _button("Record", tooltip="show settings and outputs")
        self.record_box = widgets.Textarea(layout={"width": "100%", "display": "none"}, rows=8)
        self.completions = Completions()
        self.heatmap = Heatmap()
        self.heat_feature = widgets.Dropdown(
            options=[],
            description="heatmap of",
            style={"description_width": LABEL_WIDTH},
            layout={"width": "32em", "max_width": "100%"},
        )
        self.vector_path = widgets.Text(
            placeholder="vectors.gguf",
            description="vector file",
            **{TOOLTIP: "save: the steering as vectors (gguf for llama.cpp and repeng); "
               "load: a .gguf, Neuronpedia .json, .safetensors or .pt"},
            style={"description_width": "6em"},
            layout={"flex": "0 1 20em", "min_width": "14em", "width": "auto"},
        )  # fmt: skip
        self.vector_format = widgets.Dropdown(
            options=list(FORMATS), value="gguf", layout={"width": "auto"}
        )
        self.save_vectors_button = _button("save vectors", tooltip="write the steering's vectors")
        self.load_vectors_button = _button("load vectors", tooltip="one row for the file's vectors")
        vector_row = [
            self.vector_path, self.vector_format, self.save_vectors_button,
            self.load_vectors_button,
        ]  # fmt: skip
        self.status_line = StatusLine()
        self.evaluation = EvaluatePanel()
        actions = [self.run_button, self.stop_button, self.live, self.record_button]
        self.ui = widgets.VBox(
            [
                section("Prompt"),
                row([preset]),
                row([self.mode, self.prompt]),
                section("Features"),
                picker,
                rows,
                row(vector_row, "sw-vectors"),
                row([*controls.group("steering"), self.sweep_on, self.sweep_text]),
                condition,
                section("Generation"),
                row(controls.group("generation")),
                row(actions, "sw-actions"),
                self.status_line,
                self.completions,
                self.heat_feature,
                self.heatmap,
                section("Evaluate: does it steer over many prompts?"),
                self.evaluation,
                self.record_box,
            ],
            layout={"width": "100%"},
        )
        self.ui.add_class("sw-explorer")


def close_tree(widget: widgets.Widget) -> None:
    """``widget`` and every widget below it, closed: the front end drops them all and the
    kernel can collect what they refer to (closing a box leaves its children open)."""
    for child in getattr(widget, "children", ()):
        close_tree(child)
    widget.close()
