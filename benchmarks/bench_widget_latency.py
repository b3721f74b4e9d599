"""Explorer latency: from a strength-slider change (set from Python) to the steered pane.

``first_token_ms``: slider change -> first steered token in the STEERED pane (includes the
explorer's debounce). ``full_ms``: slider change -> all 32 tokens shown. SAE warm, DEFAULT
already generated (so, as in real use, only the steered row decodes). Medians over a few
changes to different strengths. ``heatmap_lag_ms``: the last token shown in the panes -> the
heatmap showing that token's value (the heatmap is computed beside the run, not after it).
``full_ms_final_heat_only``: ``full_ms`` with the heatmap coloured only after each run (no
live updates while tokens stream), interleaved with the live runs: what live updates cost.
``first_token_during_evaluation_ms``: ``first_token_ms`` while the evaluate panel decodes.
"""

from __future__ import annotations

import os
import statistics
import time

N_TOKENS = 32
REPEATS = 5


def _engine():
    import steer_widgets as sw

    engine = sw.Engine.default()
    if not engine.saes.sources() and os.environ.get("SW_DEV_SAE"):
        engine.saes.add(os.environ["SW_DEV_SAE"], "10-dev")
    return engine


def run() -> dict:
    from steer_widgets.widgets import Explorer

    engine = _engine()
    if not engine.saes.sources():
        return {"skipped": "the default engine has no SAEs yet"}
    source = engine.saes.sources()[0]
    ex = Explorer(engine, n_completion_tokens=N_TOKENS, features=[(source, 3, 40.0)])
    assert ex.wait(300), ex.status  # warm: SAE loaded, DEFAULT cached
    first, full, engine_first, heat_lag, full_final_only = [], [], [], [], []
    for k in range(REPEATS):
        for live_heat in (True, False):
            ex.heat.live = live_heat
            t0 = time.perf_counter()
            ex.set_strength(0, 60.0 + 20 * k + (0 if live_heat else 10))
            assert ex.wait(300), ex.status
            run = ex.last_run
            assert run["default_cached"] and ex.default_generations == 1 and not ex.error, ex.status
            if not live_heat:
                full_final_only.append(1000 * (run["done_at"] - t0))
                continue
            first.append(1000 * (run["first_steered_at"] - t0))
            full.append(1000 * (run["done_at"] - t0))
            engine_first.append(1000 * (run["first_steered_at"] - run["started_at"]))
            heat_lag.append(1000 * (run["heat_at"] - run["last_token_at"]))
    during = during_evaluation(ex)
    return {
        "first_token_during_evaluation_ms": round(statistics.median(during), 1),
        "first_token_ms": round(statistics.median(first), 1),
        "full_ms": round(statistics.median(full), 1),
        "heatmap_lag_ms": round(statistics.median(heat_lag), 1),
        "full_ms_final_heat_only": round(statistics.median(full_final_only), 1),
        "first_token_from_run_start_ms": round(statistics.median(engine_first), 1),
        "debounce_ms": 1000 * ex.runner.debounce_s,
        "n_tokens": N_TOKENS,
        "default_generations": ex.default_generations,
    }


def during_evaluation(ex) -> list[float]:
    """Slider change -> first steered token while the explorer's evaluate panel (12 prompts x
    6 strengths, one ragged batch after another) decodes on the same engine: the live run
    takes its turns between the panel's steps instead of waiting for the panel."""
    assert ex.evaluate()
    time.sleep(3.0)  # the panel's first batches are decoding
    out = []
    for k in range(3):
        t0 = time.perf_counter()
        ex.set_strength(0, 50.0 + 7 * k)
        assert ex.wait(300), ex.status
        assert ex.evaluation is None or not ex.evaluation.complete, "the panel ended first"
        out.append(1000 * (ex.last_run["first_steered_at"] - t0))
    ex.stop_evaluation()
    ex.wait_evaluation(300)
    return out


if __name__ == "__main__":
    print(run())
