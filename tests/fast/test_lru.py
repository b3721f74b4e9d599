"""The one LRU every cache uses: count and byte bounds, recency, pins, get-or-compute."""

from __future__ import annotations

import threading

import pytest

from steer_widgets.lru import LRU


def test_a_count_bound_evicts_the_oldest_first():
    cache: LRU[str, int] = LRU(2)
    assert cache.put("a", 1) == []
    cache.put("b", 2)
    assert cache.put("c", 3) == ["a"]
    assert list(cache) == ["b", "c"] and len(cache) == 2
    assert "a" not in cache and cache.get("a") is None and cache.get("a", 0) == 0


def test_get_marks_recent_unless_told_not_to():
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a", touch=False) == 1 and list(cache) == ["a", "b"]
    assert "a" in cache and list(cache) == ["a", "b"]  # a look is not a use
    assert cache.get("a") == 1 and list(cache) == ["b", "a"]
    assert cache.put("c", 3) == ["b"]
    assert list(cache) == ["a", "c"]


def test_put_moves_a_key_to_the_end_unless_told_not_to():
    cache: LRU[str, int] = LRU(3)
    for k, v in zip("abc", range(3), strict=True):
        cache.put(k, v)
    cache.put("a", 10, touch=False)
    assert list(cache) == ["a", "b", "c"] and cache.get("a", touch=False) == 10
    cache.put("a", 11)
    assert list(cache) == ["b", "c", "a"]


def test_a_weight_budget_evicts_the_least_recent_until_it_fits():
    cache: LRU[str, bytes] = LRU(budget=10, weight=len)
    cache.put("a", b"1234")
    cache.put("b", b"1234")
    cache.get("a")
    assert cache.total() == 8
    assert cache.put("c", b"123") == ["b"]  # 11 > 10: b was the least recent
    assert list(cache) == ["a", "c"] and cache.total() == 7
    assert cache.put("d", b"12345678") == ["a", "c"]
    assert list(cache) == ["d"]


def test_an_entry_heavier_than_the_budget_is_kept_alone():
    cache: LRU[str, bytes] = LRU(budget=4, weight=len)
    cache.put("a", b"12")
    assert cache.put("big", b"1234567") == ["a"]
    assert list(cache) == ["big"] and cache.total() == 7
    assert cache.put("b", b"1") == ["big"]
    assert list(cache) == ["b"]


def test_pinned_entries_stay_and_evict_drops_the_rest_later():
    pinned = {"a"}
    cache: LRU[str, bytes] = LRU(budget=4, weight=len, pinned=pinned.__contains__)
    cache.put("a", b"123")
    assert cache.put("b", b"123") == []  # a is in use, b was just put: both stay
    assert list(cache) == ["a", "b"] and cache.total() == 6
    pinned.clear()
    assert cache.evict() == ["a"]
    assert list(cache) == ["b"]
    assert cache.evict() == []


def test_both_bounds_hold_together():
    cache: LRU[str, bytes] = LRU(2, budget=100, weight=len)
    for k in "abc":
        cache.put(k, b"x")
    assert list(cache) == ["b", "c"]


def test_a_budget_needs_a_weight():
    with pytest.raises(ValueError, match="weight"):
        LRU(budget=10)
    with pytest.raises(ValueError, match="budget"):
        LRU(weight=len)


def test_get_or_compute_computes_once_and_marks_recent():
    calls: list[str] = []

    def make(key: str):
        def compute() -> str:
            calls.append(key)
            return key.upper()

        return compute

    cache: LRU[str, str] = LRU(2)
    assert cache.get_or_compute("a", make("a")) == "A"
    assert cache.get_or_compute("b", make("b")) == "B"
    assert cache.get_or_compute("a", make("a")) == "A"
    assert calls == ["a", "b"] and list(cache) == ["b", "a"]
    cache.get_or_compute("c", make("c"))
    assert list(cache) == ["a", "c"]


def test_get_or_compute_keeps_none_and_computes_outside_the_lock():
    lock = threading.Lock()
    seen: list[bool] = []

    def compute() -> None:
        seen.append(lock.locked())

    cache: LRU[str, None] = LRU(4)
    assert cache.get_or_compute("a", compute, lock) is None
    assert cache.get_or_compute("a", compute, lock) is None
    assert seen == [False] and "a" in cache and not lock.locked()


def test_clear_forgets_every_entry():
    cache: LRU[str, bytes] = LRU(budget=10, weight=len)
    cache.put("a", b"12")
    cache.put("b", b"34")
    cache.clear()
    assert len(cache) == 0 and list(cache) == [] and cache.total() == 0
    assert cache.get("a") is None


def test_eviction_weighs_each_entry_once_not_once_per_drop():
    """200 entries dropped in one eviction: the weights are summed once and each dropped
    entry's taken off, about 400 weight calls where a sum per drop made about 20,000."""
    calls = [0]

    def weight(value: int) -> int:
        calls[0] += 1
        return value

    cache: LRU[int, int] = LRU(budget=10**6, weight=weight)
    for k in range(200):
        cache.put(k, 1)
    cache.budget, calls[0] = 0, 0  # only the eviction's calls are counted
    assert cache.evict() == list(range(200)) and cache.total() == 0
    assert calls[0] <= 2 * 200 + 1
