"""Triton plumbing shared by the kernels: can Triton run here, does it run in its interpreter, and
one call that runs a kernel on CUDA or its PyTorch stand-in elsewhere, into a given output buffer.

Kernel modules (``optimizations/*_triton.py``) import triton at the top; they are loaded through
:func:`kernel_module`, so a machine without Triton gets a reason instead of an ImportError.
"""
from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType
from typing import Any, Callable

import torch

# Triton reads TRITON_INTERPRET with these spellings for true (its C++ getenv_bool).
_TRUE = ("1", "true", "yes", "on")


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET). Triton decides it when a
    kernel is decorated, so what counts is the value when the kernel's module was imported."""
    try:
        import triton

        return bool(triton.knobs.runtime.interpret)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


@functools.cache
def kernel_module(name: str) -> ModuleType | str:
    """The kernel module ``name`` (imported once), or why it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # Triton is a dependency on Linux x86-64 only
        return f"Triton is not importable ({exc})"


def kernel_problem(name: str, device: torch.device | str, *, interpreter_ok: bool = False) -> str | None:
    """Why the kernel of module ``name`` cannot run on ``device``, or None. On a CPU it runs only
    in Triton's interpreter, and only where ``interpreter_ok`` (tests: it is far too slow to time)."""
    module = kernel_module(name)
    if isinstance(module, str):
        return module
    if torch.device(device).type == "cuda":
        return None
    if interpreter_ok and getattr(module, "INTERPRETED", interpreted()):
        return None
    return "needs CUDA (Triton's interpreter runs it on a CPU for tests only, too slowly to time)"


def dispatch(kernel: tuple[str, str], fallback: Callable[..., torch.Tensor], *args: torch.Tensor,
             out: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
    """``module.function(*args, out=out, **kwargs)`` for ``kernel = (module, function)`` when the
    first argument is on CUDA and the kernel imports; else ``fallback(*args, out=out, **kwargs)``.
    Both write into ``out`` when one is given (so a caller's NaN-poisoned buffer shows any element
    left unwritten)."""
    module_name, function = kernel
    if args[0].is_cuda:
        module = kernel_module(module_name)
        if not isinstance(module, str):
            return getattr(module, function)(*args, out=out, **kwargs)
    return fallback(*args, out=out, **kwargs)
