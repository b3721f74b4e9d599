"""Static HTML export: run a notebook, keep its widgets' state, write one self-contained file.

``python -m steer_widgets export NOTEBOOK.ipynb OUT.html`` executes the notebook in a fresh
kernel, waits for every explorer to finish its run and heatmap, takes the state of every live
widget from the kernel, and renders the notebook with nbconvert's ``lab`` template. The
ipywidgets HTML manager (``@jupyter-widgets/html-manager``'s ``embed-amd.js``, vendored in
``steer_widgets/widgets/static/``), require.js and anywidget's front end (read from the installed
``anywidget`` package) are inlined, so the page draws the completions and heatmaps from
file:// with no kernel and no network. MathJax and Mermaid, which nbconvert loads from a CDN,
are left out.

From Python::

    from steer_widgets.export import export
    export("notebooks/quickstart.ipynb", "quickstart.html")
"""

from __future__ import annotations

import gc
import json
import os
import re
import tempfile
from pathlib import Path

from .files import user_path, write_text_atomically

STATIC = Path(__file__).parent / "widgets" / "static"
STATE_MIME = "application/vnd.jupyter.widget-state+json"
TEMPLATE_NAME = "steer_widgets_offline.html.j2"

# nbconvert's lab page, with every CDN script replaced by inline copies.
TEMPLATE = """{%- extends 'index.html.j2' -%}
{%- block html_head_js_requirejs -%}
<script>{{ resources.sw_offline.require_js }}</script>
{%- endblock html_head_js_requirejs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block footer_js -%}
{%- if resources.sw_offline.has_widgets -%}
<script>{{ resources.sw_offline.anywidget_js }}</script>
<script>{{ resources.sw_offline.embed_js }}</script>
{%- endif -%}
{%- endblock footer_js -%}
"""

# Run as the notebook's last cell, in the kernel: wait for the explorers, dump widget state.
_DUMP_CELL = "import steer_widgets.export as _sw_export\n_sw_export.dump_kernel_state({path!r})\n"


class ExportError(RuntimeError):
    """The notebook could not be executed or exported."""


# -- in the kernel ---------------------------------------------------------------------------
def dump_kernel_state(path: str, timeout: float = 300.0) -> int:
    """Write the full state of every live widget to ``path``; returns the number of widgets.

    Runs inside the notebook's kernel. Explorers compute in background threads (runs and
    evaluations), so wait for each one first: otherwise the export would catch them half way.
    """
    from ipywidgets.embed import embed_data

    from .widgets import Explorer

    for obj in gc.get_objects():
        if isinstance(obj, Explorer) and not (obj.wait(timeout) and obj.wait_evaluation(timeout)):
            raise ExportError(f"an explorer did not finish within {timeout} s: {obj.status}")
    # drop_defaults=False: anywidget's front end needs every trait (_esm included).
    state = embed_data(views=None, drop_defaults=False)["manager_state"]
    write_text_atomically(path, json.dumps(state), _export_error)
    return len(state["state"])


# -- execution -------------------------------------------------------------------------------
def execute(notebook, timeout: int = 600, kernel_name: str = "python3", cwd=None):
    """Execute a notebook (a path or an nbformat node) and attach the widgets' final state.

    Returns the executed nbformat node; the notebook on disk is not modified. ``cwd`` is the
    kernel's working directory (default: the notebook's folder).
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    cwd = None if cwd is None else user_path(cwd, "cwd")
    if isinstance(notebook, (str, os.PathLike)):
        notebook = user_path(notebook, "notebook")
        cwd = cwd or notebook.resolve().parent
        nb = nbformat.read(str(notebook), as_version=4)
    else:
        nb = nbformat.from_dict(json.loads(json.dumps(notebook)))
    with tempfile.TemporaryDirectory(prefix="sw-export-") as tmp:
        state_path = Path(tmp) / "state.json"
        nb.cells.append(nbformat.v4.new_code_cell(_DUMP_CELL.format(path=str(state_path))))
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            resources={"metadata": {"path": str(cwd or Path.cwd())}},
        )
        try:
            client.execute()
        except CellExecutionError as err:
            raise ExportError(f"the notebook failed while executing:\n{err}") from err
        finally:
            nb.cells.pop()
        state = json.loads(state_path.read_text())
    nb.metadata["widgets"] = {STATE_MIME: state}
    return nb


# -- rendering -------------------------------------------------------------------------------
def _inline_script(source: str) -> str:
    """Make JavaScript safe inside an inline <script>: no early ``</script`` or ``<!--``."""
    source = re.sub(r"</(script)", r"<\\/\1", source, flags=re.IGNORECASE)
    return source.replace("<!--", "<\\!--")


def anywidget_amd() -> str:
    """anywidget's front end as a named AMD module, from the installed ``anywidget``."""
    import anywidget

    path = Path(anywidget.__file__).parent / "nbextension" / "index.js"
    if not path.exists():
        raise ExportError(f"anywidget's front end is missing from the installed package: {path}")
    source = path.read_text(encoding="utf-8")
    anonymous = 'define(["@jupyter-widgets/base"]'
    if source.count(anonymous) != 1:
        raise ExportError(
            f"unexpected anywidget bundle layout in {path}: cannot name its AMD module"
        )
    return source.replace(anonymous, 'define("anywidget", ["@jupyter-widgets/base"]')


def offline_resources(has_widgets: bool = True) -> dict:
    """The JavaScript the page inlines (require.js always; the widget renderer if needed)."""
    out = {
        "require_js": _inline_script((STATIC / "require.js").read_text(encoding="utf-8")),
        "has_widgets": has_widgets,
    }
    if has_widgets:
        out["embed_js"] = _inline_script((STATIC / "embed-amd.js").read_text(encoding="utf-8"))
        out["anywidget_js"] = _inline_script(anywidget_amd())
    return out


def to_html(nb, title: str | None = None) -> str:
    """Render an executed notebook (with widget state in its metadata) as one HTML page."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name="lab",
        extra_loaders=[DictLoader({TEMPLATE_NAME: TEMPLATE})],
        template_file=TEMPLATE_NAME,
    )
    has_widgets = STATE_MIME in nb.metadata.get("widgets", {})
    resources = {"sw_offline": offline_resources(has_widgets)}
    if title:
        resources["metadata"] = {"name": title}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    return body


def export(
    notebook,
    out,
    *,
    run: bool = True,
    timeout: int = 600,
    kernel_name: str = "python3",
    cwd=None,
) -> Path:
    """Execute ``notebook`` (unless ``run=False``) and write a self-contained HTML to ``out``.

    With ``run=False`` the notebook's stored outputs and stored widget state are used (save
    the notebook with widget state from JupyterLab for that). Returns the output path.
    """
    import nbformat

    src = user_path(notebook, "notebook")  # ~ is the home folder, as in every file we take
    if run:
        nb = execute(src, timeout=timeout, kernel_name=kernel_name, cwd=cwd)
    else:
        nb = nbformat.read(str(src), as_version=4)
    out = user_path(out, "out")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(out, to_html(nb, title=src.stem), _export_error)
    return out


def _export_error(path: str, problem: str) -> ExportError:
    """A file the export cannot write (whole or not at all: ``files.py``), named by path."""
    return ExportError(f"{path} {problem}")
