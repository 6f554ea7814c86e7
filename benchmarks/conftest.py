"""pytest-benchmark suites over the same baseline/optimized functions the scenarios time, at small
sizes: `pytest benchmarks/ --benchmark-json out.json --benchmark-save-data` writes a file that
`gpubench compare` reads (raw times included), and `--benchmark-compare` works as usual."""
import pytest
import torch


@pytest.fixture(scope="session")
def device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
