"""What a GGUF load keeps in the user cache so that loading the same file again takes seconds:
its matrices packed for the kernel and its measured row groups, in the folder of the file's
converted metadata (``gguf_model.metadata_dir``).

Why: packing a gigabyte of blocks into the kernel's layouts (``quant.pack``) and measuring
the batch-invariant row groups (``invariance.py``) took most of every load, for results that
change only when what they are computed from changes. Each is kept under a key that holds
everything it depends on and read back only where the whole key matches:

* the packed copy (``packed-<products>.bin``): the file's identity (``file_identity``: its
  path, size, modification time and a digest of sampled bytes, not a gigabyte hashed on every
  load), the packers' version (``quant.layout_version``), this CPU's features
  (``native.cpu_features``) and the products;
* the row groups (``row-groups.json``, an entry per key): the file's identity, this CPU's
  features and ``Transformer.calibration_key`` (the kernel's build, the thread count, torch,
  products, dtype, device, the shapes and types measured). They stay measured, on this
  machine for these weights, once per key.

A miss packs or measures as before; the result is written whole by rename
(``files.write_atomically``), and a copy that cannot be written is a warning, not a failed
load. A packed copy of an earlier version of the same file (another metadata folder) is
removed when the new one is written, so a changed file leaves no gigabyte behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import torch
from torch import Tensor

from ..errors import FileWriteError
from ..files import write_atomically, write_text_atomically
from . import native, quant

MAGIC = b"SWPACK1\n"
ALIGN = 64  # each tensor's bytes start at a multiple of this
SAMPLES, PIECE, HEAD = 64, 4096, 1 << 16  # the bytes file_identity reads
ROW_GROUPS = "row-groups.json"


def file_identity(path: Path) -> dict:
    """What tells this file from another or an edited one without reading all of it: its
    resolved path, size and modification time, and a digest of its first ``HEAD`` bytes (the
    metadata) and ``SAMPLES`` pieces spread evenly over the rest (the weights)."""
    stat = path.stat()
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        digest.update(f.read(HEAD))
        for i in range(SAMPLES):
            f.seek(i * max(stat.st_size - PIECE, 0) // max(SAMPLES - 1, 1))
            digest.update(f.read(PIECE))
    return {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "sample": digest.hexdigest(),
    }


class LoadCache:
    """One load's cache: ``get`` (``quant.Packs``) gives each matrix's packed layout, read
    from the packed copy where its key matches; ``remember`` (``transformer.Remember``) gives
    the row groups; ``close`` writes what was made. A first load shows a progress bar (on a
    terminal or in a notebook) while it packs."""

    def __init__(self, folder: Path, path: Path, products: str, total: int) -> None:
        self.path, self.folder, self.products, self.total = path, folder, products, total
        self.identity = file_identity(path)
        self.key = {
            "file": self.identity,
            "layout": quant.layout_version(),
            "cpu": native.cpu_features(),
            "products": products,
        }
        self.file = folder / f"packed-{products}.bin"
        self.made: dict[str, Tensor] = {}  # every tensor handed out, in order
        self.misses = 0
        self._bar = None
        self._stored, self._handle = self._open()

    def _open(self) -> tuple[dict, BinaryIO | None]:
        """The packed copy's index and open file where its key is this load's, else nothing."""
        try:
            f = open(self.file, "rb")
        except OSError:
            return {}, None
        try:
            header, start = _header(f)
            size = os.fstat(f.fileno()).st_size
            if header["key"] == self.key and start + header["data_bytes"] == size:
                tensors = header["tensors"].items()
                return {n: (e["shape"], start + e["offset"]) for n, e in tensors}, f
        except (OSError, ValueError, KeyError, TypeError):
            pass
        f.close()
        return {}, None

    def get(self, name: str, make: Callable[[], Tensor], nbytes: int) -> Tensor:
        """The packed tensor ``name``: the copy's bytes, or ``make()`` (then written at
        ``close``)."""
        tensor = self.read(name) if name in self._stored else None
        if tensor is None:
            tensor = self._make(make, nbytes)
        self.made[name] = tensor
        return tensor

    def read(self, name: str) -> Tensor | None:
        """Tensor ``name`` from the packed copy (None where it cannot be read whole)."""
        if self._handle is None:  # closed
            return None
        shape, offset = self._stored[name]
        tensor = torch.empty(shape, dtype=torch.uint8)
        view, done = memoryview(tensor.numpy().reshape(-1)), 0
        try:
            self._handle.seek(offset)
            while done < len(view):
                n = self._handle.readinto(view[done:])
                if not n:
                    return None
                done += n
        except OSError:
            return None
        return tensor

    def _make(self, make: Callable[[], Tensor], nbytes: int) -> Tensor:
        self.misses += 1
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=self.total,
                unit="B",
                unit_scale=True,
                desc=f"{self.path.name}: packing for this CPU (first load only)",
                disable=None,  # quiet where stderr is no terminal; shown in a notebook
            )
        tensor = make()
        if self._bar.n + nbytes > self._bar.total:  # the embedding's second layout
            self._bar.total = self._bar.n + nbytes
        self._bar.update(nbytes)
        return tensor

    def remember(self, key: dict, measure: Callable[[], dict[str, int]]) -> dict[str, int]:
        """The row groups measured for ``key`` on this file and CPU, measured now where none
        were kept."""
        full = {"file": self.identity, "cpu": native.cpu_features(), **key}
        entries = _read_json(self.folder / ROW_GROUPS)
        digest = hashlib.sha1(json.dumps(full, sort_keys=True).encode()).hexdigest()
        kept = entries.get(digest)
        if isinstance(kept, dict) and kept.get("key") == full:
            return dict(kept["groups"])
        if self._bar is not None:
            self._bar.set_postfix_str("measuring row groups")
        groups = measure()
        entries[digest] = {"key": full, "groups": groups}
        text = json.dumps(entries)
        self._write(self.folder / ROW_GROUPS, lambda p: write_text_atomically(p, text))
        return groups

    def close(self, keep: bool = True) -> None:
        """The packed copy written where anything was packed (``keep``: the load succeeded);
        the file closed. Later calls to ``get`` make what they are asked for."""
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        self._stored = {}
        if self.misses and keep:
            if self._bar is not None:
                self._bar.set_postfix_str("keeping the packed copy")
            self._write(self.file, lambda p: write_atomically(p, self._write_copy))
            if self.file.exists():
                self._remove_superseded()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.made, self.misses = {}, 0

    def _write_copy(self, tmp: Path) -> None:
        """The header (the key; each tensor's shape and offset from the data's start), then
        each tensor at a multiple of ``ALIGN``."""
        tensors, offset = {}, 0
        for name, t in self.made.items():
            tensors[name] = {"shape": list(t.shape), "offset": offset}
            offset = _aligned(offset + t.numel())
        body = json.dumps({"key": self.key, "tensors": tensors, "data_bytes": offset}).encode()
        start = _aligned(len(MAGIC) + 8 + len(body))
        with open(tmp, "wb") as f:
            f.write(MAGIC + struct.pack("<Q", len(body)) + body)
            for name, t in self.made.items():
                f.seek(start + tensors[name]["offset"])
                f.write(t.numpy().reshape(-1).data)
            f.truncate(start + offset)

    def _remove_superseded(self) -> None:
        """Packed copies of this path in other metadata folders (the file as it was)."""
        for other in self.folder.parent.glob(f"*/packed-{self.products}.bin"):
            if other == self.file:
                continue
            try:
                with open(other, "rb") as f:
                    superseded = _header(f)[0]["key"]["file"]["path"] == self.identity["path"]
                if superseded:
                    other.unlink()
            except (OSError, ValueError, KeyError, TypeError):
                continue

    def _write(self, target: Path, write: Callable[[Path], object]) -> None:
        try:
            write(target)
        except (FileWriteError, OSError) as err:
            warnings.warn(f"{target} not kept for the next load: {err}", RuntimeWarning, 3)


def _header(f: BinaryIO) -> tuple[dict, int]:
    """A packed copy's header and where its data starts."""
    if f.read(len(MAGIC)) != MAGIC:
        raise ValueError("not a packed copy")
    (length,) = struct.unpack("<Q", f.read(8))
    return json.loads(f.read(length)), _aligned(len(MAGIC) + 8 + length)


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
