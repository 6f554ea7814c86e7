"""The checks techniques share: a variant's output against its reference, with the error figure
kept (:class:`CheckResult`), and the one table of tolerances by dtype. Part of the public contract:
``gpubench.contract`` re-exports every name here, and plug-ins import them from there."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class CheckResult:
    """Outcome of comparing one variant's output with the reference output."""

    passed: bool
    error: float | None  # the error figure (e.g. relative L2 error, or count of mismatches)
    tolerance: float | None  # None for exact comparisons
    metric: str  # what ``error`` measures, e.g. "rel_l2" or "mismatched_tokens"
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# Relative L2 error allowed against a float64 reference, by the output's dtype. Techniques whose
# outputs pass through more rounded steps (a backward pass) widen it with an override, saying why.
DTYPE_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def rel_l2(reference: torch.Tensor, output: torch.Tensor) -> float:
    """‖output − reference‖ / ‖reference‖ in float64; the absolute norm when the reference is 0."""
    ref = reference.detach().to(torch.float64)
    diff = torch.linalg.vector_norm(output.detach().to(torch.float64) - ref).item()
    scale = torch.linalg.vector_norm(ref).item()
    return diff / scale if scale > 0 else diff


def _tensor_problem(name: str, reference: Any, output: Any) -> str | None:
    if not isinstance(output, torch.Tensor):
        return f"{name} is missing" if output is None else f"{name} is not a tensor"
    if output.shape != reference.shape:
        return f"{name}: shape {tuple(output.shape)} != reference {tuple(reference.shape)}"
    bad = output.numel() - int(output.isfinite().sum()) if output.is_floating_point() else 0
    if bad:
        nan = int(output.isnan().sum())
        return f"{name} has {nan} NaN and {bad - nan} Inf values of {output.numel()}"
    return None


def tensors_check(
    reference: Mapping[str, torch.Tensor],
    output: Mapping[str, torch.Tensor] | Any,
    tolerances: Mapping[torch.dtype, float] = DTYPE_TOLERANCE,
    *,
    exact: bool = False,
    dtype: torch.dtype | None = None,
) -> CheckResult:
    """Named tensors (an output and its gradients, say) against the reference's: the worst
    relative L2 error, within the tolerance of ``dtype`` (default: the first output tensor's);
    ``exact``: the largest absolute difference must be 0. A missing tensor, a wrong shape or any
    NaN / Inf (e.g. an element a kernel never wrote) fails, naming the tensor."""
    first = next(iter(output.values()), None) if isinstance(output, Mapping) else None
    dtype = dtype or (first.dtype if isinstance(first, torch.Tensor) else None)
    tolerance = None if exact else (tolerances.get(dtype, 1e-2) if dtype is not None else 1e-2)
    metric = "max_abs_diff" if exact else ("rel_l2" if len(reference) == 1 else "max_rel_l2")
    if not isinstance(output, Mapping):
        return CheckResult(False, None, tolerance, metric, f"output is a {type(output).__name__}, not named tensors")
    errors: dict[str, float] = {}
    for name, ref in reference.items():
        problem = _tensor_problem(name, ref, output.get(name))
        if problem is not None:
            nan = "NaN" in problem or "Inf" in problem
            return CheckResult(False, float("nan") if nan else None, tolerance, metric, problem)
        got = output[name]
        if exact:
            errors[name] = (got.double() - ref.double()).abs().max().item() if got.numel() else 0.0
        else:
            errors[name] = rel_l2(ref, got)
    if not errors:
        return CheckResult(False, None, tolerance, metric, "nothing to compare")
    worst = max(errors, key=lambda k: errors[k])
    limit = 0.0 if exact or tolerance is None else tolerance
    failing = [f"{k} {v:.3g}" for k, v in errors.items() if v > limit]
    if failing:
        what = "differs from the reference" if exact else f"relative L2 error above {tolerance:g} for {dtype}"
        return CheckResult(False, errors[worst], tolerance, metric, f"{what}: {', '.join(failing[:6])}")
    return CheckResult(True, errors[worst], tolerance, metric, f"worst: {worst}" if len(errors) > 1 else "")


def relative_l2_check(
    reference: torch.Tensor, output: torch.Tensor, tolerances: Mapping[torch.dtype, float] = DTYPE_TOLERANCE
) -> CheckResult:
    """One tensor against its reference: relative L2 error in float64 within the tolerance of the
    output's dtype (see ``tensors_check``)."""
    dtype = output.dtype if isinstance(output, torch.Tensor) else None
    result = tensors_check({"output": reference}, {"output": output}, tolerances, dtype=dtype)
    if not result.passed and result.error is not None and result.detail.startswith("relative"):
        result.detail = f"relative L2 error {result.error:.3g} exceeds {result.tolerance:g} for {dtype}"
    return result
