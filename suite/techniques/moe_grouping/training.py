"""One training step of the gpt-oss MoE layer (:mod:`gpubench.models.moe`) as the moe_grouping
pair runs it, whatever the forward path: the workload, the step (forward, then backward into the
input, the router and every expert weight; each part's seconds and host reads recorded), torch's
own count of its syncs on CUDA, the float64 dense reference and the check against it, and the
figures derived from the timed calls. The paths themselves are the pair's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from gpubench.checks import DTYPE_TOLERANCE, CheckResult, tensors_check
from gpubench.contract import Measured, Recorder, Workload
from gpubench.measure.phase_timer import PhaseTimer
from gpubench.measure.timing import count_cuda_syncs
from gpubench.models.moe import MoEConfig, MoEWeights, SyncLog, expert_mlp, init_weights, route

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# bf16 (8-bit mantissa, a dozen rounded intermediates on the way to each gradient) errs 5e-3 to
# 1e-2 at realistic sizes; the worst, 2.4e-2 over 90 seeded cases, is the router-bias gradient of a
# tiny case (7 tokens, 4 experts), a sum of softmax-backward differences that loses most of its
# digits to cancellation. A wrong expert, slot, weight or bias gives errors of order 0.1 to 1.
TOLERANCE = {**DTYPE_TOLERANCE, torch.bfloat16: 5e-2}
OUTPUT_KEYS = ("out", "grad_x") + tuple(f"grad_{name}" for name in MoEWeights.names())
Forward = Callable[[torch.Tensor, MoEWeights, MoEConfig, SyncLog], torch.Tensor]


@dataclass(kw_only=True)
class MoEWorkload(Workload):
    config: MoEConfig
    x: torch.Tensor  # (tokens, hidden), requires grad
    weights: MoEWeights  # every tensor requires grad
    grad_out: torch.Tensor  # (tokens, hidden), the gradient fed to the backward pass


def config_of(params: dict[str, Any]) -> MoEConfig:
    return MoEConfig(
        experts=params["experts"], top_k=params["top_k"], hidden=params["hidden"], expert_dim=params["expert_dim"]
    )


def build_workload(params: dict[str, Any], device: torch.device, seed: int) -> MoEWorkload:
    """Seeded weights of the layer ``params`` describe, ``tokens`` seeded input rows and the
    seeded gradient the backward pass is fed."""
    device = torch.device(device)
    config = config_of(params)
    dtype = DTYPES[params["dtype"]]
    gen = torch.Generator().manual_seed(seed)
    weights = init_weights(config, gen, dtype, device).map(lambda t: t.requires_grad_(True))
    x, grad_out = (
        torch.randn(params["tokens"], config.hidden, generator=gen).to(device=device, dtype=dtype) for _ in range(2)
    )
    # autograd.grad returns the gradients instead of accumulating them: no reset between calls.
    return MoEWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        config=config,
        x=x.requires_grad_(True),
        weights=weights,
        grad_out=grad_out,
    )


def step(w: MoEWorkload, rec: Recorder, forward: Forward) -> dict[str, torch.Tensor]:
    """Forward and backward of one path: records each part's seconds (the one phase timer: CUDA
    events on a GPU, read after the step) and its host reads by construction."""
    log, timer = SyncLog(), PhaseTimer(w.device)
    with timer.span("forward"):
        out = forward(w.x, w.weights, w.config, log)
    forward_reads = len(log)
    with timer.span("backward"):
        grads = torch.autograd.grad(out, (w.x, *w.weights), w.grad_out)
    seconds = timer.seconds
    rec.record(
        forward_s=seconds["forward"],
        backward_s=seconds["backward"],
        syncs_forward=forward_reads,
        syncs_backward=len(log) - forward_reads,
    )
    return dict(zip(OUTPUT_KEYS, (out.detach(), *grads)))


def cuda_syncs(w: MoEWorkload, forward: Forward) -> tuple[int, int]:
    """The syncs torch's sync debug mode sees in one forward and backward of a path (CUDA only).
    The mode slows every op it watches, so this is a call of its own, never timed."""
    with count_cuda_syncs(True) as forward_syncs:
        out = forward(w.x, w.weights, w.config, SyncLog())
    with count_cuda_syncs(True) as backward_syncs:
        torch.autograd.grad(out, (w.x, *w.weights), w.grad_out)
    forward_n, backward_n = forward_syncs["n"], backward_syncs["n"]
    assert forward_n is not None and backward_n is not None  # (an active count is set when its block ends)
    return forward_n, backward_n


def dense_reference(w: MoEWorkload) -> dict[str, torch.Tensor]:
    """float64, dense: every expert on every token, weighted by the (tokens, experts) routing
    matrix, at the experts the layer's router picks in its own dtype. One expert at a time,
    forward and backward, so memory stays at one expert's activations."""
    config = w.config
    with torch.no_grad():
        _, experts = route(w.x, w.weights.router_weight, w.weights.router_bias, config.top_k)
    with torch.enable_grad():
        x, rw, rb, gate_up, gate_up_bias, down, down_bias = leaves = [
            t.detach().to(torch.float64).requires_grad_(True) for t in (w.x, *w.weights)
        ]
        logits = x @ rw.T + rb
        routing = torch.zeros_like(logits).scatter(1, experts, logits.gather(1, experts).softmax(dim=-1))
        routing_leaf = routing.detach().requires_grad_(True)
        grad_out = w.grad_out.to(torch.float64)
        out = torch.zeros_like(x, requires_grad=False)
        for e in range(config.experts):
            y = routing_leaf[:, e : e + 1] * expert_mlp(
                x, gate_up[e], gate_up_bias[e], down[e], down_bias[e], config.alpha, config.limit
            )
            y.backward(grad_out)
            out += y.detach()
        routing.backward(routing_leaf.grad)
    return dict(zip(OUTPUT_KEYS, (out, *(t.grad for t in leaves))))


def step_check(reference_output: dict[str, torch.Tensor], output: dict[str, torch.Tensor]) -> CheckResult:
    """The worst relative L2 error over the output and the seven gradients."""
    return tensors_check(reference_output, output, TOLERANCE)


def expert_rows(w: MoEWorkload) -> list[int]:
    """Routed rows (token, slot pairs) per expert."""
    with torch.no_grad():
        _, experts = route(w.x, w.weights.router_weight, w.weights.router_bias, w.config.top_k)
        return torch.bincount(experts.flatten().cpu(), minlength=w.config.experts).tolist()


def _median_count(measured: Measured, key: str) -> int | None:
    value = measured.median_of(key)
    return None if value is None else round(value)


def step_metrics(
    w: MoEWorkload, measured: Measured, forward: Forward | None, gemm_path: str, syncs_in_path: bool = False
) -> dict[str, Any]:
    """GEMM FLOPs and tokens/s; forward and backward seconds and TFLOP/s; host syncs per step by
    construction, or on CUDA torch's own count from one untimed call of ``forward`` (None: not
    counted); the experts hit and the GEMM path (``syncs_in_path``: with the syncs measured)."""
    tokens = w.x.shape[0]
    forward_flops, backward_flops = w.config.expert_gemm_flops(tokens)
    out: dict[str, Any] = {"flops": forward_flops + backward_flops, "tokens_per_s": tokens / measured.median_s}
    forward_s, backward_s = measured.median_of("forward_s"), measured.median_of("backward_s")
    if forward_s:
        out.update(forward_s=forward_s, forward_tflops=forward_flops / forward_s / 1e12)
    if backward_s:
        out.update(backward_s=backward_s, backward_tflops=backward_flops / backward_s / 1e12)
    syncs_forward, syncs_backward = _median_count(measured, "syncs_forward"), _median_count(measured, "syncs_backward")
    constructed = None if syncs_forward is None or syncs_backward is None else syncs_forward + syncs_backward
    if constructed is not None:
        out.update(
            syncs_per_step=constructed,
            syncs_forward=syncs_forward,
            syncs_backward=syncs_backward,
            syncs_method="by construction (host reads in the code)",
        )
    if w.device.type == "cuda" and forward is not None:  # GPU-only: sync debug mode sees CUDA syncs only
        # the timed calls recorded the by-construction counts; torch's own count needs its debug
        # mode, which slows every op, so it comes from one call of its own (timing nothing)
        fwd, bwd = cuda_syncs(w, forward)
        out.update(
            syncs_per_step=fwd + bwd,
            syncs_forward=fwd,
            syncs_backward=bwd,
            syncs_method="torch.cuda sync debug mode",
            syncs_by_construction=constructed,
        )
        if syncs_in_path:
            gemm_path += f" ({fwd + bwd} host syncs measured per step)"
    rows = expert_rows(w)
    out.update(experts_hit=sum(n > 0 for n in rows), max_expert_rows=max(rows), gemm_path=gemm_path)
    return out
