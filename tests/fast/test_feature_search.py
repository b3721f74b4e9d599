"""Feature-index search over the shipped indexes, and the token-only fallback, without a model."""

from __future__ import annotations

from pathlib import Path

import pytest

import steer_widgets
from steer_widgets.feature_index import FeatureIndex

SAES = Path(steer_widgets.__file__).parent / "saes"


def no_tokens():
    raise AssertionError("a shipped index must not compute top tokens")


@pytest.fixture(scope="module")
def index():
    return FeatureIndex.load("10-smollm2-res-4k", SAES / "10-smollm2-res-4k", no_tokens)


def haystack(info) -> str:
    """What search looks in: the label, the top output tokens, the top contexts."""
    contexts = " ".join("".join(c["tokens"]) for c in info.contexts)
    return f"{info.label} {' '.join(info.top_tokens)} {contexts}".lower()


@pytest.mark.parametrize("query", ["france", " the", "war", "Congress"])
def test_every_hit_mentions_the_query_and_token_hits_rank_first(index, query):
    hits = index.search(query, limit=10_000)
    q = query.strip().lower()
    want = {i.index for i in index.infos if q in haystack(i)}
    assert {h.index for h in hits} == want and want
    in_tokens = [any(q in t.lower() for t in h.top_tokens) for h in hits]
    assert in_tokens == sorted(in_tokens, reverse=True)  # all token hits, then context hits
    first = [h.max_act or 0 for h, t in zip(hits, in_tokens, strict=True) if t]
    assert first == sorted(first, reverse=True)


def test_limit_digits_and_empty(index):
    assert len(index) == 4096
    assert len(index.search("the", limit=3)) == 3
    assert [i.index for i in index.search("42")] == [42]
    assert index.search("99999") == [] and index.search("   ") == []
    assert "[" in index[0].example or not index[0].contexts


def test_token_only_index_without_shipped_file(tmp_path):
    pairs = [([" Paris", " France"], [" the"]), ([" cat", " dog"], [" car"])]
    built = FeatureIndex.load("x", tmp_path, lambda: pairs)
    assert [i.index for i in built.search("franc")] == [0]
    assert built[1].bottom_tokens == (" car",) and built.label(1) == "→ cat, dog"
    assert [i.index for i in built.search("DOG")] == [1] and built[1].contexts == ()
    assert built.search("car") == []  # bottom tokens are not searched
