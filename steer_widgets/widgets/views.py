"""Saved views: an explorer's prompt, features, concepts, settings and outputs as JSON.

``save_view`` writes what the controls say and what the panes show; ``load_view`` builds a
new explorer from it (``apply_view`` puts it into an existing one) and runs it, which
reproduces the saved tokens (the engine is exact: same request, same seed, same tokens).
``same_tokens`` compares a loaded explorer's outputs with the saved ones.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import RequestError
from ..files import user_path, write_text_atomically
from ..steering.requests import SteerRequest, Vector, conditions_of
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
    gated = [field for field, _ in conditions_of(req) if field != "when"]
    if gated:
        raise RequestError(
            f"request.{gated[0]}",
            "the explorer gates the whole request (set(when=...)), not one entry; steer "
            "this request with engine.steer",
        )
    ex = explorer
    with ex.batch():
        while ex.features_ui.rows:
            ex.remove_feature(len(ex.features_ui.rows) - 1)
        ex.set(prompt=view["prompt"], chat=view["chat"], sweep=tuple(req.sweep))
        ex.set(**{k: getattr(req, k) for k in SETTINGS}, when=req.when)
        for f in req.features:
            ex.add_feature(f.source, f.index, f.strength)
        for name, group in _concept_groups(view, req.vectors):
            if len(group) == 1:
                v = group[0]
                ex.add_concept(name, Vector(torch.as_tensor(v.vector), v.hook, v.strength))
            else:
                ex.add_vectors(name, group)
    ex.saved_outputs = view.get("outputs", {})


def _concept_groups(view: dict, vectors) -> list[tuple[str, list[Vector]]]:
    """Each concept row's name and vectors: one vector each unless ``concept_layers`` (a
    loaded multi-layer vector's row) says how many."""
    names = view.get("concepts", [])
    counts = view.get("concept_layers", [1] * len(names))
    groups, start = [], 0
    for name, n in zip(names, counts, strict=True):
        groups.append((name, list(vectors[start : start + n])))
        start += n
    return [(name, g) for name, g in groups if g]


def same_tokens(explorer) -> bool:
    """Whether a loaded explorer's outputs are token for token the saved ones."""
    saved = getattr(explorer, "saved_outputs", {})
    got = {k: list(c.token_ids) for k, c in explorer.outputs.items()}
    return bool(saved) and got == {k: v["token_ids"] for k, v in saved.items()}
