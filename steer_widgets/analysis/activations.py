"""Where features fire: per-token values, top features per token, top features over a span.

Residual activations of recent (token ids, hook) pairs are kept in a small LRU under a byte
budget, so a second question about the same text (another feature, another k) does not run
the model again. The forward pass stops at the deepest hook asked for, and captures every
registered SAE hook up to there in the same pass.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import RequestError
from ..lru import LRU
from ..runtime.protocol import hook_layer

DEFAULT_CACHE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Text:
    """Token ids to analyse, their strings, and which are special (BOS, chat scaffolding)."""

    ids: tuple[int, ...]
    tokens: tuple[str, ...]
    special: tuple[bool, ...]


@dataclass(frozen=True)
class FeatureActivations:
    """One feature over a text. ``max_value``/``max_position`` skip special tokens."""

    source: str
    index: int
    tokens: tuple[str, ...]
    special: tuple[bool, ...]
    values: tuple[float, ...]
    max_value: float
    max_position: int | None

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"token": self.tokens, "special": self.special, "value": self.values})


@dataclass(frozen=True)
class TopFeatures:
    """Features ranked over a text; ``values[i]`` is feature ``indices[i]`` at every token."""

    source: str
    tokens: tuple[str, ...]
    indices: tuple[int, ...]
    scores: tuple[float, ...]
    values: tuple[tuple[float, ...], ...]
    rank_by: str

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(
            {
                "index": self.indices,
                self.rank_by: self.scores,
                "values": [list(v) for v in self.values],
            }
        )


@dataclass(frozen=True)
class TopPerToken:
    """For each position, the ``k`` strongest features and their values."""

    source: str
    tokens: tuple[str, ...]
    special: tuple[bool, ...]
    indices: tuple[tuple[int, ...], ...]
    values: tuple[tuple[float, ...], ...]

    def to_frame(self):
        import pandas as pd

        rows = []
        for pos, (tok, idx, val) in enumerate(
            zip(self.tokens, self.indices, self.values, strict=True)
        ):
            for rank, (i, v) in enumerate(zip(idx, val, strict=True)):
                rows.append({"position": pos, "token": tok, "rank": rank, "index": i, "value": v})
        return pd.DataFrame(rows)


class ResidualCache:
    """LRU under one byte budget of residuals, keyed by (token ids, hook name), and of the
    SAE activations computed from them, keyed by (token ids, SAE source).

    The two kinds share the budget and the eviction order but never a key, so a hook and a
    source of the same name cannot collide. Thread-safe: every access holds one lock. The
    newest entry is kept even when it alone is over the budget.
    """

    def __init__(self, budget_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._items: LRU[tuple, Tensor] = LRU(budget=budget_bytes, weight=_nbytes)
        self._lock = threading.Lock()
        self.hits = self.misses = self.forwards = 0

    @property
    def budget_bytes(self) -> int:
        return self._items.budget

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self._items.budget = value

    def get(self, ids: tuple[int, ...], hook: str) -> Tensor | None:
        """Residuals [T, d] at ``hook``, or None."""
        return self._get(("residual", ids, hook))

    def put(self, ids: tuple[int, ...], hook: str, value: Tensor) -> None:
        self._put(("residual", ids, hook), value)

    def has(self, ids: tuple[int, ...], hook: str) -> bool:
        """Whether residuals are cached, without counting a hit or a miss."""
        with self._lock:
            return ("residual", ids, hook) in self._items

    def get_features(self, ids: tuple[int, ...], source: str) -> Tensor | None:
        """All of one SAE's feature activations [T, d_sae] over ``ids``, or None."""
        return self._get(("features", ids, source))

    def put_features(self, ids: tuple[int, ...], source: str, value: Tensor) -> None:
        self._put(("features", ids, source), value)

    def count_forward(self) -> None:
        with self._lock:
            self.forwards += 1

    def clear(self) -> None:
        """Forget every entry and reset the counters."""
        with self._lock:
            self._items.clear()
            self.hits = self.misses = self.forwards = 0

    def _get(self, key: tuple) -> Tensor | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self.hits += 1
            else:
                self.misses += 1
            return value

    def _put(self, key: tuple, value: Tensor) -> None:
        with self._lock:
            self._items.put(key, value)

    def nbytes(self) -> int:
        with self._lock:
            return self._items.total()

    def stats(self) -> dict:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "forwards": self.forwards,
                "entries": len(self._items),
                "bytes": self._items.total(),
            }


def _nbytes(value: Tensor) -> int:
    return value.numel() * value.element_size()


def residuals(
    model,
    cache: ResidualCache,
    ids: tuple[int, ...],
    hooks: Sequence[str],
    also: Sequence[str] = (),
) -> dict:
    """Residuals [T, d] at ``hooks`` for ``ids``, from the cache or one truncated forward.

    Hooks in ``also`` no deeper than the deepest one needed are captured in the same pass, so
    a later question about another SAE on the same text is a cache hit.
    """
    out = {h: cache.get(ids, h) for h in hooks}
    missing = [h for h, v in out.items() if v is None]
    if not missing:
        return out
    deepest = max(_layer(h) for h in missing)
    captured: dict[str, Tensor] = {}

    def grab(name: str):
        def fn(x: Tensor, start: int) -> None:
            captured[name] = x[0].reshape(x.shape[1], -1).float().cpu().clone()  # SAEs on CPU

        return fn

    names = set(missing) | {h for h in also if _layer(h) <= deepest and not cache.has(ids, h)}
    tokens = torch.tensor([list(ids)], device=model.device)
    model.forward(tokens, hooks={h: grab(h) for h in names}, stop_at_layer=deepest + 1)
    cache.count_forward()
    for name, value in captured.items():
        cache.put(ids, name, value)
    out.update({h: captured[h] for h in missing})
    return out


def _layer(hook: str) -> int:
    layer = hook_layer(hook)
    if layer is None:
        raise RequestError("source", f"hook {hook!r} is not a blocks.L hook")
    return layer


def max_outside_special(values: Tensor, special: Sequence[bool]) -> tuple[float, int | None]:
    keep = ~torch.tensor(special, dtype=torch.bool)
    if not keep.any():
        return 0.0, None
    masked = values.masked_fill(~keep, float("-inf"))
    pos = int(masked.argmax())
    return float(values[pos]), pos
