"""Decode throughput of our generator vs transformers and TransformerLens, same weights.

64 new tokens after a chat prompt, batch 1, greedy, EOS ignored so every run decodes 64;
``ours`` reads the float32 copy of the default GGUF, ``ours_quant`` its Q4_1/Q8_0 blocks (the
same logits, bit for bit). llama.cpp on the same GGUF where ``SW_LLAMA_CPP_PYTHON`` names an
interpreter with llama-cpp-python (a throwaway venv: never a dependency; see
``llama_cpp_rate.py``). SW_BENCH_NEW_TOKENS shortens the run for a smoke test.
``ours_int8_*``: the same blocks with ``products="int8"`` (each row's activations as int8,
integer products; ``int8_greedy_tokens_equal_*``: how many of the first greedy tokens equal
the float32 path's and llama.cpp's before they part).
``ours_quant_vs_bound`` is measured on the decode steps alone (the first token comes from the
prompt's prefill, reported apart as ``ours_quant_prefill_ms``): the bound is one read of the
weights per step, which a prefill is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from common import CHAT, best_of, read_bandwidth, timed_run

from steer_widgets.runtime.tl_runtime import hooked_llama

N_NEW = int(os.environ.get("SW_BENCH_NEW_TOKENS", "64"))


def _ours(engine, ids):
    from steer_widgets.steering.generation import Row, Sampling, decode

    sampling = Sampling(temperature=0.0, freq_penalty=0.0, seed=0, n_completion_tokens=N_NEW)
    return [s.tokens[0] for s in decode(engine.model.runtime, ids, [Row()], sampling, frozenset())]


def _hf(hf, ids):
    out = hf.generate(
        torch.tensor([ids]), max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False
    )
    return out[0, len(ids) :].tolist()


def _tl(model, ids):
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=N_NEW, do_sample=False, use_past_kv_cache=True,
        stop_at_eos=False, verbose=False,
    )  # fmt: skip
    return out[0, len(ids) :].tolist()


def _on_a_thread(fn):
    """``fn()`` run on a Python worker thread, as the explorer decodes."""
    import threading

    out = {}
    thread = threading.Thread(target=lambda: out.update(value=fn()))
    thread.start()
    thread.join()
    return out["value"]


def _int8_figures(qengine, ids: list[int], quant_ids: list[int]) -> dict:
    """``products="int8"`` on the same file: speed at both thread counts, decode steps alone,
    and how far its greedy tokens and last-position logits stay with the float32 path's."""
    import steer_widgets as sw

    engine8 = sw.Engine(sw.load_model(products="int8"), saes=[])
    int8_ids = _ours(engine8, ids)
    runs = [timed_run(lambda: _ours(engine8, ids), engine8.model.runtime) for _ in range(3)]
    wall, decode = min(w for w, _ in runs), min(d for _, d in runs)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    wall_1t = best_of(lambda: _ours(engine8, ids))
    torch.set_num_threads(threads)
    x = torch.tensor([ids])
    want, got = qengine.model.runtime.forward(x)[0], engine8.model.runtime.forward(x)[0]
    return {
        "tokens": int8_ids,
        "ours_int8_tokens_per_s": N_NEW / wall,
        "ours_int8_tokens_per_s_1_thread": N_NEW / wall_1t,
        "ours_int8_decode_tokens_per_s": (N_NEW - 1) / decode,
        "ours_int8_prefill_ms": min(w - d for w, d in runs) * 1e3,
        "int8_greedy_tokens_equal_float32": _agreed(int8_ids, quant_ids),
        "int8_prompt_top1_equal_float32": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
        "int8_logits_max_abs_diff": float((got - want).abs().max()),
    }


def _agreed(a: list[int], b: list[int]) -> int:
    """How many first tokens two greedy runs share."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _load_profile(quantized: bool) -> dict:
    """Load time and peak resident memory (imports included) of the default model in a
    fresh process, after a first load has converted what it caches."""
    code = (
        "import json, time\n"
        "import steer_widgets as sw\n"
        "t = time.perf_counter()\n"
        f"sw.load_model(quantized={quantized})\n"
        "s = time.perf_counter() - t\n"
        "status = open('/proc/self/status').read().split()\n"
        "rss = int(status[status.index('VmHWM:') + 1]) / 1024\n"
        "print(json.dumps({'load_s': s, 'peak_rss_mb': rss}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _llama_cpp(ids: list[int], threads: int) -> dict | None:
    """llama.cpp's tokens/s and greedy tokens on the default GGUF, same prompt ids, batch 1,
    run by ``SW_LLAMA_CPP_PYTHON`` (an interpreter with llama-cpp-python, say a throwaway
    venv's), else by this one where ``llama_cpp`` imports; None where neither has it."""
    from steer_widgets.runtime.model import gguf_path

    python = os.environ.get("SW_LLAMA_CPP_PYTHON", sys.executable)
    has = subprocess.run([python, "-c", "import llama_cpp"], capture_output=True)
    if has.returncode:
        return None
    settings = {"ids": ids, "threads": threads, "new_tokens": N_NEW, "repeats": 3}
    script = str(Path(__file__).with_name("llama_cpp_rate.py"))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    command = [python, script, str(gguf_path()), json.dumps(settings)]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> dict:
    from transformers import AutoModelForCausalLM

    import steer_widgets as sw
    from steer_widgets.runtime.model import default_model_dir

    engine = sw.Engine(sw.load_model(quantized=False), saes=[])
    qengine = sw.Engine(sw.load_model(quantized=True), saes=[])
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    ids = list(engine.tokenizer.encode(CHAT).ids)
    ours_ids, hf_ids, quant_ids = _ours(engine, ids), _hf(hf, ids), _ours(qengine, ids)
    ours_s = best_of(lambda: _ours(engine, ids))
    runs = [timed_run(lambda: _ours(qengine, ids), qengine.model.runtime) for _ in range(3)]
    quant_s = min(wall for wall, _ in runs)  # best of 3, as best_of
    quant_decode_s = min(decode for _, decode in runs)  # the N_NEW - 1 steps after the prefill
    quant_prefill_s = min(wall - decode for wall, decode in runs)
    quant_thread_s = _on_a_thread(lambda: best_of(lambda: _ours(qengine, ids)))
    int8 = _int8_figures(qengine, ids, quant_ids)
    int8_ids = int8.pop("tokens")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the other thread count, for the record (docs/benchmarks.md)
    ours_1t_s = best_of(lambda: _ours(engine, ids))
    quant_1t_s = best_of(lambda: _ours(qengine, ids))
    llama_1t = _llama_cpp(ids, 1)
    torch.set_num_threads(threads)
    llama = _llama_cpp(ids, threads)
    hf_s = best_of(lambda: _hf(hf, ids))
    tl = hooked_llama(default_model_dir())
    tl_ids = _tl(tl, ids)
    tl_s = best_of(lambda: _tl(tl, ids), repeats=1)
    bandwidth = read_bandwidth()
    bound_tps = bandwidth / engine.model.runtime.weight_bytes()
    quant_bytes = qengine.model.runtime.weight_bytes()
    quant_bandwidth = read_bandwidth(max(1, quant_bytes // 2**20))  # streamed at that size
    quant_bound = quant_bandwidth / quant_bytes
    ours, theirs_hf, theirs_tl = N_NEW / ours_s, N_NEW / hf_s, N_NEW / tl_s
    quant = N_NEW / quant_s
    fp32_load, quant_load = _load_profile(False), _load_profile(True)
    llama_figures = {}
    if llama is not None:
        llama_figures = {
            "llama_cpp_tokens_per_s": llama["tokens_per_s"],
            "llama_cpp_tokens_per_s_1_thread": llama_1t["tokens_per_s"],
            "ours_vs_llama_cpp": quant / llama["tokens_per_s"],
            "ours_vs_llama_cpp_1_thread": (N_NEW / quant_1t_s) / llama_1t["tokens_per_s"],
            "llama_cpp_greedy_equal_hf": llama["tokens"] == hf_ids,
            "ours_int8_vs_llama_cpp": int8["ours_int8_tokens_per_s"] / llama["tokens_per_s"],
            "ours_int8_vs_llama_cpp_1_thread": int8["ours_int8_tokens_per_s_1_thread"]
            / llama_1t["tokens_per_s"],
            "int8_greedy_tokens_equal_llama_cpp": _agreed(int8_ids, llama["tokens"]),
        }
    return {
        "ours_tokens_per_s": ours,
        "ours_tokens_per_s_1_thread": N_NEW / ours_1t_s,
        "ours_quant_tokens_per_s": quant,
        "ours_quant_tokens_per_s_1_thread": N_NEW / quant_1t_s,
        "ours_quant_tokens_per_s_worker_thread": N_NEW / quant_thread_s,
        "worker_thread_vs_main_thread": quant_s / quant_thread_s,
        "ours_quant_vs_hf": quant / theirs_hf,
        "ours_quant_vs_fp32": quant / ours,
        "ours_quant_vs_fp32_1_thread": ours_1t_s / quant_1t_s,
        "ours_quant_vs_bound": (N_NEW - 1) / quant_decode_s / quant_bound,  # decode steps alone
        "ours_quant_decode_tokens_per_s": (N_NEW - 1) / quant_decode_s,
        "ours_quant_prefill_ms": quant_prefill_s * 1e3,
        "bound_quant_tokens_per_s": quant_bound,
        "weight_mb_per_step_quant": quant_bytes / 1e6,
        "read_bandwidth_quant_gb_s": quant_bandwidth / 1e9,
        "greedy_equal_hf_quant": quant_ids == hf_ids,
        **int8,
        "ours_int8_vs_float32_blocks": int8["ours_int8_tokens_per_s"] / quant,
        "ours_int8_vs_bound": int8["ours_int8_decode_tokens_per_s"] / quant_bound,
        "load_s_fp32": fp32_load["load_s"],
        "load_s_quant": quant_load["load_s"],
        "peak_rss_mb_fp32": fp32_load["peak_rss_mb"],
        "peak_rss_mb_quant": quant_load["peak_rss_mb"],
        **llama_figures,
        "hf_tokens_per_s": theirs_hf,
        "tl_tokens_per_s": theirs_tl,
        "ours_vs_hf": ours / theirs_hf,
        "ours_vs_tl": ours / theirs_tl,
        "bound_tokens_per_s": bound_tps,
        "ours_vs_bound": ours / bound_tps,
        "weight_mb_per_step": engine.model.runtime.weight_bytes() / 1e6,
        "read_bandwidth_gb_s": bandwidth / 1e9,
        "greedy_equal_hf": ours_ids == hf_ids,
        "greedy_equal_tl": ours_ids == tl_ids,
        "threads": threads,
    }
