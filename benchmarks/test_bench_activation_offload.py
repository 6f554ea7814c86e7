"""activation_offload: offloaded checkpointing with one staging buffer vs two, a training step of a
small decoder; gradients checked against the step without checkpointing."""
import pytest

from gpubench.techniques import activation_offload as technique


@pytest.fixture(scope="module")
def workload(device):
    params = {**technique.TECHNIQUE.defaults(), "layers": 4, "hidden": 64, "seq_len": 64}
    return technique.build(params, device, seed=0)


@pytest.mark.benchmark(group="activation_offload")
@pytest.mark.parametrize("variant", ["one_buffer", "two_buffers"])
def test_activation_offload(benchmark, workload, variant):
    out = benchmark.pedantic(technique.TECHNIQUE.variants[variant].call, args=(workload,),
                             setup=workload.reset, rounds=10)
    assert technique.check(technique.reference(workload), out).passed
