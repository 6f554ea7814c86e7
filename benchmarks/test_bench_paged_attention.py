"""paged_attention: gather-then-attend vs reading K/V through the block table in place (the
variant playing each role on this device), checked against float64."""
import pytest

from gpubench.techniques import paged_attention as technique


@pytest.fixture(scope="module")
def workload(device):
    params = {**technique.TECHNIQUE.defaults(), "batch": 4, "heads": 8, "kv_heads": 2, "context_len": 512}
    return technique.build(params, device, seed=0)


@pytest.mark.benchmark(group="paged_attention")
@pytest.mark.parametrize("role", ["baseline", "optimized"])
def test_paged_attention(benchmark, workload, role):
    variant = technique.TECHNIQUE.playing(role, workload.device)
    out = benchmark(variant.fn, workload)
    assert technique.check(technique.reference(workload), out).passed
