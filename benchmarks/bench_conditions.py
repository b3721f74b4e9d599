"""What a condition costs: a steered generation gated by a token-scope feature condition
against the same steering without one, decode steps only, alternating in one run.

The condition is read from an SAE at layer 5 (a TopK encode of every feature at every
step) and holds everywhere (``below=1e9``), so both runs steer alike and write the same
tokens: the difference is the condition's reading and selection alone. A window condition
(no score to read) is timed beside it.
"""

from __future__ import annotations

import os
import statistics

import torch
from common import CHAT, timed_run

import steer_widgets as sw

ALTERNATIONS = int(os.environ.get("SW_BENCH_ALTERNATIONS", "7"))
TOKENS = 64


def run() -> dict:
    engine = sw.Engine.default()
    runtime = engine.model.runtime
    steering = sw.SteerRequest(
        CHAT, features=[sw.Feature("10-smollm2-res-4k", 100, 30.0)], types=("STEERED",),
        n_completion_tokens=TOKENS, temperature=0.0,
    )  # fmt: skip
    variants = {
        "plain": steering,
        "feature": steering.with_(when=sw.When(sw.Feature("5-smollm2-res-4k", 3187), below=1e9)),
        "window": steering.with_(when=sw.When.tokens(of="all")),
    }
    outs = {name: engine.steer(r).outputs["STEERED"] for name, r in variants.items()}  # warm
    assert len({o.token_ids for o in outs.values()}) == 1, "the variants must write alike"
    steps = len(outs["plain"].token_ids) - 1  # decode steps: the first token is the prefill's
    decode = {name: [] for name in variants}
    for _ in range(ALTERNATIONS):
        for name, request in variants.items():
            _, seconds = timed_run(lambda r=request: engine.steer(r), runtime)
            decode[name].append(seconds)
    ms = {name: 1000 * statistics.median(v) / steps for name, v in decode.items()}
    return {
        "cpu_threads": torch.get_num_threads(),
        "decode_steps": steps,
        "plain_ms_per_step": round(ms["plain"], 3),
        "feature_condition_ms_per_step": round(ms["feature"], 3),
        "window_condition_ms_per_step": round(ms["window"], 3),
        "feature_condition_cost": round(ms["feature"] / ms["plain"] - 1, 4),
        "window_condition_cost": round(ms["window"] / ms["plain"] - 1, 4),
    }
