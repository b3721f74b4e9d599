"""One least-recently-used map for every cache in the package.

Why it exists: the text, residual, concept, SAE, completion and explanation caches each kept
an ``OrderedDict`` by hand, with the same move-to-end and pop-oldest lines; this is the one
copy. No lock inside, on purpose: each owner shared between threads already holds a lock that
guards the state beside its cache too (counters, pins), and ``get_or_compute`` takes it.
Standard library only: it sits below every other module.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Container, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most ``max_items`` entries and ``budget`` of summed ``weight`` (bytes), or both.

    Eviction drops the least recently used first, never a ``pinned`` key nor the one just
    put (so an entry heavier than the whole budget is kept, alone). Iterates keys oldest first.
    """

    def __init__(
        self,
        max_items: int | None = None,
        *,
        budget: int | None = None,
        weight: Callable[[V], int] | None = None,
        pinned: Callable[[K], bool] | None = None,
    ) -> None:
        if (budget is None) != (weight is None):
            raise ValueError("a budget needs a weight function, and a weight a budget")
        self.max_items, self.budget, self.weight, self.pinned = max_items, budget, weight, pinned
        self._data: OrderedDict[K, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:  # not a use: recency stays
        return key in self._data

    def __iter__(self) -> Iterator[K]:
        return iter(self._data)

    def get(self, key: K, default: V | None = None, *, touch: bool = True) -> V | None:
        """The value under ``key`` (marked most recent unless ``touch=False``), or ``default``."""
        if touch and key in self._data:
            self._data.move_to_end(key)
        return self._data.get(key, default)

    def put(self, key: K, value: V, *, touch: bool = True) -> list[K]:
        """Keep ``value`` as the most recent entry (``touch=False``: a key already here keeps
        its place), then evict past the bounds; returns the keys evicted."""
        self._data[key] = value
        if touch:
            self._data.move_to_end(key)
        return self.evict(keep=(key,))

    def get_or_compute(
        self, key: K, compute: Callable[[], V], lock: AbstractContextManager | None = None
    ) -> V:
        """The value under ``key``, else ``compute()``'s, kept. The cache is read and written
        under ``lock`` and ``compute`` runs outside it: two threads that miss together both
        compute, and the later value is kept in the earlier one's place."""
        guard = lock or nullcontext()
        with guard:
            if key in self._data:
                self._data.move_to_end(key)
                return self._data[key]
        value = compute()
        with guard:
            self.put(key, value, touch=False)
        return value

    def clear(self) -> None:
        self._data.clear()

    def total(self) -> int:
        """The entries' summed weight (0 without a weight function)."""
        return sum(map(self.weight, self._data.values())) if self.weight else 0

    def evict(self, keep: Container[K] = ()) -> list[K]:
        """Drop the least recent entries, but pinned ones and ``keep``, until within the
        bounds or only those are left; returns the keys dropped. The weights are summed once
        and each dropped entry's taken off the sum: linear in the entries, where a sum per
        dropped entry was quadratic."""
        dropped: list[K] = []
        total = self.total() if self.budget is not None else 0
        for key in list(self._data):
            over = self.max_items is not None and len(self._data) > self.max_items
            if not over and (self.budget is None or total <= self.budget):
                break
            if key not in keep and not (self.pinned and self.pinned(key)):
                if self.budget is not None and self.weight is not None:
                    total -= self.weight(self._data[key])
                del self._data[key]
                dropped.append(key)
        return dropped
