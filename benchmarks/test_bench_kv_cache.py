"""kv_cache: contiguous vs paged allocation of a real model layout, bytes checked to the byte."""
import pytest

from gpubench.techniques import kv_cache as technique


@pytest.fixture(scope="module", params=["llama-3.1-8b", "gpt-oss-20b"])
def workload(request, device):
    params = {**technique.TECHNIQUE.defaults(), "model": request.param, "max_len": 512}
    return technique.build(params, device, seed=0)


@pytest.mark.benchmark(group="kv_cache")
@pytest.mark.parametrize("variant", ["contiguous", "paged"])
def test_kv_cache(benchmark, workload, variant):
    out = benchmark(technique.TECHNIQUE.variants[variant].fn, workload)
    assert technique.check(technique.reference(workload), out).passed
