"""speculative_decoding: plain decoding vs draft-and-verify on the default trained pair, for both
drafters; greedy, so every draft_verify call is checked token for token against plain's."""
import pytest

from gpubench.contract import Recorder
from gpubench.techniques import speculative_decoding as technique


@pytest.fixture(scope="module", params=["draft_model", "ngram"])
def workload(request, device):
    params = {**technique.TECHNIQUE.defaults(), "drafter": request.param, "prompts": 1, "max_new_tokens": 48}
    return technique.build(params, device, seed=0)


@pytest.fixture(scope="module")
def expected(workload):
    return technique.plain(workload, Recorder())


@pytest.mark.benchmark(group="speculative_decoding")
@pytest.mark.parametrize("variant", ["plain", "draft_verify"])
def test_speculative_decoding(benchmark, workload, expected, variant):
    out = benchmark(technique.TECHNIQUE.variants[variant].call, workload)
    assert technique.check(expected, out).passed
