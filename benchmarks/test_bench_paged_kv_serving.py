"""paged_kv_serving: a serving run, contiguous vs paged KV (continuous batching for both)."""
import pytest
from serving_case import build_case, run_and_check

from gpubench.techniques.paged_kv_serving import TECHNIQUE


@pytest.fixture(scope="module")
def case(device):
    return build_case(TECHNIQUE, device)


@pytest.mark.benchmark(group="paged_kv_serving")
@pytest.mark.parametrize("variant", ["contiguous", "paged"])
def test_paged_kv_serving(benchmark, case, variant):
    run_and_check(benchmark, TECHNIQUE, case, variant)
