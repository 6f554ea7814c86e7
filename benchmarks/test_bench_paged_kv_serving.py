"""paged_kv_serving: a serving run, contiguous vs paged KV (continuous batching for both): 16 requests all at once (offline throughput) through the tiny model;
each run's greedy tokens checked against one-request-at-a-time generation."""
import pytest

from gpubench.techniques import paged_kv_serving as technique

SMALL = {"requests": 16, "arrival": "all", "prompt_len": "uniform:8:32", "output_len": "exp:24:64", "max_len": 96,
         "kv_budget_mib": 0.5}


@pytest.fixture(scope="module")
def case(device):
    T = technique.TECHNIQUE
    w = T.build_fn({**T.defaults(), **SMALL}, device, 0)
    return w, T.reference_fn(w)


@pytest.mark.benchmark(group="paged_kv_serving")
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_paged_kv_serving(benchmark, case, variant):
    w, ref = case
    out = benchmark(technique.TECHNIQUE.variants[variant].fn, w)
    assert technique.TECHNIQUE.check_fn(ref, out).passed
