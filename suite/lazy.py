"""Modules imported when first used: :class:`LazyModule`.

numpy takes 0.1-0.15 s to import on a quiet 2-core machine; the statistics (:mod:`gpubench.records.stats`)
and the change-point finder import it so, and a command that computes no statistics (``--help``,
``list``, ``history``, a report read from its run's records) never does. In the base layer: it
imports nothing of gpubench."""

from __future__ import annotations

import importlib
from typing import Any


class LazyModule:
    """Stands for the module ``name``: the first attribute read imports it (an ImportError then,
    as ``import name`` would raise it), and each attribute read is kept."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__") or attr == "_name":  # copy and pickle probe these before _name is set
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"
