"""Token probabilities as the panes show them on hover: each generated token's probability
and its top alternatives, from the engine's ``Completion.token_probs``.

The engine records log-probabilities under the row's own distribution (steering included,
before temperature and frequency penalty); here they become small JSON-able rows, rounded
so that streaming every frame stays cheap, with token ids turned into text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from ..steering.results import Completion

TextOf = Callable[[int], str]  # token id -> its text
DIGITS = 5  # probabilities rounded to this many decimals


def alternative_ids(outputs: Iterable[Completion]) -> set[int]:
    """Every token id listed as an alternative (their text must be known to show them)."""
    return {i for c in outputs for p in c.token_probs or () for i, _ in p.top}


def hover_rows(completion: Completion, text_of: TextOf) -> list | None:
    """Per token ``[probability, [[alternative text, probability], ...]]``, most likely
    alternative first; ``None`` where the backend supplied no probabilities."""
    if completion.token_probs is None:
        return None
    return [
        [_prob(p.logprob), [[text_of(i), _prob(lp)] for i, lp in p.top]]
        for p in completion.token_probs
    ]


def _prob(logprob: float) -> float:
    return round(math.exp(logprob), DIGITS)
