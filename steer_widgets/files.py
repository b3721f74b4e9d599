"""Writing a user's file whole or not at all: the one owner of that rule.

Why: a writer that truncates its target first (gguf's ``GGUFWriter``, ``Path.write_text``)
leaves neither the old file nor the new one when the disk fills or a file-size limit is hit
part way. Here every write goes to a fresh temporary file beside the target (the same folder,
so the same file system and an atomic rename), is fsynced, and only then replaces the target
with ``os.replace``. On any failure the temporary file is removed, the target keeps its bytes,
and the error is a named one that names the target. Vector files, saved views, the export
and the Neuronpedia cache all write through here. Standard library only: it sits below every
other module.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from .errors import FileWriteError, SteerWidgetsError

Fail = Callable[[str, str], BaseException]  # (the target's path, the problem) -> the error


def write_atomically(
    path: str | os.PathLike, write: Callable[[Path], None], error: Fail = FileWriteError
) -> Path:
    """Run ``write(tmp)``, which writes the whole file at ``tmp`` (a fresh path beside
    ``path``), then make it ``path`` in one step and return ``path``. An ``OSError`` or
    ``UnicodeError`` on the way is raised as ``error(path, problem)``; any failure leaves
    ``path`` as it was and no temporary file behind."""
    target = Path(path)
    tmp: Path | None = None
    try:
        tmp = _fresh(target)
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, target)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(err, (OSError, UnicodeError)) and not isinstance(err, SteerWidgetsError):
            raise error(str(target), f"could not be written: {err}") from None
        raise
    _fsync_folder(target.parent)
    return target


def write_text_atomically(
    path: str | os.PathLike, text: str, error: Fail = FileWriteError, encoding: str = "utf-8"
) -> Path:
    """``text`` as the whole of ``path`` (``write_atomically``)."""
    return write_atomically(path, lambda tmp: tmp.write_bytes(text.encode(encoding)), error)


def _fresh(target: Path) -> Path:
    """A new empty file beside ``target`` with a name of its own (two writers never share
    one), created as a plain write would create ``target`` (mode 0o666 less the umask), or
    with ``target``'s own mode when it exists, so a replaced file keeps its permissions."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        return tmp
    os.chmod(tmp, mode)
    return tmp


def _fsync(path: Path) -> None:
    """The file's bytes on disk before the rename makes them the target's."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_folder(folder: Path) -> None:
    """The rename itself on disk, where the system can fsync a folder (not Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
