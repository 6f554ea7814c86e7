"""packed_metadata: a training step (forward, backward, AdamW) of the Llama-style decoder on packed
rows, the attention metadata rebuilt in every layer (``per_layer``) or built once per batch by a
cache (``cached``); each call records its phase split, builds, host syncs and mask bytes.
Backends: on CUDA gpubench's own Triton varlen attention (``flash_attn_varlen_func``, forward and
backward) by default; SDPA with a block-causal mask (what a CPU runs); flash-attn's varlen kernel.

Both variants run the same builder and attention (:mod:`gpubench.lib.packing`), so a bug there would be
the same on both sides: the reference (:class:`~gpubench.techniques.packed_metadata.training.PackedReference`) also runs every
document alone through the model in float64, from the drawn document lengths and nothing of
:mod:`gpubench.lib.packing`, and every variant's losses must match it as well as the per-layer step.
"""

from __future__ import annotations

from typing import Any

import torch

from gpubench.baselines.packed_metadata import train_step as per_layer_step
from gpubench.contract import Bench, Headline, Measured, Param, Plot, Recorder, Technique
from gpubench.lib.packing import BACKENDS, StepOutput, StepStats
from gpubench.models import stand_in
from gpubench.models.llama import SIZES
from gpubench.optimizations.packed_metadata import PackedMetadataCache
from gpubench.optimizations.packed_metadata import train_step as cached_step
from gpubench.techniques.packed_metadata.claims import CLAIMS
from gpubench.techniques.packed_metadata.training import (
    DTYPES,
    PackedReference,
    PackedWorkload,
    build_workload,
    packed_check,
    packed_reference,
    packing_problems,
    recorded_step,
    step_metrics,
)

TECHNIQUE = Technique(
    name="packed_metadata",
    shape="training_step",
    summary="Packed-sequence attention metadata (cu_seqlens, max_seqlen, position ids, block-causal "
    "mask) built once per batch and shared by every layer, instead of rebuilt per layer.",
    anchor="Unsloth: +14.3% per training step, +43.3% forward (Qwen3-14B QLoRA)",
    claims=CLAIMS,
    gpu_specific=(
        "On a GPU each rebuild's max_seqlen .item() is a host sync: the host waits for the GPU to "
        "drain and stops queueing kernels ahead of it, so every layer's launches become exposed "
        "(layers syncs per step against one), and with SDPA the baseline keeps one rows x seq^2 mask "
        "per layer alive for the backward pass. On a CPU .item() is a plain read with no stall; what "
        "the CPU ratio shows is the cost of constructing the mask (elementwise work over rows x seq^2 "
        "per layer) against the step's compute, so it is not the GPU's ratio."
    ),
    headline_figures=(
        Headline("host_syncs_per_step", "host syncs per step", higher_is_better=False, replaces_time=False),
    ),
    benchmarks=[
        Bench(f"{n}-layers", {"model": "tiny", "layers": n, "rows": 1, "seq_len": 512, "mean_doc_len": 48})
        for n in (2, 4)
    ],
    params=[
        Param(
            "model",
            str,
            "tiny",
            f"a built-in size of gpubench.models.llama ({', '.join(SIZES)}), a preset, a config.json "
            "path or a checkpoint directory: seeded random weights at its shapes (a Llama-style stand-in: "
            "MoE as a dense MLP of the active width, sliding windows not applied; the case records which)",
            value_check="gpubench.models.stand_in:model_name_problem",
        ),
        Param("ignore_fields", str, "", stand_in.IGNORE_FIELDS_HELP, omit_default_from_id=True),
        Param(
            "layers",
            int,
            0,
            "decoder layers; 0 keeps the model's own; a built-in size gets that many, a preset or config its first N",
            min=0,
        ),
        Param("rows", int, 2, "packed rows per batch", min=1),
        Param(
            "micro_batches",
            int,
            1,
            "batches per step, gradients accumulated (each with its own documents): "
            "from 2 on, the cache must miss on each new batch's lengths",
            min=1,
        ),
        Param("seq_len", int, 256, "tokens per row (documents packed without padding)", min=2),
        Param(
            "mean_doc_len",
            int,
            64,
            "mean document length; lengths are uniform in "
            "[1, min(2 * mean - 1, seq_len - 1)], the last one cut to fill the row",
            min=1,
        ),
        Param("dtype", str, "float32", "dtype of weights, activations and the mask", choices=list(DTYPES)),
        Param(
            "backend",
            str,
            "auto",
            "attention: sdpa (block-causal mask), triton_varlen (gpubench's Triton "
            "varlen kernels, flash_attn_varlen_func, forward and backward; CUDA), flash_attn_varlen "
            "(flash-attn's varlen kernel, CUDA, fp16/bf16), auto (triton_varlen on CUDA, else sdpa)",
            choices=["auto", *BACKENDS],
        ),
    ],
    plots=[
        Plot(
            "Step time split (metadata build, rest of forward, backward, optimizer) against layers",
            y=("build_ms", "forward_rest_ms", "backward_ms", "optimizer_ms"),
            x="layers",
            kind="stacked",
            ylabel="ms per step",
        ),
        Plot("Metadata build time per step against layers", y="build_ms", x="layers", ylabel="build ms per step"),
        Plot(
            "Forward and backward speedup over the baseline against layers",
            y=("forward_ms", "backward_ms"),
            x="layers",
            relative=True,
            ylabel="speedup (x)",
        ),
    ],
)


validate = TECHNIQUE.validate(packing_problems)


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> PackedWorkload:
    """The packed micro-batches, seeded weights and optimizer state, and the cached variant's cache."""
    return build_workload(params, device, seed, PackedMetadataCache())


def per_layer_run(w: PackedWorkload, stats: StepStats | None = None) -> StepOutput:
    """One per_layer (baseline) step on the workload's live state."""
    return per_layer_step(w.weights, w.optimizer, w.batches, backend=w.backend, stats=stats)


def cached_run(w: PackedWorkload, stats: StepStats | None = None) -> StepOutput:
    """One cached (optimized) step on the workload's live state."""
    return cached_step(w.weights, w.optimizer, w.batches, backend=w.backend, stats=stats, cache=w.cache)


@TECHNIQUE.variant("per_layer", role="baseline")
def per_layer(w: PackedWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """every layer's attention call rebuilds cu_seqlens, max_seqlen (.item()), position ids and the mask;
    attention as the cached variant's"""
    return recorded_step(w, rec, per_layer_run)


@TECHNIQUE.variant("cached", role="optimized")
def cached(w: PackedWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """the same metadata built once per batch by a keyed cache, shared by RoPE, the loss and every layer;
    attention on CUDA by gpubench's Triton varlen kernels (flash_attn_varlen_func, forward and backward)
    unless backend names another, on a CPU SDPA with the block-causal mask (as before: our kernels run
    there only in Triton's interpreter)"""
    return recorded_step(w, rec, cached_run)


@TECHNIQUE.reference
def reference(w: PackedWorkload) -> PackedReference:
    """The per_layer step and each document run alone, from the initial state."""
    return packed_reference(w, per_layer_run)


check = TECHNIQUE.check(packed_check)


@TECHNIQUE.metrics
def metrics(w: PackedWorkload, measured: Measured) -> dict[str, Any]:
    """The step's figures (:func:`gpubench.techniques.packed_metadata.training.step_metrics`); CUDA's sync count from this variant."""
    return step_metrics(w, measured, cached_run if measured.variant == "cached" else per_layer_run)
