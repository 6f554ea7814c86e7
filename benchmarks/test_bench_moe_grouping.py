"""moe_grouping: one forward + backward step of a gpt-oss-shaped MoE layer (32 experts, top-4,
scaled-down widths), per-expert loop vs sort-and-group vs grouped GEMM, checked against float64."""
import pytest

from gpubench.techniques import moe_grouping as technique


@pytest.fixture(scope="module")
def workload(device):
    params = {**technique.TECHNIQUE.defaults(), "experts": 32, "top_k": 4, "hidden": 256, "expert_dim": 256,
              "tokens": 512}
    return technique.build(params, device, seed=0)


@pytest.fixture(scope="module")
def expected(workload):
    return technique.reference(workload)


@pytest.mark.benchmark(group="moe_grouping")
@pytest.mark.parametrize("variant", ["where_loop", "sort_group", "grouped_mm"])
def test_moe_grouping(benchmark, workload, expected, variant):
    out = benchmark(technique.TECHNIQUE.variants[variant].call, workload)
    assert technique.check(expected, out).passed
