"""Regenerate the explorer's preset gallery (steer_widgets/widgets/presets/*.json).

Each preset steers a chat prompt with a concept vector (``engine.concept_vector``) at its
recommended strength, in an explorer with the default settings, and is saved as a view
(``Explorer.save_view``) with a name, a one-line description and the model. A preset whose
STEERED text equals DEFAULT, or that mentions none of its concept's words, is reported and
not written: the gallery only shows steering that visibly works.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python scripts/make_presets.py [--out DIR] [--only NAME]

About a minute per preset on 2 CPU cores (most of it the model writing concept examples).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

import steer_widgets as sw
from steer_widgets.widgets.presets import PRESET_DIR

# name, concept, chat prompt, words a steered text should show, description
CANDIDATES = [
    ("chocolate-poem", "chocolate", "Write a short poem.", ("chocolate", "cocoa"),
     "a short poem, steered toward chocolate"),
    ("music-weekend", "music", "What should I do this weekend?", ("music", "song", "concert"),
     "weekend plans, steered toward music"),
    ("trees-advice", "trees", "Give me some advice for a good morning.", ("tree", "forest"),
     "morning advice, steered toward trees"),
    ("sports-day", "sports", "Tell me about your day.", ("sport", "game", "team", "play"),
     "a plain day, steered toward sports"),
    ("cooking-story", "cooking", "Write a short story about a cat.",
     ("cook", "culinar", "kitchen", "recipe"),
     "a cat story, steered toward cooking"),  # left out with prompt x2: cinnamon, not cooking
    ("technology-day", "technology", "Tell me about your day.", ("tech", "computer", "digital"),
     "a plain day, steered toward technology"),  # back with prompt x2 (2026-12-01)
    ("coffee-morning", "coffee", "Give me some advice for a good morning.", ("coffee", "latte"),
     "morning advice, steered toward coffee"),
]  # fmt: skip


def make(engine: sw.Engine, name: str, concept: str, prompt: str, words, description: str):
    """Run one preset; returns its view dict, or None (with the reason printed) if it
    does not visibly steer."""
    vector = engine.concept_vector(concept)
    ex = sw.Explorer(engine, prompt=prompt, chat=True, live=False)
    ex.add_concept(concept, vector)
    ex.run()
    if not ex.wait(600) or ex.error:
        print(f"{name}: failed: {ex.status}", file=sys.stderr)
        return None
    default, steered = ex.outputs["DEFAULT"].text, ex.outputs["STEERED"].text
    print(f"--- {name} (strength {vector.strength:.1f} at {vector.hook})")
    print(f"DEFAULT: {default!r}\nSTEERED: {steered!r}")
    if steered == default or not any(w in steered.lower() for w in words):
        print(f"{name}: does not visibly steer, left out", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        view = ex.save_view(Path(tmp) / "view.json")
    view["live"] = True  # a loaded preset answers slider moves at once
    layer = vector.hook.split(".")[1]
    description = f"{description} (concept vector, layer {layer})"
    return {"name": name, "description": description, "model": engine.model.name, **view}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=PRESET_DIR)
    parser.add_argument("--only", action="append", help="preset name(s) to regenerate")
    args = parser.parse_args()
    engine = sw.Engine.default()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, concept, prompt, words, description in CANDIDATES:
        if args.only and name not in args.only:
            continue
        view = make(engine, name, concept, prompt, words, description)
        if view is not None:
            (args.out / f"{name}.json").write_text(_dumps(view) + "\n")


def _dumps(view: dict) -> str:
    """Indented JSON with every list of numbers (a concept vector) on one line."""
    text = json.dumps(view, indent=1)
    return re.sub(r"\[\s*(-?[\d.e+-]+(?:,\s*-?[\d.e+-]+)*)\s*\]", _one_line, text)


def _one_line(m: re.Match) -> str:
    return "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]"


if __name__ == "__main__":
    main()
