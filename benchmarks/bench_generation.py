"""Decode throughput of our generator vs transformers and TransformerLens, same weights.

64 new tokens after a chat prompt, batch 1, greedy, EOS ignored so every run decodes 64.
"""

from __future__ import annotations

import torch
from common import CHAT, best_of, read_bandwidth

from steer_widgets.tl_runtime import hooked_llama

N_NEW = 64


def _ours(engine, ids):
    from steer_widgets.generation import Row, Sampling, decode

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


def run() -> dict:
    from transformers import AutoModelForCausalLM

    import steer_widgets as sw

    engine = sw.Engine(sw.load_model(), saes=[])
    hf = AutoModelForCausalLM.from_pretrained(engine.model.source_dir, dtype=torch.float32).eval()
    ids = list(engine.tokenizer.encode(CHAT).ids)
    ours_ids, hf_ids = _ours(engine, ids), _hf(hf, ids)
    ours_s = best_of(lambda: _ours(engine, ids))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the other thread count, for the record (docs/benchmarks.md)
    ours_1t_s = best_of(lambda: _ours(engine, ids))
    torch.set_num_threads(threads)
    hf_s = best_of(lambda: _hf(hf, ids))
    tl = hooked_llama(engine.model.source_dir)
    tl_ids = _tl(tl, ids)
    tl_s = best_of(lambda: _tl(tl, ids), repeats=1)
    bandwidth = read_bandwidth()
    bound_tps = bandwidth / engine.model.runtime.weight_bytes()
    ours, theirs_hf, theirs_tl = N_NEW / ours_s, N_NEW / hf_s, N_NEW / tl_s
    return {
        "ours_tokens_per_s": ours,
        "ours_tokens_per_s_1_thread": N_NEW / ours_1t_s,
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
