"""Opening the files fanout writes without following a link or blocking on a pipe.

Every file fanout writes (a results or scores file, their lock files, the
``--html`` page and its temporary file) is opened here, under one rule: fanout
writes only to regular files, never through a symbolic link, and never
truncates or removes a file it did not create.  What is at a path instead (a
symbolic link, even a dangling one; a directory; a pipe; a device; a socket)
is refused with ``NotRegularFile``, an ``OSError`` whose ``strerror`` is one
line naming what is there, and is left as it was.

- ``open_append``: a file appended to (results, scores): opened with
  ``O_NOFOLLOW`` and ``O_NONBLOCK`` (a pipe cannot hang the open), then checked
  with ``fstat``; created if missing.
- ``create_new``: a file only this run may have made (a lock file, a temporary
  file): ``O_CREAT | O_EXCL | O_NOFOLLOW``, so nothing already there is opened;
  ``remove_if_same`` deletes it later only while it is still that file (same
  device and inode as at creation).
- ``read_small``: the start of a small file someone else wrote (a lock file),
  under the same checks, never blocking.
- ``replace_whole``: a file written whole or not at all: a temporary file created
  with ``create_new`` beside it, then ``os.replace``.  A symbolic link at the
  destination is refused (not replaced, not written through).

Only the last component of a path is checked: directories named on the way may
be links (``~/runs -> /data/runs``), as the user chose them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable

__all__ = ["FileIdentity", "NotRegularFile", "create_new", "identity", "kind_of", "open_append",
           "read_small", "remove_if_same", "replace_whole", "temporary_name"]

#: (st_dev, st_ino, st_ctime_ns) of a file: what ``remove_if_same`` compares.  The
#: change time tells a file from a new one given the inode number of a removed one.
FileIdentity = tuple[int, int, int]


def identity(mode: os.stat_result) -> FileIdentity:
    """The identity of the file of ``mode`` (an ``fstat``), as it is now: writing to
    the file changes it."""
    return mode.st_dev, mode.st_ino, mode.st_ctime_ns

_KINDS: tuple[tuple[Callable[[int], bool], str], ...] = (
    (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe"),
    (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"))


class NotRegularFile(OSError):
    """What is at ``filename`` is not a regular file (``kind`` says what it is:
    ``"a symbolic link to 'x'"``, ``"a pipe"``...); nothing was written to it.
    ``strerror`` is ``"not a regular file: <kind>"``."""

    def __init__(self, path: str | os.PathLike[str], kind: str) -> None:
        super().__init__(errno.EINVAL, f"not a regular file: {kind}", os.fspath(path))
        self.kind = kind

    @property
    def is_link(self) -> bool:
        return self.kind.startswith("a symbolic link")


def kind_of(path: str | os.PathLike[str], mode: os.stat_result | None = None) -> str:
    """What is at ``path`` in a few words (its ``lstat`` unless ``mode`` is given):
    ``"a regular file"``, ``"a symbolic link to '/etc/passwd'"``, ``"a pipe"``...;
    ``"nothing"`` when it is missing."""
    if mode is None:
        try:
            mode = os.lstat(path)
        except FileNotFoundError:
            return "nothing"
        except OSError as exc:
            return f"unknown ({exc.strerror or exc})"
    if stat.S_ISLNK(mode.st_mode):
        try:
            return f"a symbolic link to {os.readlink(path)!r}"
        except OSError:
            return "a symbolic link"
    if stat.S_ISREG(mode.st_mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode.st_mode)), "not a file")


def _refuse_unless_regular(path: str | os.PathLike[str], mode: os.stat_result) -> None:
    if not stat.S_ISREG(mode.st_mode):
        raise NotRegularFile(path, kind_of(path, mode))


def _precheck(path: str | os.PathLike[str], *, directory_too: bool = True) -> None:
    # Before opening: opening a device can act on it (a tape rewinds), and a link
    # is best named with where it points.  A directory is left to os.open to refuse
    # (EISDIR) unless ``directory_too``.
    try:
        mode = os.lstat(path)
    except FileNotFoundError:
        return
    if directory_too or not stat.S_ISDIR(mode.st_mode):
        _refuse_unless_regular(path, mode)


def _opened(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open`` with no link followed and no blocking, checked to be a regular file
    (the check that counts: it is of what was opened)."""
    flags |= os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags, mode)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            # ELOOP: a link (O_NOFOLLOW); ENXIO: a pipe with no reader (O_NONBLOCK)
            raise NotRegularFile(path, kind_of(path)) from None
        raise
    try:
        _refuse_unless_regular(path, os.fstat(fd))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_append(path: str | os.PathLike[str], mode: int = 0o644) -> int:
    """A descriptor of the regular file at ``path`` open for reading and appending
    (``O_RDWR | O_APPEND``), created (``mode``, less the umask) if missing;
    ``NotRegularFile`` for anything else there, other ``OSError`` as ``os.open``
    (``IsADirectoryError`` for a directory)."""
    _precheck(path, directory_too=False)
    return _opened(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, mode)


def create_new(path: str | os.PathLike[str], mode: int = 0o644
               ) -> tuple[int, FileIdentity]:
    """A write-only descriptor of a file this call created at ``path``, and its
    identity (until written to).  ``FileExistsError`` if anything is there, a dangling link included
    (``O_EXCL``: nothing there is opened or followed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                 | os.O_NOCTTY, mode)
    try:
        made = os.fstat(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd, identity(made)


def remove_if_same(path: str | os.PathLike[str], same: FileIdentity) -> bool:
    """Remove ``path`` if it is still the file of identity ``same`` (not one put there
    since, nor one written to since);
    whether it was removed.  Never raises."""
    try:
        now = os.lstat(path)
        if identity(now) != same or not stat.S_ISREG(now.st_mode):
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def read_small(path: str | os.PathLike[str], limit: int = 65536
               ) -> tuple[bytes, FileIdentity]:
    """At most ``limit`` bytes from the start of the regular file at ``path``, and its
    identity; ``NotRegularFile`` for anything else there (nothing followed, never
    blocking), other ``OSError`` as ``os.open``."""
    _precheck(path)
    fd = _opened(path, os.O_RDONLY)
    try:
        made = os.fstat(fd)
        return os.read(fd, limit), identity(made)
    finally:
        os.close(fd)


def temporary_name(target: str) -> str:
    """A name for a temporary file beside ``target``: hidden, random, never a name
    anything else of fanout's uses."""
    head, tail = os.path.split(target)
    return os.path.join(head, f".{tail}.{secrets.token_hex(6)}.tmp")


def replace_whole(target: str | os.PathLike[str], data: bytes, mode: int = 0o666) -> None:
    """Put ``data`` at ``target`` whole or not at all: written to a new temporary file
    beside it (``create_new``, a fresh name if one is taken), flushed to disk, then
    renamed over ``target``.  The file gets ``mode`` less the umask, as ``open``
    would give it.  ``NotRegularFile`` if ``target`` is a symbolic link (dangling or
    not), a directory, a pipe...: it is left as it was; other ``OSError`` as writing
    fails (the temporary file is then removed)."""
    target = os.fspath(target)
    _precheck(target)
    for _ in range(100):
        temporary = temporary_name(target)
        try:
            fd, made = create_new(temporary, 0o600)
        except FileExistsError:
            continue  # a name taken (by anything, a planted link included): another one
        break
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name beside it", target)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            mask = os.umask(0)
            os.umask(mask)
            os.fchmod(fd, mode & ~mask)
            os.fsync(fd)
        finally:
            with contextlib.suppress(OSError):
                made = identity(os.fstat(fd))
            os.close(fd)
        # Checked again just before: a link put there meanwhile is refused too (and
        # were one put there after this check, the rename replaces the link itself,
        # never what it points to).
        _precheck(target)
        os.replace(temporary, target)
    except BaseException:
        remove_if_same(temporary, made)
        raise
