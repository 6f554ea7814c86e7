"""Flash attention forward as one Triton kernel: each (query tile, head) is one program.

A program loads its tile of queries once and keeps it in registers, then streams the K/V tiles
past it; scores, softmax weights and the running row statistics exist only on chip. Supports any
strides, GQA by index (query head h reads kv head h // (heads // kv_heads)), any sequence lengths
(seq_q != seq_k too), head_dim and head_dim_v (v's own, MLA's 192 / 128) each up to 256, fp16 / bf16 /
fp32 in with fp32 accumulation, causal aligned bottom-right (flash-attn's default, query i sees keys
j <= i + seq_k - seq_q) or top-left (SDPA's ``is_causal``), the padded layout (SDPA's) and the packed
variable-length one (flash-attn's ``cu_seqlens``), and optionally the log-sum-exp of each row that the
backward pass (:mod:`.flash_attention_triton_bwd`) recomputes from. Conventions:
:mod:`gpubench.lib.attention`. Tiles are autotuned on a GPU; under Triton's interpreter
(``TRITON_INTERPRET=1`` before import) one small fixed tile is used instead.

Two ways to move the tiles, one tile logic: on sm_90 and later (H100 / H200) a padded-layout call
whose tensors TMA can address (16-bit, contiguous channels, 16-byte aligned strides) passes q, k,
v and out as tensor descriptors, so every tile arrives by an asynchronous TMA copy into shared
memory, pipelined over more stages and bigger tiles than the pointer path can afford
(:mod:`.flash_attention_triton_tiles`); every other call (older GPUs, varlen, other layouts, fp32) loads by
pointers and strides. Only the loads and the final store differ (:func:`_load_rows`); the
interpreter runs both.
"""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from gpubench.lib.attention import CAUSAL_ALIGNS, check_local, check_shapes
from gpubench.lib.kernels.flash_attention_triton_tiles import (
    AUTOTUNE_KEY,
    GPU_CONFIGS,
    GPU_CONFIGS_LARGE_HEAD,
    GPU_CONFIGS_TMA,
    GPU_CONFIGS_TMA_LARGE_HEAD,
    TensorDescriptor,
    descriptor_configs_fit,
    prune_forward,
)
from gpubench.lib.triton_support import interpreted
from gpubench.measure.autotune import PersistentAutotuner, length_bucket

INTERPRETED = interpreted()  # fixed when the kernels below are decorated
# Whether calls whose layout allows it take the descriptor path, on sm_90+ and in Triton's
# interpreter (which runs descriptors as masked loads of the same boxes, so there the 16-bit
# contiguous calls of the tests take it and the others the pointer path). On by default;
# GPUBENCH_FLASH_DESCRIPTORS=0 in the environment turns it off, so that one GPU session can time
# both paths of the same build side by side; tests set it to force one path or the other.
DESCRIPTORS = os.environ.get("GPUBENCH_FLASH_DESCRIPTORS", "1").strip() != "0"

# Tiles for the interpreter: small so tests stay fast, and BLOCK_M != BLOCK_N so the causal
# split (full tiles, then diagonal tiles) is exercised in its general form.
INTERPRETER_BLOCK_M = 32
INTERPRETER_BLOCK_N = 16

# The log-sum-exp is kept in log2 units on chip, returned in natural log. A constexpr: a kernel may
# read no other global (the interpreter allows it, the compiler does not).
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _load_rows(
    src,
    desc_b,
    desc_h,
    row0,
    offs_r,
    offs_c,
    c_mask,
    n_rows,
    stride_r,
    stride_c,
    MASKED: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    USE_TMA: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    """Rows row0.. (offs_r) of one (batch, head) of q, k, v or do as a (BLOCK_R, BLOCK_C) tile, or
    (BLOCK_C, BLOCK_R) TRANSPOSED; rows past n_rows (MASKED tiles only reach them) and channels
    past the head dim read as zero.

    USE_TMA: one tensor-descriptor (TMA) copy of a (1, 1, BLOCK_R, BLOCK_C) box of the 4-D
    (batch, heads, rows, channels) tensor at (desc_b, desc_h). The hardware fills what lies outside
    the tensor with zeros, along the rows and the channels alike, so no mask is built; and the copy
    runs asynchronously into shared memory, which frees the warps' registers and issue slots for
    the matmuls while the next tiles arrive (the compiler pipelines it over num_stages buffers).
    Otherwise ``src`` is the (batch, head)'s base pointer: one masked load by the strides, a
    transposed tile read directly transposed.
    """
    if USE_TMA:
        tile = src.load([desc_b, desc_h, row0, 0]).reshape([BLOCK_R, BLOCK_C])
        if TRANSPOSED:
            tile = tl.trans(tile)
    else:
        if TRANSPOSED:
            ptrs = src + offs_r[None, :] * stride_r + offs_c[:, None] * stride_c
            mask = c_mask[:, None]
            if MASKED:
                mask = mask & (offs_r[None, :] < n_rows)
        else:
            ptrs = src + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c
            mask = c_mask[None, :]
            if MASKED:
                mask = mask & (offs_r[:, None] < n_rows)
        tile = tl.load(ptrs, mask=mask, other=0.0)
    return tile


@triton.jit
def _first_visible(pos, local_size, LOCAL: tl.constexpr):
    """The first key a query at aligned position ``pos`` sees under a local mask (keys j <= pos are
    causal's bound): LOCAL 1, a sliding window of local_size keys, pos - local_size + 1; LOCAL 2,
    chunks of local_size positions, the start of pos's chunk (gpubench.lib.attention.first_visible_key)."""
    if LOCAL == 1:
        first = pos - local_size + 1
    else:
        first = tl.maximum(pos, 0) // local_size * local_size
    return first


@triton.jit
def _attend_key_tiles(
    acc,
    row_max,
    row_sum,
    q,
    k_src,
    v_src,
    desc_b,
    desc_h,
    stride_kn,
    stride_kd,
    stride_vn,
    stride_vd,
    offs_m,
    offs_d,
    d_mask,
    offs_dv,
    dv_mask,
    n_lo,
    n_hi,
    seq_k,
    diagonal,
    local_size,
    qk_scale_log2,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    USE_TMA: tl.constexpr,
    SCALE_POSITIVE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """Fold the key tiles starting in [n_lo, n_hi) into one query tile's running state.

    MASKED is a compile-time flag: the caller runs the tiles that every query of the tile can
    fully see with MASKED=False, so only the ragged last tile and the tiles crossing the causal
    diagonal (or a local mask's lower edge) pay for building and applying a mask. Causal: query i
    sees keys j <= i + diagonal; with LOCAL also only keys j >= _first_visible(i + diagonal).
    ``k_src`` / ``v_src`` are this (batch, kv head)'s base pointers, or with USE_TMA the whole
    tensors' descriptors, read at (desc_b, desc_h): the loads differ, the tile logic is the same.
    """
    for n_start in range(n_lo, n_hi, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)

        # K transposed, (head_dim, keys), so q @ k is a plain tile matmul. Positions past seq_k
        # (ragged edge) and channels past head_dim (96 padded to 128) read as zero: a zero channel
        # adds nothing to a dot product, and the ragged keys are masked to -inf below.
        k = _load_rows(
            k_src,
            desc_b,
            desc_h,
            n_start,
            offs_n,
            offs_d,
            d_mask,
            seq_k,
            stride_kn,
            stride_kd,
            MASKED=MASKED,
            TRANSPOSED=True,
            USE_TMA=USE_TMA,
            BLOCK_R=BLOCK_N,
            BLOCK_C=BLOCK_D,
        )
        if DOT_IN_FP32:
            k = k.to(tl.float32)

        # Scores in fp32, in units of scale * log2(e): exp2 of those equals exp of the scaled
        # scores, and exp2 is what the hardware computes natively. With a positive scale (any
        # real model's) the raw dot products are kept: the row maximum is taken before scaling
        # (scaling preserves order), and each weight below is exp2 of one multiply-add, raw *
        # scale - max, instead of a multiply of the whole tile and then a subtraction: one
        # floating-point instruction per score fewer: the work beside the matmuls (the
        # exponentials above all) is what holds attention below a Hopper's tensor-core peak
        # (FlashAttention-3, section 3).
        # A zero or negative scale scales first: its order is the raw scores' reversed.
        scores = tl.dot(q, k, input_precision=DOT_PRECISION)
        if not SCALE_POSITIVE:
            scores = scores * qk_scale_log2
        if MASKED:
            visible = offs_n[None, :] < seq_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + diagonal)
                if LOCAL != 0:
                    first = _first_visible(offs_m[:, None] + diagonal, local_size, LOCAL)
                    visible = visible & (offs_n[None, :] >= first)
            scores = tl.where(visible, scores, float("-inf"))
        tile_max = tl.max(scores, 1)
        if SCALE_POSITIVE:
            tile_max = tile_max * qk_scale_log2

        # Online softmax update. What was accumulated so far was exponentiated against the old
        # row maximum; when this tile raises the maximum, the old sum and output are too large
        # by exp(old - new), so both are rescaled by that factor before this tile's weights,
        # taken against the new maximum (never above 1, so nothing overflows), are added.
        # Every row sees all of an unmasked tile, so there the maximum is finite after it. A
        # masked tile can leave a row's maximum at -inf (it has seen no key yet: bottom-right
        # alignment with seq_q > seq_k, keys still ahead of the diagonal, or before the row's
        # window or chunk, whose tiles come first); such a row is shifted by 0 instead, so its weights are exp2(-inf) = 0,
        # never the NaN of (-inf) - (-inf).
        new_max = tl.maximum(row_max, tile_max)
        if MASKED:
            shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        else:
            shift = new_max
        correction = tl.exp2(row_max - shift)
        if SCALE_POSITIVE:
            weights = tl.exp2(scores * qk_scale_log2 - shift[:, None])
        else:
            weights = tl.exp2(scores - shift[:, None])
        row_sum = row_sum * correction + tl.sum(weights, 1)

        # The weights go back to V's dtype for the second matmul (16-bit tensor-core inputs),
        # accumulated into the fp32 output. V has its own head dim (MLA: 128 against q/k's 192).
        v = _load_rows(
            v_src,
            desc_b,
            desc_h,
            n_start,
            offs_n,
            offs_dv,
            dv_mask,
            seq_k,
            stride_vn,
            stride_vd,
            MASKED=MASKED,
            TRANSPOSED=False,
            USE_TMA=USE_TMA,
            BLOCK_R=BLOCK_N,
            BLOCK_C=BLOCK_DV,
        )
        weights = weights.to(v.dtype)
        if DOT_IN_FP32:
            weights = weights.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * correction[:, None]
        acc = tl.dot(weights, v, acc, input_precision=DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def _key_ranges(
    m_start,
    seq_q,
    seq_k,
    local_size,
    CAUSAL: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """(diagonal, full_end, masked_end) of the query tile starting at m_start: key tiles starting in
    [0, full_end) are seen whole by every row of the tile (no mask), those in [full_end,
    masked_end) cross the causal diagonal or the ragged end of the keys (masked), and nothing from
    masked_end on is seen by any row (never loaded, which is what halves causal attention's work).

    Causal, query i sees keys j <= i + diagonal (diagonal = seq_k - seq_q bottom-right, 0 top-left).
    A tile [n, n + BLOCK_N) is whole for every row when its last key is visible to the tile's first
    query: n + BLOCK_N <= m_start + diagonal + 1. The last row that exists (the ragged last query
    tile stops at seq_q) sees keys up to min(m_start + BLOCK_M, seq_q) - 1 + diagonal, so tiles
    starting past it are skipped: the masked range is exactly the tiles crossing the diagonal, for
    any BLOCK_M / BLOCK_N and either alignment. Not causal: only the ragged last tile is masked.

    Returned as (diagonal, n_first, full_start, full_end, masked_end): key tiles starting in
    [n_first, full_start) are masked too, and none before n_first is loaded. Without a local mask both
    are 0. LOCAL (a sliding window or chunks, :func:`_first_visible`): nothing before the tile's
    first row's first visible key is seen (n_first, the tile holding it), and a tile is whole only
    from the last row's first visible key on (full_start, rounded up to a tile); where the rows'
    edges leave no tile whole, full_start clips so the masked ranges still cover each tile once. A
    window of w keys so loads about (w + BLOCK_M) / BLOCK_N key tiles per query tile, not the causal
    triangle's up to seq_k / BLOCK_N: that is the win.
    """
    if CAUSAL:
        if BOTTOM_RIGHT:
            diagonal = seq_k - seq_q
        else:
            diagonal = seq_k * 0
        full_end = tl.minimum(tl.maximum(m_start + diagonal + 1, 0) // BLOCK_N, seq_k // BLOCK_N) * BLOCK_N
        masked_end = tl.maximum(tl.minimum(tl.minimum(m_start + BLOCK_M, seq_q) + diagonal, seq_k), 0)
    else:
        diagonal = seq_k * 0
        full_end = (seq_k // BLOCK_N) * BLOCK_N
        masked_end = seq_k
    if LOCAL != 0:
        last_pos = tl.minimum(m_start + BLOCK_M, seq_q) - 1 + diagonal
        first_key = tl.maximum(_first_visible(m_start + diagonal, local_size, LOCAL), 0)
        # no row sees a key (top-left, every window or chunk of the tile past the last key): no tile
        masked_end = tl.where(first_key >= masked_end, 0, masked_end)
        full_end = tl.minimum(full_end, masked_end)
        n_first = first_key // BLOCK_N * BLOCK_N
        full_start = tl.cdiv(tl.maximum(_first_visible(last_pos, local_size, LOCAL), 0), BLOCK_N) * BLOCK_N
        full_start = tl.minimum(full_start, masked_end)
        full_end = tl.maximum(full_end, full_start)
    else:
        n_first = seq_k * 0
        full_start = seq_k * 0
    return diagonal, n_first, full_start, full_end, masked_end


@triton.jit
def _heavy_first(CAUSAL: tl.constexpr):
    """This program's query tile. Causal, a query tile's work grows with its index (it sees more
    keys), and the GPU starts programs in grid order: numbering the tiles from the last makes the
    longest ones start first and the short ones fill the end of the grid, where otherwise a few long
    tiles would run alone on an almost idle GPU (FlashAttention-2 orders its causal tiles so)."""
    if CAUSAL:
        m_block = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        m_block = tl.program_id(0)
    return m_block


@triton.jit
def _flash_attention_fwd(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    lse_ptr,
    cu_seqlens_q_ptr,
    cu_seqlens_k_ptr,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_vd,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_lb,
    stride_lh,
    stride_lm,
    heads,
    group,
    seq_q,
    seq_k,
    qk_scale_log2,
    local_size,
    seq_q_bucket,
    seq_k_bucket,
    local_bucket,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    LOCAL: tl.constexpr,
    VARLEN: tl.constexpr,
    STORE_LSE: tl.constexpr,
    USE_TMA: tl.constexpr,
    SCALE_POSITIVE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One (query tile, batch x head) program. USE_TMA: q, k, v and out arrive as tensor
    descriptors of the padded 4-D tensors (never varlen), else as pointers with their strides."""
    m_block = _heavy_first(CAUSAL)
    batch_head = tl.program_id(1)
    b = batch_head // heads
    h = batch_head % heads
    # GQA by indexing: the query heads h of one group all read kv head h // group.
    kv_h = h // group

    # Variable length: document b is rows cu_seqlens[b]:cu_seqlens[b + 1] of the packed tensors
    # (the batch strides are 0), and seq_q / seq_k arrive as the maxima, for the autotuner's key
    # and the grid only. Programs past their document's last query tile stop here.
    if VARLEN:
        q_start = tl.load(cu_seqlens_q_ptr + b)
        k_start = tl.load(cu_seqlens_k_ptr + b)
        seq_q = tl.load(cu_seqlens_q_ptr + b + 1) - q_start
        seq_k = tl.load(cu_seqlens_k_ptr + b + 1) - k_start
        q_start = q_start.to(tl.int64)
        k_start = k_start.to(tl.int64)
    else:
        q_start = 0
        k_start = 0
    m_start = m_block * BLOCK_M
    if m_start >= seq_q:
        return

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_mask = offs_dv < HEAD_DIM_V
    m_mask = offs_m < seq_q

    # Load the query tile once; it stays on chip while every K/V tile it needs streams past.
    # Rows past seq_q read as zero (they are computed, harmlessly, and never stored).
    if USE_TMA:
        k_src = k_ptr
        v_src = v_ptr
        q = q_ptr.load([b, h, m_start, 0]).reshape([BLOCK_M, BLOCK_D])
    else:
        # Batch and head offsets in int64: batch * heads * seq * head_dim can pass 2^31 elements.
        q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + q_start * stride_qm
        k_src = k_ptr + b.to(tl.int64) * stride_kb + kv_h.to(tl.int64) * stride_kh + k_start * stride_kn
        v_src = v_ptr + b.to(tl.int64) * stride_vb + kv_h.to(tl.int64) * stride_vh + k_start * stride_vn
        q = tl.load(
            q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
            mask=m_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
    in_dtype = q.dtype  # the inputs' and the output's
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    # Running state per query row, fp32 whatever the input dtype: the largest (log2-scaled)
    # score so far, the softmax denominator relative to it, and the unnormalised output.
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # A local mask's tiles crossing its lower edge first, masked; then the tiles every row sees
    # whole, unmasked; then those crossing the diagonal or the ragged end, masked (_key_ranges).
    diagonal, n_first, full_start, full_end, masked_end = _key_ranges(
        m_start, seq_q, seq_k, local_size, CAUSAL, BOTTOM_RIGHT, LOCAL, BLOCK_M, BLOCK_N
    )
    if LOCAL != 0:
        acc, row_max, row_sum = _attend_key_tiles(
            acc,
            row_max,
            row_sum,
            q,
            k_src,
            v_src,
            b,
            kv_h,
            stride_kn,
            stride_kd,
            stride_vn,
            stride_vd,
            offs_m,
            offs_d,
            d_mask,
            offs_dv,
            dv_mask,
            n_first,
            full_start,
            seq_k,
            diagonal,
            local_size,
            qk_scale_log2,
            BLOCK_N=BLOCK_N,
            BLOCK_D=BLOCK_D,
            BLOCK_DV=BLOCK_DV,
            MASKED=True,
            CAUSAL=CAUSAL,
            LOCAL=LOCAL,
            USE_TMA=USE_TMA,
            SCALE_POSITIVE=SCALE_POSITIVE,
            DOT_PRECISION=DOT_PRECISION,
            DOT_IN_FP32=DOT_IN_FP32,
        )
    acc, row_max, row_sum = _attend_key_tiles(
        acc,
        row_max,
        row_sum,
        q,
        k_src,
        v_src,
        b,
        kv_h,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_d,
        d_mask,
        offs_dv,
        dv_mask,
        full_start,
        full_end,
        seq_k,
        diagonal,
        local_size,
        qk_scale_log2,
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
        BLOCK_DV=BLOCK_DV,
        MASKED=False,
        CAUSAL=CAUSAL,
        LOCAL=LOCAL,
        USE_TMA=USE_TMA,
        SCALE_POSITIVE=SCALE_POSITIVE,
        DOT_PRECISION=DOT_PRECISION,
        DOT_IN_FP32=DOT_IN_FP32,
    )
    acc, row_max, row_sum = _attend_key_tiles(
        acc,
        row_max,
        row_sum,
        q,
        k_src,
        v_src,
        b,
        kv_h,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        offs_m,
        offs_d,
        d_mask,
        offs_dv,
        dv_mask,
        full_end,
        masked_end,
        seq_k,
        diagonal,
        local_size,
        qk_scale_log2,
        BLOCK_N=BLOCK_N,
        BLOCK_D=BLOCK_D,
        BLOCK_DV=BLOCK_DV,
        MASKED=True,
        CAUSAL=CAUSAL,
        LOCAL=LOCAL,
        USE_TMA=USE_TMA,
        SCALE_POSITIVE=SCALE_POSITIVE,
        DOT_PRECISION=DOT_PRECISION,
        DOT_IN_FP32=DOT_IN_FP32,
    )

    # Normalise once at the end, by the complete denominator, rather than on every tile; then
    # store in the output's dtype, leaving out padded rows and channels. A row that saw no key
    # has acc 0 and row_sum 0: it stores 0 (divided by 1) and log-sum-exp -inf. Every other row
    # has row_sum >= 1 (its maximum's weight), so the two cannot be confused.
    nothing_seen = row_sum == 0.0
    acc = acc / tl.where(nothing_seen, 1.0, row_sum)[:, None]
    if USE_TMA:
        # The descriptor's store clips the box at the tensor's edges: rows past seq_q and
        # channels past head_dim_v are not written.
        out_ptr.store([b, h, m_start, 0], acc.to(in_dtype).reshape([1, 1, BLOCK_M, BLOCK_DV]))
    else:
        o_base = out_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + q_start * stride_om
        tl.store(
            o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
            acc.to(out_ptr.dtype.element_ty),
            mask=m_mask[:, None] & dv_mask[None, :],
        )
    if STORE_LSE:
        lse_base = lse_ptr + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh + q_start * stride_lm
        lse = tl.where(nothing_seen, float("-inf"), (row_max + tl.log2(tl.where(nothing_seen, 1.0, row_sum))) * LN2)
        tl.store(lse_base + offs_m * stride_lm, lse, mask=m_mask)


def _tuned(configs, name):
    return (
        None
        if INTERPRETED
        else PersistentAutotuner(
            triton.autotune(configs=configs, key=AUTOTUNE_KEY, prune_configs_by={"early_config_prune": prune_forward})(
                _flash_attention_fwd
            ),
            name,
        )
    )


_flash_attention_fwd_tuned = _tuned(GPU_CONFIGS + GPU_CONFIGS_LARGE_HEAD, "flash_attention_fwd")
_flash_attention_fwd_tma_tuned = _tuned(GPU_CONFIGS_TMA + GPU_CONFIGS_TMA_LARGE_HEAD, "flash_attention_fwd_tma")

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


def check_blocks(block_m: int | None, block_n: int | None) -> None:
    """ValueError unless fixed tiles are both given, or neither, and powers of two >= 16."""
    if (block_m is None) != (block_n is None):
        raise ValueError("give both block_m and block_n, or neither")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block is not None and (block < 16 or block & (block - 1)):
            raise ValueError(f"{name} must be a power of two >= 16 (got {block})")


def _check_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    block_m: int | None,
    block_n: int | None,
    causal_align: str,
    causal: bool = False,
    window: int = 0,
    chunk: int = 0,
) -> None:
    """ValueError (or RuntimeError: no way to run here) for what the kernel cannot run."""
    check_local(causal, window, chunk)
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q, k, v must share one dtype of {SUPPORTED_DTYPES} (got {q.dtype}, {k.dtype}, {v.dtype})")
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS} (got {causal_align!r})")
    check_blocks(block_m, block_n)
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError(
            "the Triton flash-attention kernel needs CUDA tensors, or TRITON_INTERPRET=1 set "
            "before gpubench.lib.kernels.flash_attention_triton is imported"
        )


def _output(out: torch.Tensor | None, shape: tuple[int, ...], q: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=q.dtype, device=q.device)
    if tuple(out.shape) != shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(
            f"out must match q's dtype and device and be {shape} (q's sizes with v's head_dim): "
            f"{q.dtype} on {q.device} (got {tuple(out.shape)} {out.dtype} on {out.device})"
        )
    return out


def local_mask(window: int, chunk: int) -> tuple[int, int]:
    """The kernels' (LOCAL, local_size): (0, 1) none (the size unread), (1, window) a sliding
    window, (2, chunk) chunks (:func:`_first_visible`)."""
    return (1, window) if window else (2, chunk) if chunk else (0, 1)


def _descriptor_ready(t: torch.Tensor) -> bool:
    """Whether TMA can read or write ``t`` as a 4-D descriptor: 16-bit, no empty axis, channels
    contiguous, the other strides and the base address multiples of 16 bytes."""
    size = t.element_size()
    # An expanded axis (stride 0, e.g. k broadcast over the batch) is left to the pointer path: a
    # tensor map's strides must be positive.
    return (
        t.dtype in (torch.float16, torch.bfloat16)
        and t.dim() == 4
        and t.numel() > 0
        and t.stride(-1) == 1
        and t.data_ptr() % 16 == 0
        and all(stride * size % 16 == 0 for stride in t.stride()[:-1])
        and all(stride > 0 for stride, n in zip(t.stride(), t.shape) if n > 1)
    )


def uses_descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether a padded-layout call takes the tensor-descriptor (TMA) path: a GPU of compute
    capability 9.0 or later (Hopper's TMA unit; before it the pointer path) or the interpreter,
    :data:`DESCRIPTORS` on, and every tensor's layout TMA can address.
    Varlen never does: a box crossing a document's end would read and write the next document."""
    if TensorDescriptor is None or not DESCRIPTORS:
        return False
    # GPU-only (docs/cuda-paths.md): a CPU runs the interpreter, which takes descriptors everywhere
    if not INTERPRETED and not (
        q.is_cuda
        and torch.version.hip is None  # ROCm's (9, 4) is no Hopper
        and torch.cuda.get_device_capability(q.device)[0] >= 9
    ):
        return False
    blocks = (max(16, triton.next_power_of_2(q.shape[-1])), max(16, triton.next_power_of_2(v.shape[-1])))
    return all(_descriptor_ready(t) for t in (q, k, v, out)) and descriptor_configs_fit(q, *blocks)


def _descriptors(q, k, v, out, block_d, block_dv, block_m, block_n):
    """q, k, v and out as tensor descriptors; boxes as the tiles (fixed ones), else placeholders
    that the autotuner's pre-hook replaces by each config's tiles."""
    boxes = ((q, block_m, block_d), (k, block_n, block_d), (v, block_n, block_dv), (out, block_m, block_dv))
    return [TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, rows or 16, cols]) for t, rows, cols in boxes]


def _launch(
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens,
    strides,
    *,
    batch,
    heads,
    kv_heads,
    seq_q,
    seq_k,
    grid_m,
    scale,
    causal,
    causal_align,
    varlen,
    block_m,
    block_n,
    window=0,
    chunk=0,
):
    """One launch of the kernel; ``strides`` are q, k, v, out (each batch, head, row, channel) and
    lse (batch, head, row), 0 where a layout has no such axis."""
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    if scale is None:
        scale = head_dim**-0.5
    # tl.dot needs power-of-two tiles of at least 16; head_dim 96 runs as 128, 192 as 256,
    # masked; v's tile has its own width (MLA: 256 for q/k, 128 for v).
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_dv = max(16, triton.next_power_of_2(head_dim_v))
    use_tma = not varlen and uses_descriptors(q, k, v, out)
    if use_tma:
        block_m = block_m or (None if _flash_attention_fwd_tma_tuned is not None else INTERPRETER_BLOCK_M)
        block_n = block_n or (None if _flash_attention_fwd_tma_tuned is not None else INTERPRETER_BLOCK_N)
        tensors = _descriptors(q, k, v, out, block_d, block_dv, block_m, block_n)
    else:
        tensors = [q, k, v, out]
    cu_q, cu_k = cu_seqlens if varlen else (q, q)  # unread placeholders when not varlen
    args = (
        *tensors,
        q if lse is None else lse,
        cu_q,
        cu_k,
        *strides,
        heads,
        heads // kv_heads,
        seq_q,
        seq_k,
        scale * math.log2(math.e),
        local_mask(window, chunk)[1],
        length_bucket(seq_q),
        length_bucket(seq_k),
        length_bucket(window or chunk) if window or chunk else 0,
    )
    # Triton's interpreter keeps bf16 as raw uint16 bits and its tl.dot multiplies those bits as
    # integers (triton-lang/triton#11584; its debugging guide says to cast bf16 to fp32 there),
    # so under the interpreter the bf16 operands are widened to fp32 first. The products are the
    # same (a bf16 x bf16 product is exact in fp32, as on tensor cores) and the weights are still
    # rounded to bf16 before the second matmul; only the interpreter takes this path.
    dot_in_fp32 = INTERPRETED and q.dtype == torch.bfloat16
    constants = dict(
        HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        CAUSAL=bool(causal),
        BOTTOM_RIGHT=causal_align == "bottom_right",
        LOCAL=local_mask(window, chunk)[0],
        VARLEN=varlen,
        STORE_LSE=lse is not None,
        USE_TMA=use_tma,
        SCALE_POSITIVE=scale > 0,
        # fp32 inputs: full-precision products ("ieee"), not the default TF32 tensor-core
        # path, whose 10-bit mantissa would miss fp32's tolerance by orders of magnitude.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or dot_in_fp32 else "tf32",
        DOT_IN_FP32=dot_in_fp32,
    )
    tuned = _flash_attention_fwd_tma_tuned if use_tma else _flash_attention_fwd_tuned
    if block_m is None and tuned is not None:
        tuned_grid = lambda meta: (triton.cdiv(grid_m, meta["BLOCK_M"]), batch * heads)
        tuned[tuned_grid](*args, **constants)
    else:
        block_m = block_m or INTERPRETER_BLOCK_M
        block_n = block_n or INTERPRETER_BLOCK_N
        grid = (triton.cdiv(grid_m, block_m), batch * heads)
        _flash_attention_fwd[grid](*args, **constants, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=2)


def flash_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
    causal_align: str = "bottom_right",
    return_lse: bool = False,
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale) v by the Triton kernel. q (batch, heads, seq_q, head_dim), k
    (batch, kv_heads, seq_k, head_dim), v (batch, kv_heads, seq_k, head_dim_v), heads a multiple
    of kv_heads; any strides. Returns out (batch, heads, seq_q, head_dim_v), with ``return_lse``
    also lse (batch, heads, seq_q) float32, the natural-log log-sum-exp of each row's scaled
    scores over its visible keys (-inf, with output 0, for a row that sees none).

    ``causal_align``: "bottom_right" (query i sees keys j <= i + seq_k - seq_q, flash-attn's) or
    "top_left" (j <= i, SDPA's ``is_causal``); the same when seq_q == seq_k.
    ``block_m`` / ``block_n`` (powers of two >= 16) fix the tiles instead of the autotuned ones
    (GPU) or the interpreter's fixed ones; give both or neither.
    ``out``: write into this tensor (the output's shape, q's dtype and device; any strides).
    ``window`` / ``chunk`` (causal only; :mod:`gpubench.lib.attention`): a sliding window of that
    many keys, or chunked local attention; the key tiles outside every row's window or chunk are
    never loaded.
    """
    check_shapes(q, k, v)
    _check_call(q, k, v, block_m, block_n, causal_align, causal, window, chunk)
    batch, heads, seq_q, _ = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    out = _output(out, (batch, heads, seq_q, v.shape[3]), q)
    lse = torch.empty(batch, heads, seq_q, dtype=torch.float32, device=q.device) if return_lse else None
    if out.numel() > 0:
        strides = (*q.stride(), *k.stride(), *v.stride(), *out.stride(), *((0, 0, 0) if lse is None else lse.stride()))
        _launch(
            q,
            k,
            v,
            out,
            lse,
            None,
            strides,
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
            seq_q=seq_q,
            seq_k=seq_k,
            grid_m=seq_q,
            scale=scale,
            causal=causal,
            causal_align=causal_align,
            varlen=False,
            block_m=block_m,
            block_n=block_n,
            window=window,
            chunk=chunk,
        )
    return out if lse is None else (out, lse)


def _check_cu_seqlens(
    q: torch.Tensor,
    k: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
) -> None:
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 1 or cu.device != q.device:
            raise ValueError(
                f"{name} must be a 1-D int32 tensor of batch + 1 offsets on q's device ({q.device}); "
                f"got {cu.dtype} {tuple(cu.shape)} on {cu.device}"
            )
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must have the same length, batch + 1 "
            f"(got {cu_seqlens_q.numel()} and {cu_seqlens_k.numel()})"
        )
    if q.is_cuda:  # reading the offsets would synchronize; as flash-attn, they are trusted there
        return  # GPU-only: a CPU (interpreter) checks them below
    for name, cu, total, most in (
        ("q", cu_seqlens_q, q.shape[0], max_seqlen_q),
        ("k", cu_seqlens_k, k.shape[0], max_seqlen_k),
    ):
        lengths = cu.diff()
        if cu[0] != 0 or (lengths < 0).any() or cu[-1] > total or (lengths > most).any():
            raise ValueError(
                f"cu_seqlens_{name} must rise from 0 to at most {total} (the packed rows) in steps of "
                f"at most max_seqlen_{name}={most} (got {cu.tolist()})"
            )


def flash_attention_varlen_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    scale: float | None = None,
    *,
    causal_align: str = "bottom_right",
    return_lse: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
    out: torch.Tensor | None = None,
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Packed documents, flash-attn's varlen layout: q (total_q, heads, head_dim), k (total_k,
    kv_heads, head_dim), v (total_k, kv_heads, head_dim_v); document b is q rows
    cu_seqlens_q[b]:cu_seqlens_q[b + 1] against k/v rows cu_seqlens_k[b]:cu_seqlens_k[b + 1]
    (int32 offsets on q's device), and attends to nothing outside itself; causal alignment (and a
    window or chunk: positions count from the document's start) is per document. ``max_seqlen_q`` / ``max_seqlen_k`` must be at least every document's length (on
    CUDA they are trusted, as flash-attn does: checking would synchronize; off CUDA they are
    checked). Returns out (total_q, heads, head_dim_v) [and lse (heads, total_q) float32]; packed
    rows past cu_seqlens_q[-1] are left unwritten. Other arguments as
    :func:`flash_attention_triton`.

    Autotuning keys on max_seqlen rounded up to a power of two, so batches of varying lengths
    reuse a few tunings instead of tuning on every new maximum.
    """
    check_shapes(q, k, v, seq_dim=0)
    _check_call(q, k, v, block_m, block_n, causal_align, causal, window, chunk)
    _check_cu_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    heads, kv_heads = q.shape[1], k.shape[1]
    batch = cu_seqlens_q.numel() - 1
    out = _output(out, (q.shape[0], heads, v.shape[2]), q)
    lse = torch.empty(heads, q.shape[0], dtype=torch.float32, device=q.device) if return_lse else None
    if batch > 0 and max_seqlen_q > 0 and out.numel() > 0:
        strides = tuple(x for t in (q, k, v, out) for x in (0, t.stride(1), t.stride(0), t.stride(2)))
        strides += (0, 0, 0) if lse is None else (0, *lse.stride())
        _launch(
            q,
            k,
            v,
            out,
            lse,
            (cu_seqlens_q, cu_seqlens_k),
            strides,
            batch=batch,
            heads=heads,
            kv_heads=kv_heads,
            seq_q=triton.next_power_of_2(max_seqlen_q),
            seq_k=triton.next_power_of_2(max(max_seqlen_k, 1)),
            grid_m=max_seqlen_q,
            scale=scale,
            causal=causal,
            causal_align=causal_align,
            varlen=True,
            block_m=block_m,
            block_n=block_n,
            window=window,
            chunk=chunk,
        )
    return out if lse is None else (out, lse)
