"""llama.cpp's decode rate on a GGUF, run by an interpreter that has ``llama_cpp``.

    <python with llama-cpp-python> benchmarks/llama_cpp_rate.py MODEL.gguf '{"ids": [...],
        "threads": 2, "new_tokens": 64, "repeats": 3}'

Prints ``{"tokens_per_s": ..., "tokens": [...]}``: the best of ``repeats`` greedy runs of
``new_tokens`` tokens after the prompt ``ids`` at batch 1 (prompt evaluation included, as in
our own figure). ``bench_generation`` calls it with ``SW_LLAMA_CPP_PYTHON`` (a throwaway venv:
llama-cpp-python is never a dependency of steer_widgets), so it imports nothing of ours.
"""

from __future__ import annotations

import json
import sys
import time


def main(path: str, settings: dict) -> dict:
    from llama_cpp import Llama

    ids, n_new = settings["ids"], settings["new_tokens"]
    llm = Llama(path, n_ctx=1024, n_threads=settings["threads"], n_batch=512, verbose=False)

    def once() -> list[int]:
        llm.reset()
        out = []
        for token in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(int(token))
            if len(out) >= n_new:
                break
        return out

    tokens, best = once(), float("inf")  # the first run warms the weights' pages
    for _ in range(settings.get("repeats", 3)):
        start = time.perf_counter()
        once()
        best = min(best, time.perf_counter() - start)
    return {"tokens_per_s": n_new / best, "tokens": tokens}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], json.loads(sys.argv[2]))))
