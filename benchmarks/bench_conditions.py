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

ALTERNATIONS = int(os.environ.get("SW_BENCH_ALTERNATIONS", "25"))
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
    names = list(variants)
    for i in range(ALTERNATIONS):  # each alternation starts with another variant
        for name in names[i % len(names) :] + names[: i % len(names)]:
            _, seconds = timed_run(lambda r=variants[name]: engine.steer(r), runtime)
            decode[name].append(seconds)
    ms = {name: 1000 * statistics.median(v) / steps for name, v in decode.items()}

    def cost(name: str) -> tuple[float, float, float]:
        """The median and quartiles of the cost over alternations, each against the plain
        run of its own alternation (this machine's speed drifts between alternations)."""
        each = sorted(a / b - 1 for a, b in zip(decode[name], decode["plain"], strict=True))
        n = len(each)
        return tuple(round(x, 4) for x in (statistics.median(each), each[n // 4], each[3 * n // 4]))

    return {
        "cpu_threads": torch.get_num_threads(),
        "decode_steps": steps,
        "plain_ms_per_step": round(ms["plain"], 3),
        "feature_condition_ms_per_step": round(ms["feature"], 3),
        "window_condition_ms_per_step": round(ms["window"], 3),
        "feature_condition_cost": cost("feature"),
        "window_condition_cost": cost("window"),
        "alternations": ALTERNATIONS,
    }
