"""The training step around the offload schedules (:mod:`gpubench.lib.offload`), as the
activation_offload pair and its peers run it: the workload (a seeded Llama decoder whose weights
are leaves, restored before every call), a staging-buffer allocator a stress case can starve, the
steps without offload (with and without torch checkpointing), the step's end (gradients kept, one
AdamW step), the check of loss and gradients, and the figures derived from :class:`OffloadStats`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from gpubench.checks import DTYPE_TOLERANCE, CheckResult, tensors_check
from gpubench.contract import Measured, Recorder, Workload
from gpubench.lib.gqa import decoder_head_dim
from gpubench.lib.offload import OffloadStats
from gpubench.models.llama import (
    LlamaConfig,
    LlamaWeights,
    causal_attend,
    decoder_layer,
    head_loss,
    random_weights,
    rope_cos_sin,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# bf16 gradients come out of a backward pass through every layer, recomputed in separate graphs
# per layer, so they carry more rounding than one forward output: 2e-2 rather than 1e-2.
TOLERANCE = {**DTYPE_TOLERANCE, torch.bfloat16: 2e-2}
# Recorded per call by an offloaded step, reported as whole numbers (medians of the timed calls).
COUNTS = ("buffers", "bytes_d2h", "bytes_h2d", "extra_buffer_bytes")
TrainStep = Callable[..., tuple[torch.Tensor, OffloadStats]]


@dataclass(kw_only=True)
class OffloadWorkload(Workload):
    weights: LlamaWeights  # leaves requiring grad; reset restores them and clears their grads
    tokens: torch.Tensor  # (batch, seq_len)
    targets: torch.Tensor  # tokens shifted by one
    positions: torch.Tensor
    copy_delay_s: float
    buffer_limit: int  # staging buffers an offloaded step may allocate (0: any number)


def build_workload(params: dict[str, Any], device: torch.device, seed: int) -> OffloadWorkload:
    """Seeded weights of the decoder ``params`` describe (layers, hidden, heads, kv_heads, head_dim,
    intermediate, vocab, dtype) and a seeded token stream of ``batch`` x ``seq_len`` next-token targets."""
    device = torch.device(device)
    config = LlamaConfig(
        vocab_size=params["vocab"],
        hidden_size=params["hidden"],
        num_layers=params["layers"],
        num_heads=params["heads"],
        num_kv_heads=params["kv_heads"],
        head_dim=decoder_head_dim(params),
        intermediate_size=params.get("intermediate", 0) or params["hidden"] * 8 // 3,
    )
    weights = random_weights(config, seed, DTYPES[params["dtype"]], device)
    tensors = weights.parameters()
    for t in tensors:
        t.requires_grad_(True)
    initial = [t.detach().clone() for t in tensors]
    gen = torch.Generator().manual_seed(seed + 1)
    stream = torch.randint(0, config.vocab_size, (params["batch"], params["seq_len"] + 1), generator=gen)
    positions = torch.arange(params["seq_len"]).expand(params["batch"], -1)

    def reset() -> None:
        with torch.no_grad():
            for t, t0 in zip(tensors, initial):
                t.copy_(t0)
                t.grad = None

    return OffloadWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        reset=reset,
        weights=weights,
        tokens=stream[:, :-1].to(device),
        targets=stream[:, 1:].to(device),
        positions=positions.to(device),
        copy_delay_s=params["copy_delay_ms"] / 1e3,
        buffer_limit=params["buffer_limit"],
    )


def limited_allocator(limit: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """Staging buffers as ``torch.empty_like``, the allocation after ``limit`` of them failing with
    torch's out-of-memory error (0: never), as on a device too full for another buffer."""
    made = 0

    def allocate(like: torch.Tensor) -> torch.Tensor:
        nonlocal made
        if limit and made >= limit:
            raise torch.OutOfMemoryError(f"buffer_limit {limit}: staging buffer {made + 1} refused")
        made += 1
        return torch.empty_like(like)

    return allocate


def finish_step(w: OffloadWorkload, loss: torch.Tensor) -> dict[str, Any]:
    """Keep the gradients, then take the optimizer step (a fresh AdamW: reset restores the weights)."""
    named = w.weights.named_parameters()
    grads: dict[str, torch.Tensor] = {}
    for name, t in named.items():
        assert t.grad is not None  # (every parameter is on the loss's path)
        grads[name] = t.grad.detach().clone()
    torch.optim.AdamW(list(named.values()), lr=1e-3).step()
    return {"loss": loss.detach().float(), "grads": grads}


def offloaded_step(train_step: TrainStep, w: OffloadWorkload, rec: Recorder) -> dict[str, Any]:
    """One step through an offload schedule's ``train_step``, its copy figures recorded."""
    loss, stats = train_step(
        w.weights,
        w.tokens,
        w.targets,
        w.positions,
        copy_delay_s=w.copy_delay_s,
        allocate=limited_allocator(w.buffer_limit),
    )
    rec.record(**vars(stats))
    return finish_step(w, loss)


def _plain_step(w: OffloadWorkload, checkpointed: bool) -> dict[str, Any]:
    """One step with every layer input kept on the device, recomputed per layer when ``checkpointed``."""
    weights = w.weights
    cos, sin = rope_cos_sin(weights, w.positions)
    x = torch.nn.functional.embedding(w.tokens, weights.embed)
    for i in range(weights.config.num_layers):
        if checkpointed:
            x = checkpoint(decoder_layer, weights, i, x, cos, sin, causal_attend, use_reentrant=False)
        else:
            x = decoder_layer(weights, i, x, cos, sin, causal_attend)
    loss = head_loss(weights, x, w.targets)
    loss.backward()
    return finish_step(w, loss)


def no_checkpoint_step(w: OffloadWorkload) -> dict[str, Any]:
    """every activation kept on the device, no recompute"""
    return _plain_step(w, checkpointed=False)


def checkpoint_step(w: OffloadWorkload) -> dict[str, Any]:
    """torch.utils.checkpoint per layer, inputs kept on the device (no offload)"""
    return _plain_step(w, checkpointed=True)


def reference_step(w: OffloadWorkload) -> dict[str, Any]:
    """The same step without checkpointing, from the initial weights."""
    assert w.reset is not None  # (the build sets it)
    w.reset()
    return no_checkpoint_step(w)


def step_check(ref: dict[str, Any], out: dict[str, Any]) -> CheckResult:
    """The loss and every named gradient against the step without checkpointing."""
    dtype = next(iter(ref["grads"].values())).dtype
    return tensors_check(
        {"loss": ref["loss"], **ref["grads"]}, {"loss": out.get("loss"), **out.get("grads", {})}, TOLERANCE, dtype=dtype
    )


def step_metrics(w: OffloadWorkload, measured: Measured) -> dict[str, Any]:
    """Tokens/s, ms per step and the loss; for an offloaded step also what the copies moved (bytes,
    buffers), their rates and the time compute waited for them (medians of the timed calls)."""
    out: dict[str, Any] = {
        "tokens_per_s": w.tokens.numel() / measured.median_s,
        "ms_per_step": measured.median_s * 1e3,
        "loss": float(measured.output["loss"]),
    }
    if measured.median_of("wait_ms") is None:  # a peer: nothing offloaded
        return out
    found = {k: measured.median_of(k) for k in (*COUNTS, "d2h_ms", "h2d_ms", "wait_ms")}
    median = {k: v for k, v in found.items() if v is not None}  # (an offloaded step records each every call)
    out.update({k: int(median[k]) for k in COUNTS})
    out.update(
        {
            "fallback": next((r["fallback"] for r in measured.records if r.get("fallback")), ""),
            "d2h_gbps": median["bytes_d2h"] / median["d2h_ms"] / 1e6 if median["d2h_ms"] > 0 else None,
            "h2d_gbps": median["bytes_h2d"] / median["h2d_ms"] / 1e6 if median["h2d_ms"] > 0 else None,
            "wait_ms": median["wait_ms"],
        }
    )
    return out
