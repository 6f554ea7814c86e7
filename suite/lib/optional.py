"""Optional packages a variant may use (flash-attn, transformers): the object, or why not."""

from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.cache
def optional_import(module: str, attribute: str | None = None) -> Any:
    """``module`` (or ``module.attribute``), or a string saying why it cannot be imported."""
    try:
        imported = importlib.import_module(module)
        return imported if attribute is None else getattr(imported, attribute)
    except ModuleNotFoundError:
        return f"{module} is not installed"
    except Exception as exc:  # noqa: BLE001 - a build that does not match this torch, say
        return f"{module} does not import ({type(exc).__name__}: {exc})"
