"""Write ``steer_widgets/data/neutral.json``: the baseline a concept is contrasted with.

Concept examples are the model's answers to "Write a few sentences about {concept}." and two
other requests; the neutral set is its answers to the same requests about topic-free
subjects, so the difference in means keeps the concept and cancels the request, the chat
template and the assistant's voice. Sampled with the engine's batched ``samples`` (the same
settings as concept examples), on the offline default model::

    HF_HUB_OFFLINE=1 .venv/bin/python scripts/make_neutral_set.py
"""

from __future__ import annotations

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


def main() -> None:
    import steer_widgets as sw
    from steer_widgets import concepts

    engine = sw.Engine.default()
    chats = []
    for subject in NEUTRAL_SUBJECTS:
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
    out = {
        "about": "The default model's answers to the concept-example requests about "
        "topic-free subjects (scripts/make_neutral_set.py); the baseline of concept vectors.",
        "subjects": list(NEUTRAL_SUBJECTS),
        "chats": chats,
    }
    path = REPO / "steer_widgets" / "data" / "neutral.json"
    path.write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(chats)} neutral chats -> {path}")


if __name__ == "__main__":
    main()
