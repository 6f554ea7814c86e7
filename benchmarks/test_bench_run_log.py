"""The cost of recording one finished case does not grow with the run: appending case k to the run
log takes the same time whether k is 100 or 10,000 (``benchmarks/run_scale.py`` runs whole
scenarios of 1,000 and 10,000 cases)."""

import pytest

from gpubench.records.results import CaseRecord, RunDirectory, VariantRecord


def _record(i: int) -> CaseRecord:
    samples = [1e-3 + 1e-6 * k for k in range(30)]
    return CaseRecord(
        id=f"tiny[i={i}]",
        technique="tiny",
        params={"i": i},
        seed=i,
        policy={},
        status="passed",
        variants={
            name: VariantRecord(role=role, status="ok", samples_s=samples, metrics={"x": 1.0})
            for name, role in (("a", "baseline"), ("b", "optimized"))
        },
    )


@pytest.mark.benchmark(group="run_log")
@pytest.mark.parametrize("already", [100, 10_000])
def test_appending_a_case_costs_the_same_early_and_late(benchmark, tmp_path, already):
    run_dir = RunDirectory(tmp_path)
    with open(run_dir.cases_log, "w") as f:  # a log already holding `already` cases
        for i in range(already):
            f.write(f'{{"index": {i}, "id": "x"}}\n')
    record = _record(already)
    benchmark(run_dir.append_case, already, record)
