"""Contiguous KV cache: every sequence reserves ``max_len`` slots in every layer up front, as
static caches do (FasterTransformer, Hugging Face's StaticCache). Token t of sequence i is at
[i, t]; a sequence of 100 tokens in a 4096-slot row leaves 97.6% of its row empty, and
sliding-window layers reserve the full length too.
"""

from __future__ import annotations

import torch

from gpubench.lib.kvmath import KVLayout
from gpubench.lib.kvstorage import SequenceKV, TokenRows, empty_rows, held_bytes, tensor_scales


class ContiguousKVCache:
    allocator = "contiguous"

    def __init__(self, layout: KVLayout, batch: int, max_len: int, device: torch.device):
        self.layout, self.max_len = layout, max_len
        self.layers = [empty_rows(layout, (batch, max_len), device) for _ in range(layout.num_layers)]
        self.scales = [tensor_scales(layout, device) for _ in range(layout.num_layers)]

    def write(self, index: int, layer: int, rows: TokenRows, start: int = 0) -> None:
        end = start + rows.values.shape[0]
        self.layers[layer].values[index, start:end] = rows.values
        if rows.scales is not None:
            scales = self.layers[layer].scales
            assert scales is not None  # (rows with scales: a layout that keeps them)
            scales[index, start:end] = rows.scales

    def read(self, index: int, layer: int, start: int, end: int) -> TokenRows:
        stored = self.layers[layer]
        return TokenRows(
            stored.values[index, start:end], None if stored.scales is None else stored.scales[index, start:end]
        )

    def storage_bytes(self) -> int:
        return held_bytes(self.layers, self.scales)

    def metadata_bytes(self) -> int:
        return 0  # addressing is implicit


def build_cache(
    layout: KVLayout,
    sequences: list[SequenceKV],
    *,
    max_len: int,
    block_size: int,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> ContiguousKVCache:
    """Reserve ``max_len`` slots per sequence in every layer, then write each sequence's tokens.
    (``block_size`` and ``generator`` are unused: the signature is the paged allocator's.)"""
    too_long = [s.length for s in sequences if s.length > max_len]
    if too_long:
        raise ValueError(f"sequence of {too_long[0]} tokens does not fit max_len={max_len}")
    cache = ContiguousKVCache(layout, len(sequences), max_len, device)
    for i, seq in enumerate(sequences):
        for layer, rows in enumerate(seq.layers):
            cache.write(i, layer, rows)
    return cache
