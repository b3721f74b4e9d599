"""Activations over a 128-token text: one feature cold, another feature on the same text
(residual cache hit, and the SAE's activations of that text kept too), another SAE on the
same text (residual hit, one SAE encode), top-k per token, top-N over the text."""

from __future__ import annotations

import time

from common import best_of

import steer_widgets as sw

WORDS = (
    "In the spring of that year the river rose over its banks and the people of the valley "
    "moved their animals to the high pastures, where the grass was thin but the air was clear. "
)


def _text(engine, n_tokens: int = 128) -> str:
    text = WORDS * 8
    ids = engine.tokenizer.encode(text).ids[:n_tokens]
    return engine.tokenizer.decode(ids)


def run() -> dict:
    engine = sw.Engine.default()
    source = engine.saes.sources()[1]
    text = _text(engine)
    engine.saes.get(source)  # SAE warm: this measures the model and the residual cache
    engine.activations("warm up", source, 1)
    engine.clear_caches()
    start = time.perf_counter()
    engine.activations(text, source, 11)
    cold = (time.perf_counter() - start) * 1000
    warm = best_of(lambda: engine.activations(text, source, 12), repeats=5) * 1000
    # another SAE on the same text: residual from the cache, its SAE encode runs once
    other = engine.saes.sources()[0]
    start = time.perf_counter()
    engine.activations(text, other, 3)
    other_sae = (time.perf_counter() - start) * 1000
    topk = best_of(lambda: engine.top_features_per_token(text, source, k=5)) * 1000
    topn = best_of(lambda: engine.top_features(text, source, n=20)) * 1000
    return {
        "n_tokens": len(engine.text(text).ids),
        "single_cold_ms": cold,
        "single_warm_ms": warm,
        "other_sae_warm_ms": other_sae,
        "topk_ms": topk,
        "topn_ms": topn,
        "warm_vs_cold": cold / warm,
        "forwards": engine.residual_cache.stats()["forwards"],
    }
