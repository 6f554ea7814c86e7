"""A training step (forward, backward, AdamW) of the Llama-style decoder on packed rows, as the
packed_metadata pair runs it whichever way the metadata is built: the workload (seeded micro-
batches of packed documents, seeded weights and a mid-training AdamW state restored before every
call), a step's named outputs and recorded phases, the reference every variant is checked
against (the per_layer step, and each document run alone in float64 from the drawn lengths,
independent of :mod:`gpubench.lib.packing`'s builder), the check, and the figures of the timed calls.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpubench.checks import DTYPE_TOLERANCE, CheckResult, tensors_check
from gpubench.contract import Measured, Recorder, Workload
from gpubench.lib.packing import HALF, PackedBatch, StepOutput, StepStats, draw_doc_lens, resolve_backend
from gpubench.measure.timing import count_cuda_syncs
from gpubench.models import stand_in
from gpubench.models.llama import (
    SIZES,
    LlamaConfig,
    LlamaWeights,
    causal_attention,
    forward,
    random_weights,
    with_overrides,
)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# On CUDA the attention backward (SDPA's kernels, flash-attn) accumulates with atomics, so two
# identical steps can differ by float rounding: relative L2 allowed per tensor, by the weights' dtype.
CUDA_TOLERANCE = {**DTYPE_TOLERANCE, torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
# The check's error figure: losses against each document run alone (float64), worst relative L2.
ALONE_METRIC = "rel_l2_vs_documents_alone"
LR = 1e-4
ADAM_STEP0 = 10.0  # the restored optimizer state is that of a run 10 steps in


@dataclass(kw_only=True)
class PackedWorkload(Workload):
    config: LlamaConfig
    backend: str  # the attention backend that runs ("auto" resolved)
    batches: list[PackedBatch]  # the step's micro-batches: what the variants read
    lens: list[list[list[int]]]  # document lengths of each row of each micro-batch: what the reference reads
    names: list[str]  # parameter names, in LlamaWeights.parameters() order
    cache: Any  # the cached variant's metadata cache (the optimization's own type)
    weights: LlamaWeights  # the optimizer's leaf parameters: fresh ones from every reset
    optimizer: torch.optim.Optimizer


# One step of a variant on the workload's live state, its phases recorded into the stats when given.
Step = Callable[[PackedWorkload, StepStats | None], StepOutput]


def packing_problems(params: dict[str, Any]) -> list[str]:
    """The cross-param rules: the model names a built-in size or a model the stand-in can take (at
    most its own layers); a row holds at least two documents; flash-attn runs in half precision."""
    ignore = params.get("ignore_fields", "")
    problems = stand_in.model_problems(params["model"], params["layers"], weights=False, ignore_fields=ignore)
    if params["mean_doc_len"] >= params["seq_len"]:
        problems.append(
            f"mean_doc_len ({params['mean_doc_len']}) must be below seq_len ({params['seq_len']}): "
            "a packed row holds at least two documents"
        )
    if params["backend"] == "flash_attn_varlen" and params["dtype"] not in HALF:
        problems.append(f"backend flash_attn_varlen needs dtype float16 or bfloat16 (got {params['dtype']})")
    return problems


def config_of(params: dict[str, Any]) -> LlamaConfig:
    """The decoder's config: a built-in size (``layers`` of them when set), or the stand-in of a
    preset, config.json or checkpoint directory at its shapes (its first ``layers``; never its
    weights: the step trains from seeded ones)."""
    spec = stand_in.resolve(params["model"], weights=False, ignore_fields=params.get("ignore_fields", ""))
    if spec.config is not None:
        return LlamaConfig.from_model(spec.config, params["layers"])
    config = SIZES[params["model"]]
    return with_overrides(config, num_layers=params["layers"]) if params["layers"] else config


def build_workload(params: dict[str, Any], device: torch.device, seed: int, cache: Any) -> PackedWorkload:
    """Seeded micro-batches of packed documents, the model size's seeded weights and a seeded
    mid-training optimizer state, fresh from every reset; ``cache`` is the cached variant's."""
    device = torch.device(device)
    config, dtype = config_of(params), DTYPES[params["dtype"]]
    rows, seq = params["rows"], params["seq_len"]
    gen = torch.Generator().manual_seed(seed)
    lens, batches = [], []
    for _ in range(params["micro_batches"]):
        lens.append(draw_doc_lens(rows, seq, params["mean_doc_len"], gen))
        tokens = torch.randint(0, config.vocab_size, (rows, seq), generator=gen)
        batches.append(
            PackedBatch(
                tokens.to(device), torch.tensor([n for row in lens[-1] for n in row], dtype=torch.int32, device=device)
            )
        )
    pristine = random_weights(config, seed, dtype, device)
    # A mid-training AdamW state (seeded moments, step ADAM_STEP0), drawn on the CPU. The second
    # moments are never 0: AdamW's eps (1e-8) rounds to 0 in float16, and m / sqrt(0) is Inf.
    moments = [
        (
            (1e-3 * torch.randn(p.shape, generator=gen)).to(device=device, dtype=dtype),
            (1e-6 * (1 + torch.rand(p.shape, generator=gen))).to(device=device, dtype=dtype),
        )
        for p in pristine.parameters()
    ]

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
        params=dict(params),
        device=device,
        seed=seed,
        config=config,
        backend=resolve_backend(params["backend"], device, params["dtype"]),
        batches=batches,
        lens=lens,
        names=list(pristine.named_parameters()),
        cache=cache,
        weights=weights,
        optimizer=optimizer,
    )

    def reset() -> None:
        workload.weights, workload.optimizer = fresh_state()

    workload.reset = reset
    return workload


def restart(w: PackedWorkload) -> None:
    """``w.reset()``: the weights and optimizer state back to the start (set by the build)."""
    assert w.reset is not None  # (build_workload sets it)
    w.reset()


def named(w: PackedWorkload, out: StepOutput) -> dict[str, torch.Tensor]:
    """A step's outputs by name: loss, token losses, every gradient and every updated parameter."""
    return {
        "loss": out.loss,
        "token_losses": out.token_losses,
        **{f"grad {n}": g for n, g in zip(w.names, out.grads)},
        **{f"param {n}": p for n, p in zip(w.names, out.params)},
    }


def recorded_step(w: PackedWorkload, rec: Recorder, step: Step) -> dict[str, torch.Tensor]:
    """One step, its phase split, builds, host syncs and mask bytes recorded."""
    stats = StepStats(w.device)
    out = step(w, stats)
    rec.record(**stats.summary())
    return named(w, out)


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
                    doc = batch.tokens[r, start : start + n]
                    logits = forward(
                        weights, doc, torch.arange(n, device=w.device), lambda layer, q, k, v: causal_attention(q, k, v)
                    )
                    token_losses[m, r, start : start + n - 1] = F.cross_entropy(logits[:-1], doc[1:], reduction="none")
                    start += n
    targets = torch.tensor(
        [sum(n - 1 for row in lens for n in row) for lens in w.lens], dtype=torch.float64, device=w.device
    )
    return {"loss": (token_losses.sum((1, 2)) / targets).mean(), "token_losses": token_losses}


def packed_reference(w: PackedWorkload, per_layer: Step) -> PackedReference:
    """The documents alone from the initial state, then the ``per_layer`` step from it."""
    restart(w)
    alone = documents_alone(w)  # before the step moves the weights
    return PackedReference(named(w, per_layer(w, None)), alone, w.weights.dtype)


def packed_check(reference: PackedReference, output: dict[str, torch.Tensor]) -> CheckResult:
    """Two comparisons, both required. (1) The loss and each token's loss against each document
    run alone: relative L2 within DTYPE_TOLERANCE of the weights' dtype (the error recorded).
    (2) Loss, token losses, every gradient and every updated parameter against the per_layer
    step's, by name: bit for bit on a CPU, within CUDA_TOLERANCE on CUDA."""
    alone = tensors_check(reference.alone, output, dtype=reference.dtype)
    if reference.step["loss"].is_cuda:  # GPU-only: the loss of a step run on CUDA
        same = tensors_check(reference.step, output, CUDA_TOLERANCE, dtype=reference.dtype)
    else:
        same = tensors_check(reference.step, output, exact=True)
    alone_error = "n/a" if alone.error is None else f"{alone.error:.3g}"
    if not same.passed:
        return CheckResult(
            False,
            same.error,
            same.tolerance,
            same.metric,
            f"against the per_layer step: {same.detail} (documents alone: {ALONE_METRIC} {alone_error})",
        )
    versus = (
        "bit-identical to the per_layer step" if same.error == 0 else f"per_layer step: {same.metric} {same.error:.3g}"
    )
    if not alone.passed:
        return CheckResult(
            False,
            alone.error,
            alone.tolerance,
            ALONE_METRIC,
            f"against each document run alone: {alone.detail} ({versus})",
        )
    return CheckResult(True, alone.error, alone.tolerance, ALONE_METRIC, f"{alone.detail}; {versus}")


def matmul_params(config: LlamaConfig) -> int:
    """Parameters that take part in matmuls: all but the embedding table (a lookup), unless it is
    tied to the LM head."""
    return config.num_params() - (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


# Counted by construction, the same in every call: recorded key -> metric key.
COUNTS = {
    "builds": "metadata_builds_per_step",
    "host_syncs": "host_syncs_per_step",
    "mask_bytes_built": "mask_bytes_built_per_step",
    "mask_bytes_held": "mask_bytes_held",
    "metadata_bytes_held": "metadata_bytes_held",
    "cache_hits": "cache_hits_per_step",
    "cache_misses": "cache_misses_per_step",
}


def step_metrics(w: PackedWorkload, measured: Measured, step: Step) -> dict[str, Any]:
    """Tokens, documents, tokens/s, ms and FLOPs per step; the recorded phase split and counts
    (medians of the timed calls); on CUDA the syncs torch itself sees in one untimed ``step``."""
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
    ignore = w.params.get("ignore_fields", "")
    if note := stand_in.case_note(w.params["model"], w.params["layers"], weights=False, ignore_fields=ignore):
        out["model_note"] = note
    if measured.records:
        out.update({key: measured.median_of(key) for key in ("build_ms", "forward_ms", "backward_ms", "optimizer_ms")})
        out["forward_rest_ms"] = statistics.median(r["forward_ms"] - r["build_ms"] for r in measured.records)
        counts = {metric: measured.median_of(key) for key, metric in COUNTS.items()}
        out.update({metric: int(n) for metric, n in counts.items() if n is not None})  # (recorded every call)
    if w.device.type == "cuda":  # GPU-only: sync debug mode sees CUDA syncs only
        # Sync debug mode perturbs timing, so CUDA's own count of the step's syncs comes from one
        # extra call, untimed, of the uninstrumented step.
        restart(w)
        with count_cuda_syncs(True) as seen:
            step(w, None)
        out["host_syncs_observed"] = seen["n"]
    return out
