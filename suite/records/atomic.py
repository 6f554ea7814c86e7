"""Atomic file writes: a reader (or a crash) sees either the old complete file or the new one,
and an appended line is there whole or not at all. A write that fails because the file system
is full raises :class:`DiskFull`."""

from __future__ import annotations

import errno
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """A write failed because the file system is full (or the user's quota is): not bad input and
    not a fault of the code, so the CLI says so in one paragraph and exits with its own code."""


def disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS


def as_disk_full(exc: OSError, path: str | os.PathLike) -> DiskFull:
    """A full disk's OSError as :class:`DiskFull` naming the file it refused."""
    return exc if isinstance(exc, DiskFull) else DiskFull(exc.errno, exc.strerror, str(path))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    atomic_write_chunks(path, [text])


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable[str]) -> None:
    """:func:`atomic_write_text` for text made piece by piece (a large document is never held
    whole); a piece that fails to make leaves the old file in place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        if isinstance(exc, OSError) and disk_full(exc):
            raise as_disk_full(exc, path) from None
        raise
    try:
        # mkstemp makes the file private (0600); give it the mode a plain open() would.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and disk_full(exc):
            raise as_disk_full(exc, path) from None
        raise


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    # Serialise fully before touching the disk, so an unserialisable value never truncates a file.
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=str) + "\n")


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line (``line`` ends with a newline), flushed and fsynced, whole or not at all: a
    write cut short (a full disk) is cut back off the file, so the next line never lands on a torn
    one. A file that a killed process left torn gets its newline first."""
    data = line.encode("utf-8")
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        if start and os.pread(fd, 1, start - 1) != b"\n":
            data = b"\n" + data
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as exc:
            os.ftruncate(fd, start)
            if disk_full(exc):
                raise as_disk_full(exc, path) from None
            raise
    finally:
        os.close(fd)
