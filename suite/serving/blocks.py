"""KV-cache bookkeeping for the serving engine: which memory holds which sequence's tokens.

:class:`BlockManager` (paged): a fixed pool of ``block_size``-token blocks and a free list; a
sequence owns a block table that grows one block at a time as it generates, and gives every block
back when it finishes or is preempted. :class:`SlabAllocator` (contiguous): a fixed number of
``max_len``-token slabs; a sequence takes a whole slab when admitted, however short it turns out.

Both only count; the tensors live in :mod:`gpubench.serving.kv`. ``check()`` verifies the
invariants the engine relies on (every unit either free or owned by exactly one sequence, nothing
lost) and returns the problems found, so a run can record them instead of trusting them.
"""

from __future__ import annotations

from collections import deque


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token (got {num_blocks} x {block_size})")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.free: deque[int] = deque(range(num_blocks))
        self.tables: dict[int, list[int]] = {}

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_owned(self) -> int:
        return sum(len(t) for t in self.tables.values())

    def can_allocate(self, tokens: int) -> bool:
        return self.blocks_for(tokens) <= len(self.free)

    def allocate(self, seq: int, tokens: int) -> list[int]:
        """A new table covering ``tokens`` for a sequence that owns none."""
        if seq in self.tables:
            raise ValueError(f"sequence {seq} already owns blocks")
        need = self.blocks_for(tokens)
        if need > len(self.free):
            raise MemoryError(f"sequence {seq} needs {need} blocks, {len(self.free)} free")
        self.tables[seq] = [self.free.popleft() for _ in range(need)]
        return self.tables[seq]

    def ensure(self, seq: int, tokens: int) -> bool:
        """Grow the sequence's table to cover ``tokens``; False (and nothing taken) when the pool
        cannot."""
        table = self.tables[seq]
        if tokens <= len(table) * self.block_size:  # the common case: the last block has room
            return True
        need = self.blocks_for(tokens) - len(table)
        if need > len(self.free):
            return False
        table.extend(self.free.popleft() for _ in range(max(0, need)))
        return True

    def release(self, seq: int) -> None:
        self.free.extend(self.tables.pop(seq))

    def slot(self, seq: int, position: int) -> int:
        """Physical slot (block * block_size + offset) of a token position."""
        return self.tables[seq][position // self.block_size] * self.block_size + position % self.block_size

    def check(self) -> list[str]:
        problems = []
        seen: dict[int, int | None] = {}
        for b in self.free:
            if b in seen:
                problems.append(f"block {b} is on the free list twice")
            seen[b] = None
        for seq, table in self.tables.items():
            for b in table:
                if b in seen:
                    owner = seen[b]
                    problems.append(
                        f"block {b} owned by sequence {seq} is also "
                        + ("free" if owner is None else f"owned by sequence {owner}")
                    )
                seen[b] = seq
        bad = [b for b in seen if not 0 <= b < self.num_blocks]
        if bad:
            problems.append(f"blocks out of range: {bad[:5]}")
        missing = self.num_blocks - len(seen)
        if missing > 0:
            problems.append(f"{missing} blocks neither free nor owned (leaked)")
        return problems


class SlabAllocator:
    def __init__(self, num_slabs: int, max_len: int):
        if num_slabs < 1 or max_len < 1:
            raise ValueError(f"need at least one slab of at least one token (got {num_slabs} x {max_len})")
        self.num_slabs, self.max_len = num_slabs, max_len
        self.free: deque[int] = deque(range(num_slabs))
        self.owner: dict[int, int] = {}  # sequence -> slab

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def num_owned(self) -> int:
        return len(self.owner)

    def can_allocate(self, tokens: int) -> bool:
        return bool(self.free) and tokens <= self.max_len

    def allocate(self, seq: int, tokens: int) -> int:
        if seq in self.owner:
            raise ValueError(f"sequence {seq} already owns a slab")
        if not self.can_allocate(tokens):
            raise MemoryError(f"sequence {seq}: no free slab for {tokens} tokens")
        self.owner[seq] = self.free.popleft()
        return self.owner[seq]

    def ensure(self, seq: int, tokens: int) -> bool:
        return tokens <= self.max_len

    def release(self, seq: int) -> None:
        self.free.append(self.owner.pop(seq))

    def check(self) -> list[str]:
        problems = []
        slabs = list(self.free) + list(self.owner.values())
        if len(slabs) != len(set(slabs)):
            problems.append("a slab is free and owned, or owned twice")
        if len(set(slabs)) != self.num_slabs:
            problems.append(f"{self.num_slabs - len(set(slabs))} slabs neither free nor owned (leaked)")
        return problems
