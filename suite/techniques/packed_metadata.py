"""packed_metadata: a training step (forward, backward, AdamW) of the Llama-style decoder on packed
rows, the attention metadata rebuilt in every layer (``per_layer``) or built once per batch by a
cache (``cached``); each call records its phase split, builds, host syncs and mask bytes.
Backends: on CUDA gpubench's own Triton varlen attention (``flash_attn_varlen_func``, forward and
backward) by default; SDPA with a block-causal mask (what a CPU runs); flash-attn's varlen kernel.

Both variants run the same builder and attention (:mod:`gpubench.packing`), so a bug there would be
the same on both sides: the reference (:class:`PackedReference`) also runs every document alone
through the model in float64, from the document lengths drawn here and nothing of
:mod:`gpubench.packing`, and every variant's losses must match it as well as the per-layer step.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpubench.baselines.packed_metadata import train_step as per_layer_step
from gpubench.contract import (DTYPE_TOLERANCE, Bench, CheckResult, Claim, Headline, Measured, Param, Plot, Recorder,
                               Technique, Workload, tensors_check)
from gpubench.claims import UNSLOTH_NVIDIA
from gpubench.errors import BadInput
from gpubench.models.llama import (SIZES, LlamaConfig, LlamaWeights, causal_attention, forward,
                                   random_weights, with_overrides)
from gpubench.optimizations.packed_metadata import PackedMetadataCache
from gpubench.optimizations.packed_metadata import train_step as cached_step
from gpubench.packing import (BACKENDS, HALF, PackedBatch, StepOutput, StepStats, draw_doc_lens,
                              resolve_backend)
from gpubench.timing import count_cuda_syncs

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# On CUDA the attention backward (SDPA's kernels, flash-attn) accumulates with atomics, so two
# identical steps can differ by float rounding: relative L2 allowed per tensor, by the weights' dtype.
CUDA_TOLERANCE = {**DTYPE_TOLERANCE, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
# The check's error figure: losses against each document run alone (float64), worst relative L2.
ALONE_METRIC = "rel_l2_vs_documents_alone"
LR = 1e-4
ADAM_STEP0 = 10.0  # the restored optimizer state is that of a run 10 steps in

TECHNIQUE = Technique(
    name="packed_metadata",
    shape="training_step",
    summary="Packed-sequence attention metadata (cu_seqlens, max_seqlen, position ids, block-causal "
            "mask) built once per batch and shared by every layer, instead of rebuilt per layer.",
    anchor="Unsloth: +14.3% per training step, +43.3% forward (Qwen3-14B QLoRA)",
    claims=[Claim(*UNSLOTH_NVIDIA, text="+14.3% per training step (read as 1.143x)", figure=(1.143, 1.143),
                  measures="training step time, packed metadata cached once vs rebuilt in every layer",
                  conditions="Qwen3-14B (40 layers) QLoRA SFT on packed sequences, NVIDIA GPU",
                  when={"model": ("in", ("100m", "1b"))},
                  caveat="our decoder (seeded random weights, full training), not Qwen3-14B with QLoRA",
                  device_reason="the win is the per-layer .item() host sync, which costs a CPU nothing")],
    gpu_specific=(
        "On a GPU each rebuild's max_seqlen .item() is a host sync: the host waits for the GPU to "
        "drain and stops queueing kernels ahead of it, so every layer's launches become exposed "
        "(layers syncs per step against one), and with SDPA the baseline keeps one rows x seq^2 mask "
        "per layer alive for the backward pass. On a CPU .item() is a plain read with no stall; what "
        "the CPU ratio shows is the cost of constructing the mask (elementwise work over rows x seq^2 "
        "per layer) against the step's compute, so it is not the GPU's ratio."
    ),
    headline_figures=(Headline("host_syncs_per_step", "host syncs per step", higher_is_better=False,
                               replaces_time=False),),
    benchmarks=[Bench(f"{n}-layers", {"model": "tiny", "layers": n, "rows": 1, "seq_len": 512, "mean_doc_len": 48})
                for n in (2, 4)],
    params=[
        Param("model", str, "tiny", "model size of gpubench.models.llama (random seeded weights)",
              choices=list(SIZES)),
        Param("layers", int, 0, "decoder layers; 0 keeps the model size's own", min=0),
        Param("rows", int, 2, "packed rows per batch", min=1),
        Param("micro_batches", int, 1, "batches per step, gradients accumulated (each with its own documents): "
              "from 2 on, the cache must miss on each new batch's lengths", min=1),
        Param("seq_len", int, 256, "tokens per row (documents packed without padding)", min=2),
        Param("mean_doc_len", int, 64, "mean document length; lengths are uniform in "
              "[1, min(2 * mean - 1, seq_len - 1)], the last one cut to fill the row", min=1),
        Param("dtype", str, "float32", "dtype of weights, activations and the mask", choices=list(DTYPES)),
        Param("backend", str, "auto", "attention: sdpa (block-causal mask), triton_varlen (gpubench's Triton "
              "varlen kernels, flash_attn_varlen_func, forward and backward; CUDA), flash_attn_varlen "
              "(flash-attn's varlen kernel, CUDA, fp16/bf16), auto (triton_varlen on CUDA, else sdpa)",
              choices=["auto", *BACKENDS]),
    ],
    plots=[
        Plot("Step time split (metadata build, rest of forward, backward, optimizer) against layers",
             y=("build_ms", "forward_rest_ms", "backward_ms", "optimizer_ms"), x="layers", kind="stacked",
             ylabel="ms per step"),
        Plot("Metadata build time per step against layers", y="build_ms", x="layers", ylabel="build ms per step"),
        Plot("Forward and backward speedup over the baseline against layers", y=("forward_ms", "backward_ms"),
             x="layers", relative=True, ylabel="speedup (x)"),
    ],
)


@dataclass(kw_only=True)
class PackedWorkload(Workload):
    config: LlamaConfig
    backend: str  # the attention backend that runs ("auto" resolved)
    batches: list[PackedBatch]  # the step's micro-batches: what the variants read
    lens: list[list[list[int]]]  # document lengths of each row of each micro-batch: what the reference reads
    names: list[str]  # parameter names, in LlamaWeights.parameters() order
    cache: PackedMetadataCache  # the cached variant's
    weights: LlamaWeights  # the optimizer's leaf parameters: fresh ones from every reset
    optimizer: torch.optim.Optimizer


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    problems = []
    if params["mean_doc_len"] >= params["seq_len"]:
        problems.append(f"mean_doc_len ({params['mean_doc_len']}) must be below seq_len ({params['seq_len']}): "
                        "a packed row holds at least two documents")
    if params["backend"] == "flash_attn_varlen" and params["dtype"] not in HALF:
        problems.append(f"backend flash_attn_varlen needs dtype float16 or bfloat16 (got {params['dtype']})")
    return problems


def config_of(params: dict[str, Any]) -> LlamaConfig:
    config = SIZES[params["model"]]
    return with_overrides(config, num_layers=params["layers"]) if params["layers"] else config


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> PackedWorkload:
    device = torch.device(device)
    config, dtype = config_of(params), DTYPES[params["dtype"]]
    rows, seq = params["rows"], params["seq_len"]
    gen = torch.Generator().manual_seed(seed)
    lens, batches = [], []
    for _ in range(params["micro_batches"]):
        lens.append(draw_doc_lens(rows, seq, params["mean_doc_len"], gen))
        tokens = torch.randint(0, config.vocab_size, (rows, seq), generator=gen)
        batches.append(PackedBatch(tokens.to(device), torch.tensor([n for row in lens[-1] for n in row],
                                                                   dtype=torch.int32, device=device)))
    pristine = random_weights(config, seed, dtype, device)
    # A mid-training AdamW state (seeded moments, step ADAM_STEP0), drawn on the CPU. The second
    # moments are never 0: AdamW's eps (1e-8) rounds to 0 in float16, and m / sqrt(0) is Inf.
    moments = [((1e-3 * torch.randn(p.shape, generator=gen)).to(device=device, dtype=dtype),
                (1e-6 * (1 + torch.rand(p.shape, generator=gen))).to(device=device, dtype=dtype))
               for p in pristine.parameters()]

    def fresh_state() -> tuple[LlamaWeights, torch.optim.Optimizer]:
        """New leaf parameters holding the seeded weights and an AdamW holding the seeded state:
        every call does the same step, and an earlier call's outputs stay untouched."""
        live = [p.detach().clone().requires_grad_(True) for p in pristine.parameters()]
        optimizer = torch.optim.AdamW(live, lr=LR, weight_decay=0.01)
        for p, (m, v) in zip(live, moments):
            optimizer.state[p] = {"step": torch.tensor(ADAM_STEP0), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        return pristine.with_parameters(live), optimizer

    weights, optimizer = fresh_state()
    workload = PackedWorkload(
        params=dict(params), device=device, seed=seed, config=config,
        backend=resolve_backend(params["backend"], device, params["dtype"]), batches=batches, lens=lens,
        names=list(pristine.named_parameters()), cache=PackedMetadataCache(), weights=weights, optimizer=optimizer)

    def reset() -> None:
        workload.weights, workload.optimizer = fresh_state()

    workload.reset = reset
    return workload


# -- variants ---------------------------------------------------------------------------------

def run_step(w: PackedWorkload, variant: str, stats: StepStats | None = None) -> StepOutput:
    """One step of ``variant`` (per_layer or cached) on the workload's live state."""
    args = (w.weights, w.optimizer, w.batches)
    if variant == "cached":
        return cached_step(*args, backend=w.backend, stats=stats, cache=w.cache)
    return per_layer_step(*args, backend=w.backend, stats=stats)


def _named(w: PackedWorkload, out: StepOutput) -> dict[str, torch.Tensor]:
    return {"loss": out.loss, "token_losses": out.token_losses, **{f"grad {n}": g for n, g in zip(w.names, out.grads)},
            **{f"param {n}": p for n, p in zip(w.names, out.params)}}


def _recorded_step(w: PackedWorkload, rec: Recorder, variant: str) -> dict[str, torch.Tensor]:
    stats = StepStats(w.device)
    out = run_step(w, variant, stats)
    rec.record(**stats.summary())
    return _named(w, out)


@TECHNIQUE.variant("per_layer", role="baseline")
def per_layer(w: PackedWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """every layer's attention call rebuilds cu_seqlens, max_seqlen (.item()), position ids and the mask;
    attention as the cached variant's"""
    return _recorded_step(w, rec, "per_layer")


@TECHNIQUE.variant("cached", role="optimized")
def cached(w: PackedWorkload, rec: Recorder) -> dict[str, torch.Tensor]:
    """the same metadata built once per batch by a keyed cache, shared by RoPE, the loss and every layer;
    attention on CUDA by gpubench's Triton varlen kernels (flash_attn_varlen_func, forward and backward)
    unless backend names another, on a CPU SDPA with the block-causal mask (as before: our kernels run
    there only in Triton's interpreter)"""
    return _recorded_step(w, rec, "cached")


# -- correctness ------------------------------------------------------------------------------

@dataclass
class PackedReference:
    """What every variant is checked against: the per_layer step (run again) and, independent of
    the shared builder, the losses of each document run alone."""

    step: dict[str, torch.Tensor]  # per_layer's loss, token losses, gradients and updated parameters
    alone: dict[str, torch.Tensor]  # float64 "loss" and "token_losses", as the step lays them out
    dtype: torch.dtype  # the weights' (whose tolerance applies)


def documents_alone(w: PackedWorkload) -> dict[str, torch.Tensor]:
    """The losses the packed step must give, from the drawn document lengths alone: each document
    run by itself through the model in float64 (positions 0..n-1, plain causal attention), each
    token's loss against the next token of its own document (0 for a document's last token); the
    step's loss, the mean over each micro-batch's targets, averaged over micro-batches."""
    weights = w.weights.with_parameters([p.detach().double() for p in w.weights.parameters()])
    rows, seq = w.batches[0].tokens.shape
    token_losses = torch.zeros(len(w.batches), rows, seq, dtype=torch.float64, device=w.device)
    with torch.no_grad():
        for m, (batch, lens) in enumerate(zip(w.batches, w.lens)):
            for r, row in enumerate(lens):
                start = 0
                for n in row:
                    doc = batch.tokens[r, start:start + n]
                    logits = forward(weights, doc, torch.arange(n, device=w.device),
                                     lambda layer, q, k, v: causal_attention(q, k, v))
                    token_losses[m, r, start:start + n - 1] = F.cross_entropy(logits[:-1], doc[1:], reduction="none")
                    start += n
    targets = torch.tensor([sum(n - 1 for row in lens for n in row) for lens in w.lens],
                           dtype=torch.float64, device=w.device)
    return {"loss": (token_losses.sum((1, 2)) / targets).mean(), "token_losses": token_losses}


@TECHNIQUE.reference
def make_reference(w: PackedWorkload) -> PackedReference:
    w.reset()
    alone = documents_alone(w)  # before the step moves the weights
    return PackedReference(_named(w, run_step(w, "per_layer")), alone, w.weights.dtype)


@TECHNIQUE.check
def check(reference: PackedReference, output: dict[str, torch.Tensor]) -> CheckResult:
    """Two comparisons, both required. (1) The loss and each token's loss against each document
    run alone: relative L2 within DTYPE_TOLERANCE of the weights' dtype (the error recorded).
    (2) Loss, token losses, every gradient and every updated parameter against the per_layer
    step's, by name: bit for bit on a CPU, within CUDA_TOLERANCE on CUDA."""
    alone = tensors_check(reference.alone, output, dtype=reference.dtype)
    if reference.step["loss"].is_cuda:
        same = tensors_check(reference.step, output, CUDA_TOLERANCE, dtype=reference.dtype)
    else:
        same = tensors_check(reference.step, output, exact=True)
    alone_error = "n/a" if alone.error is None else f"{alone.error:.3g}"
    if not same.passed:
        return CheckResult(False, same.error, same.tolerance, same.metric,
                           f"against the per_layer step: {same.detail} (documents alone: {ALONE_METRIC} {alone_error})")
    versus = ("bit-identical to the per_layer step" if same.error == 0
              else f"per_layer step: {same.metric} {same.error:.3g}")
    if not alone.passed:
        return CheckResult(False, alone.error, alone.tolerance, ALONE_METRIC,
                           f"against each document run alone: {alone.detail} ({versus})")
    return CheckResult(True, alone.error, alone.tolerance, ALONE_METRIC, f"{alone.detail}; {versus}")


# -- metrics ----------------------------------------------------------------------------------

def matmul_params(config: LlamaConfig) -> int:
    """Parameters that take part in matmuls: all but the embedding table (a lookup), unless it is
    tied to the LM head."""
    return config.num_params() - (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


# Counted by construction, the same in every call: recorded key -> metric key.
COUNTS = {"builds": "metadata_builds_per_step", "host_syncs": "host_syncs_per_step",
          "mask_bytes_built": "mask_bytes_built_per_step", "mask_bytes_held": "mask_bytes_held",
          "metadata_bytes_held": "metadata_bytes_held", "cache_hits": "cache_hits_per_step",
          "cache_misses": "cache_misses_per_step"}


@TECHNIQUE.metrics
def metrics(w: PackedWorkload, measured: Measured) -> dict[str, Any]:
    tokens = sum(b.tokens.numel() for b in w.batches)
    out: dict[str, Any] = {
        "backend": w.backend,
        "layers": w.config.num_layers,
        "tokens": tokens,
        "documents": sum(int(b.doc_lens.numel()) for b in w.batches),
        "tokens_per_s": tokens / measured.median_s,
        "ms_per_step": 1e3 * measured.median_s,
        # 6 x parameters x tokens: the usual training estimate (2 forward, 4 backward), attention
        # scores not counted.
        "flops": 6 * matmul_params(w.config) * tokens,
    }
    if measured.records:
        out.update({key: measured.median_of(key) for key in ("build_ms", "forward_ms", "backward_ms", "optimizer_ms")})
        out["forward_rest_ms"] = statistics.median(r["forward_ms"] - r["build_ms"] for r in measured.records)
        out.update({metric: int(measured.median_of(key)) for key, metric in COUNTS.items()})
    if w.device.type == "cuda":
        # Sync debug mode perturbs timing, so CUDA's own count of the step's syncs comes from one
        # extra call, untimed, of the uninstrumented step.
        w.reset()
        with count_cuda_syncs(True) as seen:
            run_step(w, measured.variant)
        out["host_syncs_observed"] = seen["n"]
    return out
