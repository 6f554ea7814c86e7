"""The engine's KV cache: K and V of every layer in units of ``unit_tokens`` tokens, handed out
by an allocator from :mod:`gpubench.serving.blocks`, behind one interface (:class:`KVBackend`):
what the scheduler asks (admit, grow, release) and what the model runner asks (where a token's
K/V go, attention of one decoding token per sequence over its cache).

- :class:`PagedKV`: ``block_size``-token blocks from one pool, found through block tables;
  decode attention is :func:`gpubench.optimizations.paged_attention.paged_decode_attention`.
- :class:`ContiguousKV`: one ``max_len``-token slab per admitted request; decode attention is
  padded batch attention over the batch's slabs, as static caches do it.

Both are sized from the same budget in bytes.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, ClassVar, Protocol

import torch
import torch.nn.functional as F

from gpubench.models.llama import LlamaWeights
from gpubench.optimizations.paged_attention import paged_decode_attention
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
class DecodeBatch:
    """Where the decoding tokens of one step go: a flat slot (unit * unit_tokens + offset) each."""

    slots: torch.Tensor


@dataclass(frozen=True)
class PagedDecode(DecodeBatch):
    block_tables: torch.Tensor  # (batch, widest table) int32, padded with block 0 (never read)
    context_lens: torch.Tensor  # (batch,) int32, the decoding token included


@dataclass(frozen=True)
class ContiguousDecode(DecodeBatch):
    slabs: torch.Tensor  # (batch,) each sequence's slab
    width: int  # the longest context of the batch
    mask: torch.Tensor  # (batch, 1, 1, width): position within the sequence's own context


class KVBackend(ABC):
    layout: ClassVar[str]
    unit: ClassVar[str]  # what one unit is called in messages
    fill: ClassVar[Callable[..., torch.Tensor]]

    def __init__(self, weights: LlamaWeights, budget_bytes: int, unit_tokens: int,
                 allocator: Callable[[int], Allocator]):
        c = weights.config
        self.device = weights.device
        self.token_bytes = c.kv_bytes_per_token(weights.embed.element_size())
        self.unit_tokens = unit_tokens
        self.units = budget_bytes // (self.token_bytes * unit_tokens)
        if self.units < 1:
            raise ValueError(f"a KV budget of {budget_bytes} bytes holds no {unit_tokens}-token {self.unit} "
                             f"({self.token_bytes * unit_tokens} bytes)")
        shape = (self.units, unit_tokens, c.num_kv_heads, c.head_dim)
        fill = type(self).fill
        self.k = [fill(shape, dtype=weights.dtype, device=self.device) for _ in range(c.num_layers)]
        self.v = [fill(shape, dtype=weights.dtype, device=self.device) for _ in range(c.num_layers)]
        self.capacity_tokens = self.units * unit_tokens
        self.allocator = allocator(self.units)

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
        """Store the K/V of tokens at flat slot indices."""
        self.k[layer].view(-1, *k.shape[1:])[slots] = k
        self.v[layer].view(-1, *v.shape[1:])[slots] = v

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the tokens at flat slot indices."""
        return self.k[layer].flatten(0, 1)[slots], self.v[layer].flatten(0, 1)[slots]

    @abstractmethod
    def slots(self, seq: Sequence, start: int, stop: int) -> torch.Tensor:
        """Flat slots of the sequence's token positions ``start:stop``."""

    @abstractmethod
    def prepare_decode(self, seqs: list[Sequence]) -> DecodeBatch:
        """Slots and addressing for one decoding token (position ``cached``) per sequence."""

    @abstractmethod
    def decode_attention(self, layer: int, q: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        """(batch, heads, head_dim) attention of each decoding query over its sequence's cache,
        its own token (already written) included."""


class PagedKV(KVBackend):
    """The pool is torch.empty, as an engine's is: slots nobody wrote must never be read as data
    (the decode paths mask them)."""

    layout, unit, fill = "paged", "block", torch.empty

    def __init__(self, weights: LlamaWeights, budget_bytes: int, block_size: int):
        super().__init__(weights, budget_bytes, block_size, lambda n: BlockManager(n, block_size))
        self.block_size = block_size
        self.manager: BlockManager = self.allocator

    def slots(self, seq: Sequence, start: int, stop: int) -> torch.Tensor:
        table = torch.tensor(self.manager.tables[seq.id], dtype=torch.long)
        pos = torch.arange(start, stop)
        return (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(self.device)

    def prepare_decode(self, seqs: list[Sequence]) -> PagedDecode:
        tables = [self.manager.tables[s.id] for s in seqs]
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        slots = torch.tensor([self.manager.slot(s.id, s.cached) for s in seqs], dtype=torch.long)
        lens = torch.tensor([s.cached + 1 for s in seqs], dtype=torch.int32)
        return PagedDecode(slots.to(self.device), block_tables.to(self.device), lens.to(self.device))

    def decode_attention(self, layer: int, q: torch.Tensor, batch: PagedDecode) -> torch.Tensor:
        return paged_decode_attention(q, self.k[layer], self.v[layer], batch.block_tables, batch.context_lens)


class ContiguousKV(KVBackend):
    """Zeroed, as static caches are: the padded attention multiplies masked-out positions by
    probability 0, and 0 * (NaN left in never-written memory) would still be NaN."""

    layout, unit, fill = "contiguous", "slab", torch.zeros

    def __init__(self, weights: LlamaWeights, budget_bytes: int, max_len: int):
        super().__init__(weights, budget_bytes, max_len, lambda n: SlabAllocator(n, max_len))
        self.max_len = max_len
        self.slabs: SlabAllocator = self.allocator

    def slots(self, seq: Sequence, start: int, stop: int) -> torch.Tensor:
        return (self.slabs.owner[seq.id] * self.max_len + torch.arange(start, stop)).to(self.device)

    def prepare_decode(self, seqs: list[Sequence]) -> ContiguousDecode:
        slabs = torch.tensor([self.slabs.owner[s.id] for s in seqs], dtype=torch.long)
        pos = torch.tensor([s.cached for s in seqs], dtype=torch.long)
        width = int(pos.max()) + 1
        live = torch.arange(width)[None, :] <= pos[:, None]  # (batch, width)
        return ContiguousDecode((slabs * self.max_len + pos).to(self.device), slabs.to(self.device), width,
                                live[:, None, None, :].to(self.device))

    def decode_attention(self, layer: int, q: torch.Tensor, batch: ContiguousDecode) -> torch.Tensor:
        """Read the batch's slabs up to the longest context, mask each row past its own length."""
        keys = self.k[layer][batch.slabs, :batch.width]  # (batch, width, kv_heads, d)
        values = self.v[layer][batch.slabs, :batch.width]
        group = q.shape[1] // keys.shape[2]
        keys = keys.transpose(1, 2).repeat_interleave(group, dim=1)  # (batch, heads, width, d)
        values = values.transpose(1, 2).repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=batch.mask)
        return out[:, :, 0, :]


def make_kv(weights: LlamaWeights, config: EngineConfig) -> KVBackend:
    if config.kv == "paged":
        return PagedKV(weights, config.kv_budget_bytes, config.block_size)
    if config.kv == "contiguous":
        return ContiguousKV(weights, config.kv_budget_bytes, config.max_len)
    raise ValueError(f"kv layout {config.kv!r} is not one of {KV_LAYOUTS}")
