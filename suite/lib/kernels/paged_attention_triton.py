"""Paged decode attention as Triton kernels, GQA-aware and split over the context (flash-decoding).

One program per (sequence, KV head, context split): it loads each K/V tile of its split's token
range once, straight from the pool through the block table, for all query heads of its group
(the group's queries as one zero-padded tile of at least 16 rows, so scores and P @ V are
tensor-core dots), and keeps an fp32 online softmax. With one split it writes the output; with
several it writes its split's (max, sum, unnormalized acc) to fp32 scratch and a small second
kernel combines the splits per (sequence, query head) by log-sum-exp rescaling. The split count
comes from batch x KV heads against the SM count and the table's width (a minimum of tokens per
split, so short contexts do not split). Any strides, block sizes 1..256 (smaller or larger than a
step), head_dim up to 256 (padded to a power of two and masked), fp16 / bf16 / fp32.

Designed for memory-bound decode on Hopper-class GPUs (each KV byte read once per step, enough
programs to fill the SMs at small batch x long context); its speed is unmeasured on a GPU so
far. Runs under Triton's interpreter (``TRITON_INTERPRET=1`` before import) on CPU tensors, for
tests.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from gpubench.lib.paged_decode import check_shapes
from gpubench.lib.triton_support import interpreted

INTERPRETED = interpreted()  # fixed when the kernels below are decorated

# tl.dot needs at least 16 rows, 16 columns and a 16-deep reduction.
MIN_DOT = 16
# The dtypes whose tiles go to tl.dot as they are (tensor cores; fp32 as IEEE fp32).
DOT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Keys per loop step for head_dim up to 128 (64 x 128 bf16 K and V tiles, 16 KiB each) and above
# (32 x 256); a power of two either way.
TOKENS_PER_STEP = 64
TOKENS_PER_STEP_WIDE = 32
# Warps per decode program. Compiled for sm_90 as the JIT specializes it (unit strides, 16-byte
# aligned pointers), bf16 group 4 d128 with 64-token steps takes 108 registers a thread, so four
# programs fit an SM at once (64 K registers).
NUM_WARPS = 4
# Split choice: about two waves of those four programs per SM (mixed context lengths then balance
# across SMs), but never a split shorter than MIN_SPLIT_TOKENS (its partial's write and the reduce
# would cost more than its keys), nor more than MAX_SPLITS (the reduce and the scratch stay small).
PROGRAMS_PER_SM = 8
MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 64
# The SM count the interpreter plans with (an H100 / H200's 132), so tests see GPU-like splits.
INTERPRETER_SM_COUNT = 132
# Splits the reduce kernel folds per loop step.
REDUCE_SPLITS_PER_STEP = 16
REDUCE_NUM_WARPS = 4


@triton.jit
def _paged_decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    tables_ptr,
    lens_ptr,
    out_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    scale_log2e,
    split_tokens,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kn,
    stride_ks,
    stride_kh,
    stride_kd,
    stride_vn,
    stride_vs,
    stride_vh,
    stride_vd,
    stride_tb,
    stride_tj,
    stride_ob,
    stride_oh,
    stride_od,
    stride_pb,
    stride_ph,
    stride_ps,  # the partials' (batch, head, split); acc adds a dense dim
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    TOKENS: tl.constexpr,
    ONE_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    context_len = tl.load(lens_ptr + seq)
    split_start = split * split_tokens
    split_end = tl.minimum(split_start + split_tokens, context_len)  # <= start: an empty split

    rows = tl.arange(0, GROUP_PAD)
    row_ok = rows < GROUP
    heads = kv_head * GROUP + rows  # the query heads of this KV head's group
    dims = tl.arange(0, DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=row_ok[:, None] & dim_ok[None, :],
        other=0.0,
    )
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    m = tl.full((GROUP_PAD,), float("-inf"), tl.float32)  # running max of the scores (log2 units)
    l = tl.zeros((GROUP_PAD,), tl.float32)  # running softmax denominator
    acc = tl.zeros((GROUP_PAD, DIM_PAD), tl.float32)  # running sum of p * v

    offs = tl.arange(0, TOKENS)
    for start in range(split_start, split_end, TOKENS):
        # Logical position -> (table entry, slot in block), token by token, so a block may be
        # smaller or larger than a step. Positions past the split are masked: a table entry past
        # the sequence's last block is never read (it may hold anything), nor is its slot.
        token = start + offs
        live = token < split_end
        block = tl.load(tables_ptr + seq * stride_tb + (token // BLOCK_SIZE) * stride_tj, mask=live, other=0)
        block = block.to(tl.int64)  # int64: offsets in a big pool pass 2^31 elements
        slot = token % BLOCK_SIZE
        both = live[:, None] & dim_ok[None, :]
        krow = block * stride_kn + slot * stride_ks + kv_head * stride_kh
        k = tl.load(k_ptr + krow[:, None] + dims[None, :] * stride_kd, mask=both, other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)
        # Scores of the whole group against this tile, in fp32; scale * log2(e) applied after the
        # dot (not folded into a 16-bit q, which would round it).
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
        s = tl.where(live[None, :], s, float("-inf"))

        # Online softmax. Every step holds at least one live key, so m_new is finite and the
        # masked keys' exp2(-inf) is a clean 0 (padded rows score 0 and are never stored).
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)

        vrow = block * stride_vn + slot * stride_vs + kv_head * stride_vh
        v = tl.load(v_ptr + vrow[:, None] + dims[None, :] * stride_vd, mask=both, other=0.0)
        p = p.to(v.dtype)  # 16-bit tensor-core inputs for P @ V, as flash attention does
        if DOT_IN_FP32:
            p = p.to(tl.float32)
            v = v.to(tl.float32)
        acc = tl.dot(p, v, acc * alpha[:, None], input_precision=DOT_PRECISION)
        m = m_new

    if ONE_SPLIT:
        # A context of 0 tokens leaves l = 0: zeros rather than 0 / 0.
        out = tl.where(l[:, None] > 0, acc / tl.maximum(l, 1e-30)[:, None], 0.0)
        tl.store(
            out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty),
            mask=row_ok[:, None] & dim_ok[None, :],
        )
    else:
        # An empty split stores (-inf, 0, 0): the reduce gives it weight 0.
        part = seq * stride_pb + heads * stride_ph + split * stride_ps
        tl.store(m_ptr + part, m, mask=row_ok)
        tl.store(l_ptr + part, l, mask=row_ok)
        tl.store(acc_ptr + part[:, None] * DIM_PAD + dims[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _paged_decode_reduce_kernel(
    m_ptr,
    l_ptr,
    acc_ptr,
    out_ptr,
    num_splits,
    stride_pb,
    stride_ph,
    stride_ps,
    stride_ob,
    stride_oh,
    stride_od,
    HEAD_DIM: tl.constexpr,
    DIM_PAD: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    SPLITS_PER_STEP: tl.constexpr,
):
    """One program per (sequence, query head): out = sum_s acc_s 2^(m_s - M) / sum_s l_s 2^(m_s - M),
    M the largest split max."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    base = seq * stride_pb + head * stride_ph
    every = tl.arange(0, SPLITS_PAD)
    top = tl.max(tl.load(m_ptr + base + every * stride_ps, mask=every < num_splits, other=float("-inf")), 0)
    # All splits empty (context 0): shift by 0 so every weight is exp2(-inf) = 0, never NaN.
    top = tl.where(top == float("-inf"), 0.0, top)

    dims = tl.arange(0, DIM_PAD)
    total = tl.zeros((DIM_PAD,), tl.float32)
    denom = 0.0
    offs = tl.arange(0, SPLITS_PER_STEP)
    for first in range(0, num_splits, SPLITS_PER_STEP):
        splits = first + offs
        ok = splits < num_splits
        part = base + splits * stride_ps
        weight = tl.exp2(tl.load(m_ptr + part, mask=ok, other=float("-inf")) - top)
        denom += tl.sum(tl.load(l_ptr + part, mask=ok, other=0.0) * weight, 0)
        acc = tl.load(acc_ptr + part[:, None] * DIM_PAD + dims[None, :], mask=ok[:, None], other=0.0)
        total += tl.sum(acc * weight[:, None], 0)

    out = tl.where(denom > 0, total / tl.maximum(denom, 1e-30), 0.0)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
        out.to(out_ptr.dtype.element_ty),
        mask=dims < HEAD_DIM,
    )


@functools.cache
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors the split count plans for: the device's, or the interpreter's stand-in."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return INTERPRETER_SM_COUNT


def choose_splits(batch: int, kv_heads: int, longest: int, sms: int) -> int:
    """Context splits per (sequence, KV head): about PROGRAMS_PER_SM programs per SM of ``sms``, at
    most one split per MIN_SPLIT_TOKENS of the longest context and at most MAX_SPLITS."""
    programs = max(1, batch * kv_heads)
    wanted = -(-PROGRAMS_PER_SM * sms // programs)
    return max(1, min(wanted, -(-longest // MIN_SPLIT_TOKENS), MAX_SPLITS))


def _scratch(device: torch.device, batch: int, heads: int, splits: int, dim_pad: int):
    """The splits' fp32 partials (max, sum, acc), allocated per call: the caching allocator makes
    that cheap and stream-ordered (two decodes of one shape on two streams never share them), and
    under CUDA-graph capture they come from the graph's own pool, kept as long as the graph."""
    m = torch.empty(batch, heads, splits, device=device, dtype=torch.float32)
    return m, torch.empty_like(m), torch.empty(batch, heads, splits, dim_pad, device=device, dtype=torch.float32)


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    *,
    tokens_per_step: int | None = None,
    num_splits: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`gpubench.lib.paged_decode.paged_decode_attention` by the Triton kernels.
    ``tokens_per_step``: keys loaded per loop step, a power of two >= 16 (default 64, 32 above
    head_dim 128). ``num_splits``: context splits per (sequence, KV head), default
    :func:`choose_splits` over the table's width (the longest context it can hold, so no host
    sync). ``out``: written in place (shaped, typed and placed like q), else allocated."""
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "the Triton paged-decode kernel needs CUDA tensors, or TRITON_INTERPRET=1 set "
            "before gpubench.lib.kernels.paged_attention_triton is imported"
        )
    batch, heads, head_dim, block_size, kv_heads = check_shapes(q, k_cache, v_cache, block_tables, context_lens)
    if tokens_per_step is None:
        tokens_per_step = TOKENS_PER_STEP if head_dim <= 128 else TOKENS_PER_STEP_WIDE
    if tokens_per_step < MIN_DOT or tokens_per_step & (tokens_per_step - 1):
        raise ValueError(f"tokens_per_step must be a power of two >= {MIN_DOT} (got {tokens_per_step})")
    if num_splits is not None and num_splits < 1:
        raise ValueError(f"num_splits must be at least 1 (got {num_splits})")
    if scale is None:
        scale = head_dim**-0.5
    if out is None:
        out = torch.empty_like(q)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must be shaped, typed and placed like q ({tuple(q.shape)}, {q.dtype}, {q.device})")
    if batch == 0 or heads == 0:
        return out
    tables = block_tables.to(device=q.device, dtype=torch.int32)
    lens = context_lens.to(device=q.device, dtype=torch.int32)
    widest = tables.shape[1] * block_size
    splits = num_splits or choose_splits(batch, kv_heads, widest, sm_count(q.device))
    # Each split a whole number of steps, so only the context's end (and the split's) is ragged.
    per_split = -(-max(widest, 1) // splits)
    split_tokens = -(-per_split // tokens_per_step) * tokens_per_step
    group, dim_pad = heads // kv_heads, max(MIN_DOT, triton.next_power_of_2(head_dim))
    m, l, acc = _scratch(q.device, batch, heads, splits, dim_pad) if splits > 1 else (out, out, out)
    # Triton's interpreter keeps bf16 as raw uint16 bits and its tl.dot multiplies those bits as
    # integers (triton-lang/triton#11584), so there the bf16 tiles are widened to fp32 first; a
    # bf16 x bf16 product is exact in fp32, as on tensor cores. Other dtypes than the three the
    # kernel is built for (a float64 serving engine's) are computed in fp32 too, as before the split.
    # q over a cache of another dtype (fp32 queries over a bf16 cache) too: tl.dot takes one dtype.
    dot_in_fp32 = (
        INTERPRETED
        and q.dtype == torch.bfloat16
        or q.dtype not in DOT_DTYPES
        or k_cache.dtype != q.dtype
        or v_cache.dtype != q.dtype
    )
    _paged_decode_split_kernel[(batch, kv_heads, splits)](
        q,
        k_cache,
        v_cache,
        tables,
        lens,
        out,
        m,
        l,
        acc,
        scale * math.log2(math.e),
        split_tokens,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *tables.stride(),
        *out.stride(),
        *m.stride()[:3],
        GROUP=group,
        GROUP_PAD=max(MIN_DOT, triton.next_power_of_2(group)),
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
        DIM_PAD=dim_pad,
        TOKENS=tokens_per_step,
        ONE_SPLIT=splits == 1,
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or dot_in_fp32 else "tf32",
        DOT_IN_FP32=dot_in_fp32,
        num_warps=NUM_WARPS,
    )
    if splits > 1:
        reduce_partials(m, l, acc, out, head_dim)
    return out


def reduce_partials(
    m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, out: torch.Tensor, head_dim: int
) -> torch.Tensor:
    """Combine the splits' partials into ``out`` (batch, heads, head_dim): m, l (batch, heads,
    splits) fp32 in log2 units, acc (batch, heads, splits, dim_pad) fp32, all contiguous (the
    kernel addresses acc through m's index); a split with m = -inf and l = 0 contributes nothing."""
    batch, heads, splits = m.shape
    if not (
        m.is_contiguous()
        and l.is_contiguous()
        and acc.is_contiguous()
        and l.shape == m.shape
        and acc.shape[:3] == m.shape
        and m.dtype == l.dtype == acc.dtype == torch.float32
    ):
        raise ValueError("m, l (batch, heads, splits) and acc (batch, heads, splits, dim_pad): fp32, contiguous")
    _paged_decode_reduce_kernel[(batch, heads)](
        m,
        l,
        acc,
        out,
        splits,
        *m.stride(),
        *out.stride(),
        HEAD_DIM=head_dim,
        DIM_PAD=acc.shape[-1],
        SPLITS_PAD=triton.next_power_of_2(splits),
        SPLITS_PER_STEP=REDUCE_SPLITS_PER_STEP,
        num_warps=REDUCE_NUM_WARPS,
    )
    return out
