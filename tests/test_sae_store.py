"""The SAE store: byte budget, LRU, stats, thread safety, lazy rows, bad sources."""

from __future__ import annotations

import json
import shutil
import threading
import warnings

import pytest
import torch

import steer_widgets as sw
from steer_widgets.sae.store import SAEStore


@pytest.fixture
def store(engine, sources):
    """A fresh store over the default SAEs, budget room for two of them."""
    one = engine.saes.config(sources[0]).nbytes()
    s = SAEStore(engine.model.runtime.hook_widths(), budget_bytes=int(2.5 * one))
    for name in sources:
        s.add(engine.saes.config(name).folder, name)
    return s


def test_lru_under_budget_with_stats(store, sources):
    sources = sources[:3]  # room for two: the third evicts the first, which evicts the second
    peak = 0
    for name in sources + sources[:1]:
        store.get(name)
        peak = max(peak, store.stats()["resident_bytes"])
        assert store.stats()["resident_bytes"] <= store.budget_bytes
    stats = store.stats()
    assert stats["misses"] == 4 and stats["evictions"] == 2 and stats["hits"] == 0
    assert stats["peak_resident_bytes"] == peak <= store.budget_bytes
    assert store.resident() == [sources[2], sources[0]]  # least recently used went first
    loading = stats["load_seconds"]
    assert loading > 0  # four loads from disk
    store.get(sources[0])
    assert store.stats()["hits"] == 1
    assert store.stats()["load_seconds"] == loading  # a hit loads nothing


def test_one_sae_over_budget_is_served_with_a_warning(engine, sources):
    tiny = SAEStore(engine.model.runtime.hook_widths(), budget_bytes=1024)
    tiny.add(engine.saes.config(sources[0]).folder, sources[0])
    with pytest.warns(UserWarning, match="over its budget"):
        sae = tiny.get(sources[0])
    assert sae.W_dec.shape[0] == engine.saes.config(sources[0]).d_sae


def test_pinned_sae_is_not_evicted(engine, sources):
    one = engine.saes.config(sources[0]).nbytes()
    s = SAEStore(engine.model.runtime.hook_widths(), budget_bytes=int(1.5 * one))
    for name in sources:
        s.add(engine.saes.config(name).folder, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with s.using(sources[0]):
            s.get(sources[1])
            assert sources[0] in s.resident()
        assert s.stats()["resident_bytes"] <= s.budget_bytes


def test_concurrent_loads_of_one_sae_load_it_once(store, sources):
    barrier = threading.Barrier(6)
    got = []

    def load():
        barrier.wait()
        got.append(store.get(sources[1]))

    threads = [threading.Thread(target=load) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.stats()["misses"] == 1 and store.stats()["hits"] == 5
    assert all(g is got[0] for g in got)


def test_decoder_rows_are_read_lazily_and_kept_hot(store, sources):
    row = store.decoder_row(sources[1], 17)
    assert store.resident() == []  # no full load for steering
    full = store.get(sources[1]).W_dec[17]
    assert torch.equal(row, full)
    reads = store.stats()["row_reads"]
    store.decoder_row(sources[1], 17)
    assert store.stats()["row_reads"] == reads and store.stats()["row_hits"] == 1


def test_strength_change_touches_no_disk(engine, sources):
    request = sw.SteerRequest(
        "Hi", features=[sw.Feature(sources[2], 21, 10.0)], n_completion_tokens=1
    )
    engine.steer(request)
    reads = engine.saes.stats()["row_reads"]
    engine.steer(request.with_(features=[sw.Feature(sources[2], 21, 99.0)]))
    assert engine.saes.stats()["row_reads"] == reads


def _copy(engine, sources, tmp_path, name="copy"):
    folder = tmp_path / name
    shutil.copytree(engine.saes.config(sources[0]).folder, folder)
    return folder


def test_bad_sources_are_refused_by_name(engine, sources, tmp_path, store):
    (tmp_path / "empty").mkdir()
    with pytest.raises(sw.SourceError, match="'empty-one'.*not an SAE folder"):
        store.add(tmp_path / "empty", "empty-one")

    wide = _copy(engine, sources, tmp_path, "wide")
    cfg = json.loads((wide / "cfg.json").read_text())
    (wide / "cfg.json").write_text(json.dumps(cfg | {"d_in": 768}))
    with pytest.raises(sw.SourceError, match="'wide'.*d_in is 768"):
        store.add(wide, "wide")

    nohook = _copy(engine, sources, tmp_path, "nohook")
    cfg["metadata"]["hook_name"] = "blocks.99.hook_resid_post"
    (nohook / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(sw.SourceError, match="no hook 'blocks.99.hook_resid_post'"):
        store.add(nohook, "nohook")

    corrupt = _copy(engine, sources, tmp_path, "corrupt")
    weights = corrupt / "sae_weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(sw.SourceError, match="'corrupt'.*corrupt or unreadable"):
        store.add(corrupt, "corrupt")

    with pytest.raises(sw.SourceError, match="unknown source"):
        store.get("nope")
    assert sorted(store.sources()) == sorted(sources)  # nothing half-registered
    assert store.get(sources[0]).W_enc.shape[0] == 576  # store still usable


def test_packaged_saes_match_sae_lens(engine, sources):
    """Our reader and encode equal SAE Lens' own on the shipped SAEs."""
    from sae_lens import SAE as LensSAE

    torch.manual_seed(0)
    x = torch.randn(5, 576) * 4
    for name in sources:
        cfg = engine.saes.config(name)
        lens = LensSAE.load_from_disk(str(cfg.folder), device="cpu", dtype="float32")
        ours = engine.saes.get(name)
        torch.testing.assert_close(ours.encode(x), lens.encode(x), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(
            ours.decode(ours.encode(x)), lens.decode(lens.encode(x)), atol=1e-4, rtol=1e-4
        )
        assert ours.W_dec.dtype == torch.float32
        norms = ours.W_dec.norm(dim=1)
        torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-2, rtol=0)


def test_sae_lens_release_offline_fails_with_a_clear_error(store, monkeypatch, tmp_path):
    """``release/sae_id`` goes through SAE Lens; offline it must say what it could not load."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("STEER_WIDGETS_CACHE", str(tmp_path))
    with pytest.raises(sw.SourceError, match="gpt2-small-res-jb.*blocks.8.hook_resid_pre"):
        store.add("gpt2-small-res-jb/blocks.8.hook_resid_pre")
    with pytest.raises(sw.SourceError, match="neither a folder nor"):
        store.add("no-slash-and-no-folder")
    assert store.get(store.sources()[0]).W_dec.shape[1] == 576
