"""Offloaded activation checkpointing through one device staging buffer: reload, wait, recompute,
in turn, so every reload sits on the critical path (what a straightforward offloading checkpoint
does). The forward pass and copier are :mod:`gpubench.lib.offload`'s."""

from __future__ import annotations

from collections.abc import Callable

import torch

from gpubench.lib.offload import Copier, Layer, OffloadStats, llama_layer, offloaded_forward
from gpubench.models.llama import LlamaWeights


def train_step(
    weights: LlamaWeights,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    positions: torch.Tensor,
    *,
    copy_delay_s: float = 0.0,
    allocate: Callable[[torch.Tensor], torch.Tensor] = torch.empty_like,
    layer: Layer = llama_layer,
) -> tuple[torch.Tensor, OffloadStats]:
    """The loss of one batch, gradients accumulated into the weights (leaves requiring grad), and
    what the copies moved and waited for. ``allocate`` makes the staging buffer; ``layer`` runs each
    layer (gpubench.lib.offload.Layer; the Llama decoder layer by default)."""
    with Copier(tokens.device, copy_delay_s) as copier:
        step = offloaded_forward(weights, tokens, targets, positions, copier, layer)
        [buffer] = step.staging_buffers(1, allocate)
        free = None  # marker after the compute that last read the buffer
        for i in reversed(range(weights.config.num_layers)):
            landed = copier.copy(buffer, step.hosts[i], after=free, reload=True)
            copier.wait(landed)
            step.backward_layer(i, buffer)
            free = copier.marker()
        return step.finish()
