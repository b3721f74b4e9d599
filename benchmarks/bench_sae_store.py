"""The SAE store: a steering request cold (SAE never touched) vs warm vs a strength change,
whole-SAE loads cold vs warm, and resident bytes under a budget smaller than all SAEs."""

from __future__ import annotations

import time

from common import best_of

import steer_widgets as sw
from steer_widgets.sae.store import SAEStore


def _ms(fn) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1000


def run() -> dict:
    engine = sw.Engine.default()
    sources = engine.saes.sources()
    source = sources[1]
    request = sw.SteerRequest(
        "The weather today", types=("STEERED",), n_completion_tokens=1,
        features=[sw.Feature(source, 77, 40.0)],
    )  # fmt: skip
    engine.steer(request.with_(features=[sw.Feature(sources[0], 1, 1.0)]))  # warm the model
    engine.saes.clear()
    cold = _ms(lambda: engine.steer(request))
    warm = best_of(lambda: engine.steer(request)) * 1000
    moved = request.with_(features=[sw.Feature(source, 77, 90.0)])
    strength_change = best_of(lambda: engine.steer(moved)) * 1000

    total = sum(engine.saes.config(s).nbytes() for s in sources)
    store = SAEStore(engine.model.runtime.hook_widths(), budget_bytes=int(total * 0.6))
    for s in sources:
        store.add(engine.saes.config(s).folder, s)
    load_cold = _ms(lambda: store.get(sources[0]))
    load_warm = best_of(lambda: store.get(sources[0])) * 1000
    worst = 0
    for s in sources * 2:
        store.get(s)
        worst = max(worst, store.stats()["resident_bytes"])
    stats = store.stats()
    return {
        "cold_ms": cold,
        "warm_ms": warm,
        "strength_change_ms": strength_change,
        "warm_vs_cold": cold / warm,
        "full_load_cold_ms": load_cold,
        "full_load_warm_ms": load_warm,
        "budget_bytes": store.budget_bytes,
        "all_saes_bytes": total,
        "peak_resident_bytes": stats["peak_resident_bytes"],
        "max_resident_over_budget": max(worst, stats["peak_resident_bytes"]) / store.budget_bytes,
        "evictions": stats["evictions"],
    }
