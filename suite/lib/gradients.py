"""Checks any training technique can run on a step's gradients, beside its comparison with a
reference: a comparison alone misses a parameter cut off from the loss when the reference runs
the same code (both give it a gradient of exactly 0, and 0 equals 0).

:func:`dead_parameters` names the parameters meant to learn whose gradient is missing or all
zero; :func:`learning_check` turns that into a failing :class:`CheckResult` (None when every one
learns), for a technique's check to return before anything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from gpubench.contract import CheckResult


def dead_parameters(grads: Mapping[str, torch.Tensor | None], frozen: Iterable[str] = ()) -> list[str]:
    """Names (in ``grads``' order) whose gradient is None or exactly zero everywhere, except those
    in ``frozen`` (parameters the step is not meant to train). A single nonzero element is
    enough to learn: an expert that got no token leaves its rows zero, not the whole tensor."""
    skip = set(frozen)
    return [name for name, g in grads.items() if name not in skip and (g is None or not bool(torch.count_nonzero(g)))]


def learning_check(
    grads: Mapping[str, torch.Tensor | None], frozen: Iterable[str] = (), what: str = ""
) -> CheckResult | None:
    """A failing check naming every parameter meant to learn that got no gradient (``what``: whose
    gradients, for the detail), or None when they all did."""
    dead = dead_parameters(grads, frozen)
    if not dead:
        return None
    shown = ", ".join(dead[:8]) + (f" and {len(dead) - 8} more" if len(dead) > 8 else "")
    whose = f"{what}: " if what else ""
    return CheckResult(
        False,
        float(len(dead)),
        0.0,
        "zero_gradients",
        f"{whose}{len(dead)} parameter(s) meant to learn got an all-zero gradient: {shown}",
    )
