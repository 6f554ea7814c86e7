"""Modules imported when first used: :class:`LazyModule`.

numpy takes 0.1-0.15 s to import on a quiet 2-core machine; the statistics (:mod:`gpubench.records.stats`)
and the change-point finder import it so, and a command that computes no statistics (``--help``,
``list``, ``history``, a report read from its run's records) never does. In the base layer: it
imports nothing of gpubench."""

from __future__ import annotations

import importlib
from typing import Any

_MODULE_NAMES = {"__version__", "__name__", "__file__", "__path__", "__doc__", "__all__", "__spec__"}


class LazyModule:
    """Stands for the module ``name``: the first attribute read imports it (an ImportError then,
    as ``import name`` would raise it), and each attribute read is kept."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        # copy and pickle probe protocol methods (__deepcopy__, __setstate__, ...), some before
        # _name is set: they get none (a module has none). A module's own names (__version__) pass.
        if attr == "_name" or (attr.startswith("__") and attr not in _MODULE_NAMES):
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
