"""The technique contract: what a technique declares so the harness can run it. This module is a
public API (techniques outside the package are written against it): add to it, never break it.

A technique module defines ``TECHNIQUE = Technique(name, summary=..., shape=..., params=[...])``
and decorates its pieces:

- ``@T.build``: ``(params, device, seed) -> Workload``, seeded inputs for one case (a typed
  subclass of ``Workload``, or a plain one with an ``inputs`` dict);
- ``@T.variant(name, role=...)``: ``fn(workload)`` or ``fn(workload, recorder)``, named by what it
  runs (``eager``, ``triton``, ``sdpa``); the role (baseline / optimized / peer) is separate;
- ``@T.check``: ``(reference_output, output) -> CheckResult``, the error figure kept;
- ``@T.metrics``: ``(workload, measured) -> dict``; ``flops`` / ``bytes_moved`` per call become
  TFLOP/s, GB/s and % of the measured device peak; they count what the case's problem needs, once,
  not what a variant does (one count for every variant of a case: a variant that reads more shows
  as a lower share, on the report's roofline too);
- optional ``@T.reference``, ``@T.validate``, declared plots (``Plot``), ``headline_figures``
  (``Headline``): the figures the report reads the technique by beside or instead of time,
  ``claims`` (``Claim``, from ``gpubench.records.claims``): the published figures the report
  checks, and ``benchmarks`` (``Bench``): the small sizes benchmarks/ times it at.

Shapes: a *kernel* (a pure call), a *training step* (``Workload.reset`` restores state before
every call, untimed), a *serving run* and a *generation run* (their output carries what they
measured), and *analytic* (a calculation checked against real allocations).

Time on a GPU is taken on two clocks, each call timed on both (``gpubench.measure.timing.Clock``):
*device* time (CUDA events, the start event held behind the L2 flush: launch work excluded) and
*wall* time (the host's, launch work and host syncs included). The shape picks the headline clock
(``SHAPE_TIME_BASIS``: a kernel on device time, steps and runs on wall time); a technique may
pick the other with ``time_basis="device"`` or ``"wall"``. On a CPU they are one clock.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import re
import statistics
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

# Part of the public contract, defined where they belong:
from gpubench.records.claims import Claim as Claim

if TYPE_CHECKING:  # for type checkers and documentation tools, which read these as re-exports
    import torch

    from gpubench.checks import DTYPE_TOLERANCE as DTYPE_TOLERANCE
    from gpubench.checks import CheckResult as CheckResult
    from gpubench.checks import rel_l2 as rel_l2
    from gpubench.checks import relative_l2_check as relative_l2_check
    from gpubench.checks import tensors_check as tensors_check

# What the decorators take and give back: the function, unchanged.
_Fn = TypeVar("_Fn", bound=Callable[..., Any])

# gpubench.checks's names are part of the contract too, imported on first use: they need torch, and
# what only reads results (report, history, compare) imports this module without it (issue 35).
_FROM_CHECKS = ("DTYPE_TOLERANCE", "CheckResult", "rel_l2", "relative_l2_check", "tensors_check")


def __getattr__(name: str) -> Any:
    if name in _FROM_CHECKS:
        from gpubench import checks

        return getattr(checks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_FROM_CHECKS})


SHAPES = ("kernel", "training_step", "serving_run", "generation_run", "analytic")
ROLES = ("baseline", "optimized", "peer")
# The clock a shape's time figures are read on, on a GPU (Technique.time_basis overrides it): a
# kernel by the device's own time, launch work excluded; a step or a run by wall time, its launch
# work and host syncs included (they are what it costs). On a CPU both are one clock.
TIME_BASES = ("device", "wall")
SHAPE_TIME_BASIS = {
    "kernel": "device",
    "training_step": "wall",
    "serving_run": "wall",
    "generation_run": "wall",
    "analytic": "wall",
}

_TYPE_NAMES = {int: "int", float: "float", str: "str", bool: "bool"}


@dataclass(frozen=True)
class Param:
    """One scenario-settable parameter of a technique.

    A case's id names every param, defaults included (``compare``, the history and the case's seed
    key on it); a param added after runs were recorded sets ``omit_default_from_id=True``, so at its
    default it is left out of the id and the ids and seeds of cases that do not use it stay as they
    were.

    A value is checked for its ``type``, ``choices`` and ``min``/``max``; a rule on one value beyond
    those is ``value_check="module:function"``, a torch-free function that returns why the value is
    refused, or None (rules across params: ``Technique.validate``)."""

    name: str
    type: type
    default: Any
    help: str = ""
    choices: Sequence[Any] | None = None
    min: float | None = None
    max: float | None = None
    # True: ``min`` itself is refused (a timeout, a duration to divide by: "> 0", not ">= 0").
    min_exclusive: bool = False
    # True for a param added after runs were recorded: at its default it is left out of the case id
    # (gpubench.run.scenario.Case.id), so the ids and seeds of cases that do not use it stay as they
    # were and `gpubench compare` and the history still match them across the upgrade.
    omit_default_from_id: bool = False
    # A rule for one value beyond its type, choices and range, named ``"module:function"``: the
    # function takes the value and returns why it is refused, or None (a model param: a preset, a
    # config.json or a directory that exists). Named, not passed, so the catalogue of declarations
    # keeps it; it must import no torch, since a scenario's values are checked before any
    # technique code loads. Rules across several params belong in ``validate_fn``. Keyword-only, so
    # a subclass's own positional fields (a PolicyParam's ``above``) stay where they were.
    value_check: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.type not in _TYPE_NAMES:
            raise TypeError(f"Param {self.name}: type must be one of int, float, str, bool")
        if self.value_check is not None:
            if not _CHECK_NAME.fullmatch(self.value_check):
                raise ValueError(
                    f"Param {self.name}: value_check {self.value_check!r} must name a function as 'module:function'"
                )
            try:
                _value_check(self.value_check)
            except Exception as exc:  # noqa: BLE001 - the declaration names the check it cannot load
                raise ValueError(
                    f"Param {self.name}: value_check {self.value_check!r} cannot be loaded ({type(exc).__name__}: {exc})"
                ) from None
        if self.min_exclusive and self.min is None:
            raise ValueError(f"Param {self.name}: min_exclusive needs a min")
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
            text += f" in {'(' if self.min_exclusive else '['}{self.min}, {self.max}]"
        elif self.min is not None:
            text += f" {'>' if self.min_exclusive else '>='} {self.min}"
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
            return f"{value!r} is not {'an' if self.type_name == 'int' else 'a'} {self.type_name}"
        if self.choices is not None and value not in self.choices:
            return f"{value!r} is not one of {list(self.choices)}"
        if self.min is not None and self.min_exclusive and value <= self.min:
            return f"{value!r} is not above {self.min} (the minimum, excluded)"
        if self.min is not None and value < self.min:
            return f"{value!r} is below the minimum {self.min}"
        if self.max is not None and value > self.max:
            return f"{value!r} is above the maximum {self.max}"
        if self.value_check is not None:
            try:
                problem: str | None = _value_check(self.value_check)(value)
            except Exception as exc:  # noqa: BLE001 - a check that fails refuses the value, saying why
                return f"{value!r}: its check {self.value_check} failed ({type(exc).__name__}: {exc})"
            return problem
        return None


_CHECK_NAME = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@functools.cache
def _value_check(name: str) -> Callable[[Any], str | None]:
    """The function a :attr:`Param.value_check` names, imported once."""
    module, _, attr = name.partition(":")
    function: Callable[[Any], str | None] = getattr(importlib.import_module(module), attr)
    return function


@dataclass
class Workload:
    """Seeded inputs for one case; every variant of the case receives the same object.

    Built-in techniques subclass it with typed fields (``@dataclass(kw_only=True)``). The plain
    form keeps its inputs in ``inputs``, reachable as attributes (``workload.q``). ``reset``, when
    set, runs before every call of every variant, outside the timed region, to restore mutable
    state (training steps, engines)."""

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
        import torch

        g = torch.Generator(device="cpu")
        g.manual_seed(self.seed + offset)
        return g


class Recorder:
    """Side data of one call of a variant: phase times, sync counts, copy waits. A variant that
    takes a second argument gets a fresh one per call; the harness hands ``metrics`` only those
    of the timed repetitions (never the checked call, warm-up or energy calls), in
    ``Measured.records``. ``record`` sets values, ``add`` accumulates."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def record(self, **values: Any) -> None:
        self.values.update(values)

    def add(self, name: str, amount: float = 1) -> None:
        self.values[name] = self.values.get(name, 0) + amount


@dataclass
class Measured:
    """What ``metrics`` sees of one measured variant."""

    variant: str
    samples_s: list[float]
    median_s: float
    output: Any  # the checked call's output
    device: torch.device
    records: list[dict[str, Any]] = field(default_factory=list)  # Recorder values, one per timed call

    def median_of(self, key: str) -> float | None:
        """The median over the timed calls of a recorded number (None when never recorded)."""
        values = [r[key] for r in self.records if isinstance(r.get(key), (int, float))]
        return statistics.median(values) if values else None


@dataclass
class Variant:
    name: str
    role: str
    fn: Callable[..., Any]
    description: str = ""
    # Returns None when the variant can run on this device, else the reason it cannot. A function
    # of two arguments, ``(device, params)``, also gets the case's params (None when the question
    # is about the device alone), so a case the variant cannot take (a layer width its kernel's
    # alignment rule refuses) skips it with the reason instead of failing.
    unavailable: Callable[..., str | None] | None = None
    # Returns None when the variant is timed on this device as usual, else why it runs there only
    # to be checked (a Triton kernel in Triton's interpreter on a CPU): its output is checked like
    # any other, it is never timed, so no figure of it is compared with anything, and it never
    # plays the baseline or optimized role.
    checked_only: Callable[[torch.device], str | None] | None = None

    def unavailable_reason(self, device: torch.device, params: Mapping[str, Any] | None = None) -> str | None:
        if self.unavailable is None:
            return None
        if _positional(self.unavailable, required=False) >= 2:
            return self.unavailable(device, params)
        return self.unavailable(device)

    def checked_only_reason(self, device: torch.device) -> str | None:
        return None if self.checked_only is None else self.checked_only(device)

    @property
    def takes_recorder(self) -> bool:
        return _positional(self.fn, required=True) >= 2

    def call(self, workload: Workload, recorder: Recorder | None = None) -> Any:
        if self.takes_recorder:
            return self.fn(workload, recorder if recorder is not None else Recorder())
        return self.fn(workload)


@dataclass(frozen=True)
class Plot:
    """A figure a technique declares; ``gpubench.reports`` draws it from the run's results.

    ``y`` names what is plotted, per variant: a metric key, ``time`` (median seconds per call),
    ``peak_memory`` (bytes) or ``speedup`` (over the baseline, with its CI); a tuple draws several
    on one axis. ``kind``:

    - ``line``: y against the param ``x``, a panel per value of the ``panels`` params, a line per
      variant and per value of any other param that varies (drawn when some line has 2 points);
    - ``stacked``: the metrics in ``y`` stacked, a bar per variant, against ``x`` or per case;
    - ``bars``: per case, the metrics in ``y`` side by side, a bar per variant;
    - ``series``: per case, a list metric ``y`` against a list metric ``x`` (e.g. over time);
    - ``cdf``: per case, the distribution of a list metric ``y``.

    ``variants`` are roles or names (default the baseline and optimized ones); ``scale``
    multiplies the values (1e3: s to ms); ``relative`` plots the baseline's value over the
    variant's (a speedup of that figure)."""

    title: str
    y: str | tuple[str, ...]
    x: str | None = None
    kind: str = "line"
    ylabel: str = ""
    xlabel: str = ""  # default: the name of x
    panels: tuple[str, ...] = ()
    variants: tuple[str, ...] = ("baseline", "optimized")
    scale: float = 1.0
    relative: bool = False
    log_y: bool = False
    max_cases: int = 4  # per-case kinds: the first N cases

    KINDS = ("line", "stacked", "bars", "series", "cdf")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"Plot {self.title!r}: kind must be one of {self.KINDS}")
        if self.kind in ("line",) and self.x is None:
            raise ValueError(f"Plot {self.title!r}: a line plot needs x (a param)")
        if self.kind == "series" and self.x is None:
            raise ValueError(f"Plot {self.title!r}: a series plot needs x (a list metric)")

    @property
    def ys(self) -> tuple[str, ...]:
        return (self.y,) if isinstance(self.y, str) else tuple(self.y)


@dataclass(frozen=True)
class Headline:
    """A figure the report's headline reads a technique by. ``metric`` is a per-variant metric,
    shown baseline -> optimized under ``label``; ``percent`` shows a fraction as a percentage;
    ``higher_is_better`` says which way is a win (it orders cases best first).

    ``replaces_time`` (the default): the win is this figure, not time (kv_cache: KV utilization;
    serving: output tokens/s), so it stands in place of the speedup and ranks the cases. False: a
    figure shown beside the speedup, the win is still time (moe_grouping: host syncs per step). A
    technique that declares none is read by time alone: the optimized variant's speedup.

    ``exact``: the figure is bookkeeping (bytes, blocks, requests that fit): the same at every call
    and on any device, so it needs no confidence interval (the report's answer table ranks on it
    as it stands). False (the default): a figure measured over the timed calls (tokens/s), as sure
    as the time it was measured over."""

    metric: str
    label: str = ""  # default: the metric's name
    percent: bool = False
    higher_is_better: bool = True
    replaces_time: bool = True
    exact: bool = False

    @property
    def name(self) -> str:
        return self.label or self.metric


_BENCH_NAME = re.compile(r"[A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class Bench:
    """A small size the pytest-benchmark suite (benchmarks/test_bench_techniques.py) times the
    technique at: ``params`` over the technique's defaults; every variant that runs and is timed on
    the device is timed there, and each output is checked as a run checks it. One line in the
    declaration: ``benchmarks=[Bench("causal", {"seq_len": 512, "causal": True})]``. Optional: the
    suite lists a technique that declares none as skipped and never times it at its defaults,
    which may be a GPU's sizes."""

    name: str  # in the test's id, so in the benchmark JSON's names: letters, digits, - _ .
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _BENCH_NAME.fullmatch(self.name):
            raise ValueError(f"Bench {self.name!r}: a name is letters, digits, '-', '_' or '.'")
        object.__setattr__(self, "params", dict(self.params))


@dataclass
class Technique:
    """A registered technique. Build one at module level, then decorate its pieces:

        T = Technique("demo", summary="...", shape="kernel", params=[...])

        @T.build
        def build(params, device, seed): ...

        @T.variant("eager", role="baseline")
        def eager(w): ...

    Several variants may be declared for the baseline or optimized role, in order of preference:
    on a device, the first one that can run there plays the role and the others that can run are
    timed as peers (e.g. ``triton`` on CUDA, with ``torch_tiled`` standing in elsewhere).
    """

    name: str
    summary: str
    shape: str
    params: Sequence[Param]
    anchor: str = ""  # the published figure the pair is measured against (stated here only)
    gpu_specific: str = ""  # non-empty: why a CPU ratio is not the GPU's win
    # Deprecated: headline_figures=(Headline(metric, replaces_time=False),). Read back, ``headline``
    # is the first headline figure's metric (a property, defined below the class).
    headline: InitVar[str] = ""
    # The regression gate compares this metric (per call, lower is better, deterministic) instead of
    # time, for techniques whose figure of merit is not time (kv_cache: bytes_reserved).
    gate_metric: str = ""
    build_fn: Callable[[dict[str, Any], torch.device, int], Workload] | None = None
    variants: dict[str, Variant] = field(default_factory=dict)
    check_fn: Callable[[Any, Any], CheckResult] | None = None
    reference_fn: Callable[[Workload], Any] | None = None
    metrics_fn: Callable[[Workload, Measured], dict[str, Any]] | None = None
    validate_fn: Callable[[dict[str, Any]], list[str]] | None = None
    # Deprecated (declare ``plots``): case records of this technique -> [(title, matplotlib
    # Figure)]. The report calls it only where the technique is importable: code is not in a run.
    figures_fn: Callable[[list[dict[str, Any]]], list[tuple[str, Any]]] | None = None
    plots: Sequence[Plot] = ()
    source: str = ""  # where it came from: a module path or file (set by the registry)
    # What the report's headline reads the technique by beside or instead of time (see Headline);
    # empty: time alone, the speedup of optimized over baseline.
    headline_figures: Sequence[Headline] = ()
    # The published figures the pair is checked against (the report's "published claims on this
    # device" table): see gpubench.records.claims.Claim. Optional: a technique without claims still runs.
    claims: Sequence[Claim] = ()
    # The small sizes benchmarks/ times the technique at (see Bench); empty: not benchmarked there.
    benchmarks: Sequence[Bench] = ()
    # The clock its time figures (samples_s, speedups, the gate, the history) are read on, on a GPU:
    # "device" (CUDA events, launch work excluded) or "wall" (the host's, from just before the
    # launch to after the final sync: launch work and host syncs included). Empty: the shape's
    # (SHAPE_TIME_BASIS: a kernel on device time, a step or a run on wall time, where host syncs
    # are the point). The other clock is recorded beside it; on a CPU both are one clock.
    time_basis: str = ""

    def __post_init__(self, headline: str) -> None:
        if self.shape not in SHAPES:
            raise ValueError(f"technique {self.name}: shape must be one of {SHAPES}")
        if self.time_basis not in ("", *TIME_BASES):
            raise ValueError(
                f"technique {self.name}: time_basis must be one of {TIME_BASES} (or empty: the "
                f"shape's, {SHAPE_TIME_BASIS[self.shape]!r} for {self.shape})"
            )
        self.time_basis = self.time_basis or SHAPE_TIME_BASIS[self.shape]
        names = [p.name for p in self.params]
        if len(names) != len(set(names)):
            raise ValueError(f"technique {self.name}: duplicate param names")
        self.plots = list(self.plots)
        self.headline_figures = _declared(self.name, "headline_figures", self.headline_figures, Headline)
        if headline:
            self._take_legacy_headline(headline)
        self.claims = _declared(self.name, "claims", self.claims, Claim)
        self.benchmarks = _declared(self.name, "benchmarks", self.benchmarks, Bench)
        problems = self.bench_problems()
        if problems:
            raise ValueError(f"technique {self.name}: {'; '.join(problems)}")
        if self.figures_fn is not None:
            warnings.warn(_FIGURES_DEPRECATED, DeprecationWarning, stacklevel=3)

    def _take_legacy_headline(self, metric: str) -> None:
        """``headline="x"``, the older spelling: a figure shown beside the speedup, put first so
        that ``headline`` reads back as it was given; a metric already declared stays as declared."""
        warnings.warn(
            f"Technique(headline={metric!r}) is deprecated: use "
            f"headline_figures=(Headline({metric!r}, replaces_time=False),)",
            DeprecationWarning,
            stacklevel=4,
        )
        if all(h.metric != metric for h in self.headline_figures):
            self.headline_figures = (Headline(metric, replaces_time=False), *self.headline_figures)

    # -- decorators ---------------------------------------------------------------------------
    def build(self, fn: _Fn) -> _Fn:
        """Decorator: ``fn(params, device, seed) -> Workload``, the seeded inputs of one case (never zeros)."""
        self.build_fn = fn
        return fn

    def variant(
        self,
        name: str,
        role: str = "peer",
        description: str = "",
        unavailable: Callable[..., str | None] | None = None,
        checked_only: Callable[[torch.device], str | None] | None = None,
    ) -> Callable[[_Fn], _Fn]:
        """Decorator: ``fn(workload)`` or ``fn(workload, recorder)`` is variant ``name`` (named by what it
        runs: ``eager``, ``triton``) playing ``role`` (baseline / optimized / peer). Its description
        in the report is ``description`` or its docstring's first paragraph. ``unavailable(device)``
        (or ``(device, params)``) returns why it cannot run there, None when it can;
        ``checked_only(device)`` why it is only checked there, not timed."""
        if role not in ROLES:
            raise ValueError(f"variant {name}: role must be one of {ROLES}")
        if name in ROLES and role != name:
            raise ValueError(f"variant {name}: a role's name can only name a variant of that role")

        def register(fn: _Fn) -> _Fn:
            if name in self.variants:
                raise ValueError(f"technique {self.name}: variant {name} registered twice")
            doc = description or first_paragraph(fn.__doc__)
            self.variants[name] = Variant(name, role, fn, doc, unavailable, checked_only)
            return fn

        return register

    def check(self, fn: _Fn) -> _Fn:
        """Decorator: ``fn(reference_output, output) -> CheckResult``, the error figure kept."""
        self.check_fn = fn
        return fn

    def reference(self, fn: _Fn) -> _Fn:  # fn(workload) -> the reference output
        """Optional: a more precise reference than the baseline (e.g. float64). When set, the
        baseline is checked against it too."""
        self.reference_fn = fn
        return fn

    def metrics(self, fn: _Fn) -> _Fn:
        """Decorator: ``fn(workload, measured) -> dict`` of derived figures; ``flops`` and ``bytes_moved``
        per call (what the problem needs, once) become TFLOP/s, GB/s and % of the device peak."""
        self.metrics_fn = fn
        return fn

    def figures(self, fn: _Fn) -> _Fn:  # fn(case records) -> [(title, figure)]
        """Deprecated: the technique's own report figures, built from its case records. Declare
        ``Plot``s instead: a run holds them, so its report draws them without this code."""
        warnings.warn(_FIGURES_DEPRECATED, DeprecationWarning, stacklevel=2)
        self.figures_fn = fn
        return fn

    def plot(self, plot: Plot) -> Plot:
        """Declare a report figure (see ``Plot``)."""
        cast(list[Plot], self.plots).append(plot)  # a list since __post_init__
        return plot

    def validate(self, fn: _Fn) -> _Fn:  # fn(params) -> problems
        """Optional: cross-parameter rules (e.g. heads divisible by kv_heads); returns problems."""
        self.validate_fn = fn
        return fn

    # -- queries ------------------------------------------------------------------------------
    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def bench_params(self, bench: Bench) -> dict[str, Any]:
        """The params ``bench`` is built with: its own over the defaults."""
        return {**self.defaults(), **bench.params}

    def bench_problems(self) -> list[str]:
        """What is wrong with the declared benchmark sizes: a name used twice, an unknown param, a
        value its param refuses (cross-param rules are ``validate``'s, which may come later)."""
        names = [b.name for b in self.benchmarks]
        out = [f"benchmark {n!r} declared twice" for n in sorted({n for n in names if names.count(n) > 1})]
        for bench in self.benchmarks:
            for key, value in bench.params.items():
                param = self.param(key)
                problem = (
                    f"unknown param; allowed: {', '.join(p.name for p in self.params)}"
                    if param is None
                    else param.problem(value)
                )
                if problem is not None:
                    out.append(f"benchmark {bench.name!r}: {key}: {problem}")
        return out

    def declared(self, role: str) -> list[Variant]:
        """The variants declared for ``role``, in order of preference."""
        return [v for v in self.variants.values() if v.role == role]

    @property
    def baseline(self) -> Variant:
        return self.declared("baseline")[0]

    @property
    def optimized(self) -> Variant:
        return self.declared("optimized")[0]

    def cast(self, device: torch.device, params: Mapping[str, Any] | None = None) -> dict[str, tuple[str, str | None]]:
        """Each variant's role on ``device`` (for a case of ``params``, when given) and why it cannot
        run there (None when it can):
        the first variant declared for baseline / optimized that runs there and is timed there
        (not only checked) plays that role; every other variant is a peer (a role nobody can play
        stays with the first declared, unrunnable)."""
        reasons = {v.name: v.unavailable_reason(device, params) for v in self.variants.values()}
        out = {name: ("peer", reason) for name, reason in reasons.items()}
        for role in ("baseline", "optimized"):
            declared = self.declared(role)
            player = next(
                (v for v in declared if reasons[v.name] is None and v.checked_only_reason(device) is None),
                declared[0] if declared else None,
            )
            if player is not None:
                out[player.name] = (role, reasons[player.name])
        return out

    def playing(self, role: str, device: torch.device) -> Variant | None:
        """The variant that plays ``role`` (baseline, optimized) on ``device``, if any can."""
        return next(
            (self.variants[n] for n, (r, reason) in self.cast(device).items() if r == role and reason is None), None
        )

    def resolve(self, names: Sequence[str], device: torch.device, params: Mapping[str, Any] | None = None) -> list[str]:
        """Variant names for a scenario's ``variants`` list, where a role name (baseline,
        optimized) stands for the variant playing that role on ``device`` (in a case of ``params``)."""
        cast = self.cast(device, params)
        out = []
        for name in names:
            if name in self.variants:
                out.append(name)
                continue
            playing = [n for n, (role, reason) in cast.items() if role == name and reason is None]
            out += playing or [v.name for v in self.declared(name)[:1]]
        return list(dict.fromkeys(out))

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


def _headline_metric(self: Technique) -> str:
    """The first headline figure's metric, "" for a technique read by time alone (what a case
    record keeps as ``headline``; the attribute older code reads)."""
    return self.headline_figures[0].metric if self.headline_figures else ""


# Set after the class: a property in its body would become the default of the ``headline`` InitVar.
Technique.headline = property(_headline_metric)  # type: ignore[attr-defined]  # an InitVar to mypy

_FIGURES_DEPRECATED = (
    "Technique.figures / figures_fn is deprecated: declare Plot(...)s (Technique(plots=...) or "
    "@T.plot), which a run records and its report draws without the technique's code"
)


def _declared(technique: str, what: str, values: Sequence[Any], kind: type) -> tuple[Any, ...]:
    """``values`` as a tuple, each one a ``kind`` declaration, else TypeError."""
    values = tuple(values)
    if any(not isinstance(v, kind) for v in values):
        raise TypeError(f"technique {technique}: {what} must be {kind.__name__}(...) declarations")
    return values


def _positional(fn: Callable[..., Any], *, required: bool) -> int:
    """How many positional parameters ``fn`` takes (``required``: only those without a default);
    0 when it cannot be inspected."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return 0
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len([p for p in positional if not required or p.default is p.empty])


def first_paragraph(docstring: str | None) -> str:
    """A docstring's first paragraph on one line: whole sentences, never cut at a line break."""
    paragraph = inspect.cleandoc(docstring or "").split("\n\n")[0]
    return " ".join(paragraph.split())
