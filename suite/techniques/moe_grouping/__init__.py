"""moe_grouping: one training step (forward, then backward into the input, the router and every
expert weight) of a gpt-oss MoE layer: the per-expert ``torch.where`` loop against sort-and-group,
with torch's grouped GEMM as a peer, checked against a float64 dense reference. Each call records
its forward and backward seconds and its host reads by construction.
"""

from __future__ import annotations

from typing import Any

import torch

from gpubench.baselines.moe_grouping import moe_forward as per_expert_loop
from gpubench.contract import Bench, Headline, Measured, Param, Plot, Recorder, Technique
from gpubench.models.moe import routing_problems
from gpubench.optimizations.moe_grouping import (
    grouped_gemm_path,
    grouped_mm_function,
    grouped_mm_problem,
    moe_forward_grouped_mm,
)
from gpubench.optimizations.moe_grouping import moe_forward as sort_and_group
from gpubench.techniques.moe_grouping.claims import CLAIMS
from gpubench.techniques.moe_grouping.training import (
    DTYPES,
    Forward,
    MoEWorkload,
    build_workload,
    config_of,
    dense_reference,
    step,
    step_check,
    step_metrics,
)

FORWARDS: dict[str, Forward] = {
    "where_loop": per_expert_loop,
    "sort_group": sort_and_group,
    "grouped_mm": moe_forward_grouped_mm,
}
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
    claims=CLAIMS,
    gpu_specific=(
        "The win the pair is built to show is host-device synchronization: on a GPU the loop's "
        "torch.where per expert idles the device while the host waits; sort-and-group waits once "
        "per layer, the grouped GEMM never. On a CPU a sync costs nothing: the ratio comes from "
        "per-op overhead and the loop's per-expert gradient assembly in the backward, and torch's "
        "grouped_mm is itself a loop of matmuls, so the CPU ratio says little about a GPU's."
    ),
    headline_figures=(Headline("syncs_per_step", "host syncs per step", higher_is_better=False, replaces_time=False),),
    benchmarks=[
        Bench("32-experts-top-4", {"experts": 32, "top_k": 4, "hidden": 256, "expert_dim": 256, "tokens": 512})
    ],
    params=[
        Param("experts", int, 8, "experts in the layer (gpt-oss-20b: 32, gpt-oss-120b: 128)", min=1),
        Param("top_k", int, 2, "experts per token (gpt-oss: 4)", min=1),
        Param("hidden", int, 64, "model width (gpt-oss: 2880)", min=1),
        Param("expert_dim", int, 64, "expert intermediate width (gpt-oss: 2880)", min=1),
        Param("tokens", int, 256, "tokens in the step (batch x sequence)", min=1),
        Param("dtype", str, "float32", "dtype of the activations and weights", choices=list(DTYPES)),
    ],
    plots=[
        Plot(
            "Forward speedup over the per-expert loop against tokens",
            y="forward_s",
            relative=True,
            x="tokens",
            variants=("optimized", "grouped_mm"),
            ylabel="forward speedup (x)",
        ),
        Plot(
            "Backward speedup over the per-expert loop against tokens",
            y="backward_s",
            relative=True,
            x="tokens",
            variants=("optimized", "grouped_mm"),
            ylabel="backward speedup (x)",
        ),
        Plot(
            "Device-to-host synchronizations per step (forward + backward) against tokens",
            y="syncs_per_step",
            x="tokens",
            variants=("baseline", "optimized", "grouped_mm"),
            ylabel="syncs per step",
        ),
    ],
)


validate = TECHNIQUE.validate(routing_problems)
build = TECHNIQUE.build(build_workload)


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
    return None if params is None else grouped_mm_problem(config_of(params), DTYPES[params["dtype"]])


@TECHNIQUE.variant("grouped_mm", unavailable=grouped_mm_unavailable)
def grouped_mm(w: MoEWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """sort-and-group with torch's grouped GEMM per projection; offsets stay on the device"""
    return step(w, rec, moe_forward_grouped_mm)


reference = TECHNIQUE.reference(dense_reference)
check = TECHNIQUE.check(step_check)


@TECHNIQUE.metrics
def metrics(w: MoEWorkload, measured: Measured) -> dict[str, Any]:
    """The step's figures (:func:`gpubench.techniques.moe_grouping.training.step_metrics`) with this variant's GEMM path."""
    path = GEMM_PATHS.get(measured.variant) or grouped_gemm_path(w.device, w.x.dtype)
    return step_metrics(
        w, measured, FORWARDS.get(measured.variant), path, syncs_in_path=measured.variant == "grouped_mm"
    )
