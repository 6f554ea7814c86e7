"""Serving runs: static vs continuous batching (continuous_batching) and contiguous vs paged KV
(paged_kv_serving), 16 requests all at once (offline throughput) through the tiny model; each
run's greedy tokens checked against one-request-at-a-time generation."""
import pytest

from gpubench.techniques import continuous_batching, paged_kv_serving

SMALL = {"requests": 16, "arrival": "all", "prompt_len": "uniform:8:32", "output_len": "exp:24:64", "max_len": 96,
         "kv_budget_mib": 0.5}
MODULES = {"continuous_batching": continuous_batching, "paged_kv_serving": paged_kv_serving}


@pytest.fixture(scope="module", params=sorted(MODULES))
def case(request, device):
    T = MODULES[request.param].TECHNIQUE
    w = T.build_fn({**T.defaults(), **SMALL}, device, 0)
    return request.param, T, w, T.reference_fn(w)


@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_serving(benchmark, case, variant):
    name, T, w, ref = case
    benchmark.group = name
    out = benchmark(T.variants[variant].fn, w)
    assert T.check_fn(ref, out).passed
