"""Every registered technique (the built-ins and entry-point plug-ins) at the small sizes it
declares (``Technique(benchmarks=[Bench(...)])``): each variant that runs and is timed on this
device is timed, and each output is checked as a run checks it (against ``@T.reference``, else
the baseline's output). A variant that cannot run here, or only runs here to be checked (a Triton
kernel in Triton's interpreter), is skipped with its reason; a technique that declares no sizes is
listed as skipped, never timed at its defaults (they may be a GPU's sizes).

Tests are named ``test_technique[<technique>-<size>-<variant>]`` and grouped by technique, which
``gpubench compare`` reads as the case's technique."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from gpubench import techniques
from gpubench.contract import Bench, Technique, Workload

# A training step restores its weights before every call (untimed), so pytest-benchmark runs it
# in fixed rounds with that setup; every other shape is timed in its usual calibrated loop.
RESET_ROUNDS, RESET_WARMUP_ROUNDS = 10, 1


def bench_params(registry: Mapping[str, Technique]) -> list[Any]:
    """One pytest param (technique, size, variant) per declared size and variant, in declaration
    order so that a size's variants run together on one workload."""
    out: list[Any] = []
    for name, tech in registry.items():
        if not tech.benchmarks:
            why = f"{name} declares no benchmark sizes (Technique(benchmarks=[Bench(name, params)]))"
            out.append(pytest.param(name, None, None, id=name, marks=pytest.mark.skip(reason=why)))
        for bench in tech.benchmarks:
            out += [
                pytest.param(name, bench.name, variant, id=f"{name}-{bench.name}-{variant}")
                for variant in tech.variants
            ]
    return out


class CurrentCase:
    """The workload of the size being benchmarked and the output its variants are checked
    against, built once for all its variants; the previous size's is dropped first (a trained
    draft pair or a training model is not small)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.key: tuple[str, str] | None = None
        self.workload: Workload | None = None
        self.expected: Any = None

    def get(self, tech: Technique, bench: Bench) -> tuple[Workload, Any]:
        if self.key != (tech.name, bench.name):
            self.key, self.workload, self.expected = None, None, None
            workload = tech.build_fn(tech.bench_params(bench), self.device, 0)
            self.expected = expected_output(tech, workload)
            self.key, self.workload = (tech.name, bench.name), workload
        return self.workload, self.expected


def expected_output(tech: Technique, workload: Workload) -> Any:
    """What a run checks the variants against: the technique's reference, else the output of the
    variant playing the baseline here."""
    if workload.reset is not None:
        workload.reset()
    if tech.reference_fn is not None:
        return tech.reference_fn(workload)
    baseline = tech.playing("baseline", workload.device)
    if baseline is None:
        pytest.skip(f"{tech.name}: no baseline runs on {workload.device.type}, so nothing to check against")
    return baseline.call(workload)


@pytest.fixture(scope="session")
def current_case(device):
    return CurrentCase(device)


@pytest.mark.parametrize("name,size,variant", bench_params(techniques.all_techniques()))
def test_technique(benchmark, current_case, name, size, variant):
    time_and_check(benchmark, current_case, techniques.get(name), size, variant)


def time_and_check(benchmark: Any, current_case: CurrentCase, tech: Technique, size: str, variant: str) -> None:
    """Time ``variant`` of ``tech`` at the declared size ``size`` with pytest-benchmark's
    ``benchmark`` fixture, then check the timed call's output; skip, with the reason, a variant
    that cannot run or is only checked on this device."""
    device = current_case.device
    chosen = tech.variants[variant]
    unavailable, checked_only = chosen.unavailable_reason(device), chosen.checked_only_reason(device)
    if unavailable:
        pytest.skip(f"{tech.name} {variant} cannot run on {device.type}: {unavailable}")
    if checked_only:
        pytest.skip(f"{tech.name} {variant} is checked, never timed, on {device.type}: {checked_only}")
    bench = next(b for b in tech.benchmarks if b.name == size)
    workload, expected = current_case.get(tech, bench)
    benchmark.group = tech.name
    benchmark.extra_info["params"] = dict(bench.params)
    if workload.reset is None:
        out = benchmark(chosen.call, workload)
    else:
        out = benchmark.pedantic(
            chosen.call, args=(workload,), setup=workload.reset, rounds=RESET_ROUNDS, warmup_rounds=RESET_WARMUP_ROUNDS
        )
    result = tech.check_fn(expected, out)
    assert result.passed, f"{tech.name} {variant} at {size}: {result.detail} (error {result.error})"
