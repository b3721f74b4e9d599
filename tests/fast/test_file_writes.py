"""A user's file is written whole or not at all (``steer_widgets/files.py``): a write that
fails part way, by an error a writer raises or by a real file-size limit, is a named error
naming the path, leaves the file that was there byte for byte, and leaves no temporary file.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest
import torch
from gguf import GGUFWriter

import steer_widgets as sw
from steer_widgets.errors import FileWriteError
from steer_widgets.files import write_atomically, write_text_atomically
from steer_widgets.sae import neuronpedia

FORMATS = {"gguf": ".gguf", "neuronpedia": ".json", "safetensors": ".safetensors"}


def layers(n: int, width: int) -> list[sw.Vector]:
    g = torch.Generator().manual_seed(n)
    return [sw.Vector(torch.randn(width, generator=g), f"blocks.{k}.hook_resid_post") for k in
            range(1, n + 1)]  # fmt: skip


def old_files(folder, fmt: str) -> tuple:
    """A one-layer vector file saved in ``folder``, its path and its bytes."""
    path = sw.save_vectors(layers(1, 8), folder / f"v{FORMATS[fmt]}", format=fmt)
    return path, path.read_bytes()


def test_a_write_lands_whole_and_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "a.txt"
    assert write_text_atomically(path, "first") == path and path.read_text() == "first"
    os.chmod(path, 0o640)
    write_text_atomically(path, "second é")
    assert path.read_text(encoding="utf-8") == "second é"
    assert oct(path.stat().st_mode & 0o777) == oct(0o640)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_write_that_fails_part_way_changes_nothing_and_names_the_path(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"old bytes")

    def half(tmp) -> None:
        tmp.write_bytes(b"new by")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(FileWriteError, match="No space left") as err:
        write_atomically(path, half)
    assert err.value.path == str(path) and isinstance(err.value, OSError)
    with pytest.raises(sw.VectorError) as named:  # the caller's own error
        write_atomically(path, half, sw.VectorError)
    assert named.value.source == str(path)
    with pytest.raises(KeyError):  # anything else: raised as it is, after the clean-up
        write_atomically(path, lambda tmp: {}["x"])
    assert path.read_bytes() == b"old bytes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_a_folder_that_is_missing_is_a_named_error(tmp_path):
    with pytest.raises(FileWriteError) as err:
        write_text_atomically(tmp_path / "no" / "a.txt", "x")
    assert err.value.path == str(tmp_path / "no" / "a.txt")


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges there")
def test_a_write_through_a_chain_of_links_replaces_the_file_and_keeps_the_links(
    tmp_path, monkeypatch
):
    """Issue 67 item 14: the write replaced the link with a regular file, so the file it
    pointed at kept the old bytes. Now it follows every link, writes its temporary file
    beside the final target (its folder, its file system) and keeps the mode."""
    real, links = tmp_path / "real", tmp_path / "links"
    real.mkdir()
    links.mkdir()
    target = real / "v.txt"
    target.write_text("old")
    os.chmod(target, 0o640)
    (links / "b").symlink_to(target)
    (links / "a").symlink_to("b")  # a -> b -> real/v.txt
    replaced = []
    replace = os.replace

    def seen(src, dst, *args, **kwargs):
        replaced.append((os.fspath(src), os.fspath(dst)))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", seen)
    assert write_text_atomically(links / "a", "new") == links / "a"
    assert target.read_text() == "new" and oct(target.stat().st_mode & 0o777) == oct(0o640)
    assert (links / "a").is_symlink() and os.readlink(links / "a") == "b"
    assert (links / "b").is_symlink() and os.readlink(links / "b") == str(target)
    ((src, dst),) = replaced
    assert os.path.samefile(os.path.dirname(src), real) and os.path.samefile(dst, target)
    assert sorted(p.name for p in real.iterdir()) == ["v.txt"]
    assert sorted(p.name for p in links.iterdir()) == ["a", "b"]


@pytest.mark.skipif(sys.platform == "win32", reason="symbolic links need privileges there")
def test_a_dangling_link_gets_the_file_it_names_and_a_loop_is_named(tmp_path):
    """A link to no file yet: the file it names is created, as ``open(link, "w")`` does; a
    loop of links names the path given and changes nothing."""
    (tmp_path / "link").symlink_to("made.txt")
    write_text_atomically(tmp_path / "link", "new")
    assert (tmp_path / "link").is_symlink() and (tmp_path / "made.txt").read_text() == "new"
    (tmp_path / "x").symlink_to("y")
    (tmp_path / "y").symlink_to("x")
    with pytest.raises(FileWriteError, match="loop") as err:
        write_text_atomically(tmp_path / "x", "new")
    assert err.value.path == str(tmp_path / "x")
    assert (tmp_path / "x").is_symlink() and (tmp_path / "y").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "made.txt", "x", "y"]


def test_a_gguf_writer_failing_part_way_leaves_the_old_file(tmp_path, monkeypatch):
    """ENOSPC after the header and part of the tensors: gguf's writer truncates its path
    first, so before the atomic write the old file was gone."""
    path, before = old_files(tmp_path, "gguf")
    write_tensors = GGUFWriter.write_tensors_to_file

    def disk_full(self, *args, **kwargs) -> None:
        for fout in self.fout:
            fout.write(b"\0" * 100)
            fout.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(GGUFWriter, "write_tensors_to_file", disk_full)
    with pytest.raises(sw.VectorError, match="No space left") as err:
        sw.save_vectors(layers(28, 64), path)
    assert err.value.source == str(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["v.gguf"]
    monkeypatch.setattr(GGUFWriter, "write_tensors_to_file", write_tensors)
    sw.save_vectors(layers(28, 64), path)  # and a write that works still replaces it
    assert len(sw.load_vectors(path)) == 28


SIZE_LIMITED = """
import json, resource, signal, sys
from pathlib import Path
import torch
import steer_widgets as sw

folder = Path(sys.argv[1])
g = torch.Generator().manual_seed(28)
vectors = [sw.Vector(torch.randn(64, generator=g), f"blocks.{k}.hook_resid_post")
           for k in range(1, 29)]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit: EFBIG, not a kill
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
seen = {}
for fmt, suffix in json.loads(sys.argv[2]).items():
    try:
        sw.save_vectors(vectors, folder / f"v{suffix}", format=fmt)
        seen[fmt] = "returned"
    except sw.VectorError as err:
        seen[fmt] = [err.source, err.problem]
print(json.dumps(seen))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE as Linux has it")
def test_a_file_size_limit_is_a_named_error_and_the_old_file_stays(tmp_path):
    """A 28-layer vector (7 KiB of floats) saved over each format's old file in a process
    whose files may not grow past 4096 bytes (2026-12-03: gguf's save returned without an
    error and left the first bytes of the new file in place of the old one)."""
    before = {fmt: old_files(tmp_path, fmt) for fmt in FORMATS}
    assert all(len(data) < 4096 for _, data in before.values())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [sys.executable, "-c", SIZE_LIMITED, str(tmp_path), json.dumps(FORMATS)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    for fmt, (path, data) in before.items():
        assert seen[fmt] != "returned", fmt
        assert seen[fmt][0] == str(path) and "could not be written" in seen[fmt][1], seen[fmt]
        assert path.read_bytes() == data, fmt
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"v{s}" for s in FORMATS.values())


def test_the_neuronpedia_cache_is_written_once_per_fetch(tmp_path, monkeypatch):
    """Each write rewrites the whole file: one per fetched index made a fetch of n indices
    write n files' worth; now a fetch writes once, also when a later request fails."""
    monkeypatch.setenv("STEER_WIDGETS_CACHE", str(tmp_path))
    monkeypatch.setattr(neuronpedia, "offline", lambda: False)
    monkeypatch.setattr(neuronpedia, "_description", lambda nid, i: f"feature {i}")
    cache = neuronpedia.Explanations("m/src")
    writes: list[str] = []
    replace = os.replace

    def counted(src, dst, *args, **kwargs):
        if os.fspath(dst) == os.fspath(cache.path):
            writes.append(os.fspath(dst))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", counted)
    assert cache.fetch(range(10)) == {i: f"feature {i}" for i in range(10)}
    assert len(writes) == 1
    assert cache.fetch(range(10)) and len(writes) == 1  # all on disk: no write

    def fails_at_12(nid: str, i: int) -> str:
        if i == 12:
            raise neuronpedia.NeuronpediaUnavailable("rate-limited")
        return f"feature {i}"

    monkeypatch.setattr(neuronpedia, "_description", fails_at_12)
    with pytest.raises(neuronpedia.NeuronpediaUnavailable):
        cache.fetch([10, 11, 12, 13])
    assert len(writes) == 2 and set(cache.cached()) == set(range(12))  # 10, 11 kept
