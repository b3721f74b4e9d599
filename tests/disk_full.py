"""A disk that fills up half-way through a write: for the tests of atomic file writes."""

from __future__ import annotations

import errno
from pathlib import Path


def fill_disk_halfway(monkeypatch) -> None:
    """``Path.write_text`` and ``write_bytes`` write half their data, then raise ENOSPC."""

    def half(self, data, *args, **kwargs):
        raw = data.encode() if isinstance(data, str) else data
        with open(self, "wb") as f:
            f.write(raw[: len(raw) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", half)
    monkeypatch.setattr(Path, "write_bytes", half)
