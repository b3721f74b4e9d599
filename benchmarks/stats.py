"""Bootstrap intervals for the steering benchmark: resampled over concepts, the unit the
benchmark's concepts were drawn in (rows of one concept are not independent)."""

from __future__ import annotations

import random
from collections import defaultdict

RESAMPLES = 2000
SEED = 20261203


def _by_concept(rows: list[dict], method: str) -> dict[str, dict[int | str, bool]]:
    out: dict[str, dict] = defaultdict(dict)
    for r in rows:
        if r["method"] == method:
            out[r["concept"]][r["prompt"]] = bool(r["success"])
    return out


def _interval(values: list[float], level: float) -> tuple[float, float]:
    values = sorted(values)
    lo = values[int((1 - level) / 2 * len(values))]
    hi = values[min(len(values) - 1, int((1 + level) / 2 * len(values)))]
    return lo, hi


def success_interval(rows: list[dict], method: str, level: float = 0.95) -> tuple:
    """(success rate, lower, upper): a percentile bootstrap over concepts."""
    cells = _by_concept(rows, method)
    concepts = sorted(cells)
    rate = sum(sum(c.values()) for c in cells.values()) / sum(len(c) for c in cells.values())
    rng = random.Random(SEED)
    draws = []
    for _ in range(RESAMPLES):
        picked = [cells[rng.choice(concepts)] for _ in concepts]
        draws.append(sum(sum(c.values()) for c in picked) / sum(len(c) for c in picked))
    return (rate, *_interval(draws, level))


def paired_bootstrap(rows: list[dict], a: str, b: str, level: float = 0.95) -> tuple:
    """(success of ``a`` minus ``b``, lower, upper) on the same (concept, prompt) cells,
    resampling concepts with their prompts."""
    ca, cb = _by_concept(rows, a), _by_concept(rows, b)
    concepts = sorted(set(ca) & set(cb))
    diffs = {
        c: [ca[c][p] - cb[c][p] for p in sorted(set(ca[c]) & set(cb[c]), key=str)] for c in concepts
    }
    if not concepts:
        raise ValueError(f"no cells with both {a!r} and {b!r}")

    def mean(cs: list[str]) -> float:
        return sum(sum(diffs[c]) for c in cs) / max(1, sum(len(diffs[c]) for c in cs))

    rng = random.Random(SEED)
    draws = [mean([rng.choice(concepts) for _ in concepts]) for _ in range(RESAMPLES)]
    return (mean(concepts), *_interval(draws, level))
