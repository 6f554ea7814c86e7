"""continuous_batching: a serving run, static vs continuous batching (contiguous KV for both)."""
import pytest
from serving_case import build_case, run_and_check

from gpubench.techniques.continuous_batching import TECHNIQUE


@pytest.fixture(scope="module")
def case(device):
    return build_case(TECHNIQUE, device)


@pytest.mark.benchmark(group="continuous_batching")
@pytest.mark.parametrize("variant", ["static", "continuous"])
def test_continuous_batching(benchmark, case, variant):
    run_and_check(benchmark, TECHNIQUE, case, variant)
