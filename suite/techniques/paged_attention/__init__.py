"""paged_attention: one decode step over a paged KV cache, gathering each sequence's blocks into a
contiguous copy first (``gather``) against reading K/V through the block table in place (the
Triton kernel on CUDA, ``torch_blocks`` standing in elsewhere), checked against float64 attention.
Peers: SDPA over a contiguous cache (``sdpa_contiguous``, no paging at all) and FlashInfer's paged
decode (``flashinfer``, where it is installed and the device is CUDA).

A case's sequences have mixed context lengths (drawn in [1, context_len], the longest set to
context_len, or ``edges``: at and around block edges), their blocks shuffled through a pool with
spare ones, and every slot of the pool holds random data: a read through a wrong block or past a
context's end changes the result. The check takes the worst sequence, so a fault in one long
context is not diluted by the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gpubench.baselines.paged_attention import paged_decode_attention as gather_then_attend
from gpubench.contract import (
    Bench,
    CheckResult,
    Claim,
    Measured,
    Param,
    Plot,
    Technique,
    Workload,
    relative_l2_check,
    tensors_check,
)
from gpubench.lib import gqa
from gpubench.lib.attention import attention_flops
from gpubench.lib.gqa import head_params, head_problems
from gpubench.lib.kvmath import block_edge_lengths
from gpubench.lib.optional import optional_import
from gpubench.lib.paged_decode import KERNEL, decode_token_slots, grouped_decode_sdpa
from gpubench.lib.triton_support import interpreter_note, kernel_module, kernel_problem
from gpubench.optimizations.paged_attention import paged_decode_attention_torch
from gpubench.records.claims import VLLM

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Blocks in the pool beyond those the sequences hold, as a fraction of those (at least one): the
# free blocks of a running engine, and the targets of any read through a wrong table entry.
SPARE_BLOCK_FRACTION = 0.25

TECHNIQUE = Technique(
    name="paged_attention",
    shape="kernel",
    summary="Decode attention reading K/V through the block table in place, instead of gathering "
    "each sequence's blocks into a contiguous copy first.",
    anchor="vLLM: KV memory waste under 4% (vs 60-80% for contiguous reservation); 2-4x throughput",
    claims=[
        Claim(
            *VLLM,
            text="2-4x serving throughput with PagedAttention",
            figure=(2.0, 4.0),
            measures="serving throughput, paged KV vs contiguous reservation",
            conditions="OPT-13B to 175B and LLaMA-13B on A100s, ShareGPT and Alpaca traces",
            not_measured="this pair times decode attention alone; vLLM's 2-4x comes from the larger "
            "batches paging allows (paged_kv_serving measures that)",
        )
    ],
    gpu_specific=(
        "The win is HBM traffic: decode is memory-bound, and the gather writes every KV byte into a "
        "copy and reads it back, where the Triton kernel reads each byte once (once per KV head's "
        "whole query group, long contexts split across SMs). On a CPU the optimized role is played "
        "by torch_blocks, the kernel's logic as vectorized PyTorch; both sides run largely from "
        "caches, so the CPU ratio says little about a GPU's."
    ),
    params=[
        Param("batch", int, 4, "sequences decoding one token each (lengths: random or full)", min=1),
        *head_params(heads=8),
        Param("head_dim", int, 64, "channels per head", choices=[64, 128]),
        Param("context_len", int, 512, "longest context (tokens); the others are drawn in [1, this]", min=1),
        Param("block_size", int, 16, "tokens per KV block", choices=[8, 16, 32]),
        Param(
            "lengths",
            str,
            "random",
            "random: `batch` contexts in [1, context_len]; full: all `batch` at "
            "context_len (a bandwidth test: every split busy); edges: one sequence per length at and around "
            "block edges (1, B-1, B, B+1, 2B-1, .., context_len)",
            choices=["random", "full", "edges"],
        ),
        Param(
            "dtype",
            str,
            "float32",
            "dtype of q, the KV cache and the output",
            choices=["float32", "float16", "bfloat16"],
        ),
    ],
    plots=[
        Plot(
            "Decode bandwidth (GB/s, each KV byte counted once) against the longest context",
            y="gbps",
            x="context_len",
            ylabel="GB/s",
        ),
        Plot("Time per decode step (ms) against batch", y="time", x="batch", scale=1e3, ylabel="ms per step"),
    ],
    benchmarks=[Bench("4-seqs-512", {"batch": 4, "heads": 8, "kv_heads": 2, "context_len": 512})],
)


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

    def args(self) -> tuple[torch.Tensor, ...]:
        return self.q, self.k_cache, self.v_cache, self.block_tables, self.context_lens


TECHNIQUE.validate(head_problems)


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


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> PagedDecodeWorkload:
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
    move = dict(device=device, dtype=DTYPES[params["dtype"]])
    k_cache, v_cache = k_cache.to(**move), v_cache.to(**move)
    context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    (contiguous_k, contiguous_v), mask = contiguous_copy(k_cache, v_cache, tables.to(device), context_lens, max(lens))
    return PagedDecodeWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        q=q.to(**move),
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=tables.to(device),
        context_lens=context_lens,
        lens=lens,
        reference_tables=tables.clone(),
        triton_out=torch.full((batch, heads, dim), float("nan"), **move),
        torch_out=torch.full((batch, heads, dim), float("nan"), **move),
        contiguous_k=contiguous_k,
        contiguous_v=contiguous_v,
        contiguous_mask=mask,
    )


def contiguous_copy(
    k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, context_lens: torch.Tensor, longest: int
) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
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


# -- variants ---------------------------------------------------------------------------------


@TECHNIQUE.variant("gather", role="baseline")
def gather(w: PagedDecodeWorkload) -> torch.Tensor:
    """gather each sequence's blocks into a contiguous copy, then masked eager attention"""
    return gather_then_attend(*w.args())


@TECHNIQUE.variant(
    "triton",
    role="optimized",
    unavailable=lambda device: kernel_problem(KERNEL[0], device, interpreter_ok=True),
    checked_only=interpreter_note(KERNEL[0]),
)
def triton_kernel(w: PagedDecodeWorkload) -> torch.Tensor:
    """the Triton kernels: one program per (sequence, KV head, context split) loads each K/V tile once for its
    whole query-head group (tensor-core dots), a second kernel combines the splits"""
    return getattr(kernel_module(KERNEL[0]), KERNEL[1])(*w.args(), out=w.triton_out)


@TECHNIQUE.variant("torch_blocks", role="optimized")
def torch_blocks(w: PagedDecodeWorkload) -> torch.Tensor:
    """the kernel's logic as vectorized PyTorch: chunks of many blocks, one grouped softmax each, merged by
    log-sum-exp (stands in where the kernel cannot run)"""
    return paged_decode_attention_torch(*w.args(), out=w.torch_out)


@TECHNIQUE.variant("sdpa_contiguous")
def sdpa_contiguous(w: PagedDecodeWorkload) -> torch.Tensor:
    """torch SDPA over the same keys in a contiguous (batch, kv_heads, longest, d) cache (copied outside the timed
    call), the query-head group as rows, padding masked: no paging at all, an upper bound for a paged kernel when
    contexts are equal (with mixed lengths it also reads the padding)"""
    return grouped_decode_sdpa(w.q, w.contiguous_k, w.contiguous_v, w.contiguous_mask)


def _flashinfer_unavailable(device: torch.device, params: dict[str, Any] | None = None) -> str | None:
    if torch.device(device).type != "cuda":
        return "FlashInfer's kernels need CUDA"
    if params is not None and params.get("dtype") == "float32":
        return "FlashInfer's paged decode takes fp16 / bf16 caches, not float32"
    imported = optional_import("flashinfer")
    return imported if isinstance(imported, str) else None


def flashinfer_wrapper(w: PagedDecodeWorkload) -> Any:
    """FlashInfer's BatchDecodeWithPagedKVCacheWrapper planned for the workload's tables (plan()
    is the host-side scheduling a server does once per step, outside the timed call)."""
    flashinfer = optional_import("flashinfer")
    _, heads, head_dim = w.q.shape
    _, block_size, kv_heads, _ = w.k_cache.shape
    counts = [-(-n // block_size) for n in w.lens]
    tables = w.block_tables.cpu()
    indices = torch.cat([tables[b, :c] for b, c in enumerate(counts)]).to(device=w.device, dtype=torch.int32)
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=w.device)
    last = torch.tensor([n - (c - 1) * block_size for n, c in zip(w.lens, counts)], dtype=torch.int32, device=w.device)
    workspace = torch.zeros(128 << 20, dtype=torch.uint8, device=w.device)
    # Tensor-core decode for groups above 4 query heads per KV head, as vLLM chooses it.
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=heads // kv_heads > 4)
    wrapper.plan(
        indptr,
        indices,
        last,
        heads,
        kv_heads,
        head_dim,
        block_size,
        q_data_type=w.q.dtype,
        kv_data_type=w.k_cache.dtype,
        sm_scale=head_dim**-0.5,
    )
    return wrapper


@TECHNIQUE.variant("flashinfer", unavailable=_flashinfer_unavailable)
def flashinfer_decode(w: PagedDecodeWorkload) -> torch.Tensor:
    """FlashInfer's paged decode (BatchDecodeWithPagedKVCacheWrapper, NHD pages read through the same block
    table; plan() on the first, checked call, never timed)"""
    if w.flashinfer_decode is None:
        w.flashinfer_decode = flashinfer_wrapper(w)
    return w.flashinfer_decode.run(w.q, (w.k_cache, w.v_cache))


# -- correctness ------------------------------------------------------------------------------


@TECHNIQUE.reference
def reference(w: PagedDecodeWorkload) -> torch.Tensor:
    """Attention in float64 over each sequence's keys and values, gathered through the block
    table as built."""
    q = w.q.to(torch.float64)
    batch, heads, head_dim = q.shape
    block_size, kv_heads = w.k_cache.shape[1], w.k_cache.shape[2]
    out = torch.empty_like(q)
    for b, n in enumerate(w.lens):
        blocks = w.reference_tables[b, : -(-n // block_size)].to(device=w.k_cache.device, dtype=torch.long)
        k, v = (cache[blocks].flatten(0, 1)[:n].to(torch.float64) for cache in (w.k_cache, w.v_cache))
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))  # (n, heads, dim)
        scores = torch.einsum("hd,nhd->hn", q[b], k) * head_dim**-0.5
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)
    return out


@TECHNIQUE.check
def check(reference_out: torch.Tensor, output: torch.Tensor) -> CheckResult:
    """Each sequence's output against the reference's: the worst relative L2 error. (Over the
    whole batch, short contexts, whose outputs average few values and are large, would hide an
    error in a long one.)"""
    if not isinstance(output, torch.Tensor) or output.shape != reference_out.shape:
        return relative_l2_check(reference_out, output)  # names what is wrong with it
    return tensors_check(
        {f"sequence {b}": r for b, r in enumerate(reference_out)},
        {f"sequence {b}": o for b, o in enumerate(output)},
        dtype=output.dtype,
    )


# -- metrics ----------------------------------------------------------------------------------


def decode_bytes(lens: list[int], kv_heads: int, head_dim: int, element_size: int, q_numel: int) -> int:
    """Least memory traffic of one decode step: each context's K and V read once, q read, the
    output (shaped like q) written. Block tables and lengths are left out (a few bytes per block)."""
    return sum(lens) * kv_heads * head_dim * 2 * element_size + 2 * q_numel * element_size


@TECHNIQUE.metrics
def metrics(w: PagedDecodeWorkload, measured: Measured) -> dict[str, Any]:
    _, _, kv_heads, head_dim = w.k_cache.shape
    return {
        "bytes_moved": decode_bytes(w.lens, kv_heads, head_dim, w.k_cache.element_size(), w.q.numel()),
        # Two matmuls per query head over its context (q.k and p.v), as flash attention counts them:
        # about heads / kv_heads FLOPs per byte of 16-bit KV, far below any GPU's ridge point.
        "flops": sum(attention_flops(1, w.q.shape[1], 1, n, head_dim, head_dim, False) for n in w.lens),
        "tokens_per_s": len(w.lens) / measured.median_s,  # one new token per sequence per step
        "context_tokens": sum(w.lens),
        "sequences": len(w.lens),
    }
