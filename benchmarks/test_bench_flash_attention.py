"""flash_attention: materialized baseline vs tiled online softmax, checked against float64."""
import pytest

from gpubench.techniques import flash_attention as technique


@pytest.fixture(scope="module", params=[False, True], ids=["full", "causal"])
def workload(request, device):
    params = {**technique.TECHNIQUE.defaults(), "batch": 1, "heads": 4, "seq_len": 512, "causal": request.param}
    return technique.build(params, device, seed=0)


@pytest.mark.benchmark(group="flash_attention")
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_flash_attention(benchmark, workload, variant):
    out = benchmark(technique.TECHNIQUE.variants[variant].fn, workload)
    assert technique.check(technique.reference(workload), out).passed
