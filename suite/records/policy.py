"""A scenario's ``policy:`` (how long and how often to measure): :class:`Policy`, what each key
means and allows (:data:`POLICY_PARAMS`) and its validation. Imports no torch, so that a scenario
is read and refused at once (issue 35); :mod:`gpubench.measure.timing` names all of it too."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpubench.contract import Param
from gpubench.errors import BadInput


@dataclass(frozen=True)
class Policy:
    """How long and how often to measure. Scenario files set these under ``policy:``; what each
    key means and allows is declared once, in :data:`POLICY_PARAMS`."""

    warmup_s: float = 0.05
    min_reps: int = 5
    max_reps: int = 200
    min_time_s: float = 0.2
    max_time_s: float = 10.0
    target_iqr: float = 0.05
    case_timeout_s: float = 300.0
    flush_l2: bool = True
    cuda_graph: bool = False
    energy_s: float = 0.3
    profile: bool = False
    profile_calls: int = 3
    # Through torch.cuda.set_per_process_memory_fraction: a smaller card's memory on a bigger GPU,
    # whose compute and bandwidth stay its own.
    gpu_memory_gib: float = 0.0

    def scaled(self, factor: float) -> Policy:
        """Scale repetition counts and times by ``factor`` (``--repeat-scale``)."""
        min_reps = max(1, round(self.min_reps * factor))
        return dataclasses.replace(
            self,
            warmup_s=self.warmup_s * factor,
            min_reps=min_reps,
            max_reps=max(min_reps, round(self.max_reps * factor)),
            min_time_s=self.min_time_s * factor,
            max_time_s=self.max_time_s * factor,
            energy_s=self.energy_s * factor,
            # Building inputs and checking do not shrink with the scale; longer timing does grow.
            case_timeout_s=self.case_timeout_s * max(1.0, factor),
        )

    def to_dict(self) -> dict[str, Any]:
        """The policy's keys; the profile keys only when set (profiling never touches the timed
        repetitions, so runs from before them still compare as the same scenario definition)."""
        out = dataclasses.asdict(self)
        for key in PROFILE_KEYS:
            if out[key] == getattr(Policy, key):
                del out[key]
        return out


PROFILE_KEYS = ("profile", "profile_calls", "gpu_memory_gib")  # left out of to_dict at their defaults


@dataclass(frozen=True)
class PolicyParam(Param):
    """A ``policy:`` key, checked as a technique's params are (:meth:`Param.problem`: type, range,
    choices), with one bound more: ``above``, an exclusive minimum (a time limit of 0 s would mean
    none to the runner's alarm, but a kill at once to the supervisor)."""

    above: float | None = None

    def problem(self, value: Any) -> str | None:
        problem = super().problem(value)
        if problem is None and self.above is not None and value <= self.above:
            return f"{value!r} is not above {self.above:g}"
        return problem

    def allowed(self) -> str:
        if self.type is bool:
            return "true or false"  # as a scenario file spells it
        text = super().allowed()
        return text if self.above is None else f"{text} > {self.above:g}"


POLICY_PARAMS: dict[str, PolicyParam] = {
    p.name: p
    for p in (
        PolicyParam(
            "warmup_s", float, Policy.warmup_s, "seconds of warm-up per variant before timing, at least one call", min=0
        ),
        PolicyParam("min_reps", int, Policy.min_reps, "timed calls per variant, at least", min=1),
        PolicyParam("max_reps", int, Policy.max_reps, "timed calls per variant, at most", min=1),
        PolicyParam(
            "min_time_s",
            float,
            Policy.min_time_s,
            "seconds of timed calls per variant before stopping is allowed",
            min=0,
        ),
        PolicyParam(
            "max_time_s",
            float,
            Policy.max_time_s,
            "seconds of wall time one case's timing loop may take, all variants",
            above=0,
        ),
        PolicyParam(
            "target_iqr", float, Policy.target_iqr, "stop once IQR / median of every variant is at or below this", min=0
        ),
        PolicyParam(
            "case_timeout_s",
            float,
            Policy.case_timeout_s,
            "seconds a case may take before it is stopped and recorded as failed",
            above=0,
        ),
        PolicyParam("flush_l2", bool, Policy.flush_l2, "GPU: overwrite the L2 cache before each timed call"),
        PolicyParam(
            "cuda_graph", bool, Policy.cuda_graph, "GPU: replay a captured CUDA graph (stateless variants only)"
        ),
        PolicyParam(
            "energy_s",
            float,
            Policy.energy_s,
            "seconds per variant of energy measurement, where NVML has an energy counter",
            min=0,
        ),
        PolicyParam("profile", bool, Policy.profile, "after timing: profile each variant (gpubench.measure.profiling)"),
        PolicyParam(
            "profile_calls", int, Policy.profile_calls, "calls under the profiler, after one warm-up call", min=1
        ),
        PolicyParam(
            "gpu_memory_gib",
            float,
            Policy.gpu_memory_gib,
            "GPU memory as on a card of this many GiB "
            "(approximate: torch's caching allocator is capped at the card's usable bytes; 0: all)",
            min=0,
        ),
    )
}


def policy_problems(values: dict[str, Any]) -> dict[str, str]:
    """Per-key problems with a ``policy:`` mapping (empty when valid)."""
    problems: dict[str, str] = {}
    for key, value in values.items():
        param = POLICY_PARAMS.get(key)
        if param is None:
            problems[key] = f"unknown policy key; allowed: {', '.join(POLICY_PARAMS)}"
        elif (problem := param.problem(value)) is not None:
            problems[key] = f"{problem}; allowed: {param.allowed()} ({param.help})"
    if not problems and values.get("min_reps", 1) > values.get("max_reps", 10**9):
        problems["min_reps"] = f"{values['min_reps']} is above max_reps ({values['max_reps']})"
    return problems


def _gib(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:g}"


CAP_NOTE_START = "policy gpu_memory_gib"  # how a note of memory_cap_note begins (the CLI prints these)


def memory_cap_note(
    caps_gib: Iterable[float], device_type: str, total_bytes: int | None = None, label: str = "the GPU"
) -> str | None:
    """What a reader must be told of ``gpu_memory_gib`` caps that do not do what they say: on a
    device other than a CUDA GPU they do nothing; on a GPU, one above the card's memory caps nothing
    (the cases had the whole card). None where every cap applies (or none is set)."""
    caps = sorted({float(c) for c in caps_gib if c and c > 0})
    if not caps:
        return None
    if device_type != "cuda":
        named = " / ".join(map(_gib, caps))
        return (
            f"{CAP_NOTE_START} {named} GiB does nothing on a {device_type} device: it caps a CUDA GPU's "
            f"memory only, so these cases had this machine's memory (remove the key, or run on a GPU)."
        )
    over = [c for c in caps if total_bytes and c * 2**30 > total_bytes]
    if not over or not total_bytes:  # (over is empty without total_bytes)
        return None
    return (
        f"{CAP_NOTE_START} {' / '.join(map(_gib, over))} GiB exceeds {label}'s "
        f"{total_bytes / 2**30:.0f} GiB: nothing was capped for those cases (they had the whole card); "
        f"give a size below it to stand for a smaller card (0: no cap)."
    )


def parse_threshold(text: str | float, source: str = "--threshold") -> float:
    """'5%', '0.05' or 0.05 -> 0.05: a gate threshold (a slowdown fraction), as ``--threshold``
    and a scenario's ``thresholds:`` give it; here so that a scenario reads one without importing
    the gate."""
    try:
        value = float(str(text).strip().rstrip("%")) / (100.0 if str(text).strip().endswith("%") else 1.0)
    except ValueError:
        value = -1.0
    if not 0 < value < 10:
        raise BadInput(
            f"{source}: {text!r} is not a valid threshold; allowed: a slowdown fraction "
            f"such as 5% or 0.05 (greater than 0)."
        )
    return value
