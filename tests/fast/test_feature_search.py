"""Feature-index search over the shipped indexes, and the token-only fallback, without a model."""

from __future__ import annotations

from pathlib import Path

import pytest

import steer_widgets
from steer_widgets.sae.feature_index import FeatureIndex

SAES = Path(steer_widgets.__file__).parent / "data" / "saes"


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


def test_contexts_read_back_as_shipped_and_stay_compact():
    """Each feature's contexts equal the shipped JSON's; the index keeps them compact: the
    parsed contexts of a 4k index held 37 MB of Python objects for the session; now 13 MB."""
    import gzip
    import json
    import tracemalloc

    folder = SAES / "10-smollm2-res-4k"
    shipped = json.loads(gzip.decompress((folder / "feature_index.json.gz").read_bytes()))
    tracemalloc.start()
    try:
        index = FeatureIndex.load("10-smollm2-res-4k", folder, no_tokens)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 20e6, f"{held / 1e6:.1f} MB held by the index"
    for info, raw in zip(index.infos, shipped["features"], strict=True):
        contexts = raw.get("contexts", [])
        assert len(info.contexts) == len(contexts) and list(info.contexts) == contexts
        assert info.contexts[:2] == tuple(contexts[:2]) and info.contexts == tuple(contexts)
    info = index[7]
    assert hash(info) == hash(index[7]) and info == index[7]
