"""Atomic file writes: a reader (or a crash) sees either the old complete file or the new one."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, then rename it over ``path``."""
    atomic_write_chunks(path, [text])


def atomic_write_chunks(path: str | os.PathLike, chunks: Iterable[str]) -> None:
    """:func:`atomic_write_text` for text made piece by piece (a large document is never held
    whole); a piece that fails to make leaves the old file in place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str | os.PathLike, data: Any) -> None:
    # Serialise fully before touching the disk, so an unserialisable value never truncates a file.
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=str) + "\n")
