"""Activation checkpointing with offload and one staging buffer: every reload on the critical path.

Each layer's input goes to host memory in the forward pass and the layer is recomputed in the
backward pass, as in :mod:`gpubench.optimizations.activation_offload`. Here there is one device
buffer to reload into: the reload of layer i may only start once the recompute and backward of
layer i + 1 have finished reading that buffer, and layer i's recompute waits for its reload, so
copy and compute take turns. This is what a straightforward offloading checkpoint does.
"""
from __future__ import annotations

import torch

from gpubench.models.llama import LlamaWeights
from gpubench.optimizations.activation_offload import OffloadStats, offloaded_train_step


def train_step(weights: LlamaWeights, tokens: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor,
               *, copy_delay_s: float = 0.0, **kw) -> tuple[torch.Tensor, OffloadStats]:
    """Offloaded checkpointing with one staging buffer (each reload waited for before its recompute)."""
    return offloaded_train_step(weights, tokens, targets, positions, buffers=1, copy_delay_s=copy_delay_s, **kw)
