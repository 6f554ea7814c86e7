"""Figures drawn once: each report figure's SVG is kept in a per-user cache, named by what draws
it and what it is drawn from, so a report drawn again from the same numbers (``gpubench report
RUN`` after ``gpubench run`` wrote the first one, a report re-rendered with another comparison)
reads the SVG back and imports no matplotlib. On a quiet 2-core machine that is ~0.7 s of
importing and ~0.6 s of drawing of a small run's report.

A figure's key is a SHA-256 of

- the code that draws it: gpubench's version, the source of the report and record modules (an
  edited chart, a changed record method), the versions of matplotlib and numpy, and the user's
  ``matplotlibrc`` files (a font or style set there changes the drawing);
- the builder (its module and name) and every argument it is called with, read down to plain
  values: lists, dicts, dataclasses by the fields that define their equality, numpy arrays by
  their bytes.

An argument the key cannot read that way (a function, an open file, an object of a class the
report does not know) means that figure is drawn every time: never a figure drawn from other
numbers. The cache is ``figures/`` in gpubench's cache folder
(:func:`gpubench.measure.devicecache.cache_root`: ``$GPUBENCH_CACHE_DIR``, else
``$XDG_CACHE_HOME/gpubench``, else ``~/.cache/gpubench``); it keeps the most recently used
figures, at most :data:`KEEP_FILES` of them and :data:`KEEP_BYTES` (a small run's are 10-20 kB).
A cache that cannot be read or written (a read-only home, a full disk, a file cut short) costs
the time it would have saved, never the report. A kept figure goes into the page as it is, so
figures are read only from a folder this user owns and no one else may write (created 0700), only
files this user owns, never through a link, each operation through one checked descriptor of the
folder: a cache folder others may write draws every figure and keeps none. The drawing itself starts from matplotlib's defaults and the
user's ``matplotlibrc`` (:func:`gpubench.reports.drawing.styled`), never from settings some code
changed in the process, so what is kept is what any process draws.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import importlib.util
import itertools
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpubench.measure.devicecache import cache_root

KEEP_FILES = 2000  # past either bound, the least recently used go, down to three quarters of it
KEEP_BYTES = 100 * 2**20
_ATOMS = (type(None), bool, int, float, complex, str, bytes)
# A data artist's id as matplotlib writes it, inside a tag (<g id=...>, <image ... id=...>); never
# text in a label, whose "<" is written "&lt;".
_DATA_ID = re.compile(r'(<[A-Za-z][\w:-]*\s[^<>]*?)id="data-\d+"')
NOTHING = "<!-- nothing to draw -->\n"  # kept for a figure with no data; an empty file is a damaged one
_KEPT_NAME = re.compile(r"[0-9a-f]{40}\.svg")  # the only names pruning removes: the cache's own
_ASIDE_NAME = re.compile(r"\.[0-9a-f]{16}\.tmp")
_next_id = itertools.count(1)  # the data ids of the page being written (new_page starts them again)
_pruned = False


class Opaque(Exception):
    """An argument the key cannot read down to plain values: its figure is not cached."""


def cache_dir() -> Path:
    """Where figures are kept."""
    return cache_root() / "figures"


def svg(builder: Callable[..., Any], *args: Any, **kwargs: Any) -> str | None:
    """The SVG of ``builder(*args, **kwargs)`` (a function that returns a matplotlib figure or
    None), from the cache when it holds it, else drawn and kept; None when there is nothing to
    draw (no figure, or a figure with no data: :func:`gpubench.reports.drawing.mark_data`)."""
    key = figure_key(builder, args, kwargs)
    if key is not None:
        found = _read(cache_dir(), f"{key}.svg")
        if found is not None:
            return _page_ids(found) if found != NOTHING else None
    text = _svg_of(builder(*args, **kwargs))
    if key is not None:  # kept with its ids from 1: the same figure, the same file
        _write(cache_dir(), f"{key}.svg", _DATA_ID.sub(_numbered(itertools.count(1)), text) if text else NOTHING)
    return _page_ids(text) if text else None


def figure_svg(fig: Any) -> str | None:
    """The SVG of a figure drawn already (a technique's own hook's), or None when there is none or
    it shows no data; its data ids numbered as the page's."""
    text = _svg_of(fig)
    return _page_ids(text) if text else None


def _svg_of(fig: Any) -> str | None:
    if fig is None:
        return None
    from gpubench.reports import drawing

    if drawing.mark_data(fig) == 0:
        drawing.close(fig)
        return None
    return drawing.to_svg(fig)


def _page_ids(text: str) -> str:
    """The figure's data ids (``data-N``, :func:`gpubench.reports.drawing.mark_data`) numbered in
    the order the page shows them: unique in the page, and the same whether the figure was drawn
    now or in another process."""
    return _DATA_ID.sub(_numbered(_next_id), text)


def _numbered(ids: Iterator[int]) -> Callable[[re.Match[str]], str]:
    return lambda found: f'{found.group(1)}id="data-{next(ids)}"'


def new_page() -> None:
    """Number the data ids of the figures from here on from 1: a page's ids depend on that page
    only (the same run gives the same report, in this process or another)."""
    global _next_id
    _next_id = itertools.count(1)


# -- the key -----------------------------------------------------------------------------------
def figure_key(builder: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str | None:
    """The cache key of ``builder(*args, **kwargs)``, or None when an argument is opaque."""
    digest = hashlib.sha256(code_version().encode())
    digest.update(f"{builder.__module__}:{builder.__qualname__}\0".encode())
    try:
        _feed(digest, args)
        _feed(digest, dict(kwargs))
    except Opaque:
        return None
    return digest.hexdigest()[:40]


@functools.cache
def code_version() -> str:
    """A digest of everything besides the arguments that decides how a figure looks."""
    digest = hashlib.sha256()
    for dist in ("gpubench", "matplotlib", "numpy"):
        try:
            digest.update(f"{dist}={importlib.metadata.version(dist)}\0".encode())
        except importlib.metadata.PackageNotFoundError:
            digest.update(f"{dist}=?\0".encode())
    records = importlib.util.find_spec("gpubench.records")
    contract = importlib.util.find_spec("gpubench.contract")
    record_dirs = list(records.submodule_search_locations or []) if records is not None else []
    folders = [Path(__file__).parent, *map(Path, record_dirs)]
    files = [f for folder in folders for f in sorted(folder.glob("*.py"))]
    files += [Path(contract.origin)] if contract is not None and contract.origin else []
    files += _matplotlibrc_files()
    for path in files:
        try:
            digest.update(f"{path.name}\0".encode() + path.read_bytes() + b"\0")
        except OSError:
            digest.update(f"{path.name}: unreadable\0".encode())
    return digest.hexdigest()


def _matplotlibrc_files() -> list[Path]:
    """The matplotlibrc files matplotlib would read besides its own (those that exist)."""
    found = []
    for env in ("MATPLOTLIBRC", "MPLCONFIGDIR"):
        value = os.environ.get(env)
        if value:
            path = Path(value)
            found.append(path / "matplotlibrc" if path.is_dir() else path)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    found += [Path("matplotlibrc"), Path(config) / "matplotlib" / "matplotlibrc"]
    return [p for p in found if p.is_file()]


_COMPARED: dict[type, tuple[str, ...]] = {}


def _compared(kind: type) -> tuple[str, ...]:
    """A dataclass's fields that define its objects (a read-back cache of key order does not)."""
    if kind not in _COMPARED:
        _COMPARED[kind] = tuple(f.name for f in dataclasses.fields(kind) if f.compare)
    return _COMPARED[kind]


def _feed(digest: Any, value: Any) -> None:
    """Feed ``value``, read down to plain values, to ``digest``; Opaque where it cannot be."""
    kind = type(value)
    if kind in _ATOMS:
        digest.update(f"{kind.__name__}:{value!r}\0".encode())
    elif kind in (list, tuple):
        if all(type(v) in _ATOMS for v in value):  # the common case (samples, labels): one repr
            digest.update(f"{kind.__name__}{value!r}\0".encode())
        else:
            digest.update(f"{kind.__name__}[{len(value)}\0".encode())
            for v in value:
                _feed(digest, v)
    elif kind is dict and all(type(k) in _ATOMS and type(v) in _ATOMS for k, v in value.items()):
        digest.update(f"dict{list(value.items())!r}\0".encode())  # a call's recorded numbers: one repr
    elif isinstance(value, Mapping):
        digest.update(f"{kind.__name__}{{{len(value)}\0".encode())
        for k, v in value.items():
            _feed(digest, k)
            _feed(digest, v)
    elif isinstance(value, (set, frozenset)):
        if not all(type(v) in _ATOMS for v in value):
            raise Opaque(kind.__name__)
        digest.update(f"{kind.__name__}{sorted(map(repr, value))!r}\0".encode())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        digest.update(f"{kind.__module__}.{kind.__qualname__}\0".encode())
        for name in _compared(kind):
            digest.update(f"{name}=".encode())
            _feed(digest, getattr(value, name))
    elif isinstance(value, enum.Enum):
        digest.update(f"{kind.__module__}.{kind.__qualname__}.{value.name}\0".encode())
    elif kind.__module__ == "numpy" and hasattr(value, "tobytes") and hasattr(value, "dtype"):
        digest.update(f"numpy:{value.dtype}:{getattr(value, 'shape', ())}\0".encode())
        digest.update(value.tobytes())
    else:
        raise Opaque(kind.__qualname__)


# -- the files ---------------------------------------------------------------------------------
# Every file operation goes through one descriptor of the folder, checked once (fstat): a path
# looked up again could be a link another user swapped in between the check and the use.
def _open_folder(folder: Path, *, make: bool = False) -> int | None:
    """A descriptor of ``folder`` if it is a directory this user owns and no one else may write (a
    kept figure goes into the page as it is), else None (the figure is drawn, nothing kept).
    ``make``: create it (0700) where missing."""
    try:
        if make:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        found = os.fstat(handle)
        if found.st_uid == os.getuid() and not found.st_mode & 0o022:
            return handle
    except OSError:
        pass
    os.close(handle)
    return None


def _read(folder: Path, name: str) -> str | None:
    """A kept figure (:data:`NOTHING` for no figure), or None: not kept, damaged, or not ours."""
    where = _open_folder(folder)
    if where is None:
        return None
    try:
        # Not through a link, and never waiting (a FIFO at the name): a regular file of ours or nothing.
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=where)
    except OSError:
        return None
    finally:
        os.close(where)
    try:
        found = os.fstat(handle)
    except OSError:
        found = None
    if found is None or not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid():
        os.close(handle)
        return None
    try:
        with os.fdopen(handle, encoding="utf-8") as kept:
            text = kept.read()
            try:
                os.utime(kept.fileno())  # recently used: the last to be pruned
            except OSError:
                pass
    except (OSError, UnicodeDecodeError):
        return None
    if text != NOTHING and not (text.startswith("<svg") and text.rstrip().endswith("</svg>")):
        return None  # cut short (an empty file too): drawn again, and the file rewritten whole
    return text


def _write(folder: Path, name: str, text: str) -> None:
    """Keep ``text`` as ``folder/name``, whole or not at all: written to a new file of its own
    (created, never opened through a link), then renamed over the old one."""
    where = _open_folder(folder, make=True)
    if where is None:
        return
    aside = f".{secrets.token_hex(8)}.tmp"
    try:
        handle = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=where)
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(aside, name, src_dir_fd=where, dst_dir_fd=where)
    except OSError:
        try:
            os.unlink(aside, dir_fd=where)
        except OSError:
            pass
    else:
        _prune(where)
    finally:
        os.close(where)


def _prune(where: int) -> None:
    """In the folder ``where``: past :data:`KEEP_FILES` figures or :data:`KEEP_BYTES`, remove the
    least recently used down to three quarters of both, and files a killed writer left over an
    hour ago (once per process: a report adds tens of figures)."""
    global _pruned
    if _pruned:
        return
    _pruned = True
    try:
        found = [(name, os.stat(name, dir_fd=where, follow_symlinks=False)) for name in os.listdir(where)]
    except OSError:
        return
    for name, st in found:
        if _ASIDE_NAME.fullmatch(name) and st.st_mtime < time.time() - 3600:  # a killed writer's
            _unlink(name, where)
    kept = sorted(((st.st_mtime, st.st_size, name) for name, st in found if _KEPT_NAME.fullmatch(name)), reverse=True)
    if len(kept) <= KEEP_FILES and sum(size for _, size, _ in kept) <= KEEP_BYTES:
        return
    total = 0
    for count, (_, size, name) in enumerate(kept):
        total += size
        if count >= KEEP_FILES * 3 // 4 or total > KEEP_BYTES * 3 // 4:
            _unlink(name, where)


def _unlink(name: str, where: int) -> None:
    try:
        os.unlink(name, dir_fd=where)
    except OSError:
        pass
