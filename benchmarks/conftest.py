"""pytest-benchmark suites: test_bench_techniques.py times every registered technique at the small
sizes it declares (``Technique(benchmarks=[Bench(...)])``), over the same variants the scenarios
time, each output checked; test_bench_run_log.py times the harness's own cost per case.
`pytest benchmarks/ --benchmark-json out.json --benchmark-save-data` writes a file that
`gpubench compare` reads (raw times included), and `--benchmark-compare` works as usual."""

import pytest
import torch


@pytest.fixture(scope="session")
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
