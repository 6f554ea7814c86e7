"""Run one case of a technique in this process, as the harness runs it (checked call, reference,
check, a short timing), so a test can plant a bug with monkeypatch and see whether the
technique's own check catches it."""

from __future__ import annotations

import inspect
import textwrap
from typing import Any

import torch

from gpubench import techniques
from gpubench.measure import timing
from gpubench.records.results import CaseRecord
from gpubench.run import runner
from gpubench.run.scenario import Case, case_seed

CPU = torch.device("cpu")
QUICK = timing.Policy(
    warmup_s=0.0,
    min_reps=1,
    max_reps=2,
    min_time_s=0.0,
    max_time_s=1.0,
    target_iqr=1.0,
    case_timeout_s=600.0,
    energy_s=0.0,
)


class _NoTelemetry:
    def set_tag(self, case_id: Any, variant: Any) -> None:
        pass

    def energy_mj(self) -> None:
        return None


def run_planted(technique: str, *, variants: tuple[str, ...] | None = None, **params: Any) -> CaseRecord:
    """One case of ``technique`` at ``params`` (over its defaults), measured in this process.
    ``variants``: the variants to run (names, as a scenario's ``variants`` list; None: all, as a
    run has them). A test whose bug only one variant can reach names that one and the baseline, so
    it does not pay for peers its bug cannot touch (the Triton interpreter's checked-only run: most
    of a CPU case's time); the case's data and seed do not depend on it."""
    tech = techniques.get(technique)
    full = {**tech.defaults(), **params}
    problems = tech.validate_fn(full) if tech.validate_fn else []
    assert not problems, problems
    case = Case(technique, full, QUICK, 0)
    case = Case(technique, full, QUICK, case_seed(case.id), variants)
    record = runner.run_case(case, CPU, timing.Clock(CPU, flush_l2=False), _NoTelemetry(), None)
    assert variants is None or set(record.variants) == set(variants), (variants, list(record.variants))
    return record


_SHIPPED: dict[str, CaseRecord] = {}


def shipped(technique: str, *, variants: tuple[str, ...] | None = None, **params: Any) -> CaseRecord:
    """The control: :func:`run_planted` with nothing planted, run once per process for each case
    (several tests plant their bugs in the same case; the shipped code's record is the same for
    all). Call it only before a test plants anything: a record made with a bug in place would be
    handed to every later test of that case."""
    key = repr((technique, variants, sorted(params.items())))
    if key not in _SHIPPED:
        _SHIPPED[key] = run_planted(technique, variants=variants, **params)
    return _SHIPPED[key]


def caught(record: CaseRecord, variant: str | None = None) -> bool:
    """The case failed because a check failed (on ``variant``, the optimized one by default)."""
    name = variant or record.role_variant("optimized")
    check = record.variants[name].check or {}
    return (
        record.status == "failed"
        and record.failure is not None
        and record.failure.kind == "check"
        and check.get("passed") is False
    )


def passed(record: CaseRecord) -> bool:
    return record.status == "passed"


def mutant(fn: Any, old: str, new: str) -> Any:
    """``fn`` recompiled with the source text ``old`` (found exactly once) replaced by ``new``: a
    one-line bug planted in the real code, so the test reads like the diff that introduces it."""
    source = textwrap.dedent(inspect.getsource(fn))
    assert source.count(old) == 1, f"{old!r} is not in {fn.__qualname__} exactly once"
    namespace = dict(fn.__globals__)
    exec(compile(source.replace(old, new), f"<planted {fn.__qualname__}>", "exec"), namespace)
    return namespace[fn.__name__]
