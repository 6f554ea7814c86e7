"""A technique pair written outside gpubench, against its public contract only: RMSNorm composed
of four eager ops (what a model written by hand does) vs torch's fused ``rms_norm``.

Run it: ``gpubench run --scenario examples/rmsnorm.yaml`` (the scenario names this file).
"""

import torch
import torch.nn.functional as F

from gpubench.contract import Bench, CheckResult, Param, Technique, Workload

TECHNIQUE = Technique(
    "rmsnorm",
    summary="RMSNorm: four eager ops vs torch's fused rms_norm",
    shape="kernel",
    params=[
        Param("rows", int, 4096, "tokens", min=1),
        Param("hidden", int, 1024, "model width", min=1),
        Param("dtype", str, "float32", choices=["float32", "bfloat16"]),
    ],
    benchmarks=[Bench("small", {"rows": 256, "hidden": 256})],  # what benchmarks/ times, once installed
)


@TECHNIQUE.build
def build(params, device, seed):
    g = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, params["dtype"])
    x = torch.randn(params["rows"], params["hidden"], generator=g).to(device=device, dtype=dtype)
    weight = (1 + 0.1 * torch.randn(params["hidden"], generator=g)).to(device=device, dtype=dtype)
    return Workload(params, device, seed, {"x": x, "weight": weight})


@TECHNIQUE.variant("eager", role="baseline")
def eager(w):
    """x * rsqrt(mean(x^2) + eps) * weight, one op at a time, in float32"""
    x = w.x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w.weight.float()).to(w.x.dtype)


@TECHNIQUE.variant("fused", role="optimized")
def fused(w):
    """torch.nn.functional.rms_norm"""
    return F.rms_norm(w.x, (w.x.shape[-1],), w.weight, eps=1e-6)


@TECHNIQUE.check
def check(reference, output):
    tolerance = 1e-5 if output.dtype == torch.float32 else 2e-2
    error = float((output.double() - reference.double()).norm() / reference.double().norm())
    return CheckResult(error <= tolerance, error, tolerance, "rel_l2")


@TECHNIQUE.metrics
def metrics(w, measured):
    return {"bytes_moved": 2 * w.x.numel() * w.x.element_size(), "rows_per_s": w.x.shape[0] / measured.median_s}
