"""The technique registry: every module in this package defines one :class:`Technique` named
``TECHNIQUE``. Adding a technique is adding a module here (see README, "Adding a technique")."""
from __future__ import annotations

import importlib
import pkgutil

from gpubench.contract import Technique

_REGISTRY: dict[str, Technique] = {}
_LOADED = False


def register(technique: Technique) -> Technique:
    missing = technique.incomplete()
    if missing:
        raise ValueError(f"technique {technique.name} is incomplete: missing {', '.join(missing)}")
    if technique.name in _REGISTRY and _REGISTRY[technique.name] is not technique:
        raise ValueError(f"technique {technique.name} registered twice")
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
            register(technique)


def all_techniques() -> dict[str, Technique]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> Technique | None:
    _load()
    return _REGISTRY.get(name)
