"""packed_metadata: a full training step on a packed batch, metadata rebuilt per layer vs built
once per batch; every round starts from the same weights and optimizer state (reset, untimed)."""
import pytest

from gpubench.techniques import packed_metadata as technique


@pytest.fixture(scope="module", params=[2, 4], ids=["2-layers", "4-layers"])
def workload(request, device):
    params = {**technique.TECHNIQUE.defaults(), "model": "tiny", "layers": request.param, "rows": 1,
              "seq_len": 512, "mean_doc_len": 48}
    return technique.build(params, device, seed=0)


@pytest.mark.benchmark(group="packed_metadata")
@pytest.mark.parametrize("role", ["baseline", "optimized"])
def test_packed_metadata(benchmark, workload, role):
    variant = technique.TECHNIQUE.playing(role, workload.device)
    out = benchmark.pedantic(variant.call, args=(workload,), setup=workload.reset, rounds=10, warmup_rounds=1)
    assert technique.check(technique.TECHNIQUE.reference_fn(workload), out).passed
