"""What a run is asked to do beyond its scenario (:class:`RunOptions`: devices, isolation, a
cluster, exclusivity, locked clocks, a time budget, ...), and the checks that refuse a bad request before anything
is created: devices that do not exist here (:func:`resolve_devices`), options that do not go
together (:func:`check_options`), and, with ``--exclusive``, a GPU other processes use
(:func:`check_hygiene`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from gpubench.errors import BadInput
from gpubench.measure import hygiene

# Device counts through NVML where torch can (torch reads this at each call): the supervisor never
# creates a CUDA context of its own.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

ISOLATIONS = ("process", "none")


@dataclass
class RunOptions:
    devices: list[str] = field(default_factory=lambda: ["cpu"])
    isolation: str = "process"
    cluster: str | None = None  # "ray" or "ray://host:port"
    gpu_type: str | None = None  # Ray accelerator type, e.g. H100
    max_parallel: int | None = None
    exclusive: bool = False  # refuse to start when other processes use a GPU
    lock_clocks: bool = False
    per_model: bool = False  # every case once on each device model (a fleet's technique x device matrix)
    profile: bool = False  # --profile: every case's policy.profile on (profiles after timing)
    budget_s: float | None = None  # --budget: plan the run to fit this wall time (gpubench.run.budget)
    fill_budget: bool = False  # --fill-budget: admit a case on its lower figure (gpubench.run.budget)
    budget_from: float | None = None  # time.monotonic() the budget counts from (default: when the run starts)


def resolve_devices(text: str, source: str = "--devices") -> list[str]:
    """``all``, ``cpu``, ``cuda``, ``cuda:N`` or a comma-separated list (a device may repeat: one
    worker each) -> device strings that exist here; BadInput otherwise."""
    allowed = "all, auto, cpu, cuda, cuda:N, or a comma-separated list such as cuda:0,cuda:2 (or cpu,cpu)"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    out = []
    for item in [t.strip() for t in text.split(",") if t.strip()] or [""]:
        if item == "all":
            out += [f"cuda:{i}" for i in range(count)] or ["cpu"]
        elif item == "auto":
            out.append("cuda:0" if count else "cpu")
        elif item == "cpu":
            out.append("cpu")
        elif item == "cuda" or (item.startswith("cuda:") and item[5:].isdigit()):
            index = int(item[5:]) if ":" in item else 0
            if not count:
                raise BadInput(
                    f"{source}: device {item!r} was asked for, but no CUDA GPU is usable here "
                    f"(torch {torch.__version__}). Allowed: {allowed}; use 'cpu' on this machine."
                )
            if index >= count:
                raise BadInput(
                    f"{source}: device {item!r} does not exist; this machine has {count} CUDA "
                    f"device(s) (cuda:0..cuda:{count - 1})."
                )
            out.append(f"cuda:{index}")
        else:
            raise BadInput(f"{source}: {item!r} is not a device; allowed: {allowed}.")
    return out


# -- --cluster: what it accepts, checked here; gpubench.run.cluster (the executor) uses both ----------
def ray_module() -> Any:
    """Ray, imported only when a run asks for a cluster: an optional extra, and slow to import (here,
    beside the option it checks, so that checking an option never imports the executor)."""
    try:
        import ray
    except ImportError:
        raise BadInput(
            "--cluster ray: Ray is not installed; install the extra with pip install 'gpubench[ray]' "
            "(or pip install ray), then run again."
        ) from None
    return ray


def check_address(address: str) -> None:
    """``--cluster``: ``ray`` or ``ray://HOST:PORT``; BadInput otherwise (before a run directory is made)."""
    if address != "ray" and not address.startswith("ray://"):
        raise BadInput(
            f"--cluster: {address!r} is not valid; allowed: ray (a local Ray instance, or the cluster "
            "RAY_ADDRESS names) or ray://HOST:PORT (an existing cluster). On SLURM, start Ray inside "
            "the allocation and give --cluster ray (README, 'A Ray cluster')."
        )


def check_options(options: RunOptions) -> None:
    """Bad combinations, refused before anything is created."""
    if options.isolation not in ISOLATIONS:
        raise BadInput(f"--isolation: {options.isolation!r} is not valid; allowed: {', '.join(ISOLATIONS)}.")
    if options.isolation == "none" and len(options.devices) > 1 and not options.cluster:
        raise BadInput(
            "--isolation none runs every case in this process, on one device; give one device "
            f"(got {', '.join(options.devices)}) or use worker processes (--isolation process)."
        )
    if options.budget_s is not None and not options.budget_s > 0:
        raise BadInput(f"--budget: {options.budget_s!r} is not valid; allowed: a duration above 0 (540, 9m, 1h30m).")
    if options.fill_budget and options.budget_s is None:
        raise BadInput("--fill-budget: only with --budget DURATION (it says how a budget admits its cases).")
    if options.max_parallel is not None and options.max_parallel < 1:
        raise BadInput(f"--max-parallel: {options.max_parallel} is not valid; allowed: an integer >= 1.")
    if options.cluster:
        check_address(options.cluster)
        ray_module()  # BadInput when Ray is not installed


def check_hygiene(devices: Sequence[str], exclusive: bool) -> dict[str, Any]:
    """The other processes on each CUDA device (NVML's list, or why it could not be read); with
    ``exclusive``, BadInput when any has one."""
    found = {d: hygiene.gpu_processes(d) for d in dict.fromkeys(devices) if d.startswith("cuda")}
    busy = {d: p for d, p in found.items() if isinstance(p, list) and p}
    if exclusive and busy:
        listing = "; ".join(
            f"{d}: " + ", ".join(f"{p['name']} (pid {p['pid']})" for p in procs) for d, procs in busy.items()
        )
        raise BadInput(
            f"--exclusive: other processes are using the GPU ({listing}); their work would share the "
            "device with the measurements. Stop them, or run without --exclusive (the report then warns)."
        )
    return found
