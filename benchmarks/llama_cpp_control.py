"""A control-vector file applied by llama.cpp, run by an interpreter that has ``llama_cpp``
and ``gguf``.

    <python with llama-cpp-python and gguf> benchmarks/llama_cpp_control.py MODEL.gguf \
        VECTOR.gguf '{"ids": [...], "new_tokens": 32, "scale": 1.0, "threads": 2}'

Prints ``{"default": [...], "steered": [...]}``: greedy tokens after the prompt ``ids`` without
and with the control vector. The file is read as llama.cpp's ``common_control_vector_load``
reads it (``direction.k`` times the scale into the buffer at ``n_embd * (k - 1)``, layers 1
to n_layer) and handed to ``llama_set_adapter_cvec``, the call its CLI and server make:
llama-cpp-python has no loader of its own. ``bench_vectors`` calls it with
``SW_LLAMA_CPP_PYTHON``, so it imports nothing of ours.
"""

from __future__ import annotations

import ctypes
import json
import sys


def control_buffer(path: str, scale: float, n_embd: int, n_layer: int) -> list[float]:
    """The n_embd x n_layer buffer (layer 1 first) llama.cpp builds from a control vector."""
    from gguf import GGUFReader

    data = [0.0] * (n_embd * n_layer)
    for tensor in GGUFReader(path).tensors:
        k = int(tensor.name.removeprefix("direction."))
        if not 1 <= k <= n_layer or len(tensor.data) != n_embd:
            raise ValueError(f"{path}: {tensor.name} does not fit {n_layer} x {n_embd}")
        for j, value in enumerate(tensor.data):
            data[n_embd * (k - 1) + j] += float(value) * scale
    return data


def main(model: str, vector: str, settings: dict) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(model, n_ctx=512, n_threads=settings["threads"], verbose=False)
    n_embd, n_layer = llm.n_embd(), llama_cpp.llama_model_n_layer(llm.model)

    def greedy() -> list[int]:
        llm.reset()
        out = []
        for token in llm.generate(settings["ids"], temp=0.0, top_k=1, reset=True):
            out.append(int(token))
            if len(out) >= settings["new_tokens"]:
                break
        return out

    default = greedy()
    data = control_buffer(vector, settings["scale"], n_embd, n_layer)
    buffer = (ctypes.c_float * len(data))(*data)
    if llama_cpp.llama_set_adapter_cvec(llm.ctx, buffer, len(data), n_embd, 1, n_layer) != 0:
        raise RuntimeError("llama_set_adapter_cvec refused the control vector")
    return {"default": default, "steered": greedy()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))))
