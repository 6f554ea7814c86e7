"""The engine's KV cache: K and V of every layer in units of ``unit_tokens`` tokens, handed out
by an allocator from :mod:`gpubench.serving.blocks`, behind one interface (:class:`KVBackend`):
what the scheduler asks (admit, grow, release) and what the model runner asks (where a token's
K/V go, addressing of a step's decodes as host lists and then device tensors, attention of one
decoding token per sequence over its cache). Each layer writes a step's new K/V in one
index_copy_ per tensor.

- :class:`PagedKV`: ``block_size``-token blocks from one pool, found through block tables;
  decode attention (:mod:`gpubench.lib.paged_decode`) is the paged_attention pair's Triton kernel on CUDA,
  elsewhere one gather of every sequence's blocks through its table, then SDPA.
- :class:`ContiguousKV`: one ``max_len``-token slab per admitted request; decode attention is
  padded batch attention over the batch's slabs, as static caches do it.

Both are sized from the same budget in bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Generic, Protocol, TypeVar, cast

import torch

from gpubench.lib.paged_decode import gathered_decode, grouped_decode_sdpa, paged_decode_attention
from gpubench.models.llama import LlamaWeights
from gpubench.serving.blocks import BlockManager, SlabAllocator
from gpubench.serving.config import KV_LAYOUTS, EngineConfig
from gpubench.serving.sequence import Sequence


class Allocator(Protocol):
    """What :class:`BlockManager` and :class:`SlabAllocator` both offer: they only count."""

    @property
    def num_free(self) -> int: ...
    @property
    def num_owned(self) -> int: ...
    def can_allocate(self, tokens: int) -> bool: ...
    def allocate(self, seq: int, tokens: int) -> object: ...
    def ensure(self, seq: int, tokens: int) -> bool: ...
    def release(self, seq: int) -> None: ...
    def check(self) -> list[str]: ...


@dataclass(frozen=True)
class DecodeRows:
    """One step's decoding sequences as host lists (what the model runner stages to the device):
    each one's write slot, context length (its decoding token included) and addressing row."""

    slots: list[int]
    lens: list[int]
    rows: list[list[int]]  # paged: the block table padded to the widest; contiguous: [slab]


@dataclass(frozen=True)
class PagedDecode:
    block_tables: torch.Tensor  # (batch, widest table): int32 for the kernel; int64 on CPU, padded with block 0
    context_lens: torch.Tensor  # (batch,) int32, the decoding token included
    live: torch.Tensor | None = None  # CPU: (batch, table width * block_size) keys inside each context


@dataclass(frozen=True)
class ContiguousDecode:
    slabs: torch.Tensor  # (batch,) each sequence's slab
    width: int  # positions read per slab: the longest context (eager) or max_len (CUDA graphs)
    mask: torch.Tensor  # (batch, 1, 1, width): position within the sequence's own context


DecodeBatch = PagedDecode | ContiguousDecode
# The decode batch a backend makes and reads back (PagedKV: PagedDecode, ContiguousKV: ContiguousDecode).
BatchT = TypeVar("BatchT", PagedDecode, ContiguousDecode)


class KVBackend(ABC, Generic[BatchT]):
    layout: ClassVar[str]
    unit: ClassVar[str]  # what one unit is called in messages
    max_len: int  # the longest request, in tokens: sizes decode buffers (PagedKV: 0 where not given)
    fill: ClassVar[Callable[..., torch.Tensor]]

    def __init__(
        self,
        weights: LlamaWeights,
        budget_bytes: int,
        unit_tokens: int,
        allocator: Callable[[int], Allocator],
        spare_unit: bool = False,
    ):
        c = weights.config
        self.device = weights.device
        self.token_bytes = c.kv_bytes_per_token(weights.embed.element_size())
        self.unit_tokens = unit_tokens
        self.units = budget_bytes // (self.token_bytes * unit_tokens)
        if self.units < 1:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no {unit_tokens}-token {self.unit} "
                f"({self.token_bytes * unit_tokens} bytes)"
            )
        # A spare unit past the allocator's (CUDA graphs: a bucket's padding rows write there) is
        # outside the budget and never handed out.
        self.spare_unit = self.units if spare_unit else None
        shape = (self.units + spare_unit, unit_tokens, c.num_kv_heads, c.head_dim)
        fill = type(self).fill
        self.k = [fill(shape, dtype=weights.dtype, device=self.device) for _ in range(c.num_layers)]
        self.v = [fill(shape, dtype=weights.dtype, device=self.device) for _ in range(c.num_layers)]
        self.capacity_tokens = self.units * unit_tokens
        self.allocator = allocator(self.units)

    def spare(self) -> int:
        """The spare unit (padding rows write there); only a backend made with one has it."""
        if self.spare_unit is None:
            raise ValueError(f"this KV backend has no spare {self.unit} for padding rows (made without spare_unit)")
        return self.spare_unit

    # -- the scheduler's side -----------------------------------------------------------------
    def can_admit(self, seq: Sequence) -> bool:
        return self.allocator.can_allocate(len(seq.tokens))

    def admit(self, seq: Sequence) -> None:
        self.allocator.allocate(seq.id, len(seq.tokens))

    def reserve_next(self, seq: Sequence) -> bool:
        """Room for the sequence's next token; False (nothing taken) when there is none."""
        return self.allocator.ensure(seq.id, seq.cached + 1)

    def release(self, seq: Sequence) -> None:
        self.allocator.release(seq.id)

    def reserved_bytes(self) -> int:
        return self.allocator.num_owned * self.unit_tokens * self.token_bytes

    def problems(self, finished: bool = False) -> list[str]:
        """Broken accounting (a unit owned twice, or lost); ``finished``: also any unit not free."""
        problems = self.allocator.check()
        held = self.units - self.allocator.num_free
        if finished and held:
            problems.append(f"{held} {self.unit}s not free at the end")
        return problems

    # -- the model runner's side --------------------------------------------------------------
    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of a step's new tokens at their flat slots: one index_copy_ each."""
        self.k[layer].view(-1, *k.shape[1:]).index_copy_(0, slots, k)
        self.v[layer].view(-1, *v.shape[1:]).index_copy_(0, slots, v)

    @abstractmethod
    def slot_list(self, seq: Sequence, start: int, stop: int) -> list[int]:
        """Flat slots (unit * unit_tokens + offset) of the sequence's token positions ``start:stop``."""

    @abstractmethod
    def decode_rows(self, seqs: list[Sequence]) -> DecodeRows:
        """Host-side addressing of one decoding token (position ``cached``) per sequence."""

    @abstractmethod
    def padding_row(self, width: int) -> tuple[int, list[int]]:
        """Write slot and addressing row of a padding row (CUDA graph buckets): the spare unit."""

    @abstractmethod
    def decode_width(self) -> int:
        """Columns of an addressing row at the longest request (the static buffers of CUDA graphs)."""

    @abstractmethod
    def decode_batch(self, lens: torch.Tensor, rows: torch.Tensor, width: int) -> BatchT:
        """Device-side addressing of a step's decodes from its staged ``lens`` (batch,) and
        ``rows`` (batch, columns), built once per step for every layer; ``width``: the longest
        context (contiguous KV reads that many positions). No host sync (CUDA-graph safe)."""

    @abstractmethod
    def decode_attention(self, layer: int, q: torch.Tensor, batch: BatchT) -> torch.Tensor:
        """(batch, heads, head_dim) attention of each decoding query over its sequence's cache,
        its own token (already written) included."""


class PagedKV(KVBackend[PagedDecode]):
    """The pool is zeroed once, so every slot holds finite values (K/V written by some sequence,
    or 0): the CPU decode gathers whole blocks through the tables and masks what lies past each
    context in the scores (a NaN in never-written memory would survive that mask as 0 * NaN).
    The Triton kernel never reads past a context at all."""

    layout, unit, fill = "paged", "block", torch.zeros

    def __init__(
        self, weights: LlamaWeights, budget_bytes: int, block_size: int, max_len: int = 0, spare_unit: bool = False
    ):
        super().__init__(weights, budget_bytes, block_size, lambda n: BlockManager(n, block_size), spare_unit)
        self.block_size, self.max_len = block_size, max_len
        self.manager = cast(BlockManager, self.allocator)  # (the factory above makes a BlockManager)

    def slot_list(self, seq: Sequence, start: int, stop: int) -> list[int]:
        table, size = self.manager.tables[seq.id], self.block_size
        return [table[p // size] * size + p % size for p in range(start, stop)]

    def decode_rows(self, seqs: list[Sequence]) -> DecodeRows:
        tables = [self.manager.tables[s.id] for s in seqs]
        width = max(len(t) for t in tables)
        size = self.block_size
        slots = [t[s.cached // size] * size + s.cached % size for s, t in zip(seqs, tables)]
        return DecodeRows(slots, [s.cached + 1 for s in seqs], [t + [0] * (width - len(t)) for t in tables])

    def padding_row(self, width: int) -> tuple[int, list[int]]:
        spare = self.spare()
        return spare * self.block_size, [spare] * width

    def decode_width(self) -> int:
        return -(-self.max_len // self.block_size)

    def decode_batch(self, lens: torch.Tensor, rows: torch.Tensor, width: int) -> PagedDecode:
        if self.device.type == "cuda":  # the Triton kernel walks the tables itself
            return PagedDecode(rows.to(torch.int32), lens.to(torch.int32))
        live = torch.arange(rows.shape[1] * self.block_size)[None, :] < lens[:, None]
        return PagedDecode(rows, lens, live)

    def decode_attention(self, layer: int, q: torch.Tensor, batch: PagedDecode) -> torch.Tensor:
        if batch.live is None:
            return paged_decode_attention(q, self.k[layer], self.v[layer], batch.block_tables, batch.context_lens)
        return gathered_decode(q, self.k[layer], self.v[layer], batch.block_tables, batch.live)


class ContiguousKV(KVBackend[ContiguousDecode]):
    """Zeroed, as static caches are: the padded attention multiplies masked-out positions by
    probability 0, and 0 * (NaN left in never-written memory) would still be NaN."""

    layout, unit, fill = "contiguous", "slab", torch.zeros

    def __init__(self, weights: LlamaWeights, budget_bytes: int, max_len: int, spare_unit: bool = False):
        super().__init__(weights, budget_bytes, max_len, lambda n: SlabAllocator(n, max_len), spare_unit)
        self.max_len = max_len
        self.slabs = cast(SlabAllocator, self.allocator)  # (the factory above makes a SlabAllocator)

    def slot_list(self, seq: Sequence, start: int, stop: int) -> list[int]:
        base = self.slabs.owner[seq.id] * self.max_len
        return list(range(base + start, base + stop))

    def decode_rows(self, seqs: list[Sequence]) -> DecodeRows:
        slabs = [self.slabs.owner[s.id] for s in seqs]
        return DecodeRows(
            [slab * self.max_len + s.cached for s, slab in zip(seqs, slabs)],
            [s.cached + 1 for s in seqs],
            [[slab] for slab in slabs],
        )

    def padding_row(self, width: int) -> tuple[int, list[int]]:
        spare = self.spare()
        return spare * self.max_len, [spare]

    def decode_width(self) -> int:
        return 1

    def decode_batch(self, lens: torch.Tensor, rows: torch.Tensor, width: int) -> ContiguousDecode:
        live = torch.arange(width, device=lens.device)[None, :] < lens[:, None]  # (batch, width)
        return ContiguousDecode(rows[:, 0], width, live[:, None, None, :])

    def decode_attention(self, layer: int, q: torch.Tensor, batch: ContiguousDecode) -> torch.Tensor:
        """Read the batch's slabs up to the longest context, mask each row past its own length."""
        keys = self.k[layer][batch.slabs, : batch.width]  # (batch, width, kv_heads, d)
        values = self.v[layer][batch.slabs, : batch.width]
        return grouped_decode_sdpa(q, keys.transpose(1, 2), values.transpose(1, 2), batch.mask)


def make_kv(weights: LlamaWeights, config: EngineConfig, spare_unit: bool = False) -> KVBackend:
    """The backend ``config.kv`` names; ``spare_unit``: one unit more, outside the budget, where
    the padding rows of CUDA-graph buckets write."""
    if config.kv == "paged":
        return PagedKV(weights, config.kv_budget_bytes, config.block_size, config.max_len, spare_unit)
    if config.kv == "contiguous":
        return ContiguousKV(weights, config.kv_budget_bytes, config.max_len, spare_unit)
    raise ValueError(f"kv layout {config.kv!r} is not one of {KV_LAYOUTS}")
