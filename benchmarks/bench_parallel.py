"""Parallel DEFAULT + STEERED (and sweeps) vs the same rows alone, in one run.

64 new tokens after a chat prompt, temperature 0.5, one feature of a default SAE; EOS ignored
by asking for a long answer (rows that stop early are reported in ``min_tokens``).
"""

from __future__ import annotations

from common import CHAT, best_of

SWEEP = (-2.0, -1.0, 2.0, 4.0)


def run() -> dict:
    import steer_widgets as sw

    engine = sw.Engine.default()
    source = engine.saes.sources()[len(engine.saes.sources()) // 2]
    base = sw.SteerRequest(
        CHAT, features=[sw.Feature(source, 11, 40.0)], n_completion_tokens=64, temperature=0.5
    )
    cases = {
        "default": base.with_(types=("DEFAULT",)),
        "steered": base.with_(types=("STEERED",)),
        "pair": base,
        "sweep5": base.with_(types=("DEFAULT",), sweep=SWEEP),
    }
    results, seconds = {}, {}
    for name, request in cases.items():

        def once(request=request, name=name):
            engine.clear_caches()  # time real generation, not the DEFAULT cache
            results[name] = engine.steer(request)

        seconds[name] = best_of(once)
    solo = {"DEFAULT": results["default"].outputs["DEFAULT"]}
    solo["STEERED"] = results["steered"].outputs["STEERED"]
    identical = results["pair"].outputs == {k: solo[k] for k in ("DEFAULT", "STEERED")}
    for m in SWEEP:
        engine.clear_caches()
        alone = engine.steer(base.with_(types=("STEERED",), strength_multiplier=m))
        identical &= results["sweep5"].outputs[f"STEERED*{m:g}"] == alone.outputs["STEERED"]
    identical &= results["sweep5"].outputs["DEFAULT"] == solo["DEFAULT"]
    a, b, c, d = (seconds[k] for k in ("default", "steered", "pair", "sweep5"))
    lengths = [len(o.token_ids) for r in results.values() for o in r.outputs.values()]
    return {
        "default_s": a,
        "steered_s": b,
        "pair_s": c,
        "sweep5_s": d,
        "ratio_pair_vs_single": c / a,
        "ratio_pair_vs_serial": c / (a + b),
        "ratio_sweep5_vs_single": d / a,
        "identical": bool(identical),
        "min_tokens": min(lengths),
    }
