"""A user's files: what a path they give means (``user_path``) and writing a file whole or
not at all (``write_atomically``), the one owner of each rule.

Why ``user_path``: a path kept as typed made ``save_view("~/v.json")`` write into a folder
named ``~`` while the vector files expanded it; every reader and writer of a user's file takes
its path through here, so ``~`` means the home folder everywhere.

Why ``write_atomically``: a writer that truncates its target first (gguf's ``GGUFWriter``,
``Path.write_text``) leaves neither the old file nor the new one when the disk fills or a
file-size limit is hit part way. Here every write goes to a fresh temporary file beside the
target (the same folder, so the same file system and an atomic rename), is fsynced, and only
then replaces the target with ``os.replace``; a symbolic link is followed and the file it
names replaced (what editors do), so the link stays a link. On any failure the temporary
file is removed, the target keeps its bytes, and the error is a named one that names the
target. Vector files, saved views, the export and the Neuronpedia cache all write through
here. Standard library only: it sits below every other module.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Callable
from pathlib import Path

from .errors import FileWriteError, RequestError, SteerWidgetsError

Fail = Callable[[str, str], BaseException]  # (the target's path, the problem) -> the error


def user_path(value, field: str = "path", error: Fail = RequestError) -> Path:
    """``value`` (a str or ``os.PathLike``) as the path the user means, ``~`` and ``~user``
    expanded as a shell does. Anything else (a number, a blank string, a NUL byte, a name the
    file system cannot encode, a ``~user`` with no home here) is ``error(field, problem)``
    before any file is touched."""
    text = None
    try:
        text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
        usable = isinstance(text, str) and text.strip() and b"\x00" not in os.fsencode(text)
    except (TypeError, UnicodeEncodeError):  # __fspath__ gave no str; a lone surrogate
        usable = False
    if not usable:
        raise error(field, f"must be a file path, got {value!r:.200}")
    try:
        return Path(text).expanduser()
    except RuntimeError:  # Path.expanduser: no such user, or no home folder at all
        home = Path(text).parts[0]
        raise error(field, f"is not a usable path: no home folder for {home!r}") from None


def write_atomically(
    path: str | os.PathLike, write: Callable[[Path], None], error: Fail = FileWriteError
) -> Path:
    """Run ``write(tmp)``, which writes the whole file at ``tmp`` (a fresh path beside
    ``path``), then make it ``path`` in one step and return ``path``. An ``OSError`` or
    ``UnicodeError`` on the way is raised as ``error(path, problem)``; any failure leaves
    ``path`` as it was and no temporary file behind.

    A symbolic link (or a chain of them) at ``path`` is followed: the file it finally names
    is replaced and the link stays a link, as an editor saving through it does; replacing
    the link itself would cut the file off from wherever the link points. A dangling link
    gets the file it names created (as ``open(link, "w")`` does); a loop of links is a
    named error."""
    target = Path(path)
    tmp: Path | None = None
    try:
        real = _final_target(target)
        tmp = _fresh(real)
        write(tmp)
        _fsync(tmp)
        os.replace(tmp, real)
    except BaseException as err:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        if isinstance(err, (OSError, UnicodeError)) and not isinstance(err, SteerWidgetsError):
            raise error(str(target), f"could not be written: {err}") from None
        raise
    _fsync_folder(real.parent)
    return target


def write_text_atomically(
    path: str | os.PathLike, text: str, error: Fail = FileWriteError, encoding: str = "utf-8"
) -> Path:
    """``text`` as the whole of ``path`` (``write_atomically``)."""
    return write_atomically(path, lambda tmp: tmp.write_bytes(text.encode(encoding)), error)


def _final_target(target: Path) -> Path:
    """The file ``target`` names once every symbolic link on the way is followed (``target``
    itself when it is none): the temporary file goes beside it, on its file system."""
    if not os.path.islink(target):
        return target
    real = Path(os.path.realpath(target))
    if os.path.islink(real):  # realpath stops where links loop
        raise OSError(errno.ELOOP, "a loop of symbolic links", str(target))
    return real


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
