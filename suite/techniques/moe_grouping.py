"""moe_grouping: one training step (forward, then backward into the input, the router and every
expert weight) of a gpt-oss MoE layer: the per-expert ``torch.where`` loop against sort-and-group,
with torch's grouped GEMM as a peer, checked against a float64 dense reference. Each call records
its forward and backward seconds and its host reads by construction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from gpubench.baselines.moe_grouping import moe_forward as per_expert_loop
from gpubench.contract import (DTYPE_TOLERANCE, Bench, CheckResult, Claim, Headline, Measured, Param, Plot, Recorder,
                               Technique, Workload, tensors_check)
from gpubench.claims import UNSLOTH_NVIDIA
from gpubench.models.moe import MoEConfig, MoEWeights, SyncLog, expert_mlp, init_weights, route, routing_problems
from gpubench.optimizations.moe_grouping import (grouped_gemm_path, grouped_mm_function, grouped_mm_problem,
                                                 moe_forward as sort_and_group,
                                                 moe_forward_grouped_mm)
from gpubench.phase_timer import PhaseTimer
from gpubench.timing import count_cuda_syncs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# bf16 (8-bit mantissa, a dozen rounded intermediates on the way to each gradient) errs 5e-3 to
# 1e-2 at realistic sizes; the worst, 2.4e-2 over 90 seeded cases, is the router-bias gradient of a
# tiny case (7 tokens, 4 experts), a sum of softmax-backward differences that loses most of its
# digits to cancellation. A wrong expert, slot, weight or bias gives errors of order 0.1 to 1.
TOLERANCE = {**DTYPE_TOLERANCE, torch.bfloat16: 5e-2}
OUTPUT_KEYS = ("out", "grad_x") + tuple(f"grad_{name}" for name in MoEWeights.names())
Forward = Callable[[torch.Tensor, MoEWeights, MoEConfig, SyncLog], torch.Tensor]
FORWARDS: dict[str, Forward] = {"where_loop": per_expert_loop, "sort_group": sort_and_group,
                                "grouped_mm": moe_forward_grouped_mm}
GEMM_PATHS = {
    "where_loop": "per-expert matmul + bias in a Python loop over the experts hit",
    "sort_group": "per-expert addmm on contiguous slices of the sorted rows",
}

TECHNIQUE = Technique(
    name="moe_grouping",
    shape="training_step",
    summary="A gpt-oss MoE layer, forward + backward: an eager loop over the experts (one host "
            "sync each) against sorting the routed rows by expert once and working on contiguous slices.",
    anchor="Unsloth: gpt-oss training +15%, forward +23%, backward +13%",
    claims=[Claim(*UNSLOTH_NVIDIA, text="gpt-oss training +15% (read as 1.15x)", figure=(1.15, 1.15),
                  measures="training step time, MoE routing by argsort + bincount vs a torch.where per expert",
                  conditions="gpt-oss (20b: 32 experts, top-4, hidden 2880) fine-tuning, NVIDIA GPU",
                  when={"experts": (">=", 32), "top_k": (">=", 4), "hidden": (">=", 2880)},
                  caveat="the pair times one MoE layer's forward + backward, not the whole model's step, "
                         "where attention and the rest dilute the layer's gain",
                  device_reason="the win is one host sync per expert, which costs a CPU nothing")],
    gpu_specific=(
        "The win the pair is built to show is host-device synchronization: on a GPU the loop's "
        "torch.where per expert idles the device while the host waits; sort-and-group waits once "
        "per layer, the grouped GEMM never. On a CPU a sync costs nothing: the ratio comes from "
        "per-op overhead and the loop's per-expert gradient assembly in the backward, and torch's "
        "grouped_mm is itself a loop of matmuls, so the CPU ratio says little about a GPU's."
    ),
    headline_figures=(Headline("syncs_per_step", "host syncs per step", higher_is_better=False,
                               replaces_time=False),),
    benchmarks=[Bench("32-experts-top-4", {"experts": 32, "top_k": 4, "hidden": 256, "expert_dim": 256,
                                             "tokens": 512})],
    params=[
        Param("experts", int, 8, "experts in the layer (gpt-oss-20b: 32, gpt-oss-120b: 128)", min=1),
        Param("top_k", int, 2, "experts per token (gpt-oss: 4)", min=1),
        Param("hidden", int, 64, "model width (gpt-oss: 2880)", min=1),
        Param("expert_dim", int, 64, "expert intermediate width (gpt-oss: 2880)", min=1),
        Param("tokens", int, 256, "tokens in the step (batch x sequence)", min=1),
        Param("dtype", str, "float32", "dtype of the activations and weights", choices=list(DTYPES)),
    ],
    plots=[
        Plot("Forward speedup over the per-expert loop against tokens", y="forward_s", relative=True,
             x="tokens", variants=("optimized", "grouped_mm"), ylabel="forward speedup (x)"),
        Plot("Backward speedup over the per-expert loop against tokens", y="backward_s", relative=True,
             x="tokens", variants=("optimized", "grouped_mm"), ylabel="backward speedup (x)"),
        Plot("Device-to-host synchronizations per step (forward + backward) against tokens",
             y="syncs_per_step", x="tokens", variants=("baseline", "optimized", "grouped_mm"),
             ylabel="syncs per step"),
    ],
)


@dataclass(kw_only=True)
class MoEWorkload(Workload):
    config: MoEConfig
    x: torch.Tensor  # (tokens, hidden), requires grad
    weights: MoEWeights  # every tensor requires grad
    grad_out: torch.Tensor  # (tokens, hidden), the gradient fed to the backward pass


validate = TECHNIQUE.validate(routing_problems)


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> MoEWorkload:
    device = torch.device(device)
    config = MoEConfig(experts=params["experts"], top_k=params["top_k"], hidden=params["hidden"],
                       expert_dim=params["expert_dim"])
    dtype = DTYPES[params["dtype"]]
    gen = torch.Generator().manual_seed(seed)
    weights = init_weights(config, gen, dtype, device).map(lambda t: t.requires_grad_(True))
    x, grad_out = (torch.randn(params["tokens"], config.hidden, generator=gen).to(device=device, dtype=dtype)
                   for _ in range(2))
    # autograd.grad returns the gradients instead of accumulating them: no reset between calls.
    return MoEWorkload(params=dict(params), device=device, seed=seed, config=config,
                       x=x.requires_grad_(True), weights=weights, grad_out=grad_out)


# -- one step -----------------------------------------------------------------------------------

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
    rec.record(forward_s=seconds["forward"], backward_s=seconds["backward"], syncs_forward=forward_reads,
               syncs_backward=len(log) - forward_reads)
    return dict(zip(OUTPUT_KEYS, (out.detach(), *grads)))


def cuda_syncs(w: MoEWorkload, forward: Forward) -> tuple[int, int]:
    """The syncs torch's sync debug mode sees in one forward and backward of a path (CUDA only).
    The mode slows every op it watches, so this is a call of its own, never timed."""
    with count_cuda_syncs(True) as forward_syncs:
        out = forward(w.x, w.weights, w.config, SyncLog())
    with count_cuda_syncs(True) as backward_syncs:
        torch.autograd.grad(out, (w.x, *w.weights), w.grad_out)
    return forward_syncs["n"], backward_syncs["n"]


@TECHNIQUE.variant("where_loop", role="baseline")
def where_loop(w: MoEWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """eager loop over the experts hit: one-hot mask, torch.where per expert, gather, MLP, index_add_"""
    return step(w, rec, per_expert_loop)


@TECHNIQUE.variant("sort_group", role="optimized")
def sort_group(w: MoEWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """stable argsort by expert, counts read once, addmm per contiguous slice, one index_add_"""
    return step(w, rec, sort_and_group)


def grouped_mm_unavailable(device: torch.device, params: dict[str, Any] | None = None) -> str | None:
    """Why grouped_mm cannot run: this torch has none, or (given a case's params) the layer breaks
    its 16-byte row rule, the one :func:`grouped_mm_problem` states, so a misaligned case skips the
    variant with that reason (the runner passes each case's params; None: the device alone)."""
    if grouped_mm_function() is None:
        return f"torch {torch.__version__} has no grouped_mm (torch.nn.functional.grouped_mm / torch._grouped_mm)"
    if params is None:
        return None
    config = MoEConfig(experts=params["experts"], top_k=params["top_k"], hidden=params["hidden"],
                       expert_dim=params["expert_dim"])
    return grouped_mm_problem(config, DTYPES[params["dtype"]])


@TECHNIQUE.variant("grouped_mm", unavailable=grouped_mm_unavailable)
def grouped_mm(w: MoEWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """sort-and-group with torch's grouped GEMM per projection; offsets stay on the device"""
    return step(w, rec, moe_forward_grouped_mm)


# -- correctness ------------------------------------------------------------------------------

@TECHNIQUE.reference
def reference(w: MoEWorkload) -> dict[str, torch.Tensor]:
    """float64, dense: every expert on every token, weighted by the (tokens, experts) routing
    matrix, at the experts the layer's router picks in its own dtype. One expert at a time,
    forward and backward, so memory stays at one expert's activations."""
    config = w.config
    with torch.no_grad():
        _, experts = route(w.x, w.weights.router_weight, w.weights.router_bias, config.top_k)
    with torch.enable_grad():
        x, rw, rb, gate_up, gate_up_bias, down, down_bias = leaves = [
            t.detach().to(torch.float64).requires_grad_(True) for t in (w.x, *w.weights)]
        logits = x @ rw.T + rb
        routing = torch.zeros_like(logits).scatter(1, experts, logits.gather(1, experts).softmax(dim=-1))
        routing_leaf = routing.detach().requires_grad_(True)
        grad_out = w.grad_out.to(torch.float64)
        out = torch.zeros_like(x, requires_grad=False)
        for e in range(config.experts):
            y = routing_leaf[:, e:e + 1] * expert_mlp(x, gate_up[e], gate_up_bias[e], down[e], down_bias[e],
                                                      config.alpha, config.limit)
            y.backward(grad_out)
            out += y.detach()
        routing.backward(routing_leaf.grad)
    return dict(zip(OUTPUT_KEYS, (out, *(t.grad for t in leaves))))


@TECHNIQUE.check
def check(reference_output: dict[str, torch.Tensor], output: dict[str, torch.Tensor]) -> CheckResult:
    """The worst relative L2 error over the output and the seven gradients."""
    return tensors_check(reference_output, output, TOLERANCE)


# -- metrics ----------------------------------------------------------------------------------

def expert_rows(w: MoEWorkload) -> list[int]:
    """Routed rows (token, slot pairs) per expert."""
    with torch.no_grad():
        _, experts = route(w.x, w.weights.router_weight, w.weights.router_bias, w.config.top_k)
        return torch.bincount(experts.flatten().cpu(), minlength=w.config.experts).tolist()


def _median_count(measured: Measured, key: str) -> int | None:
    value = measured.median_of(key)
    return None if value is None else round(value)


@TECHNIQUE.metrics
def metrics(w: MoEWorkload, measured: Measured) -> dict[str, Any]:
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
        out.update(syncs_per_step=constructed, syncs_forward=syncs_forward, syncs_backward=syncs_backward,
                   syncs_method="by construction (host reads in the code)")
    path = GEMM_PATHS.get(measured.variant) or grouped_gemm_path(w.device, w.x.dtype)
    if w.device.type == "cuda" and measured.variant in FORWARDS:
        # the timed calls recorded the by-construction counts; torch's own count needs its debug
        # mode, which slows every op, so it comes from one call of its own (timing nothing)
        fwd, bwd = cuda_syncs(w, FORWARDS[measured.variant])
        out.update(syncs_per_step=fwd + bwd, syncs_forward=fwd, syncs_backward=bwd,
                   syncs_method="torch.cuda sync debug mode", syncs_by_construction=constructed)
        if measured.variant == "grouped_mm":
            path += f" ({fwd + bwd} host syncs measured per step)"
    rows = expert_rows(w)
    out.update(experts_hit=sum(n > 0 for n in rows), max_expert_rows=max(rows), gemm_path=path)
    return out
