"""Packed-sequence metadata built once per batch and reused: a :class:`PackedMetadataCache` runs
the builder of :mod:`gpubench.lib.packing` on the batch's first request and hands that one record to
RoPE, the loss and every layer; the next micro-batch's lengths miss it and rebuild, and the step
releases it when its last backward pass is done.

Attention is the step's backend (:func:`gpubench.lib.packing.packed_attention`): on CUDA by default
gpubench's own Triton varlen kernels (``flash_attn_varlen_func``, forward and backward, fed the
cached ``cu_seqlens`` and ``max_seqlen``), on a CPU SDPA with the block-causal mask. The per-layer
baseline attends the same way, so the pair differs only in how often the metadata is built."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from gpubench.lib.packing import (
    PackedBatch,
    PackedMetadata,
    StepOutput,
    StepStats,
    build_metadata,
    packed_attention,
    training_step,
)
from gpubench.models.llama import LlamaWeights, forward


class PackedMetadataCache:
    """The metadata of the batch in flight, built on first use, shared by every layer. Keyed so a
    new batch never sees a stale entry: the key is the lengths tensor's identity and in-place
    version (the tensor is held while cached, so its id cannot be recycled), shape, dtype and
    device, with rows, seq, backend and mask dtype; anything else is a miss and a rebuild."""

    def __init__(self) -> None:
        self._lens: torch.Tensor | None = None  # held so that its id, in the key, is not recycled
        self._key: tuple | None = None
        self._meta: PackedMetadata | None = None
        self.hits = 0
        self.misses = 0

    @staticmethod
    def _key_of(doc_lens: torch.Tensor, rows: int, seq: int, backend: str, dtype: torch.dtype) -> tuple:
        return (
            id(doc_lens),
            doc_lens._version,
            tuple(doc_lens.shape),
            doc_lens.dtype,
            doc_lens.device,
            rows,
            seq,
            backend,
            dtype,
        )

    def get(
        self,
        doc_lens: torch.Tensor,
        rows: int,
        seq: int,
        backend: str,
        dtype: torch.dtype,
        stats: StepStats | None = None,
    ) -> PackedMetadata:
        """The cached record when it was built from this very lengths tensor, unmodified, for the
        same shape, backend and dtype; else a fresh build."""
        key = self._key_of(doc_lens, rows, seq, backend, dtype)
        if self._meta is not None and self._key == key:
            self.hits += 1
            if stats is not None:
                stats.cache_hits += 1
            return self._meta
        self.misses += 1
        if stats is not None:
            stats.cache_misses += 1
        self.release()
        meta = build_metadata(doc_lens, rows, seq, backend, dtype, stats)
        self._lens, self._key, self._meta = doc_lens, key, meta
        return meta

    def release(self) -> None:
        """Drop the cached record (and the reference to its lengths)."""
        self._lens = self._key = self._meta = None

    @property
    def held(self) -> PackedMetadata | None:
        return self._meta

    @contextlib.contextmanager
    def batch(self) -> Iterator[PackedMetadataCache]:
        """Scope the cache (to a step): whatever it holds is released on exit."""
        try:
            yield self
        finally:
            self.release()


def packed_forward(
    weights: LlamaWeights,
    tokens: torch.Tensor,
    doc_lens: torch.Tensor,
    *,
    backend: str = "sdpa",
    stats: StepStats | None = None,
    cache: PackedMetadataCache | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (rows, seq, vocab) of a packed batch and its position ids; the metadata comes from
    ``cache`` for the RoPE positions and every layer alike. The caller releases the cache."""
    cache = PackedMetadataCache() if cache is None else cache
    rows, seq = tokens.shape
    positions = cache.get(doc_lens, rows, seq, backend, weights.dtype, stats).position_ids

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return packed_attention(cache.get(doc_lens, rows, seq, backend, q.dtype, stats), q, k, v)

    return forward(weights, tokens, positions, attend), positions


def train_step(
    weights: LlamaWeights,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[PackedBatch],
    *,
    backend: str = "sdpa",
    stats: StepStats | None = None,
    cache: PackedMetadataCache | None = None,
) -> StepOutput:
    """One training step over packed micro-batches (forward, loss, backward each; one optimizer
    step) with the metadata built once per micro-batch: every forward and backward pass inside one
    cache scope, the optimizer step after its release."""
    cache = PackedMetadataCache() if cache is None else cache
    return training_step(
        weights,
        optimizer,
        batches,
        lambda b: packed_forward(weights, b.tokens, b.doc_lens, backend=backend, stats=stats, cache=cache),
        stats,
        metadata_scope=cache.batch(),
    )
