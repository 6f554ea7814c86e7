"""Paged KV cache: blocks of ``block_size`` tokens taken on demand from a pool and found through
a per-sequence block table (vLLM's memory manager). A sequence holds ceil(length / block_size)
blocks, so at most block_size - 1 slots per sequence and layer are wasted; sliding-window layers
keep only the blocks that still hold tokens inside the window.

Tokens are written through a slot mapping (block_table[t // B] * B + t % B), as vLLM's
reshape_and_cache does; a token outside the blocks its sequence holds has no slot (vLLM's -1) and
is not stored. Blocks come from a shuffled free list, scattered through the pool as in a
long-running engine.
"""

from __future__ import annotations

import torch

from gpubench.lib.kvmath import KVLayout
from gpubench.lib.kvstorage import SequenceKV, TokenRows, empty_rows, held_bytes, tensor_scales


def held_blocks(length: int, window: int | None, block_size: int) -> tuple[int, int]:
    """(first logical block kept, blocks held) for a sequence of ``length`` tokens in one layer:
    every block from the one holding token 0 (a sliding layer: token length - window) to the one
    holding token length - 1."""
    if length <= 0:
        return 0, 0
    first = max(0, length - window) // block_size if window else 0
    return first, (length - 1) // block_size - first + 1


class PagedKVCache:
    allocator = "paged"

    def __init__(
        self,
        layout: KVLayout,
        lengths: list[int],
        block_size: int,
        device: torch.device,
        generator: torch.Generator | None = None,
    ):
        self.layout, self.block_size, self.lengths = layout, block_size, list(lengths)
        self.pools: list[TokenRows] = []
        self.first_block: list[list[int]] = []  # per layer, per sequence: first logical block kept
        self.block_tables: list[list[torch.Tensor]] = []  # per layer, per sequence: physical blocks
        self.scales = [tensor_scales(layout, device) for _ in range(layout.num_layers)]
        for window in layout.windows:
            held = [held_blocks(n, window, block_size) for n in lengths]
            counts = [count for _, count in held]
            free_list = torch.randperm(sum(counts), generator=generator).to(torch.int32)
            tables, start = [], 0
            for count in counts:
                tables.append(free_list[start : start + count].to(device).clone())
                start += count
            self.pools.append(empty_rows(layout, (sum(counts), block_size), device))
            self.first_block.append([first for first, _ in held])
            self.block_tables.append(tables)

    def _held(self, index: int, layer: int, start: int, end: int) -> tuple[int, int]:
        """The run lo..hi-1 of tokens start..end-1 that lies in blocks the sequence holds."""
        first = self.first_block[layer][index] * self.block_size
        held_end = first + len(self.block_tables[layer][index]) * self.block_size
        lo = min(max(start, first), end)
        return lo, max(lo, min(end, held_end))

    def _slots(self, index: int, layer: int, start: int, end: int) -> torch.Tensor:
        """Flat pool slots of tokens start..end-1 of a sequence (all in blocks it holds)."""
        table = self.block_tables[layer][index]
        tokens = torch.arange(start, end, device=table.device)
        blocks = table[tokens // self.block_size - self.first_block[layer][index]].long()
        return blocks * self.block_size + tokens % self.block_size

    @staticmethod
    def _flat_bytes(t: torch.Tensor) -> torch.Tensor:
        """(blocks, block_size, ...) -> (slots, ...) viewed as raw bytes: the copy is the same
        for every format, fp8 included (whose index kernels torch lacks on some devices)."""
        return t.view(-1, *t.shape[2:]).view(torch.uint8)

    def write(self, index: int, layer: int, rows: TokenRows, start: int = 0) -> None:
        """Store tokens start.. of a sequence; those outside its blocks have no slot and are dropped."""
        lo, hi = self._held(index, layer, start, start + rows.values.shape[0])
        slots = self._slots(index, layer, lo, hi)
        pool, part = self.pools[layer], slice(lo - start, hi - start)
        self._flat_bytes(pool.values).index_copy_(0, slots, rows.values[part].contiguous().view(torch.uint8))
        if rows.scales is not None:
            assert pool.scales is not None  # (rows with scales: a layout that keeps them)
            self._flat_bytes(pool.scales).index_copy_(0, slots, rows.scales[part].contiguous())

    def read(self, index: int, layer: int, start: int, end: int) -> TokenRows:
        """Tokens start..end-1 of a sequence, leaving out those outside its blocks (never stored)."""
        slots = self._slots(index, layer, *self._held(index, layer, start, end))
        pool = self.pools[layer]
        values = self._flat_bytes(pool.values).index_select(0, slots).view(pool.values.dtype)
        scales = None if pool.scales is None else self._flat_bytes(pool.scales).index_select(0, slots)
        return TokenRows(values, scales)

    def storage_bytes(self) -> int:
        return held_bytes(self.pools, self.scales)

    def metadata_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for tables in self.block_tables for t in tables)


def build_cache(
    layout: KVLayout,
    sequences: list[SequenceKV],
    *,
    max_len: int,
    block_size: int,
    device: torch.device,
    generator: torch.Generator | None = None,
) -> PagedKVCache:
    """Take the blocks each sequence needs (window-aware), then write each sequence's tokens
    through its block table. (``max_len`` is unused: nothing is reserved ahead.)"""
    cache = PagedKVCache(layout, [s.length for s in sequences], block_size, device, generator)
    for i, seq in enumerate(sequences):
        for layer, rows in enumerate(seq.layers):
            # Tokens in blocks the window already left are not kept; the rest is written.
            first_token = cache.first_block[layer][i] * block_size
            cache.write(
                i,
                layer,
                TokenRows(rows.values[first_token:], None if rows.scales is None else rows.scales[first_token:]),
                first_token,
            )
    return cache
