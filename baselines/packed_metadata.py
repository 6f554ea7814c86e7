"""Packed-sequence metadata rebuilt in every attention layer, as stacks that recover document
boundaries inside the attention function do: each layer calls the builder of
:mod:`gpubench.lib.packing` (cu_seqlens, max_seqlen with its ``.item()``, position ids, mask) again."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpubench.lib.packing import (
    PackedBatch,
    StepOutput,
    StepStats,
    build_metadata,
    document_positions,
    packed_attention,
    phase,
    training_step,
)
from gpubench.models.llama import LlamaWeights, forward


def packed_forward(
    weights: LlamaWeights,
    tokens: torch.Tensor,
    doc_lens: torch.Tensor,
    *,
    backend: str = "sdpa",
    stats: StepStats | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (rows, seq, vocab) of a packed batch and its position ids. The RoPE positions are
    derived from the lengths once; then every layer's attention call rebuilds the whole metadata."""
    rows, seq = tokens.shape
    with phase(stats, "build"):
        positions = document_positions(doc_lens, rows, seq)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return packed_attention(build_metadata(doc_lens, rows, seq, backend, q.dtype, stats), q, k, v)

    return forward(weights, tokens, positions, attend), positions


def train_step(
    weights: LlamaWeights,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[PackedBatch],
    *,
    backend: str = "sdpa",
    stats: StepStats | None = None,
) -> StepOutput:
    """One training step over packed micro-batches (forward, loss, backward each; one optimizer
    step), every layer rebuilding the metadata. ``weights``' tensors are the optimizer's leaf
    parameters."""
    return training_step(
        weights,
        optimizer,
        batches,
        lambda b: packed_forward(weights, b.tokens, b.doc_lens, backend=backend, stats=stats),
        stats,
    )
