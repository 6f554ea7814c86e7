"""Layer 4, with baselines/ and optimizations/: may import the library, measure, records, the
contract and errors; a technique package imports its own pair's baselines and optimizations, never
another technique's package; never run, gate, reports or cli.

The technique registry. Techniques come from three places, all validated the same way:

- the modules of this package, each defining a :class:`Technique` named ``TECHNIQUE``;
- installed packages, through the entry point group ``gpubench.techniques`` (the entry point
  names a module holding ``TECHNIQUE``, or the Technique itself);
- a scenario entry naming a module (``technique: my_pkg.my_pair``, looked up on ``sys.path`` and
  beside the scenario file; ``my_pkg.pairs:NORM`` names another attribute than ``TECHNIQUE``) or
  a Python file (``technique: pairs/my_pair.py``, relative to it).

A file is loaded as a module of its own, named after its resolved path (two ``pair.py`` in two
folders are two modules), inside a package that stands for its folder: a module beside it is
imported relatively (``from . import helpers``), and ``sys.path`` is left as it is. Its recorded
``source`` is that resolved path, which is how a worker process or a later report finds it again.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import pkgutil
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType

from gpubench.contract import Param, Technique
from gpubench.errors import BadInput

ENTRY_POINT_GROUP = "gpubench.techniques"

_REGISTRY: dict[str, Technique] = {}
_BROKEN: dict[str, str] = {}  # entry points that failed to load -> why
_LOADED = False


def problems(technique: object) -> list[str]:
    """What keeps ``technique`` from being run: not a Technique, or pieces it does not declare."""
    if not isinstance(technique, Technique):
        return [f"TECHNIQUE is a {type(technique).__name__}, not a gpubench.contract.Technique"]
    out = [f"missing {piece}" for piece in technique.incomplete()]
    out += [f"param {p!r} is not a gpubench.contract.Param" for p in technique.params if not isinstance(p, Param)]
    return out


def register(technique: Technique, source: str = "") -> Technique:
    found = problems(technique)
    if found:
        name = getattr(technique, "name", "?")
        raise ValueError(f"technique {name} is incomplete: {', '.join(found)}")
    known = _REGISTRY.get(technique.name)
    if known is not None and known is not technique:
        raise ValueError(
            f"technique {technique.name} registered twice ({known.source or 'built in'} and "
            f"{source or technique.source or 'another module'})"
        )
    if source and not technique.source:
        technique.source = source
    _REGISTRY[technique.name] = technique
    return technique


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        technique = getattr(module, "TECHNIQUE", None)
        if isinstance(technique, Technique):
            register(technique, module.__name__)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = entry.load()
            technique = getattr(obj, "TECHNIQUE", obj) if isinstance(obj, ModuleType) else obj
            technique = _validated(technique, f"entry point {entry.name} ({entry.value})")
            register(technique, entry.value.split(":")[0])
        except Exception as exc:  # noqa: BLE001 - a broken plug-in is reported, never fatal
            _BROKEN[entry.name] = f"{entry.value}: {exc}"


def all_techniques() -> dict[str, Technique]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def loaded() -> bool:
    """Whether the built-ins and entry points are imported already (as the first lookup does)."""
    return _LOADED


def registered() -> dict[str, Technique]:
    """The techniques registered so far, nothing imported to find more (gpubench.techniques.catalog adds the
    built-ins' declarations to them without their code)."""
    return dict(_REGISTRY)


def broken() -> dict[str, str]:
    """Entry-point techniques that could not be loaded, with the reason."""
    _load()
    return dict(_BROKEN)


def get(name: str) -> Technique | None:
    _load()
    return _REGISTRY.get(name)


def _validated(technique: object, where: str) -> Technique:
    found = problems(technique)
    if found:
        raise BadInput(
            f"{where}: the technique cannot run: {'; '.join(found)}. A technique defines "
            "TECHNIQUE = gpubench.contract.Technique(...) with @TECHNIQUE.build, @TECHNIQUE.check "
            "and at least a baseline and an optimized variant ('Bring your own pair', "
            "docs/bring-your-own-pair.md)."
        )
    return technique  # type: ignore[return-value]


def _file_of(spec: str, base_dir: Path | None) -> Path | None:
    """The file a spec names (a path, or ending in .py), relative to ``base_dir``; None for a module."""
    if not (spec.endswith(".py") or "/" in spec or "\\" in spec):
        return None
    path = Path(spec)
    return (base_dir / path if not path.is_absolute() and base_dir is not None else path).resolve()


def _folder_package(folder: Path) -> ModuleType:
    """The package standing for a plug-in's folder (created once per folder, never executed): its
    ``__path__`` is the folder, so relative imports of the plug-in find the modules beside it, and
    its name comes from the folder's resolved path, so two folders never share a module."""
    readable = re.sub(r"\W", "_", folder.name)[:40]
    name = f"gpubench_user_{readable}_{hashlib.sha1(str(folder).encode()).hexdigest()[:12]}"
    package = sys.modules.get(name)
    if package is None:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        package = sys.modules[name] = importlib.util.module_from_spec(spec)
    return package


def _import_file(path: Path) -> ModuleType:
    """Executes a plug-in file as ``<its folder's package>.<stem>``; a file that raises leaves no
    module behind (as a failed import does)."""
    name = f"{_folder_package(path.parent).__name__}.{path.stem}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:  # a .py path always has one
        raise ImportError(f"cannot import {path}", path=str(path))
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _import(spec: str, base_dir: Path | None) -> ModuleType:
    path = _file_of(spec, base_dir)
    if path is not None:
        if not path.is_file():
            what = "is a directory, not a .py file" if path.is_dir() else "no such file"
            raise BadInput(
                f"technique {spec!r}: {what} ({path}); give a built-in technique, a module "
                f"(my_pkg.my_pair) or a .py file relative to the scenario."
            )
        return _import_file(path)
    if base_dir is not None and str(base_dir) not in sys.path:
        sys.path.append(str(base_dir))
    return importlib.import_module(spec)


def _sibling_hint(exc: ModuleNotFoundError, path: Path | None) -> str:
    """For a plug-in file whose absolute import names a module beside it: how to import that one."""
    top = (exc.name or "").split(".")[0]
    if path is None or not top or not ((path.parent / f"{top}.py").is_file() or (path.parent / top).is_dir()):
        return ""
    return (
        f" {top} is beside {path.name}: a plug-in file imports the modules beside it relatively "
        f"(from . import {top}); sys.path is left as it is."
    )


def _where_raised(exc: BaseException) -> str:
    """'ValueError: bad at /path/pair.py:12 (in build_table)': the exception and the line of the
    user's code it came from (the innermost frame outside the import machinery)."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{type(exc).__name__}: {exc.msg} at {exc.filename}:{exc.lineno}"
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__) if "importlib" not in f.filename and f.filename != __file__
    ]
    if frames:
        text += f" at {frames[-1].filename}:{frames[-1].lineno} (in {frames[-1].name})"
    return text


def load(spec: str, base_dir: Path | None = None) -> Technique:
    """The technique a scenario names: a registered name, a module holding ``TECHNIQUE`` or a
    ``.py`` file (relative to ``base_dir``, the scenario's folder). Raises :class:`BadInput` with
    what is wrong: unimportable, no ``TECHNIQUE``, or an incomplete one."""
    known = get(spec)
    path = _file_of(spec, base_dir)
    if known is None and path is not None:  # a file loaded before (another scenario, another entry)
        known = next((t for t in all_techniques().values() if t.source == str(path)), None)
    if known is not None:
        return known
    if spec in _BROKEN:
        raise BadInput(
            f"technique {spec!r} (entry point of group {ENTRY_POINT_GROUP}) cannot be loaded: {_BROKEN[spec]}"
        )
    module_spec, _, attribute = spec.partition(":") if not spec.endswith(".py") else (spec, "", "")
    attribute = attribute or "TECHNIQUE"
    try:
        module = _import(module_spec, base_dir)
    except BadInput:
        raise
    except ModuleNotFoundError as exc:
        if exc.name is None or not module_spec.startswith(exc.name):  # the module is there; an import inside it is not
            raise BadInput(
                f"technique {spec!r}: importing it failed: {_where_raised(exc)}.{_sibling_hint(exc, path)}"
            ) from None
        raise BadInput(
            f"technique {spec!r} is neither a registered technique ({', '.join(all_techniques())}) nor an "
            f"importable module: {type(exc).__name__}: {exc}."
        ) from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while imported: where, no traceback
        raise BadInput(f"technique {spec!r}: importing it failed: {_where_raised(exc)}.") from None
    technique = getattr(module, attribute, None)
    if technique is None:
        raise BadInput(
            f"technique {spec!r}: module {module.__name__} ({getattr(module, '__file__', '?')}) has no "
            f"{attribute}; define TECHNIQUE = gpubench.contract.Technique(...) at module level."
        )
    technique = _validated(technique, f"technique {spec!r}")
    source = str(path) if path is not None else spec
    try:
        return register(technique, source)
    except ValueError as exc:
        raise BadInput(f"technique {spec!r}: {exc}; give it a name of its own.") from None


def find(name: str, source: str = "") -> Technique | None:
    """For readers of results (report): the registered technique, else the one its recorded
    ``source`` defines, else None. Never raises."""
    known = get(name)
    if known is not None or not source:
        return known
    try:
        technique = load(source)
    except (BadInput, Exception):  # noqa: BLE001 - the report goes on without it
        return None
    return technique if technique.name == name else None
