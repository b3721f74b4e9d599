"""Write the two baselines a concept is contrasted with, under ``steer_widgets/data/``.

Concept examples are the model's answers to "Write a few sentences about {concept}." and two
other requests (``concepts.example_prompts``). A concept vector is the mean of those answers
minus the mean of the same requests answered about *other* subjects:

* ``contrast.json``: answers about 47 everyday subjects, every 7th line of
  ``scripts/chat_topics.txt`` (a topic list written for SAE training data before the steering
  benchmark's concepts were chosen). One-vs-rest: what every "write about X" answer shares
  (the request, the chat template, the assistant's essay voice) cancels, and what is left is
  X. Contrasting with topic-free answers instead kept a shared "essay about a topic" push that
  turned every concept into the same ornate prose ("a tapestry of ancient wisdom").
* ``neutral.json``: answers about topic-free subjects ("an ordinary day"), kept as the text on
  which ``typical_norm`` measures the residual's size.

Sampled with the engine's batched ``samples`` (the concept examples' settings, 2 samples per
request, seed 0: deterministic), on the offline default model::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/make_baselines.py [--only contrast]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NEUTRAL_SUBJECTS = (
    "an ordinary day",
    "a list of everyday things",
    "a plan for tomorrow",
    "something that happened recently",
    "a normal afternoon",
    "a few general thoughts",
    "a typical week",
    "an everyday routine",
    "a simple question",
    "whatever comes to mind",
    "a common situation",
    "a usual morning",
)
TOPICS_FILE = REPO / "scripts" / "chat_topics.txt"
CONTRAST_EVERY = 7


def contrast_subjects() -> list[str]:
    """Every 7th topic of the SAE-training topic list (a fixed, mechanical draw)."""
    lines = [s.strip() for s in TOPICS_FILE.read_text().splitlines()]
    topics = [s for s in lines if s and not s.startswith("#")]
    return topics[2::CONTRAST_EVERY]


def answers(engine, subjects) -> tuple[list, list[str]]:
    """(chats, the subject of each chat): 2 samples of each request about each subject."""
    from steer_widgets.analysis import concepts

    chats, about = [], []
    for subject in subjects:
        for prompt in concepts.example_prompts(subject, chat=True):
            for s in engine.samples(
                prompt,
                2,
                temperature=concepts.EXAMPLE_TEMPERATURE,
                freq_penalty=0.0,
                seed=0,
                n_completion_tokens=concepts.EXAMPLE_TOKENS,
            ):
                chats.append([*prompt, {"role": "assistant", "content": s.text}])
                about.append(subject)
        print(subject, flush=True)
    return chats, about


def main(argv=None) -> None:
    import steer_widgets as sw

    p = argparse.ArgumentParser()
    p.add_argument("--only", choices=("neutral", "contrast"), default=None)
    args = p.parse_args(argv)
    engine = sw.Engine.default()
    data = REPO / "steer_widgets" / "data"
    if args.only in (None, "neutral"):
        chats, _ = answers(engine, NEUTRAL_SUBJECTS)
        out = {
            "about": "The default model's answers to the concept-example requests about "
            "topic-free subjects (scripts/make_baselines.py); where typical_norm is measured.",
            "subjects": list(NEUTRAL_SUBJECTS),
            "chats": chats,
        }
        (data / "neutral.json").write_text(json.dumps(out, indent=1) + "\n")
    if args.only in (None, "contrast"):
        chats, about = answers(engine, contrast_subjects())
        out = {
            "about": "The default model's answers to the concept-example requests about "
            "everyday subjects (scripts/make_baselines.py); the one-vs-rest baseline of "
            "concept vectors. chat_subjects[i] is what chats[i] is about.",
            "chat_subjects": about,
            "chats": chats,
        }
        (data / "contrast.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
