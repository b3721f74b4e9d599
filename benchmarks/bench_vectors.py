"""Our exported control vector in llama.cpp: does its greedy text move the way ours does?

A concept vector ("rain") at its recommended strength, steered here with
``prompt_multiplier=1`` (llama.cpp adds a control vector at every position, prompt
included), exported with ``sw.save_vectors(..., "x.gguf")`` and applied by llama.cpp on the
default GGUF (``llama_cpp_control.py``, run by ``SW_LLAMA_CPP_PYTHON``: an interpreter with
llama-cpp-python and gguf, say a throwaway venv). Greedy, 32 tokens after two chat prompts.
Not exact: llama.cpp quantizes activations for its quantized products, so its texts are
compared by what they say (``mentions``: the concept's word forms in DEFAULT and STEERED)
and by the shared prefix of the steered tokens, not token for token.

    SW_LLAMA_CPP_PYTHON=/path/to/venv/bin/python python benchmarks/run.py --only vectors
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CONCEPT = "rain"
FORMS = ("rain", "rainy", "rainfall", "raindrop", "umbrella")  # what a turned text says
N_NEW = 32
PROMPTS = [
    [{"role": "user", "content": "Tell me about your weekend plans."}],
    [{"role": "user", "content": "Describe a walk through the city."}],
]


def _llama(python: str, gguf: str, vector: Path, ids: list[int], threads: int) -> dict:
    settings = {"ids": ids, "new_tokens": N_NEW, "scale": 1.0, "threads": threads}
    script = str(Path(__file__).with_name("llama_cpp_control.py"))
    command = [python, script, gguf, str(vector), json.dumps(settings)]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def run() -> dict:
    import torch

    import steer_widgets as sw
    from steer_widgets.analysis.judges import mentions
    from steer_widgets.runtime.model import gguf_path

    python = os.environ.get("SW_LLAMA_CPP_PYTHON")
    if not python:
        return {"skipped": "SW_LLAMA_CPP_PYTHON names no interpreter with llama-cpp-python"}
    engine = sw.Engine.default()
    vector = engine.concept_vector(CONCEPT)

    def said(text: str) -> bool:
        return mentions(text, FORMS)

    out: dict = {"hook": vector.hook, "strength": vector.strength}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{CONCEPT}.gguf"
        for i, prompt in enumerate(PROMPTS):
            request = sw.SteerRequest(
                prompt, vectors=[vector], n_completion_tokens=N_NEW, temperature=0.0,
                prompt_multiplier=1.0, freq_penalty=0.0,
            )  # fmt: skip
            sw.save_vectors(engine.vectors(request), path, model=engine)
            ours = engine.steer(request).outputs
            ids = list(engine.plan(request)[0].ids)
            theirs = _llama(python, str(gguf_path()), path, ids, torch.get_num_threads())
            text = {k: engine.tokenizer.decode(v) for k, v in theirs.items()}
            out[f"prompt{i}"] = {
                "ours_default_mentions": said(ours["DEFAULT"].text),
                "ours_steered_mentions": said(ours["STEERED"].text),
                "llama_default_mentions": said(text["default"]),
                "llama_steered_mentions": said(text["steered"]),
                "llama_moved": theirs["steered"] != theirs["default"],
                "default_shared_prefix": _prefix(
                    list(ours["DEFAULT"].token_ids), theirs["default"]
                ),
                "steered_shared_prefix": _prefix(
                    list(ours["STEERED"].token_ids), theirs["steered"]
                ),
                "ours_steered": ours["STEERED"].text,
                "llama_steered": text["steered"],
            }
    return out


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
    sys.exit(0)
