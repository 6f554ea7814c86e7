"""The smallest technique pair there is (a sum of 16 numbers two ways): what a run of thousands of
cases costs the harness itself, per case, when the cases cost nothing."""

import torch

from gpubench.contract import CheckResult, Param, Technique, Workload

TECHNIQUE = Technique(
    "tiny_pair",
    summary="a sum of 16 numbers, two ways",
    shape="kernel",
    params=[Param("i", int, 0, "which case", min=0)],
)


@TECHNIQUE.build
def build(params, device, seed):
    return Workload(params, device, seed, {"x": torch.randn(16, generator=torch.Generator().manual_seed(seed))})


TECHNIQUE.variant("python_sum", role="baseline")(lambda w: torch.tensor(sum(w.x.tolist())))
TECHNIQUE.variant("torch_sum", role="optimized")(lambda w: w.x.sum())


@TECHNIQUE.check
def check(reference, output):
    error = float((output - reference).abs())
    return CheckResult(error <= 1e-5, error, 1e-5, "abs")
