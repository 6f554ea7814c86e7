"""flash_attention: eager attention vs tiled online softmax (the variant playing each role on this
device), forward and forward + backward (train), checked against float64."""
import pytest

from gpubench.techniques import flash_attention as technique


@pytest.fixture(scope="module", params=[(False, "forward"), (True, "forward"), (True, "train")],
                ids=["full", "causal", "causal-train"])
def workload(request, device):
    causal, mode = request.param
    params = {**technique.TECHNIQUE.defaults(), "batch": 1, "heads": 4, "seq_len": 512, "causal": causal,
              "mode": mode}
    return technique.build(params, device, seed=0)


@pytest.mark.benchmark(group="flash_attention")
@pytest.mark.parametrize("role", ["baseline", "optimized"])
def test_flash_attention(benchmark, workload, role):
    variant = technique.TECHNIQUE.playing(role, workload.device)
    out = benchmark(variant.fn, workload)
    assert technique.check(technique.reference(workload), out).passed
