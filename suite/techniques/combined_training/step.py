"""combined_training's step: one training step with a variant's optimizations on
(:func:`train_step`: the offloaded, checkpointed forward and backward, then AdamW), its result
(:class:`Step`), and a variant's call with its instrumentation recorded (:func:`run_variant`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from gpubench.baselines import activation_offload as one_buffer_schedule
from gpubench.baselines.moe_grouping import moe_forward as per_expert_loop
from gpubench.contract import Recorder
from gpubench.lib.packing import (
    StepStats,
    build_metadata,
    document_positions,
    next_token_labels,
    packed_attention,
    phase,
)
from gpubench.models.moe import SyncLog
from gpubench.models.moe_decoder import MoEDecoderWeights, moe_decoder_layer
from gpubench.optimizations import activation_offload as two_buffer_schedule
from gpubench.optimizations.moe_grouping import moe_forward as sort_and_group
from gpubench.techniques.combined_training.workload import BACKEND, VARIANTS, CombinedWorkload, Options

FORWARDS = {"where_loop": per_expert_loop, "sort_group": sort_and_group}  # moe_grouping's two paths


@dataclass
class Step:
    """What a step leaves to check: its loss and every parameter's gradient by name, and the MoE
    path it took (``moe``: a key of :data:`FORWARDS`)."""

    loss: torch.Tensor  # detached scalar, float32
    grads: dict[str, torch.Tensor]
    moe: str

    def flat(self) -> dict[str, torch.Tensor]:
        """The loss and the gradients in one mapping, as the checks compare them."""
        return {"loss": self.loss, **self.grads}


def train_step(
    w: CombinedWorkload, options: Options, stats: StepStats | None = None, syncs: SyncLog | None = None
) -> tuple[Step, Any]:
    """One step with ``options``: the offloaded, checkpointed forward and backward of the
    schedule's buffer count (activation_offload's), every layer's attention metadata from the
    cache or rebuilt, every MoE call by ``options.moe``; then AdamW. Returns the loss and the
    gradients by name (a :class:`Step`), and the schedule's OffloadStats."""
    weights, tokens, doc_lens = w.weights, w.tokens, w.doc_lens
    rows, seq = tokens.shape
    cache = w.cache if options.cached_metadata else None

    def metadata(dtype: torch.dtype):
        if cache is not None:
            return cache.get(doc_lens, rows, seq, BACKEND, dtype, stats)
        return build_metadata(doc_lens, rows, seq, BACKEND, dtype, stats)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return packed_attention(metadata(q.dtype), q, k, v)

    def moe_forward(x, experts, config, log):
        with phase(stats, "moe_forward"):
            return FORWARDS[options.moe](x, experts, config, log)

    def layer(weights_: MoEDecoderWeights, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return moe_decoder_layer(weights_, i, x, cos, sin, attend, moe_forward, syncs)

    schedule = two_buffer_schedule if options.buffers == 2 else one_buffer_schedule
    with cache.batch() if cache is not None else contextlib.nullcontext():
        if cache is not None:
            positions = metadata(weights.dtype).position_ids
        else:  # as packed_metadata's per-layer baseline: RoPE positions straight from the lengths
            with phase(stats, "build"):
                positions = document_positions(doc_lens, rows, seq)
        loss, offload = schedule.train_step(
            weights, tokens, next_token_labels(tokens, positions), positions, layer=layer
        )
    return _finish(w, loss, options.moe, stats), offload


def gradients(weights: MoEDecoderWeights) -> dict[str, torch.Tensor]:
    """Each parameter's gradient by name, copied; zeros where none reached it (a path that cuts
    the router off the loss still has a gradient to compare, and it is wrong)."""
    return {
        name: (t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t))
        for name, t in weights.named_parameters().items()
    }


def _finish(w: CombinedWorkload, loss: torch.Tensor, moe: str, stats: StepStats | None) -> Step:
    """Keep the gradients, then take the optimizer step (a fresh AdamW: reset restores the weights)."""
    named = w.weights.named_parameters()
    grads = gradients(w.weights)
    with phase(stats, "optimizer"):
        torch.optim.AdamW(list(named.values()), lr=1e-3).step()
    return Step(loss.detach().float(), grads, moe)


def run_variant(w: CombinedWorkload, rec: Recorder, name: str) -> Step:
    """Variant ``name``'s step, its phases, metadata builds, host reads and reloads recorded."""
    options = VARIANTS[name].options
    stats, syncs = StepStats(w.device), SyncLog()
    with phase(stats, "step"):
        out, offload = train_step(w, options, stats, syncs)
    summary = stats.summary()
    rec.record(
        **{key: summary[key] for key in ("build_ms", "moe_forward_ms", "optimizer_ms", "step_ms")},
        builds=stats.builds,
        metadata_syncs=stats.host_syncs,
        moe_host_reads=len(syncs),
        cache_hits=stats.cache_hits,
        cache_misses=stats.cache_misses,
        buffers=offload.buffers,
        wait_ms=offload.wait_ms,
        bytes_h2d=offload.bytes_h2d,
        bytes_d2h=offload.bytes_d2h,
        fallback=offload.fallback,
    )
    return out
