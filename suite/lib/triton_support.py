"""Triton plumbing shared by the kernels: can Triton run here, does it run in its interpreter, and
one call that runs a kernel on CUDA or its PyTorch stand-in elsewhere, into a given output buffer.

Kernel modules (:mod:`gpubench.lib.kernels`) import triton at the top; they are loaded through
:func:`kernel_module`, so a machine without Triton gets a reason instead of an ImportError.

On a machine without CUDA, importing this module turns Triton's interpreter on for the processes
started after it (:func:`interpreter_by_default`): ``gpubench run``'s workers then check every
Triton kernel there. A variant built on a kernel declares ``checked_only=interpreter_note(...)``:
checked like any other, never timed (:data:`INTERPRETER_NOTE`).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

# Triton reads TRITON_INTERPRET with these spellings for true (its C++ getenv_bool).
_TRUE = ("1", "true", "yes", "on")
INTERPRETER = "Triton interpreter"
# Why a kernel run by the interpreter is checked and never timed (the report shows it beside the variant).
INTERPRETER_NOTE = (
    f"checked in the {INTERPRETER}, not timed: it runs the kernel's blocks one by one in NumPy, "
    "so its time says nothing of a GPU's"
)


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET). Triton decides it when a
    function is decorated, so what counts is the value when the kernel's module was imported, and
    when Triton itself was (its library's functions, ``tl.max`` and the like, are decorated then:
    set afterwards, they stay compiled and an interpreted kernel cannot call them)."""
    try:
        import triton
        import triton.language.standard as library
        from triton.runtime.interpreter import InterpretedFunction

        return bool(triton.knobs.runtime.interpret) and isinstance(library.max, InterpretedFunction)
    except (ImportError, AttributeError):
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def interpreter_by_default() -> None:
    """Without a CUDA device Triton can run a kernel only in its interpreter: turn it on for the
    processes started from now on (``gpubench run``'s workers), and for this one if Triton is not
    imported yet, unless the environment already says (``TRITON_INTERPRET=0`` keeps it off)."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


interpreter_by_default()


@functools.cache
def kernel_module(name: str) -> ModuleType | str:
    """The kernel module ``name`` (imported once), or why it cannot be imported."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:  # Triton is a dependency on Linux x86-64 only
        return f"Triton is not importable ({exc})"


def kernel_problem(name: str, device: torch.device | str, *, interpreter_ok: bool = False) -> str | None:
    """Why the kernel of module ``name`` cannot run on ``device``, or None. On a CPU it runs only
    in Triton's interpreter, and only where ``interpreter_ok``: a variant that is checked there,
    never timed (:func:`interpreter_note`), or a test."""
    module = kernel_module(name)
    if isinstance(module, str):
        return module
    if torch.device(device).type == "cuda":
        return None
    if interpreter_ok and getattr(module, "INTERPRETED", interpreted()):
        return None
    if interpreter_ok:
        return (
            "needs CUDA, or Triton's interpreter: TRITON_INTERPRET=1 set before Triton is imported (gpubench "
            "run's worker processes have it on a machine without CUDA; --isolation none does not)"
        )
    return "needs CUDA (Triton's interpreter runs it on a CPU only to check it, far too slowly to time)"


def interpreter_note(name: str) -> Callable[[torch.device | str], str | None]:
    """A variant's ``checked_only`` for the kernel of module ``name``: :data:`INTERPRETER_NOTE`
    where the interpreter runs it (its module imported under ``TRITON_INTERPRET``), else None."""

    def note(device: torch.device | str) -> str | None:
        module = kernel_module(name)
        return INTERPRETER_NOTE if not isinstance(module, str) and getattr(module, "INTERPRETED", False) else None

    return note


def dispatch(
    kernel: tuple[str, str],
    fallback: Callable[..., torch.Tensor],
    *args: torch.Tensor,
    out: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``module.function(*args, out=out, **kwargs)`` for ``kernel = (module, function)`` when the
    first argument is on CUDA and the kernel imports; else ``fallback(*args, out=out, **kwargs)``.
    Both write into ``out`` when one is given (so a caller's NaN-poisoned buffer shows any element
    left unwritten)."""
    module_name, function = kernel
    if args[0].is_cuda:  # GPU-only: compiled kernels; on a CPU their own tests run them interpreted
        module = kernel_module(module_name)
        if not isinstance(module, str):
            return getattr(module, function)(*args, out=out, **kwargs)
    return fallback(*args, out=out, **kwargs)
