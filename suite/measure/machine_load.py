"""How busy the machine is, and what that does to a case's time limit.

A case's ``case_timeout_s`` is a hang guard, far from its normal seconds on an idle machine. On a
machine whose run queue is longer than its cores (load average above the CPU count), every case
gets a share of the CPUs and runs that many times slower: a limit fit for an idle machine then
stops a case that was not hung. So a case's limit is scaled by the 1-minute load average per
logical CPU at its start, never below x1 and never above :data:`LIMIT_SCALE_CAP` (a real hang is
still stopped, at most that many times later), and the record keeps the limit, its scale and the
load it came from. A case that still passes its limit on an overloaded machine is a timeout of the
run's environment (failure kind ``overloaded``), not a failure of the technique; it is still not a
passed case (see :mod:`gpubench.run.outcome` for the exit code).

:func:`read` is the one place the load is read (tests replace it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

OVERLOAD_PER_CPU = 2.0  # load per core above which a timeout is the machine's (the run itself is about 1)
LIMIT_SCALE_CAP = 4.0  # the most a busy machine stretches a case's limit: 300 s becomes at most 1200 s


@dataclass(frozen=True)
class Load:
    """The 1-minute load average and the logical CPUs it is shared by."""

    load_1m: float
    cpus: int

    @property
    def per_cpu(self) -> float:
        return self.load_1m / max(1, self.cpus)

    @property
    def overloaded(self) -> bool:
        """Runnable work beyond :data:`OVERLOAD_PER_CPU` times the cores: a case gets a share of a
        core, not a core. Not at one per core: the load counts the run's own threads too (torch's
        intra-op threads, the worker's main thread), about one a core on a machine with nothing
        else on it, so a hung case on an idle machine must not read as an overloaded one."""
        return self.load_1m > OVERLOAD_PER_CPU * self.cpus

    def words(self) -> str:
        return f"load {self.load_1m:.1f} on {self.cpus} core{'s' if self.cpus != 1 else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"load_1m": round(self.load_1m, 2), "cpus": self.cpus}


def read() -> Load | None:
    """The machine's load now, or None where the platform has no load average."""
    try:
        load_1m = os.getloadavg()[0]
    except (OSError, AttributeError):
        return None
    return Load(load_1m, _cpus())


def _cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's or taskset's share, where the
    platform says), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def scale_for(load: Load | None) -> float:
    """The factor a case's limit is stretched by at this load: load per CPU, within [1, cap]."""
    if load is None:
        return 1.0
    return min(LIMIT_SCALE_CAP, max(1.0, load.per_cpu))


@dataclass(frozen=True)
class TimeLimit:
    """A case's time limit: its policy's ``case_timeout_s`` times ``scale``, set by ``load`` (the
    machine's at the case's start; None where it was not read, or not read here: a Ray task runs
    on another machine)."""

    policy_s: float
    scale: float = 1.0
    load: Load | None = None

    @property
    def seconds(self) -> float:
        return self.policy_s * self.scale

    def words(self, now: Load | None = None) -> str:
        """``limit 300 s x1.0; machine at load 11.0 on 2 cores, 9.0 at the case's start`` (the
        load ``now`` where given, else the start's): policy.case_timeout_s times the scale."""
        text = f"limit {self.policy_s:g} s x{self.scale:.1f}"
        if now is not None:
            text += f"; machine at {now.words()}"
            if self.load is not None:
                text += f", {self.load.load_1m:.1f} at the case's start"
        elif self.load is not None:
            text += f"; machine at {self.load.words()} at the case's start"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "limit_s": round(self.seconds, 3),
            "case_timeout_s": self.policy_s,
            "scale": round(self.scale, 3),
            "load": self.load.to_dict() if self.load is not None else None,
        }


def time_limit(policy_s: float, probe: Callable[[], Load | None] | None = None) -> TimeLimit:
    """The limit of a case starting now: ``policy_s`` scaled by the load ``probe`` reads (default
    :func:`read`); unscaled where there is no probe (``probe=None`` is the default one; pass
    ``lambda: None`` for none)."""
    load = (probe or read)()
    return TimeLimit(policy_s, scale_for(load), load)


def overloaded(start: Load | None, now: Load | None) -> bool:
    """Whether a case that timed out ran on an overloaded machine (at its start or at the end)."""
    return any(load is not None and load.overloaded for load in (start, now))
