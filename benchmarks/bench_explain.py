"""Why the text changed: the steering effect of a 32-token STEERED completion (cold: one
unsteered forward; cached), attribution of one token with the default SAEs, and first-order
attributions against real removals and ablations over a fixed set of cases.

Cases: three prompts, each steered by a layer-12 feature at its recommended strength, by a
layer-5 plus a layer-22 feature together, and by a planted direction (a token's unembedding
at layer 24); in each, the two tokens steering raised most. Every steering row is removed
and the top five SAE features at or after the steering are ablated (their activation set
back to the unsteered run's): ``attribution_rank_corr`` is Spearman's rank correlation of
predicted against measured changes of the token's log-probability over all those pairs.
Every figure for both ``products`` settings (``int8_*``).
"""

from __future__ import annotations

import time

from common import best_of

import steer_widgets as sw
from steer_widgets.analysis.agreement import agreement
from steer_widgets.steering.requests import Feature, SteerRequest, Vector

PROMPTS = (
    [{"role": "user", "content": "Tell me about your day."}],
    [{"role": "user", "content": "What should I cook tonight?"}],
    "The best way to learn a language is",
)
PLANTED = (" ocean", " music", " cheese")


def _steerings(engine, i: int) -> list[dict]:
    strength = engine.default_strength
    token = engine.tokenizer.hf.encode(PLANTED[i], add_special_tokens=False)[0]
    direction = engine.model.runtime.unembed_weight[token].tolist()
    late = "blocks.24.hook_resid_post"
    return [
        {"features": (Feature("12-smollm2-res-4k", 100 + 37 * i, strength("12-smollm2-res-4k")),)},
        {
            "features": (
                Feature("5-smollm2-res-4k", 200 + 11 * i, strength("5-smollm2-res-4k")),
                Feature("22-smollm2-res-4k", 300 + 5 * i, strength("22-smollm2-res-4k")),
            )
        },
        {
            "vectors": (Vector(direction, late, 0.3 * engine.typical_norm(late)),),
            "normalize_steering": True,
        },
    ]


def _request(engine, prompt, n: int = 32, **steer) -> SteerRequest:
    return SteerRequest(
        prompt=prompt,
        n_completion_tokens=n,
        temperature=0,
        prompt_multiplier=engine.default_prompt_multiplier(),
        **steer,
    )


def _top_positions(effect, k: int = 2) -> list[int]:
    return sorted(range(len(effect.effect)), key=lambda i: -effect.effect[i])[:k]


def run() -> dict:
    """The figures with the default float32 products, then ``int8_*`` with
    ``products="int8"`` (attribution's backward stays float32 there)."""
    figures = _figures(sw.Engine.default())
    int8 = _figures(sw.Engine(sw.load_model(products="int8")))
    return {**figures, **{f"int8_{k}": v for k, v in int8.items()}}


def _figures(engine) -> dict:
    for source in engine.saes.sources():  # labels and SAEs warm: this measures the maths
        engine.feature_index(source)
        engine.saes.get(source)
    timed = engine.steer(_request(engine, PROMPTS[0], **_steerings(engine, 0)[0]))
    start = time.perf_counter()
    effect = engine.steering_effect(timed)
    effect_ms = (time.perf_counter() - start) * 1000
    effect_cached_ms = best_of(lambda: engine.steering_effect(timed), repeats=5) * 1000
    position = _top_positions(effect, 1)[0]
    attribute_ms = best_of(lambda: engine.attribute(timed, position=position)) * 1000
    gradient_ms = best_of(lambda: engine.attribute(timed, position=position, steps=1)) * 1000
    attributions = []
    for i, prompt in enumerate(PROMPTS):
        for steer in _steerings(engine, i):
            result = engine.steer(_request(engine, prompt, n=16, **steer))
            for pos in _top_positions(engine.steering_effect(result)):
                attributions.append(engine.attribute(result, position=pos, n=5, ablate=True))
    report = agreement(attributions)
    features_only = agreement(attributions, rows=False)
    return {
        "effect_ms": effect_ms,
        "effect_cached_ms": effect_cached_ms,
        "effect_tokens": len(effect.token_ids),
        "attribute_ms": attribute_ms,
        "attribute_gradient_only_ms": gradient_ms,
        "attribution_rank_corr": report.rank_corr,
        "attribution_median_relative_error": report.median_relative_error,
        "features_rank_corr": features_only.rank_corr,
        "features_median_relative_error": features_only.median_relative_error,
        "n_cases": len(attributions),
        "n_pairs": len(report.predicted),
    }
