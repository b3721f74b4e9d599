"""What a GGUF load keeps in the user cache (``load_cache.py``): a second load reads the packed
blocks and the row groups instead of making them, with the bits of a fresh load, and
anything they depend on that changes (the file's size, modification time or sampled bytes,
the packers' version, the CPU, the thread count, the kernel's build) makes them again.

Work is counted (packings, measurements), never timed. Every cache here lives under
``tmp_path``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from test_quantized import tokenizer_fields, write_tiny_qwen2

from steer_widgets.runtime import load_cache, native, quant
from steer_widgets.runtime.model import load_model
from steer_widgets.runtime.transformer import Transformer

pytestmark = pytest.mark.skipif(native.extension() is None, reason="no C++ compiler here")

PROMPT = "The ocean is deep and"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A 2-layer Qwen 2 GGUF (q, k, v of three types: fused parts; an untied unembedding)."""
    path = tmp_path_factory.mktemp("tiny") / "tiny-qwen2.gguf"
    write_tiny_qwen2(path, tokenizer_fields())
    return path


@pytest.fixture
def cache(tiny, monkeypatch) -> Path:
    """The tiny model's cache, kept for the module (its metadata converted once), sharing
    this process's compiled kernel."""
    folder = tiny.parent / "cache"
    monkeypatch.setenv("STEER_WIDGETS_CACHE", str(folder))
    for kept in folder.glob("gguf/*/packed-*.bin"):  # each test starts with no packed copy
        kept.unlink()
    for kept in folder.glob("gguf/*/row-groups.json"):
        kept.unlink()
    return folder


@pytest.fixture
def work(monkeypatch) -> dict[str, int]:
    """How many matrices were packed and row groups measured since the test began."""
    counts = {"packed": 0, "measured": 0}
    packed, calibrate = quant._packed, Transformer.calibrate

    def counting_packed(*args, **kwargs):
        counts["packed"] += 1
        return packed(*args, **kwargs)

    def counting_calibrate(self):
        counts["measured"] += 1
        return calibrate(self)

    monkeypatch.setattr(quant, "_packed", counting_packed)
    monkeypatch.setattr(Transformer, "calibrate", counting_calibrate)
    return counts


@pytest.fixture
def bars(monkeypatch) -> list[str]:
    """The descriptions of the packing progress bars shown since the test began."""
    import tqdm.auto

    shown = []

    class Recording(tqdm.auto.tqdm):
        def __init__(self, *args, **kwargs) -> None:
            if "packing" in kwargs.get("desc", ""):
                shown.append(kwargs["desc"])
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tqdm.auto, "tqdm", Recording)
    return shown


def _logits_and_tokens(model) -> tuple[torch.Tensor, list[int]]:
    ids = torch.tensor([model.tokenizer.encode(PROMPT).ids])
    logits = model.runtime.forward(ids)
    tokens, cache = [], model.runtime.new_cache(1, ids.shape[1] + 4)
    step = model.runtime.forward(ids, cache)
    for _ in range(4):
        tokens.append(int(step[0, -1].argmax()))
        step = model.runtime.forward(torch.tensor([[tokens[-1]]]), cache)
    return logits, tokens


@pytest.mark.parametrize("products", ["float32", "int8"])
def test_a_second_load_reads_what_the_first_made_with_the_same_bits(
    tiny, cache, work, bars, products
):
    first = load_model(str(tiny), products=products)
    made = dict(work)
    assert made["packed"] > 0 and made["measured"] == 1
    assert bars == ["tiny-qwen2.gguf: packing for this CPU (first load only)"]
    second = load_model(str(tiny), products=products)
    assert work == made and len(bars) == 1  # nothing packed or measured again, no bar
    assert second.runtime.row_groups == first.runtime.row_groups
    for a, b in zip(first.runtime._products(), second.runtime._products(), strict=True):
        for x, y in zip(getattr(a, "parts", [a]), getattr(b, "parts", [b]), strict=True):
            assert torch.equal(x.packed, y.packed)
    assert torch.equal(first.runtime.embed._float_layout(), second.runtime.embed._float_layout())
    logits, tokens = _logits_and_tokens(first)
    again, tokens_again = _logits_and_tokens(second)
    assert torch.equal(logits, again) and tokens == tokens_again


def test_a_changed_thread_count_kernel_or_cpu_measures_again(tiny, cache, work, monkeypatch):
    """Row groups are kept per thread count and kernel build; the packed copy does not depend
    on either (packing is numpy's arithmetic) and is read, unless the CPU changed."""
    load_model(str(tiny))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        seen = dict(work)
        load_model(str(tiny))
        assert work == {"packed": seen["packed"], "measured": seen["measured"] + 1}
    finally:
        torch.set_num_threads(threads)
    seen = dict(work)
    monkeypatch.setattr(native, "build_tag", lambda: "another-kernel-build")
    load_model(str(tiny))
    assert work == {"packed": seen["packed"], "measured": seen["measured"] + 1}
    seen = dict(work)
    features = native.cpu_features()
    monkeypatch.setattr(native, "cpu_features", lambda: features + " another_flag")
    load_model(str(tiny))
    assert work["packed"] > seen["packed"] and work["measured"] == seen["measured"] + 1


def test_a_failed_load_keeps_no_packed_copy(tiny, cache, work, monkeypatch):
    def fail(self):
        raise RuntimeError("stopped mid-load")

    with monkeypatch.context() as patch:
        patch.setattr(Transformer, "calibrate", fail)
        with pytest.raises(RuntimeError, match="mid-load"):
            load_model(str(tiny))
    assert list(cache.glob("gguf/*/packed-*.bin")) == []
    load_model(str(tiny))
    assert len(list(cache.glob("gguf/*/packed-float32.bin"))) == 1


# ------------------------------------------------------------------ the keys, one by one


@pytest.fixture
def blob(tmp_path) -> Path:
    """A file standing for a GGUF: larger than what ``file_identity`` reads of it."""
    path = tmp_path / "model.gguf"
    path.write_bytes(os.urandom(load_cache.HEAD + 64 * load_cache.PIECE * 3))
    return path


def _change(path: Path, what: str, monkeypatch) -> None:
    """One thing the packed copy and the row groups depend on, changed."""
    stat = path.stat()
    if what == "size":
        with open(path, "ab") as f:
            f.write(b"\0")
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif what == "mtime":
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    elif what == "sample":  # a byte of a sampled piece; size and modification time kept
        at = load_cache.SAMPLES // 2 * (stat.st_size - load_cache.PIECE) // (load_cache.SAMPLES - 1)
        data = bytearray(path.read_bytes())
        data[at] ^= 0xFF
        path.write_bytes(bytes(data))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    elif what == "layout":
        version = quant.layout_version()
        monkeypatch.setattr(quant, "layout_version", lambda: version + " next")
    elif what == "cpu":
        features = native.cpu_features()
        monkeypatch.setattr(native, "cpu_features", lambda: features + " another_flag")


def _packing(blob: Path, folder: Path, products: str = "float32"):
    """A LoadCache on ``blob`` and a packer counting its calls."""
    made = []

    def make() -> torch.Tensor:
        made.append(1)
        return torch.arange(3 * 5 * 7, dtype=torch.uint8).reshape(3, 5, 7)

    return load_cache.LoadCache(folder, blob, products, 105), make, made


CHANGES = ["size", "mtime", "sample", "layout", "cpu"]


@pytest.mark.parametrize("what", [None, *CHANGES, "products"])
def test_a_packed_copy_is_read_only_under_its_whole_key(blob, tmp_path, monkeypatch, what):
    folder = tmp_path / "meta"
    folder.mkdir()
    first, make, made = _packing(blob, folder)
    want = first.get("float32/w", make, 105)
    first.close()
    assert len(made) == 1 and first.file.exists()
    _change(blob, what, monkeypatch)
    second, _, _ = _packing(blob, folder, "int8" if what == "products" else "float32")
    got = second.get("float32/w", make, 105)
    second.close()
    assert len(made) == (1 if what is None else 2)
    assert torch.equal(got, want)


@pytest.mark.parametrize("what", [None, *CHANGES, "threads", "build"])
def test_row_groups_are_kept_only_under_their_whole_key(blob, tmp_path, monkeypatch, what):
    folder = tmp_path / "meta"
    folder.mkdir()
    measured = []

    def measure() -> dict[str, int]:
        measured.append(1)
        return {"matmul": 16, "attention": 3}

    key = {"threads": 2, "build": "abc", "products": "int8"}
    first, _, _ = _packing(blob, folder)
    assert first.remember(key, measure) == {"matmul": 16, "attention": 3}
    _change(blob, what, monkeypatch)
    if what in ("threads", "build"):
        key = {**key, what: "other"}
    second, _, _ = _packing(blob, folder)
    assert second.remember(key, measure) == {"matmul": 16, "attention": 3}
    assert len(measured) == (1 if what in (None, "layout") else 2)  # groups do not read layout


def test_a_damaged_copy_is_made_again_and_a_changed_file_leaves_no_copy_behind(blob, tmp_path):
    folder, other = tmp_path / "meta", tmp_path / "meta-of-the-edited-file"
    folder.mkdir()
    other.mkdir()
    first, make, made = _packing(blob, folder)
    want = first.get("float32/w", make, 105)
    first.close()
    with open(first.file, "r+b") as f:  # cut short: its header no longer matches its size
        f.truncate(first.file.stat().st_size - 1)
    again, _, _ = _packing(blob, folder)
    assert torch.equal(again.get("float32/w", make, 105), want) and len(made) == 2
    again.close()
    assert torch.equal(_packing(blob, folder)[0].read("float32/w"), want)
    _change(blob, "size", None)  # the file edited: its metadata would go to another folder
    edited, _, _ = _packing(blob, other)
    edited.get("float32/w", make, 105)
    edited.close()
    assert edited.file.exists() and not first.file.exists()
    assert [p.name for p in tmp_path.rglob("*.tmp")] == []
