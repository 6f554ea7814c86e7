"""paged_attention's workload: :class:`PagedDecodeWorkload` (one decode step's query, a pool of
random blocks, the block tables and context lengths, the same keys as a contiguous cache, the
variants' output buffers), the context lengths a case draws, the shuffled block tables
(:func:`build_block_tables`) and :func:`build_workload`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gpubench.contract import Workload
from gpubench.lib import gqa
from gpubench.lib.kvmath import block_edge_lengths
from gpubench.lib.paged_decode import decode_token_slots

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Blocks in the pool beyond those the sequences hold, as a fraction of those (at least one): the
# free blocks of a running engine, and the targets of any read through a wrong table entry.
SPARE_BLOCK_FRACTION = 0.25


@dataclass(kw_only=True)
class PagedDecodeWorkload(Workload):
    q: torch.Tensor  # (batch, heads, head_dim)
    k_cache: torch.Tensor  # (num_blocks, block_size, kv_heads, head_dim)
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # (batch, max_blocks) int32
    context_lens: torch.Tensor  # (batch,) int32
    lens: list[int]  # context_lens on the host
    # The table as built, for the reference only: a variant given a corrupted block_tables is
    # then checked against what the sequences really hold.
    reference_tables: torch.Tensor
    # Where triton and torch_blocks write, one buffer each (the harness checks every variant's
    # output after all have run). NaN until their first (checked) call, so an element a variant
    # never writes fails the check instead of inheriting a correct value from memory.
    triton_out: torch.Tensor
    torch_out: torch.Tensor
    # The same keys and values as a contiguous (batch, kv_heads, longest context, head_dim) cache,
    # zero past each context, and its mask (batch, 1, 1, longest): sdpa_contiguous's input, copied
    # here so the copy is never timed.
    contiguous_k: torch.Tensor
    contiguous_v: torch.Tensor
    contiguous_mask: torch.Tensor
    # FlashInfer's decode wrapper, planned on the flashinfer variant's first (checked) call.
    flashinfer_decode: Any = field(default=None, repr=False)

    def args(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.context_lens


def draw_context_lens(batch: int, context_len: int, gen: torch.Generator) -> list[int]:
    """Mixed lengths in [1, context_len]; the longest is context_len, so the case's longest context
    (and the block table's width) is the parameter."""
    lens = torch.randint(1, context_len + 1, (batch,), generator=gen)
    lens[int(lens.argmax())] = context_len
    return lens.tolist()


def build_block_tables(lens: list[int], block_size: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """(block_tables, num_blocks): every sequence gets ceil(len / block_size) blocks from a
    shuffled pool that also holds spare blocks; entries past a sequence's last block name spare
    blocks (never read by a correct kernel)."""
    counts = [-(-n // block_size) for n in lens]
    needed = sum(counts)
    spare = max(1, int(needed * SPARE_BLOCK_FRACTION))
    pool = torch.randperm(needed + spare, generator=gen).to(torch.int32)
    used, free = pool[:needed], pool[needed:]
    width = max(counts)
    tables = torch.empty(len(lens), width, dtype=torch.int32)
    start = 0
    for b, count in enumerate(counts):
        tables[b, :count] = used[start : start + count]
        tables[b, count:] = free[torch.randint(0, len(free), (width - count,), generator=gen)]
        start += count
    return tables, needed + spare


def build_workload(params: dict[str, Any], device: torch.device, seed: int) -> PagedDecodeWorkload:
    """A case's decode step: its contexts (drawn, full or at block edges), their blocks shuffled
    through a pool of random data, and every variant's input and output buffer."""
    device = torch.device(device)
    batch, heads, dim, block_size = params["batch"], params["heads"], params["head_dim"], params["block_size"]
    kv_heads = gqa.kv_heads(params)
    gen = torch.Generator().manual_seed(seed)
    if params["lengths"] == "edges":
        lens = block_edge_lengths(block_size, params["context_len"])
        batch = len(lens)
    elif params["lengths"] == "full":
        lens = [params["context_len"]] * batch
    else:
        lens = draw_context_lens(batch, params["context_len"], gen)
    tables, num_blocks = build_block_tables(lens, block_size, gen)
    # Drawn on the CPU in float32, then moved: the same values on every device. Every slot of the
    # pool is random (spare blocks and the tail of each last block included), never zeros.
    q = torch.randn(batch, heads, dim, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    dtype = DTYPES[params["dtype"]]
    k_cache, v_cache = k_cache.to(device=device, dtype=dtype), v_cache.to(device=device, dtype=dtype)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    (contiguous_k, contiguous_v), mask = contiguous_copy(k_cache, v_cache, tables.to(device), context_lens, max(lens))
    return PagedDecodeWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        q=q.to(device=device, dtype=dtype),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables.to(device),
        context_lens=context_lens,
        lens=lens,
        reference_tables=tables.clone(),
        triton_out=torch.full((batch, heads, dim), float("nan"), device=device, dtype=dtype),
        torch_out=torch.full((batch, heads, dim), float("nan"), device=device, dtype=dtype),
        contiguous_k=contiguous_k,
        contiguous_v=contiguous_v,
        contiguous_mask=mask,
    )


def contiguous_copy(
    k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, context_lens: torch.Tensor, longest: int
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """((k, v), mask): the sequences' keys and values as (batch, kv_heads, longest, head_dim),
    zero past each context, and the (batch, 1, 1, longest) mask of live keys."""
    _, block_size, kv_heads, head_dim = k_cache.shape
    slots, live = decode_token_slots(tables, context_lens, block_size)
    slots, live = slots[:, :longest], live[:, :longest]
    copies = tuple(
        cache.reshape(-1, kv_heads, head_dim)[slots]
        .masked_fill(~live[:, :, None, None], 0.0)
        .transpose(1, 2)
        .contiguous()
        for cache in (k_cache, v_cache)
    )
    return copies, live[:, None, None, :]
