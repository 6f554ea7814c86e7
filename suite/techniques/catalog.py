"""The built-in techniques' declarations as data, so that ``gpubench list`` and a scenario's
validation need no technique code (issue 35: the technique modules import torch, 10-20 s).

``gpubench/techniques/catalog.json`` holds, for each technique of ``gpubench.techniques``, what
``list`` prints and what a scenario is checked against: name, shape, summary, anchor, gpu_specific,
claims, params (enough to rebuild each :class:`~gpubench.contract.Param` and check a value exactly
as the technique does), variants (name, role, description) and whether it has a ``validate_fn``.

It is a cache keyed by the source: it records a hash of every ``.py`` and ``.json`` file of the
package's folders (suite/, optimizations/, baselines/) it was built from. Where the installed
sources hash otherwise (an edited checkout), :func:`built_ins` is None and every caller falls back
to the registry (the modules imported as before: correct, only slower). A maintainer rebuilds it::

    python -m gpubench.techniques.catalog --write      # or: make catalog

and tests/test_catalog.py fails, naming that command, while the committed file is stale.

Plug-ins (entry points of ``gpubench.techniques``, modules and files a scenario names) are never
in it: where entry points are installed, :func:`declared` loads the registry as before.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubench import techniques
from gpubench.contract import Param, Technique
from gpubench.errors import BadInput
from gpubench.records.claims import Claim

FORMAT = 1
CATALOG_FILE = Path(__file__).resolve().parent / "catalog.json"
WRITE_COMMAND = "python -m gpubench.techniques.catalog --write (or: make catalog)"
_TYPES = {"int": int, "float": float, "str": str, "bool": bool}
_HASHED = (".py", ".json")


@dataclass(frozen=True)
class VariantInfo:
    """A variant as declared: what ``list`` prints and a scenario's ``variants:`` is checked against."""

    name: str
    role: str
    description: str = ""


@dataclass(frozen=True)
class Declared:
    """A built-in technique's declarations, read from the catalogue: the parts of a
    :class:`~gpubench.contract.Technique` that ``list`` and a scenario's validation read, under the
    same names. ``validates`` says the technique has a ``validate_fn`` (code: its cross-param rules
    need the module, loaded through the registry when they are checked)."""

    name: str
    shape: str
    summary: str
    params: tuple[Param, ...]
    anchor: str = ""
    gpu_specific: str = ""
    source: str = ""
    claims: tuple[Claim, ...] = ()
    variants: Mapping[str, VariantInfo] = field(default_factory=dict)
    validates: bool = False

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}


# -- the source it was built from -----------------------------------------------------------------
# The packages a declaration could depend on, hashed under these names whether installed from a
# checkout (package-dir: suite/, optimizations/, baselines/) or a wheel (nested in gpubench/); the
# other packages mapped to folders of their own are left out of gpubench's.
HASHED_PACKAGES = ("gpubench", "gpubench.optimizations", "gpubench.baselines")
OTHER_PACKAGES = ("gpubench.reports", "gpubench.scenarios")


def _folder(package: str) -> Path | None:
    """Where ``package`` is installed, found without importing it."""
    if package == "gpubench":
        return Path(__file__).resolve().parent.parent
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]).resolve() if locations else None


def source_dirs() -> dict[str, Path]:
    """The installed folders of :data:`HASHED_PACKAGES`, by package name."""
    return {name: folder for name in HASHED_PACKAGES if (folder := _folder(name)) is not None}


def source_hash(dirs: Mapping[str, Path] | None = None) -> str:
    """sha256 of every .py and .json file of the packages in ``dirs`` (package name -> folder):
    each file's path inside its package and its bytes, the catalogue itself left out. About
    20-40 ms for the 140 files of today (README, 'Start-up')."""
    dirs = dict(dirs if dirs is not None else source_dirs())
    elsewhere = {f for name in (*HASHED_PACKAGES, *OTHER_PACKAGES) if (f := _folder(name)) is not None}
    digest = hashlib.sha256()
    for name, root in sorted(dirs.items()):
        found = []
        for folder, subdirs, files in os.walk(root):
            subdirs[:] = [d for d in subdirs if d != "__pycache__" and (Path(folder) / d).resolve() not in elsewhere]
            found += [Path(folder) / f for f in files if f.endswith(_HASHED)]
        for path in sorted(found):
            inside = path.relative_to(root).as_posix()
            if (name, inside) == ("gpubench", "techniques/catalog.json"):
                continue
            digest.update(f"{name}:{inside}\0".encode())
            digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


# -- writing --------------------------------------------------------------------------------------
def _param_entry(tech: str, param: Param) -> dict[str, Any]:
    if type(param) is not Param:  # a subclass may check values its own way: data cannot say how
        raise ValueError(
            f"{tech}.{param.name}: a {type(param).__name__}, not a plain Param; the catalogue can only rebuild Param"
        )
    return {
        "name": param.name,
        "type": param.type_name,
        "default": param.default,
        "help": param.help,
        "choices": list(param.choices) if param.choices is not None else None,
        "min": param.min,
        "max": param.max,
        "min_exclusive": param.min_exclusive,
        "omit_default_from_id": param.omit_default_from_id,
        "value_check": param.value_check,
    }


def entry_of(tech: Technique) -> dict[str, Any]:
    """One technique's declarations as the catalogue stores them (JSON-ready)."""
    return {
        "name": tech.name,
        "shape": tech.shape,
        "summary": tech.summary,
        "anchor": tech.anchor,
        "gpu_specific": tech.gpu_specific,
        "source": tech.source,
        "claims": [c.to_dict() for c in tech.claims],
        "params": [_param_entry(tech.name, p) for p in tech.params],
        "variants": [{"name": v.name, "role": v.role, "description": v.description} for v in tech.variants.values()],
        "validates": tech.validate_fn is not None,
    }


def build() -> dict[str, Any]:
    """The catalogue of the built-in techniques as the modules declare them now (imports them)."""
    built_in = {n: t for n, t in techniques.all_techniques().items() if t.source.startswith(f"{techniques.__name__}.")}
    return {
        "format": FORMAT,
        "source_hash": source_hash(),
        "techniques": {n: entry_of(t) for n, t in sorted(built_in.items())},
    }


def write(path: Path = CATALOG_FILE) -> dict[str, Any]:
    data = build()
    # json round-trip first: what is written is what is read back (tuples become lists)
    path.write_text(json.dumps(json.loads(json.dumps(data)), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data


# -- reading --------------------------------------------------------------------------------------
def declared_of(entry: Mapping[str, Any]) -> Declared:
    """A :class:`Declared` from its catalogue entry."""
    params = tuple(
        Param(
            p["name"],
            _TYPES[p["type"]],
            p["default"],
            p.get("help", ""),
            tuple(p["choices"]) if p.get("choices") is not None else None,
            p.get("min"),
            p.get("max"),
            p.get("min_exclusive", False),
            p.get("omit_default_from_id", False),
            value_check=p.get("value_check"),
        )
        for p in entry["params"]
    )
    variants = {v["name"]: VariantInfo(v["name"], v["role"], v.get("description", "")) for v in entry["variants"]}
    return Declared(
        entry["name"],
        entry["shape"],
        entry["summary"],
        params,
        entry.get("anchor", ""),
        entry.get("gpu_specific", ""),
        entry.get("source", ""),
        tuple(Claim.from_dict(c) for c in entry.get("claims", ())),
        variants,
        bool(entry.get("validates")),
    )


_CACHE: dict[str, Any] = {}


def built_ins() -> dict[str, Declared] | None:
    """The built-in techniques' declarations from the catalogue, or None where it cannot stand for
    them (missing, another format, or built from other sources than those installed). Read once."""
    if "built_ins" not in _CACHE:
        _CACHE["built_ins"] = _read()
    return _CACHE["built_ins"]


def _read() -> dict[str, Declared] | None:
    try:
        data = json.loads(CATALOG_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("source_hash") != source_hash():
        return None
    try:
        return {name: declared_of(entry) for name, entry in data["techniques"].items()}
    except (KeyError, TypeError, ValueError):  # a hand-edited file: the registry is the truth
        return None


def entry_points_installed() -> bool:
    """Whether any package declares a technique through the entry point group (read from the
    installed metadata: nothing is imported)."""
    if "entry_points" not in _CACHE:
        _CACHE["entry_points"] = bool(importlib.metadata.entry_points(group=techniques.ENTRY_POINT_GROUP))
    return _CACHE["entry_points"]


def declared() -> dict[str, Declared | Technique]:
    """Every technique known here, by name, sorted: the built-ins from the catalogue and those
    registered in this process (a scenario's or ``list``'s modules and files). The registry itself
    (every module imported) where the catalogue is stale or missing, where entry points are
    installed, or where it is loaded already."""
    catalogue = built_ins()
    if catalogue is None or techniques.loaded() or entry_points_installed():
        return dict(techniques.all_techniques())
    merged: dict[str, Declared | Technique] = {**catalogue, **techniques.registered()}
    return dict(sorted(merged.items()))


def declaration(name: str) -> Declared | Technique | None:
    return declared().get(name)


def broken() -> dict[str, str]:
    """Entry points that could not be loaded (the registry's), without loading it when none is installed."""
    return techniques.broken() if entry_points_installed() else {}


def load(spec: str, base_dir: Path | None = None) -> Declared | Technique:
    """:func:`gpubench.techniques.load`, but a built-in name is answered from the catalogue, and a
    plain name that is neither known nor an importable module is refused (the same words) without
    importing the built-ins."""
    known = declared()
    if spec in known:
        return known[spec]
    if (
        built_ins() is not None
        and not entry_points_installed()
        and spec.isidentifier()
        and not _importable(spec, base_dir)
    ):
        raise BadInput(
            f"technique {spec!r} is neither a registered technique ({', '.join(known)}) nor an "
            f"importable module: ModuleNotFoundError: No module named {spec!r}."
        )
    return techniques.load(spec, base_dir)


def _importable(name: str, base_dir: Path | None) -> bool:
    """Whether the top-level module ``name`` is found on sys.path or beside the scenario (where
    :func:`gpubench.techniques.load` would look), without importing it."""
    if base_dir is not None and ((base_dir / f"{name}.py").is_file() or (base_dir / name).is_dir()):
        return True
    return name in sys.modules or importlib.util.find_spec(name) is not None


def stale_entries(committed: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """What differs between two catalogues (for the test that keeps the committed one fresh)."""
    out = []
    if committed.get("source_hash") != now.get("source_hash"):
        out.append("the sources it was built from changed (source_hash)")
    a, b = committed.get("techniques", {}), now.get("techniques", {})
    out += [
        f"{n}: {'added' if n not in a else 'removed' if n not in b else 'declarations changed'}"
        for n in sorted(set(a) | set(b))
        if a.get(n) != b.get(n)
    ]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpubench.techniques.catalog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help=f"rebuild {CATALOG_FILE.name} from the modules")
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed catalogue is stale")
    args = parser.parse_args(argv)
    if args.write:
        data = write()
        print(f"wrote {CATALOG_FILE} ({len(data['techniques'])} techniques, source {data['source_hash'][:12]})")
        return 0
    try:
        committed = json.loads(CATALOG_FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"{CATALOG_FILE}: cannot be read ({exc}); run {WRITE_COMMAND}")
        return 1
    diff = stale_entries(committed, json.loads(json.dumps(build())))
    for line in diff:
        print(line)
    print(f"{CATALOG_FILE}: {'stale; run ' + WRITE_COMMAND if diff else 'up to date'}")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
