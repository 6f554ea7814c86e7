"""Offloaded activation checkpointing through two device staging buffers used alternately: layer
i - 1's input is reloaded into one while layer i recomputes from the other, so reloads hide
behind recompute. Events guard both ways: a reload waits for the compute that last read its
buffer, compute waits for its buffer's reload. The forward pass and copier are
:mod:`gpubench.lib.offload`'s."""

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
    what the copies moved and waited for. ``allocate`` makes the staging buffers; when the second
    cannot be had, the step runs on one and says why in ``fallback``."""
    with Copier(tokens.device, copy_delay_s) as copier:
        step = offloaded_forward(weights, tokens, targets, positions, copier, layer)
        buffers = step.staging_buffers(2, allocate)
        n = len(buffers)  # 1 when the second could not be allocated
        free = [None] * n  # marker after the compute that last read each buffer
        landed = {}

        def reload(i: int) -> None:
            landed[i] = copier.copy(buffers[i % n], step.hosts[i], after=free[i % n], reload=True)

        layers = weights.config.num_layers
        reload(layers - 1)
        for i in reversed(range(layers)):
            if n > 1 and i > 0:
                reload(i - 1)  # into the other buffer: overlaps the recompute below
            copier.wait(landed.pop(i))
            step.backward_layer(i, buffers[i % n])
            free[i % n] = copier.marker()
            if n == 1 and i > 0:
                reload(i - 1)  # fallback: the one buffer is free only now
        return step.finish()
