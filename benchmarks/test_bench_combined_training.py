"""combined_training: a full training step of the MoE decoder on packed rows with offloaded
checkpointing, the three optimizations all off vs all on; every round starts from the same
weights (reset, untimed)."""
import pytest

from gpubench.techniques import combined_training as technique


@pytest.fixture(scope="module", params=[2, 4], ids=["2-layers", "4-layers"])
def workload(request, device):
    params = {**technique.TECHNIQUE.defaults(), "layers": request.param, "hidden": 64, "experts": 8, "top_k": 2,
              "expert_dim": 64, "rows": 1, "seq_len": 256, "mean_doc_len": 48}
    return technique.build(params, device, seed=0)


@pytest.mark.benchmark(group="combined_training")
@pytest.mark.parametrize("role", ["baseline", "optimized"])
def test_combined_training(benchmark, workload, role):
    variant = technique.TECHNIQUE.playing(role, workload.device)
    out = benchmark.pedantic(variant.call, args=(workload,), setup=workload.reset, rounds=10, warmup_rounds=1)
    assert technique.check(technique.TECHNIQUE.reference_fn(workload), out).passed
