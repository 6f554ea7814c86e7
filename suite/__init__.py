"""gpubench: what LLM training and inference optimizations are worth on your hardware."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from importlib import metadata as _metadata
from types import ModuleType
from typing import Any

try:
    __version__ = _metadata.version("gpubench")
except _metadata.PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+source"

# Where each module of the flat suite/ (before the layer folders, issue 36) lives now: a script or
# a CI job written against the old paths (`from gpubench import compare`, `gpubench.results.load_run`)
# keeps working, with a DeprecationWarning naming the new path. Nothing inside gpubench uses them.
MOVED: dict[str, str] = {
    "cli_console": "cli.console",
    "cli_gate": "cli.gate",
    "cli_history": "cli.history",
    "cli_info": "cli.info",
    "cli_run": "cli.run",
    "cli_tools": "cli.tools",
    "supervisor": "run.supervisor",
    "executor": "run.executor",
    "local_workers": "run.local_workers",
    "in_process": "run.in_process",
    "cluster": "run.cluster",
    "worker": "run.worker",
    "runner": "run.runner",
    "closing": "run.closing",
    "stopping": "run.stopping",
    "estimate": "run.estimate",
    "budget": "run.budget",
    "outcome": "run.outcome",
    "run_options": "run.run_options",
    "scenario": "run.scenario",
    "timing": "measure.timing",
    "phase_timer": "measure.phase_timer",
    "energy": "measure.energy",
    "telemetry": "measure.telemetry",
    "telemetry_source": "measure.telemetry_source",
    "telemetry_summary": "measure.telemetry_summary",
    "throttle": "measure.throttle",
    "hygiene": "measure.hygiene",
    "env": "measure.env",
    "autotune": "measure.autotune",
    "profiling": "measure.profiling",
    "devicecache": "measure.devicecache",
    "machine_load": "measure.machine_load",
    "results": "records.results",
    "declarations": "records.declarations",
    "policy": "records.policy",
    "pytest_benchmark": "records.pytest_benchmark",
    "atomic": "records.atomic",
    "claims": "records.claims",
    "notices": "records.notices",
    "stats": "records.stats",
    "compare": "gate.compare",
    "history": "gate.history",
    "history.changepoints": "gate.history.changepoints",
    "history.judge": "gate.history.judge",
    "history.links": "gate.history.links",
    "history.rows": "gate.history.rows",
    "history.schema": "gate.history.schema",
    "history.since": "gate.history.since",
    "history.store": "gate.history.store",
    "history.trends": "gate.history.trends",
    "attention": "lib.attention",
    "gqa": "lib.gqa",
    "gradients": "lib.gradients",
    "drafting": "lib.drafting",
    "kvmath": "lib.kvmath",
    "kvstorage": "lib.kvstorage",
    "offload": "lib.offload",
    "packing": "lib.packing",
    "paged_decode": "lib.paged_decode",
    "triton_support": "lib.triton_support",
    "optional": "lib.optional",
    "moe_training": "techniques.moe_grouping.training",
    "offload_training": "techniques.activation_offload.training",
    "packed_training": "techniques.packed_metadata.training",
    "speculative_check": "techniques.speculative_decoding.run_check",
    "speculative_metrics": "techniques.speculative_decoding.figures",
    "speculative_run": "techniques.speculative_decoding.generation",
    "kv_allocation": "techniques.kv_cache.allocation",
    "kv_server_memory": "techniques.kv_cache.server_memory",
    "catalog": "techniques.catalog",
    "optimizations.flash_attention_triton": "lib.kernels.flash_attention_triton",
    "optimizations.flash_attention_triton_bwd": "lib.kernels.flash_attention_triton_bwd",
    "optimizations.flash_attention_triton_tiles": "lib.kernels.flash_attention_triton_tiles",
    "optimizations.paged_attention_triton": "lib.kernels.paged_attention_triton",
}


def _moved(old: str) -> ModuleType:
    new = f"{__name__}.{MOVED[old]}"
    warnings.warn(f"{__name__}.{old} moved to {new}; import it from there", DeprecationWarning, stacklevel=3)
    return importlib.import_module(new)


class _MovedLoader(importlib.abc.Loader):
    """Loads an old module path as the module that now lives at the new one (the same object)."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return _moved(spec.name[len(__name__) + 1 :])

    def exec_module(self, module: ModuleType) -> None:
        pass  # imported already, at its new path


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        prefix = __name__ + "."
        if fullname.startswith(prefix) and fullname[len(prefix) :] in MOVED:
            return importlib.util.spec_from_loader(fullname, _MovedLoader())
        return None


# First: an old package path (gpubench.history) is the new package object, whose __path__ the
# path finder would otherwise search for gpubench.history.store, loading a second copy of it.
if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())


def __getattr__(name: str) -> Any:
    """``from gpubench import compare``: an old module name gives the module at its new path."""
    if name in MOVED and "." not in name:
        return _moved(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
