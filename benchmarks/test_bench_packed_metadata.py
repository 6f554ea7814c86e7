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
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_packed_metadata(benchmark, workload, variant):
    fn = technique.TECHNIQUE.variants[variant].fn
    out = benchmark.pedantic(fn, args=(workload,), setup=workload.reset, rounds=10, warmup_rounds=1)
    workload.reset()
    reference = technique.TECHNIQUE.variants["baseline"].fn(workload)
    assert technique.check(reference, out).passed
