"""Saved views: an explorer's prompt, features, concepts, settings and outputs as JSON.

``save_view`` writes what the controls say and what the panes show; ``load_view`` builds a
new explorer from it (``apply_view`` puts it into an existing one) and runs it, which
reproduces the saved tokens (the engine is exact: same request, same seed, same tokens).
``same_tokens`` compares a loaded explorer's outputs with the saved ones.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from ..errors import RequestError
from ..files import user_path, write_text_atomically
from ..steering.requests import SteerRequest, Vector
from ..steering.results import check_products

VIEW_VERSION = 1


def save_view(explorer, path: str | Path) -> dict:
    """Write the explorer's current view to ``path``; returns the dict written."""
    target = user_path(path)  # ~ is the home folder here as in every file we take
    req = explorer.request()
    rows = explorer.features_ui.rows
    view = {
        "steer_widgets_view": VIEW_VERSION,
        "chat": explorer.view.mode.value == "chat",
        "prompt": explorer.view.prompt.value,
        "live": bool(explorer.live.value),
        "request": req.to_dict(),
        "concepts": [r.name for r in rows if r.vector is not None],
        # how many of the request's vectors each concept row holds (a loaded vector: its layers)
        "concept_layers": [1 + len(r.extra) for r in rows if r.vector is not None],
        "outputs": {
            k: {"text": c.text, "token_ids": list(c.token_ids), "stop": c.stop}
            for k, c in explorer.outputs.items()
        },
        "outputs_match_request": explorer.request_done == req,
        "products": explorer.engine.products,  # the saved tokens replay on this setting
        # what the "steer when" controls say (the request's, then each row's), so a view
        # loads back editable; the request's record holds the conditions themselves
        "condition_rows": {
            "when": explorer.condition_row.state(),
            "rows": [None if r.condition is None else r.condition.state() for r in rows],
        },
    }
    write_text_atomically(target, json.dumps(view, indent=1), _path_error)
    return view


def _path_error(path: str, problem: str) -> RequestError:
    """A view that cannot be written (whole or not at all: ``files.py``), named by its path."""
    return RequestError("path", f"{path!r} {problem}")


SETTINGS = (
    "strength_multiplier",
    "steer_method",
    "steer_special_tokens",
    "prompt_multiplier",
    "n_completion_tokens",
    "temperature",
    "freq_penalty",
    "seed",
)


def read_view(source: str | Path | dict) -> dict:
    """A saved view from a file (or an already-read dict), checked for its format."""
    view = source if isinstance(source, dict) else _read_json(user_path(source))
    if not isinstance(view, dict) or view.get("steer_widgets_view") != VIEW_VERSION:
        raise RequestError("view", f"{source} is not a steer_widgets view (version {VIEW_VERSION})")
    for key, kind in (("prompt", str), ("chat", bool), ("request", dict)):
        if not isinstance(view.get(key), kind):
            raise RequestError(f"view.{key}", f"must be a {kind.__name__}, got {view.get(key)!r}")
    if not isinstance(view.get("live", True), bool):
        raise RequestError("view.live", f"must be a bool, got {view['live']!r}")
    concepts = view.get("concepts", [])
    if not isinstance(concepts, list) or not all(isinstance(c, str) for c in concepts):
        raise RequestError("view.concepts", f"must be a list of names, got {concepts!r}")
    layers = view.get("concept_layers", [1] * len(concepts))
    counts_ok = isinstance(layers, list) and len(layers) == len(concepts)
    if not counts_ok or not all(type(n) is int and n >= 1 for n in layers):
        raise RequestError("view.concept_layers", f"must be a count per concept, got {layers!r}")
    if not isinstance(view.get("outputs", {}), dict):
        raise RequestError("view.outputs", f"must be a dict, got {view['outputs']!r}")
    return view


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeEncodeError) as err:
        raise RequestError("path", f"cannot read {str(path)!r}: {err}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RequestError("path", f"{str(path)!r} is not JSON: {err}") from None


def load_view(cls, source: str | Path | dict, engine=None, **kwargs):
    """A new ``cls`` explorer showing the saved view; it runs once to reproduce the outputs."""
    view = read_view(source)
    live = kwargs.pop("live", view.get("live", True))
    ex = cls(engine, live=False, **kwargs)
    apply_view(ex, view)
    ex.live.value = live
    ex.run()  # once, live or not: the panes show the view's tokens again
    return ex


def apply_view(explorer, source: str | Path | dict) -> None:
    """Replace an explorer's prompt, features, concepts and settings with a saved view's
    (one change: a live explorer runs once); ``same_tokens`` then compares the outputs."""
    view = read_view(source)
    check_products(view.get("products", "float32"), explorer.engine.products)
    req = SteerRequest.from_dict(view["request"])
    groups = _concept_groups(view, req.vectors)
    row_whens = [f.when for f in req.features] + [_group_when(view, req, g) for g in groups]
    states = _condition_states(view, len(row_whens))
    ex = explorer
    with ex.batch():
        while ex.features_ui.rows:
            ex.remove_feature(len(ex.features_ui.rows) - 1)
        ex.set(prompt=view["prompt"], chat=view["chat"], sweep=tuple(req.sweep))
        ex.set(**{k: getattr(req, k) for k in SETTINGS})
        _show_condition(ex.condition_row, req.when, states["when"])
        for f in req.features:
            ex.add_feature(f.source, f.index, f.strength)
        for name, group, _ in groups:
            if len(group) == 1:
                v = group[0]
                ex.add_concept(name, Vector(torch.as_tensor(v.vector), v.hook, v.strength))
            else:
                ex.add_vectors(name, [replace(v, when=None) for v in group])
        added = len(ex.features_ui.rows) == len(row_whens)  # else the status line says why
        for i, when in enumerate(row_whens if added else ()):
            if when is not None or states["rows"][i] is not None:
                _show_condition(ex.features_ui.condition_of(i), when, states["rows"][i])
    ex.saved_outputs = view.get("outputs", {})


def _group_when(view: dict, req: SteerRequest, group: tuple[str, list[Vector], int]):
    """A concept row's condition: every vector of a row shares it (its ``when`` control)."""
    start, vectors = group[2], group[1]
    records = [None if v.when is None else v.when.to_dict() for v in vectors]
    for k, record in enumerate(records[1:], start + 1):
        if record != records[0]:
            raise RequestError(
                f"request.vectors[{k}].when",
                f"differs from vectors[{start}].when: one explorer row has one condition",
            )
    return vectors[0].when


def _condition_states(view: dict, n_rows: int) -> dict:
    """The saved "steer when" controls, checked: one state (or None) per row."""
    saved = view.get("condition_rows") or {}
    if not isinstance(saved, dict):
        raise RequestError("condition_rows", f"must be a dict, got {saved!r:.80}")
    rows = saved.get("rows") or [None] * n_rows
    if not isinstance(rows, list) or len(rows) != n_rows:
        raise RequestError("condition_rows.rows", f"must list {n_rows} rows, got {rows!r:.80}")
    states = {"when": saved.get("when"), "rows": rows}
    for field, state in [("condition_rows.when", states["when"])] + [
        (f"condition_rows.rows[{i}]", s) for i, s in enumerate(rows)
    ]:
        _check_state(field, state)
    return states


def _check_state(field: str, state) -> None:
    if state is None:
        return
    ok = (
        isinstance(state, dict)
        and state.get("kind") in ("feature", "concept")
        and isinstance(state.get("what"), str)
        and isinstance(state.get("threshold"), (int, float))
        and not isinstance(state.get("threshold"), bool)
        and state.get("scope") in ("token", "prompt")
    )
    if not ok:
        raise RequestError(field, f"is not a saved condition row: {state!r:.120}")


def _show_condition(row, when, state: dict | None) -> None:
    """Put a saved condition into a "steer when" row: editable where the row's controls
    make exactly the saved condition from the saved state (a concept's vector as saved),
    else listed as set from Python."""
    if when is None:
        row.show_custom(None)
        return
    if state is not None:
        vector = when.on if state["kind"] == "concept" and hasattr(when, "on") else None
        row.show_state(state, vector)
        try:
            rebuilt = row.condition()
        except RequestError:
            rebuilt = None
        if rebuilt is not None and rebuilt.to_dict() == when.to_dict():
            return
    row.show_custom(when)


def _concept_groups(view: dict, vectors) -> list[tuple[str, list[Vector], int]]:
    """Each concept row's name, vectors and first vector's place: one vector each unless
    ``concept_layers`` (a loaded multi-layer vector's row) says how many."""
    names = view.get("concepts", [])
    counts = view.get("concept_layers", [1] * len(names))
    groups, start = [], 0
    for name, n in zip(names, counts, strict=True):
        groups.append((name, list(vectors[start : start + n]), start))
        start += n
    return [(name, g, at) for name, g, at in groups if g]


def same_tokens(explorer) -> bool:
    """Whether a loaded explorer's outputs are token for token the saved ones."""
    saved = getattr(explorer, "saved_outputs", {})
    got = {k: list(c.token_ids) for k, c in explorer.outputs.items()}
    return bool(saved) and got == {k: v["token_ids"] for k, v in saved.items()}
