"""speculative_decoding: plain decoding vs draft-and-verify on the default trained pair, for both
drafters; greedy, so every optimized call is checked token for token against the baseline's."""
import pytest

from gpubench.techniques import speculative_decoding as technique


@pytest.fixture(scope="module", params=["draft_model", "ngram"])
def workload(request, device):
    params = {**technique.TECHNIQUE.defaults(), "drafter": request.param, "prompts": 1, "max_new_tokens": 48}
    return technique.build(params, device, seed=0)


@pytest.fixture(scope="module")
def expected(workload):
    return technique.run_baseline(workload)


@pytest.mark.benchmark(group="speculative_decoding")
@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_speculative_decoding(benchmark, workload, expected, variant):
    out = benchmark(technique.TECHNIQUE.variants[variant].fn, workload)
    assert technique.check(expected, out).passed
