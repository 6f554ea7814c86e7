"""The technique contract: what a technique module declares so the harness can run it.

A technique is a pair (baseline, optimized) plus optional reference peers, all taking the same
:class:`Workload`. The module declares

- ``params``: names, types, defaults and allowed values a scenario may set (validated up front);
- ``build(params, device, seed) -> Workload``: inputs and weights for one case, drawn from
  ``seed`` (the harness derives it from the case, so every run of a case sees the same inputs);
- variants, each ``fn(workload) -> output``, registered with :meth:`Technique.variant`;
- ``check(reference_output, output) -> CheckResult``: exact or within a stated tolerance, with
  the error figure recorded;
- ``metrics(workload, measured) -> dict``: derived figures. Returning ``flops`` and/or
  ``bytes_moved`` (per call) lets the harness add TFLOP/s, GB/s and % of the measured device peak.

Four shapes fit this contract:

- a *kernel* is a pure call (attention, an MoE layer);
- a *training step* mutates state (weights, optimizer): the workload's ``reset`` restores it,
  untimed, before every call, so each repetition does the same work;
- a *serving run* returns its own per-request latencies in its output; ``metrics`` reads them
  from ``measured.output`` (TTFT percentiles, throughput) beside the harness's wall time;
- a *generation run* returns token ids; ``check`` compares them exactly.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

SHAPES = ("kernel", "training_step", "serving_run", "generation_run", "analytic")
ROLES = ("baseline", "optimized", "peer")

_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool"}


@dataclass(frozen=True)
class Param:
    """One scenario-settable parameter of a technique."""

    name: str
    type: type
    default: Any
    help: str = ""
    choices: Sequence[Any] | None = None
    min: float | None = None
    max: float | None = None

    def __post_init__(self) -> None:
        if self.type not in _TYPE_NAMES:
            raise TypeError(f"Param {self.name}: type must be one of int, float, str, bool")
        problem = self.problem(self.default)
        if problem is not None:
            raise ValueError(f"Param {self.name}: default {self.default!r}: {problem}")

    @property
    def type_name(self) -> str:
        return _TYPE_NAMES[self.type]

    def allowed(self) -> str:
        """Human-readable description of what this param accepts."""
        if self.choices is not None:
            return f"one of {list(self.choices)}"
        text = self.type_name
        if self.min is not None and self.max is not None:
            text += f" in [{self.min}, {self.max}]"
        elif self.min is not None:
            text += f" >= {self.min}"
        elif self.max is not None:
            text += f" <= {self.max}"
        return text

    def coerce(self, value: Any) -> Any:
        """Return ``value`` as this param's type; raise ValueError with the reason otherwise."""
        problem = self.problem(value)
        if problem is not None:
            raise ValueError(problem)
        return float(value) if self.type is float else value

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not acceptable, or None when it is."""
        t = self.type
        if t is bool:
            ok = isinstance(value, bool)
        elif t is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif t is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else:
            ok = isinstance(value, str)
        if not ok:
            return f"{value!r} is not a {self.type_name}"
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {list(self.choices)}"
        if self.min is not None and value < self.min:
            return f"{value!r} is below the minimum {self.min}"
        if self.max is not None and value > self.max:
            return f"{value!r} is above the maximum {self.max}"
        return None


@dataclass
class Workload:
    """Seeded inputs for one case. Every variant of the case receives the same object.

    ``inputs`` holds tensors and anything else the variants need; they are reachable as
    attributes (``workload.q``). ``reset``, when set, is called before every call of every
    variant, outside the timed region, to restore mutable state (training steps, engines).
    """

    params: dict[str, Any]
    device: torch.device
    seed: int
    inputs: dict[str, Any] = field(default_factory=dict)
    reset: Callable[[], None] | None = None

    def __getattr__(self, name: str) -> Any:
        inputs = self.__dict__.get("inputs", {})
        if name in inputs:
            return inputs[name]
        raise AttributeError(name)

    def generator(self, offset: int = 0) -> torch.Generator:
        """A CPU generator seeded from this case's seed (draw on CPU, then move: same values on
        every device)."""
        g = torch.Generator(device="cpu")
        g.manual_seed(self.seed + offset)
        return g


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


@dataclass
class Measured:
    """What ``metrics`` sees of one measured variant."""

    variant: str
    samples_s: list[float]
    median_s: float
    output: Any
    device: torch.device


@dataclass
class Variant:
    name: str
    role: str
    fn: Callable[[Workload], Any]
    description: str = ""
    # Returns None when the variant can run on this device, else the reason it cannot.
    unavailable: Callable[[torch.device], str | None] | None = None

    def unavailable_reason(self, device: torch.device) -> str | None:
        return None if self.unavailable is None else self.unavailable(device)


@dataclass
class Technique:
    """A registered technique. Build one at module level, then decorate its pieces:

    >>> T = Technique("demo", summary="...", shape="kernel", params=[...])
    >>> @T.build
    ... def build(params, device, seed): ...
    >>> @T.variant("baseline", role="baseline")
    ... def baseline(w): ...
    """

    name: str
    summary: str
    shape: str
    params: Sequence[Param]
    anchor: str = ""  # the published figure the pair is measured against
    gpu_specific: str = ""  # non-empty: why a CPU ratio is not the GPU's win
    headline: str = ""  # a metric key shown beside the speedup when the win is not time (e.g. utilization)
    # The regression gate compares this metric (per call, lower is better, deterministic) instead of
    # time, for techniques whose figure of merit is not time (kv_cache: bytes_reserved).
    gate_metric: str = ""
    build_fn: Callable[[dict[str, Any], torch.device, int], Workload] | None = None
    variants: dict[str, Variant] = field(default_factory=dict)
    check_fn: Callable[[Any, Any], CheckResult] | None = None
    reference_fn: Callable[[Workload], Any] | None = None
    metrics_fn: Callable[[Workload, Measured], dict[str, Any]] | None = None
    validate_fn: Callable[[dict[str, Any]], list[str]] | None = None
    # Report hook: case records of this technique (from results.json) -> [(title, matplotlib
    # Figure)]. Reads results only; never re-runs anything.
    figures_fn: Callable[[list[dict[str, Any]]], list[tuple[str, Any]]] | None = None

    def __post_init__(self) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"technique {self.name}: shape must be one of {SHAPES}")
        names = [p.name for p in self.params]
        if len(names) != len(set(names)):
            raise ValueError(f"technique {self.name}: duplicate param names")

    # -- decorators ---------------------------------------------------------------------------
    def build(self, fn: Callable[[dict[str, Any], torch.device, int], Workload]):
        self.build_fn = fn
        return fn

    def variant(self, name: str, role: str = "peer", description: str = "",
                unavailable: Callable[[torch.device], str | None] | None = None):
        if role not in ROLES:
            raise ValueError(f"variant {name}: role must be one of {ROLES}")

        def register(fn: Callable[[Workload], Any]):
            if name in self.variants:
                raise ValueError(f"technique {self.name}: variant {name} registered twice")
            if role in ("baseline", "optimized") and any(v.role == role for v in self.variants.values()):
                raise ValueError(f"technique {self.name}: a second {role} variant ({name})")
            doc = description or next(iter((fn.__doc__ or "").strip().splitlines()), "")
            self.variants[name] = Variant(name, role, fn, doc, unavailable)
            return fn

        return register

    def check(self, fn: Callable[[Any, Any], CheckResult]):
        self.check_fn = fn
        return fn

    def reference(self, fn: Callable[[Workload], Any]):
        """Optional: a more precise reference than the baseline (e.g. float64). When set, the
        baseline is checked against it too."""
        self.reference_fn = fn
        return fn

    def metrics(self, fn: Callable[[Workload, Measured], dict[str, Any]]):
        self.metrics_fn = fn
        return fn

    def figures(self, fn: Callable[[list[dict[str, Any]]], list[tuple[str, Any]]]):
        """Optional: the technique's own report figures, built from its case records."""
        self.figures_fn = fn
        return fn

    def validate(self, fn: Callable[[dict[str, Any]], list[str]]):
        """Optional: cross-parameter rules (e.g. heads divisible by kv_heads); returns problems."""
        self.validate_fn = fn
        return fn

    # -- queries ------------------------------------------------------------------------------
    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    @property
    def baseline(self) -> Variant:
        return next(v for v in self.variants.values() if v.role == "baseline")

    @property
    def optimized(self) -> Variant:
        return next(v for v in self.variants.values() if v.role == "optimized")

    def incomplete(self) -> list[str]:
        """What the module forgot to declare (checked when the registry loads it)."""
        missing = []
        if self.build_fn is None:
            missing.append("build")
        if self.check_fn is None:
            missing.append("check")
        roles = {v.role for v in self.variants.values()}
        missing += [f"{r} variant" for r in ("baseline", "optimized") if r not in roles]
        return missing


# Relative L2 error allowed against a float64 reference, by the output's dtype.
DTYPE_TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def relative_l2_check(reference: torch.Tensor, output: torch.Tensor,
                      tolerances: dict[torch.dtype, float] = DTYPE_TOLERANCE) -> CheckResult:
    """‖output − reference‖ / ‖reference‖ in float64 against the tolerance of the output's dtype;
    a wrong shape or any NaN / Inf (e.g. an element a kernel never wrote) fails with the count."""
    tolerance = tolerances.get(output.dtype, 1e-2)
    if output.shape != reference.shape:
        return CheckResult(False, None, tolerance, "rel_l2",
                           f"shape {tuple(output.shape)} != reference {tuple(reference.shape)}")
    nan, inf = int(output.isnan().sum()), int(output.isinf().sum())
    if nan or inf:
        return CheckResult(False, float("nan"), tolerance, "rel_l2",
                           f"output has {nan} NaN and {inf} Inf values of {output.numel()}")
    ref = reference.to(torch.float64)
    diff = torch.linalg.vector_norm(output.to(torch.float64) - ref).item()
    scale = torch.linalg.vector_norm(ref).item()
    error = diff / scale if scale > 0 else diff
    passed = error <= tolerance
    detail = "" if passed else f"relative L2 error {error:.3g} exceeds {tolerance:g} for {output.dtype}"
    return CheckResult(passed, error, tolerance, "rel_l2", detail)
