"""Flash attention backward as Triton kernels, and the autograd function around the forward kernel.

FlashAttention-2's backward: nothing of the forward's N x N probabilities is kept, only the
output and each row's log-sum-exp; a tile of probabilities is recomputed from those when needed.
Three kernels: a preprocess for delta = rowsum(dO * O); dK/dV with one program per key tile (and
kv head) that streams the query tiles seeing it, summing over the query heads of its GQA group; dQ
with one program per query tile that streams the key tiles it sees. dQ is a separate kernel rather
than atomic adds into an fp32 buffer: gradients are deterministic (the same bits every run), no
scratch buffer has to be zeroed (or reset between autotuning trials), at the cost of recomputing
Q K^T and dO V^T there: 7 tile matmuls per tile pair instead of 5, so a TFLOP/s figure that counts
the backward as 2.5x the forward (5 matmuls, flash-attn's convention) understates the work done by
7/5. Layouts, causal alignment, GQA, head dims and varlen packing as the forward
(:mod:`.flash_attention_triton`), and its two load paths: on sm_90 and later q, k, v and dO arrive
by tensor-descriptor (TMA) copies where their layout allows (never varlen), else by pointers; the
gradients are stored by pointers. Checked in Triton's interpreter against float64 autograd on both
paths; the GPU tiles below are reasoned, not yet measured.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpubench.lib.attention import check_shapes

# The forward kernel's own argument checks, tile helpers and configs: these files are one
# kernel (its forward and its backward), so sharing its private helpers crosses no layer.
from gpubench.lib.kernels.flash_attention_triton import (
    _check_call,
    _check_cu_seqlens,
    _descriptors,
    _first_visible,
    _heavy_first,
    _key_ranges,
    _load_rows,
    flash_attention_triton,
    flash_attention_varlen_triton,
    local_mask,
    uses_descriptors,
)
from gpubench.lib.kernels.flash_attention_triton_tiles import descriptor_configs, pointer_configs
from gpubench.lib.triton_support import interpreted
from gpubench.measure.autotune import PersistentAutotuner, length_bucket

INTERPRETED = interpreted()  # fixed when the kernels below are decorated

LOG2E = math.log2(math.e)

# Interpreter tiles: small, and BLOCK_M != BLOCK_N so the causal split is exercised in its general form.
INTERPRETER_BLOCK_M = 16
INTERPRETER_BLOCK_N = 32
# delta's rows per program: two (rows x head_dim_v) fp32 tiles, at head_dim_v 256 and 4 warps 128
# registers a thread; memory-bound, so nothing to tune.
PREPROCESS_BLOCK_M = 32

# GPU tiles (Ampere/Hopper-class; the autotuner drops configs that do not fit shared memory; none
# has run on a GPU yet, so they are reasoned, not measured). A dK/dV program keeps its K and V
# tiles and two fp32 accumulators (BLOCK_N x head_dim each) on chip and streams short query tiles
# past them, so it wants BLOCK_N large and BLOCK_M small; dQ is the mirror image (a tall query
# tile and its dQ accumulator stay, short key tiles stream). At head_dim 128 the largest, 128 keys
# x 2 accumulators over 8 warps, holds 128 fp32 registers a thread, as Triton's fused-attention
# tutorial's 32 x 128 backward tile. head_dim > 128 (256, MLA's 192 / 128 padded to 256 / 128)
# doubles every tile's bytes and the accumulators' registers: those configs halve the tiles (at
# most 128 accumulator registers a thread: 64 x 256 x 2 over 8 warps, 32 x 256 x 2 over 4) and use
# at most 2 pipeline stages.
DKDV_SHAPES = [(32, 128, 8, 3), (32, 128, 4, 3), (64, 128, 8, 2), (64, 64, 4, 3), (32, 64, 4, 4), (16, 64, 4, 3)]
DQ_SHAPES = [(128, 32, 8, 3), (128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (64, 32, 4, 4), (32, 64, 4, 3)]
DKDV_SHAPES_WIDE = [(32, 64, 8, 2), (16, 64, 8, 2), (32, 32, 4, 2), (64, 32, 8, 1)]
DQ_SHAPES_WIDE = [(64, 32, 8, 2), (64, 64, 8, 1), (32, 32, 4, 2), (32, 64, 4, 2)]
# Added on sm_90 and later (H100 / H200: 227 KiB of shared memory per block against an A100's 163,
# and wgmma tiles of 64 rows per warpgroup), head dims up to 128: deeper pipelines over the same
# shapes, as Triton's Hopper tutorial's backward (32 x 128 dK/dV and 128 x 32 dQ tiles, 4 warps, 5
# stages), and 64 x 128 / 128 x 64 over two warpgroups. Reasoned, not yet measured; a config that
# does not fit is skipped by the autotuner.
DKDV_SHAPES_SM90 = [(32, 128, 4, 5), (32, 128, 8, 4), (64, 128, 8, 3), (64, 128, 8, 4)]
DQ_SHAPES_SM90 = [(128, 32, 4, 5), (128, 32, 8, 4), (128, 64, 8, 3), (128, 64, 8, 4)]
# Lengths as power-of-two buckets, tunings kept on disk: as the forward (gpubench.measure.autotune); USE_TMA
# selects the path (each its own tuner, as the forward's).
AUTOTUNE_KEY = [
    "seq_q_bucket",
    "seq_k_bucket",
    "HEAD_DIM",
    "HEAD_DIM_V",
    "CAUSAL",
    "BOTTOM_RIGHT",
    "VARLEN",
    "USE_TMA",
    "LOCAL",  # a sliding window or chunks, and its size's bucket, as the forward's
    "local_bucket",
]  # + dtypes


def _compute_capability(t: torch.Tensor) -> int:
    """t's GPU's major compute capability (9: Hopper); 0 off CUDA."""
    return torch.cuda.get_device_capability(t.device)[0] if t.is_cuda else 0


def _autotuned(kernel, shapes, wide_shapes, sm90_shapes, name, descriptors=False):
    """``kernel`` autotuned over ``shapes`` for head dims up to 128 (with ``sm90_shapes`` on sm_90
    and later), ``wide_shapes`` above, its tunings kept on disk as ``name`` (per GPU model, so the
    candidates that depend on the GPU need no place in the key). ``descriptors``: the tuner of the
    descriptor path (sm_90 and later only), whose configs set the descriptors' boxes."""
    make = descriptor_configs if descriptors else pointer_configs
    narrow, wide, sm90 = make(shapes), make(wide_shapes), make(sm90_shapes)

    def prune(candidates, named_args, **kwargs):
        large = max(kwargs["BLOCK_D"], kwargs["BLOCK_DV"]) > 128
        hopper = _compute_capability(named_args["lse_ptr"]) >= 9  # lse: a tensor on either path
        return [
            c for c in candidates if any(c is w for w in wide) == large and (hopper or not any(c is h for h in sm90))
        ]

    return (
        None
        if INTERPRETED
        else PersistentAutotuner(
            triton.autotune(
                configs=narrow + sm90 + wide, key=AUTOTUNE_KEY, prune_configs_by={"early_config_prune": prune}
            )(kernel),
            name,
        )
    )


@triton.jit
def _first_past(key, local_size, LOCAL: tl.constexpr):
    """The first aligned query position whose first visible key (the forward's _first_visible) lies
    past ``key`` (>= 0): key + window under a sliding window, the next chunk's start under chunks."""
    if LOCAL == 1:
        first = key + local_size
    else:
        first = (key // local_size + 1) * local_size
    return first


@triton.jit
def _document(cu_ptr, b, seq_len, VARLEN: tl.constexpr):
    """(first row, length) of sequence b: a document of the packed tensor, or the whole padded one."""
    if VARLEN:
        start = tl.load(cu_ptr + b)
        seq_len = tl.load(cu_ptr + b + 1) - start
    else:
        start = b * 0
    return start, seq_len


@triton.jit
def _documents(cu_q_ptr, cu_k_ptr, b, seq_q, seq_k, VARLEN: tl.constexpr, BOTTOM_RIGHT: tl.constexpr):
    """Sequence b's query and key spans, and its causal diagonal: query i sees key j iff
    j <= i + diagonal. Bottom-right aligns the last query with the last key (flash-attn >= 2.1),
    top-left the first with the first (SDPA's is_causal)."""
    q_start, seq_q = _document(cu_q_ptr, b, seq_q, VARLEN)
    k_start, seq_k = _document(cu_k_ptr, b, seq_k, VARLEN)
    diagonal = seq_k - seq_q if BOTTOM_RIGHT else 0
    return q_start, seq_q, k_start, seq_k, diagonal


@triton.jit
def _base(ptr, b, h, start, stride_b, stride_h, stride_m):
    # int64: batch * heads * seq * head_dim can pass 2^31 elements. Varlen passes stride_b = 0.
    return ptr + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h + start.to(tl.int64) * stride_m


@triton.jit
def _sources(
    a_ptr, c_ptr, b, h, start, stride_ab, stride_ah, stride_am, stride_cb, stride_ch, stride_cm, USE_TMA: tl.constexpr
):
    """What _load_rows reads two tensors' rows of sequence b, head h from: their descriptors
    (USE_TMA: the whole tensors, indexed at (b, h) by the load) or their base pointers."""
    if USE_TMA:
        a_src = a_ptr
        c_src = c_ptr
    else:
        a_src = _base(a_ptr, b, h, start, stride_ab, stride_ah, stride_am)
        c_src = _base(c_ptr, b, h, start, stride_cb, stride_ch, stride_cm)
    return a_src, c_src


@triton.jit
def _load_pair(
    a_src,
    c_src,
    b,
    h,
    row0,
    offs_r,
    offs_d,
    d_mask,
    offs_dv,
    dv_mask,
    n_rows,
    stride_ar,
    stride_ad,
    stride_cr,
    stride_cd,
    USE_TMA: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    """Rows row0.. of two tensors of sequence b, head h, the first with head_dim channels and the
    second with head_dim_v (q and dO, or k and v), from _sources; rows past n_rows read as zero."""
    a = _load_rows(
        a_src,
        b,
        h,
        row0,
        offs_r,
        offs_d,
        d_mask,
        n_rows,
        stride_ar,
        stride_ad,
        MASKED=True,
        TRANSPOSED=False,
        USE_TMA=USE_TMA,
        BLOCK_R=BLOCK_R,
        BLOCK_C=BLOCK_D,
    )
    c = _load_rows(
        c_src,
        b,
        h,
        row0,
        offs_r,
        offs_dv,
        dv_mask,
        n_rows,
        stride_cr,
        stride_cd,
        MASKED=True,
        TRANSPOSED=False,
        USE_TMA=USE_TMA,
        BLOCK_R=BLOCK_R,
        BLOCK_C=BLOCK_DV,
    )
    return a, c


@triton.jit
def _load_tile(base, rows, cols, stride_r, stride_c, row_mask, col_mask):
    """The (rows, cols) tile at ``base`` by strides; elements outside the masks read as 0."""
    return tl.load(
        base + rows[:, None] * stride_r + cols[None, :] * stride_c,
        mask=row_mask[:, None] & col_mask[None, :],
        other=0.0,
    )


@triton.jit
def _bwd_preprocess(
    out_ptr,
    do_ptr,
    delta_ptr,
    cu_q_ptr,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_lb,
    stride_lh,
    stride_lm,
    heads,
    seq_q,
    HEAD_DIM_V: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    VARLEN: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """delta_i = sum_d dO_id O_id = sum_j P_ij dP_ij, the term softmax's gradient subtracts."""
    m_block = tl.program_id(0)
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    start, seq_q = _document(cu_q_ptr, b, seq_q, VARLEN)
    if m_block * BLOCK_M >= seq_q:
        return
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_mask = offs_m < seq_q
    dv_mask = offs_dv < HEAD_DIM_V
    o = _load_tile(
        _base(out_ptr, b, h, start, stride_ob, stride_oh, stride_om),
        offs_m,
        offs_dv,
        stride_om,
        stride_od,
        m_mask,
        dv_mask,
    )
    do = _load_tile(
        _base(do_ptr, b, h, start, stride_dob, stride_doh, stride_dom),
        offs_m,
        offs_dv,
        stride_dom,
        stride_dod,
        m_mask,
        dv_mask,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(_base(delta_ptr, b, h, start, stride_lb, stride_lh, stride_lm) + offs_m * stride_lm, delta, mask=m_mask)


@triton.jit
def _load_row_stats(lse_base, delta_base, offs_m, m_mask, stride_lm):
    """A query tile's log2-scaled log-sum-exp and delta. Rows past the sequence read lse +inf, so
    exp2(s - lse) is exactly 0 for them. A row that sees no key (lse -inf: bottom-right, seq_q >
    seq_k) is only ever in a masked tile (its tile's first row sees no key either, so the causal
    split puts no full tile before it), where its infinite exp2 is replaced by 0, never multiplied."""
    lse = tl.load(lse_base + offs_m * stride_lm, mask=m_mask, other=float("inf")) * 1.4426950408889634  # log2(e)
    delta = tl.load(delta_base + offs_m * stride_lm, mask=m_mask, other=0.0)
    return lse, delta


@triton.jit
def _dq_key_tiles(
    dq,
    q,
    do,
    lse2,
    delta,
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
    offs_dv,
    d_mask,
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
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """dQ += dS K over the key tiles starting in [n_lo, n_hi); dS = P * (dP - delta), dP = dO V^T.
    K and V by pointers from this (batch, kv head)'s bases, or by descriptors (USE_TMA), as the forward."""
    for n_start in range(n_lo, n_hi, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)
        # K and V transposed, (head_dim, keys). A MASKED tile may pass seq_k: those keys read as
        # zero and their probabilities are forced to 0 below (a zero key row alone would not do:
        # exp2(0 - lse) can overflow and 0 * inf is NaN).
        n_mask = offs_n < seq_k
        kt = _load_rows(
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
        vt = _load_rows(
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
            TRANSPOSED=True,
            USE_TMA=USE_TMA,
            BLOCK_R=BLOCK_N,
            BLOCK_C=BLOCK_DV,
        )
        in_dtype = kt.dtype
        if DOT_IN_FP32:
            kt = kt.to(tl.float32)
            vt = vt.to(tl.float32)
        # The forward's probabilities, recomputed exactly: exp2 of the log2-scaled scores minus
        # the row's log2 log-sum-exp (no running max or sum needed, the forward's lse has them).
        p = tl.exp2(tl.dot(q, kt, input_precision=DOT_PRECISION) * qk_scale_log2 - lse2[:, None])
        if MASKED:
            visible = n_mask[None, :]
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None] + diagonal)
                if LOCAL != 0:
                    first = _first_visible(offs_m[:, None] + diagonal, local_size, LOCAL)
                    visible = visible & (offs_n[None, :] >= first)
            p = tl.where(visible, p, 0.0)
        dp = tl.dot(do, vt, input_precision=DOT_PRECISION)
        # dS goes to the inputs' dtype for the matmul (16-bit tensor cores), accumulated in fp32.
        ds = (p * (dp - delta[:, None])).to(in_dtype)
        if DOT_IN_FP32:
            ds = ds.to(tl.float32)
        dq = tl.dot(ds, tl.trans(kt), dq, input_precision=DOT_PRECISION)
    return dq


@triton.jit
def _dkdv_query_tiles(
    dk,
    dv,
    k,
    v,
    q_src,
    do_src,
    desc_b,
    desc_h,
    lse_base,
    delta_base,
    stride_qm,
    stride_qd,
    stride_dom,
    stride_dod,
    stride_lm,
    offs_n,
    offs_d,
    offs_dv,
    d_mask,
    dv_mask,
    m_lo,
    m_hi,
    seq_q,
    seq_k,
    diagonal,
    local_size,
    qk_scale_log2,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    MASKED: tl.constexpr,
    LOCAL: tl.constexpr,
    USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
):
    """dV += P^T dO and dK += dS^T Q over the query tiles starting in [m_lo, m_hi), transposed
    (keys are this program's rows). Query rows past seq_q read as zero with lse +inf: P^T is 0 there,
    so the ragged last tile needs no mask. Key rows past seq_k are computed and never stored.
    Q and dO by pointers from this (batch, head)'s bases, or by descriptors (USE_TMA)."""
    for m_start in range(m_lo, m_hi, BLOCK_M):
        offs_m = m_start + tl.arange(0, BLOCK_M)
        m_mask = offs_m < seq_q
        q, do = _load_pair(
            q_src,
            do_src,
            desc_b,
            desc_h,
            m_start,
            offs_m,
            offs_d,
            d_mask,
            offs_dv,
            dv_mask,
            seq_q,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            USE_TMA,
            BLOCK_M,
            BLOCK_D,
            BLOCK_DV,
        )
        lse2, delta = _load_row_stats(lse_base, delta_base, offs_m, m_mask, stride_lm)
        in_dtype = q.dtype
        if DOT_IN_FP32:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        pt = tl.exp2(tl.dot(k, tl.trans(q), input_precision=DOT_PRECISION) * qk_scale_log2 - lse2[None, :])
        if MASKED:  # a tile crossing the causal diagonal: query i sees key j iff j <= i + diagonal
            visible = offs_n[:, None] <= offs_m[None, :] + diagonal
            if LOCAL != 0:
                # and a local mask's lower edge: j >= _first_visible(i + diagonal); and keys past
                # seq_k, which a row seeing no key at all (lse -inf, top-left past the last key)
                # would otherwise weigh as inf into rows that are never stored
                first = _first_visible(offs_m[None, :] + diagonal, local_size, LOCAL)
                visible = visible & (offs_n[:, None] >= first) & (offs_n[:, None] < seq_k)
            pt = tl.where(visible, pt, 0.0)
        # As the forward's second matmul: probabilities rounded to the inputs' dtype, fp32 accumulation.
        pt_in = pt.to(in_dtype)
        if DOT_IN_FP32:
            pt_in = pt_in.to(tl.float32)
        dv = tl.dot(pt_in, do, dv, input_precision=DOT_PRECISION)
        dpt = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)
        dst = (pt * (dpt - delta[None, :])).to(in_dtype)
        if DOT_IN_FP32:
            dst = dst.to(tl.float32)
        dk = tl.dot(dst, q, dk, input_precision=DOT_PRECISION)
    return dk, dv


@triton.jit
def _query_ranges(
    n_start,
    seq_q,
    seq_k,
    diagonal,
    local_size,
    CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The dK/dV program's split of the query tiles for its key tile at n_start, (m_lo, m_full,
    m_full_end, m_end): tiles starting in [m_lo, m_full) and [m_full_end, m_end) masked, in
    [m_full, m_full_end) whole (every row sees every key of the tile), none other run.

    Causal: query tiles before the first query that sees this tile's first key are skipped;
    from m_lo the tiles crossing the diagonal are masked; from m_full every query sees every key
    of the tile. Keys a causal mask hides from every query (top-left, seq_k > seq_q) get m_lo at
    seq_q: no tile runs and their gradients are stored as 0.
    A local mask: query tiles from m_end on see none of this tile's keys (each row's first visible
    key is past its last key) and are skipped; from m_full_end some row misses its first key, so
    those up to m_end are masked again. Where no query tile sees the whole key tile the ranges
    clip, so that each query tile still runs once."""
    if CAUSAL:
        m_lo = tl.maximum(n_start - diagonal, 0) // BLOCK_M * BLOCK_M
        m_lo = tl.where(n_start - diagonal >= seq_q, seq_q, m_lo)  # no query reaches this tile's keys
        m_full = tl.cdiv(tl.maximum(n_start + BLOCK_N - 1 - diagonal, 0), BLOCK_M) * BLOCK_M
        m_full = tl.minimum(tl.maximum(m_full, m_lo), seq_q)
    else:
        m_lo = seq_q * 0
        m_full = seq_q * 0
    if LOCAL != 0:
        n_last = tl.minimum(n_start + BLOCK_N, seq_k) - 1
        m_end = tl.cdiv(tl.maximum(_first_past(n_last, local_size, LOCAL) - diagonal, 0), BLOCK_M) * BLOCK_M
        m_end = tl.minimum(m_end, seq_q)
        m_full = tl.minimum(m_full, m_end)
        m_full_end = tl.maximum(_first_past(n_start, local_size, LOCAL) - diagonal, 0) // BLOCK_M * BLOCK_M
        m_full_end = tl.maximum(tl.minimum(m_full_end, m_end), m_full)
    else:
        m_end = seq_q
        m_full_end = seq_q
    return m_lo, m_full, m_full_end, m_end


@triton.jit
def _bwd_dq(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dq_ptr,
    cu_q_ptr,
    cu_k_ptr,
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
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_lb,
    stride_lh,
    stride_lm,
    stride_dqb,
    stride_dqh,
    stride_dqm,
    stride_dqd,
    heads,
    group,
    seq_q,
    seq_k,
    sm_scale,
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
    USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dQ of one query tile of one (batch, head). USE_TMA: q, k, v and do arrive as tensor
    descriptors of the padded 4-D tensors (never varlen), else as pointers with their strides."""
    m_block = _heavy_first(CAUSAL)  # the longest query tiles first, as the forward
    b = tl.program_id(1) // heads
    h = tl.program_id(1) % heads
    kv_h = h // group  # GQA by indexing, as the forward
    q_start, seq_q, k_start, seq_k, diagonal = _documents(cu_q_ptr, cu_k_ptr, b, seq_q, seq_k, VARLEN, BOTTOM_RIGHT)
    m_start = m_block * BLOCK_M
    if m_start >= seq_q:  # varlen: the grid covers the longest document
        return

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    m_mask = offs_m < seq_q
    d_mask = offs_d < HEAD_DIM
    dv_mask = offs_dv < HEAD_DIM_V
    q_src, do_src = _sources(
        q_ptr, do_ptr, b, h, q_start, stride_qb, stride_qh, stride_qm, stride_dob, stride_doh, stride_dom, USE_TMA
    )
    k_src, v_src = _sources(
        k_ptr, v_ptr, b, kv_h, k_start, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, USE_TMA
    )
    q, do = _load_pair(
        q_src,
        do_src,
        b,
        h,
        m_start,
        offs_m,
        offs_d,
        d_mask,
        offs_dv,
        dv_mask,
        seq_q,
        stride_qm,
        stride_qd,
        stride_dom,
        stride_dod,
        USE_TMA,
        BLOCK_M,
        BLOCK_D,
        BLOCK_DV,
    )
    lse2, delta = _load_row_stats(
        _base(lse_ptr, b, h, q_start, stride_lb, stride_lh, stride_lm),
        _base(delta_ptr, b, h, q_start, stride_lb, stride_lh, stride_lm),
        offs_m,
        m_mask,
        stride_lm,
    )
    if DOT_IN_FP32:
        q = q.to(tl.float32)
        do = do.to(tl.float32)

    # Key tiles every row of this query tile sees whole run unmasked; then the tiles crossing the
    # diagonal (and the ragged last one) masked; tiles past the last visible key of the tile's last
    # row are skipped: the forward's split (_key_ranges). A local mask adds the masked tiles across
    # its lower edge, before them, and skips every tile wholly before the first row's first key.
    diagonal, n_first, full_start, full_end, n_hi = _key_ranges(
        m_start, seq_q, seq_k, local_size, CAUSAL, BOTTOM_RIGHT, LOCAL, BLOCK_M, BLOCK_N
    )
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if LOCAL != 0:
        dq = _dq_key_tiles(
            dq,
            q,
            do,
            lse2,
            delta,
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
            offs_dv,
            d_mask,
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
            DOT_PRECISION=DOT_PRECISION,
            DOT_IN_FP32=DOT_IN_FP32,
        )
    dq = _dq_key_tiles(
        dq,
        q,
        do,
        lse2,
        delta,
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
        offs_dv,
        d_mask,
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
        DOT_PRECISION=DOT_PRECISION,
        DOT_IN_FP32=DOT_IN_FP32,
    )
    dq = _dq_key_tiles(
        dq,
        q,
        do,
        lse2,
        delta,
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
        offs_dv,
        d_mask,
        dv_mask,
        full_end,
        n_hi,
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
        DOT_PRECISION=DOT_PRECISION,
        DOT_IN_FP32=DOT_IN_FP32,
    )
    # Every row is stored, a row that sees no key as 0.
    tl.store(
        _base(dq_ptr, b, h, q_start, stride_dqb, stride_dqh, stride_dqm)
        + offs_m[:, None] * stride_dqm
        + offs_d[None, :] * stride_dqd,
        (dq * sm_scale).to(dq_ptr.dtype.element_ty),
        mask=m_mask[:, None] & d_mask[None, :],
    )


@triton.jit
def _bwd_dkdv(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    lse_ptr,
    delta_ptr,
    dk_ptr,
    dv_ptr,
    cu_q_ptr,
    cu_k_ptr,
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
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dod,
    stride_lb,
    stride_lh,
    stride_lm,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dkd,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    stride_dvd,
    kv_heads,
    group,
    seq_q,
    seq_k,
    sm_scale,
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
    USE_TMA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """dK and dV of one key tile of one (batch, kv head); q, k, v and do by descriptors or pointers
    as :func:`_bwd_dq`."""
    n_block = tl.program_id(0)
    b = tl.program_id(1) // kv_heads
    kv_h = tl.program_id(1) % kv_heads
    q_start, seq_q, k_start, seq_k, diagonal = _documents(cu_q_ptr, cu_k_ptr, b, seq_q, seq_k, VARLEN, BOTTOM_RIGHT)
    n_start = n_block * BLOCK_N
    if n_start >= seq_k:
        return

    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    n_mask = offs_n < seq_k
    d_mask = offs_d < HEAD_DIM
    dv_mask = offs_dv < HEAD_DIM_V
    # This program's K and V tiles stay on chip while every query tile that sees them streams past.
    k_src, v_src = _sources(
        k_ptr, v_ptr, b, kv_h, k_start, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn, USE_TMA
    )
    k, v = _load_pair(
        k_src,
        v_src,
        b,
        kv_h,
        n_start,
        offs_n,
        offs_d,
        d_mask,
        offs_dv,
        dv_mask,
        seq_k,
        stride_kn,
        stride_kd,
        stride_vn,
        stride_vd,
        USE_TMA,
        BLOCK_N,
        BLOCK_D,
        BLOCK_DV,
    )
    if DOT_IN_FP32:
        k = k.to(tl.float32)
        v = v.to(tl.float32)

    m_lo, m_full, m_full_end, m_end = _query_ranges(
        n_start, seq_q, seq_k, diagonal, local_size, CAUSAL, LOCAL, BLOCK_M, BLOCK_N
    )
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    # GQA: the query heads of this kv head's group are summed here, in one program, so no two
    # programs write the same dK/dV rows.
    for g in range(group):
        h = kv_h * group + g
        q_src, do_src = _sources(
            q_ptr, do_ptr, b, h, q_start, stride_qb, stride_qh, stride_qm, stride_dob, stride_doh, stride_dom, USE_TMA
        )
        lse_base = _base(lse_ptr, b, h, q_start, stride_lb, stride_lh, stride_lm)
        delta_base = _base(delta_ptr, b, h, q_start, stride_lb, stride_lh, stride_lm)
        dk, dv = _dkdv_query_tiles(
            dk,
            dv,
            k,
            v,
            q_src,
            do_src,
            b,
            h,
            lse_base,
            delta_base,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            stride_lm,
            offs_n,
            offs_d,
            offs_dv,
            d_mask,
            dv_mask,
            m_lo,
            m_full,
            seq_q,
            seq_k,
            diagonal,
            local_size,
            qk_scale_log2,
            BLOCK_M=BLOCK_M,
            BLOCK_D=BLOCK_D,
            BLOCK_DV=BLOCK_DV,
            MASKED=CAUSAL,
            LOCAL=LOCAL,
            USE_TMA=USE_TMA,
            DOT_PRECISION=DOT_PRECISION,
            DOT_IN_FP32=DOT_IN_FP32,
        )
        dk, dv = _dkdv_query_tiles(
            dk,
            dv,
            k,
            v,
            q_src,
            do_src,
            b,
            h,
            lse_base,
            delta_base,
            stride_qm,
            stride_qd,
            stride_dom,
            stride_dod,
            stride_lm,
            offs_n,
            offs_d,
            offs_dv,
            d_mask,
            dv_mask,
            m_full,
            m_full_end,
            seq_q,
            seq_k,
            diagonal,
            local_size,
            qk_scale_log2,
            BLOCK_M=BLOCK_M,
            BLOCK_D=BLOCK_D,
            BLOCK_DV=BLOCK_DV,
            MASKED=False,
            LOCAL=LOCAL,
            USE_TMA=USE_TMA,
            DOT_PRECISION=DOT_PRECISION,
            DOT_IN_FP32=DOT_IN_FP32,
        )
        if LOCAL != 0:
            dk, dv = _dkdv_query_tiles(
                dk,
                dv,
                k,
                v,
                q_src,
                do_src,
                b,
                h,
                lse_base,
                delta_base,
                stride_qm,
                stride_qd,
                stride_dom,
                stride_dod,
                stride_lm,
                offs_n,
                offs_d,
                offs_dv,
                d_mask,
                dv_mask,
                m_full_end,
                m_end,
                seq_q,
                seq_k,
                diagonal,
                local_size,
                qk_scale_log2,
                BLOCK_M=BLOCK_M,
                BLOCK_D=BLOCK_D,
                BLOCK_DV=BLOCK_DV,
                MASKED=True,
                LOCAL=LOCAL,
                USE_TMA=USE_TMA,
                DOT_PRECISION=DOT_PRECISION,
                DOT_IN_FP32=DOT_IN_FP32,
            )
    tl.store(
        _base(dk_ptr, b, kv_h, k_start, stride_dkb, stride_dkh, stride_dkn)
        + offs_n[:, None] * stride_dkn
        + offs_d[None, :] * stride_dkd,
        (dk * sm_scale).to(dk_ptr.dtype.element_ty),
        mask=n_mask[:, None] & d_mask[None, :],
    )
    tl.store(
        _base(dv_ptr, b, kv_h, k_start, stride_dvb, stride_dvh, stride_dvn)
        + offs_n[:, None] * stride_dvn
        + offs_dv[None, :] * stride_dvd,
        dv.to(dv_ptr.dtype.element_ty),
        mask=n_mask[:, None] & dv_mask[None, :],
    )


TUNED = {  # (kernel, descriptors?) -> its tuner
    (_bwd_dq, False): _autotuned(_bwd_dq, DQ_SHAPES, DQ_SHAPES_WIDE, DQ_SHAPES_SM90, "flash_attention_bwd_dq"),
    (_bwd_dkdv, False): _autotuned(
        _bwd_dkdv, DKDV_SHAPES, DKDV_SHAPES_WIDE, DKDV_SHAPES_SM90, "flash_attention_bwd_dkdv"
    ),
    (_bwd_dq, True): _autotuned(
        _bwd_dq, DQ_SHAPES, DQ_SHAPES_WIDE, DQ_SHAPES_SM90, "flash_attention_bwd_dq_tma", descriptors=True
    ),
    (_bwd_dkdv, True): _autotuned(
        _bwd_dkdv, DKDV_SHAPES, DKDV_SHAPES_WIDE, DKDV_SHAPES_SM90, "flash_attention_bwd_dkdv_tma", descriptors=True
    ),
}


def _layout_strides(t: torch.Tensor, varlen: bool) -> tuple[int, ...]:
    """(batch, head, row[, channel]) strides of a padded (B, H, S[, D]) tensor, or of a packed
    (T, H[, D]) / lse (H, T) one as a batch of documents sharing storage (batch stride 0)."""
    if not varlen:
        return t.stride()
    if t.dim() == 2:  # lse (heads, tokens)
        return (0, t.stride(0), t.stride(1))
    return (0, t.stride(1), t.stride(0), t.stride(2))


def _check_backward_inputs(
    do,
    q,
    k,
    v,
    out,
    lse,
    varlen,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    block_m,
    block_n,
    causal_align,
    causal=False,
    window=0,
    chunk=0,
):
    """ValueError (RuntimeError: no way to run here) for what the backward cannot run; q, k, v, the
    tiles, causal_align, a local mask and the varlen offsets as the forward checks them."""
    check_shapes(q, k, v, seq_dim=0 if varlen else 2)
    _check_call(q, k, v, block_m, block_n, causal_align, causal, window, chunk)
    if varlen:
        if cu_seqlens_k is None or max_seqlen_q is None or max_seqlen_k is None:
            raise ValueError("varlen: give cu_seqlens_q, cu_seqlens_k, max_seqlen_q and max_seqlen_k together")
        _check_cu_seqlens(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        lse_shape = (q.shape[1], q.shape[0])
    else:
        if cu_seqlens_k is not None or max_seqlen_q is not None or max_seqlen_k is not None:
            raise ValueError("cu_seqlens_k, max_seqlen_q and max_seqlen_k need cu_seqlens_q (varlen)")
        lse_shape = tuple(q.shape[:3])
    out_shape = (*q.shape[:-1], v.shape[-1])
    if tuple(out.shape) != out_shape or tuple(do.shape) != out_shape:
        raise ValueError(
            f"out {tuple(out.shape)} and do {tuple(do.shape)} must both be {out_shape} (q's sizes with v's head_dim)"
        )
    if out.dtype != q.dtype or do.dtype != q.dtype:
        raise ValueError(f"out and do must have q's dtype {q.dtype} (got {out.dtype}, {do.dtype})")
    if tuple(lse.shape) != lse_shape or lse.dtype != torch.float32 or lse.device != q.device:
        raise ValueError(
            f"lse must be float32 {lse_shape} on {q.device}, as the forward returns it (got "
            f"{lse.dtype} {tuple(lse.shape)} on {lse.device})"
        )


def flash_attention_backward_triton(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    causal_align: str = "bottom_right",
    cu_seqlens_q: torch.Tensor | None = None,
    cu_seqlens_k: torch.Tensor | None = None,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    window: int = 0,
    chunk: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of out = softmax(q k^T * scale) v given do = dL/d(out), from the forward's out
    and lse (natural-log log-sum-exp of the scaled scores over visible keys, float32).

    Padded: q (B, H, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv), out and do (B, H, Sq, Dv), lse
    (B, H, Sq). Varlen (``cu_seqlens_q`` given): q (Tq, H, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv), lse
    (H, Tq), cu_seqlens_* int32 (documents + 1,), max_seqlen_* the longest document. Any strides;
    gradients in the inputs' dtypes. Causal: query i of a sequence sees key j iff j <= i + (Sk - Sq)
    (``causal_align="bottom_right"``) or j <= i (``"top_left"``). ``block_m`` / ``block_n`` fix
    the tiles of both kernels (powers of two >= 16) instead of the autotuned / interpreter ones.
    ``window`` / ``chunk``: the forward's local mask (causal only), whose skipped tiles both
    kernels skip too.
    """
    varlen = cu_seqlens_q is not None
    _check_backward_inputs(
        do,
        q,
        k,
        v,
        out,
        lse,
        varlen,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        block_m,
        block_n,
        causal_align,
        causal,
        window,
        chunk,
    )
    head_dim, head_dim_v = q.shape[-1], v.shape[-1]
    heads, kv_heads = q.shape[1], k.shape[1]
    if scale is None:
        scale = head_dim**-0.5
    if varlen:
        # (_check_backward_inputs refuses varlen without all four of its arguments)
        assert cu_seqlens_q is not None and cu_seqlens_k is not None
        assert max_seqlen_q is not None and max_seqlen_k is not None
        batch = cu_seqlens_q.numel() - 1
        grid_q, grid_k = max_seqlen_q, max_seqlen_k
        # As the forward: the kernels read each document's lengths from cu_seqlens; the length
        # arguments are only the autotuning key, max_seqlen rounded up to a power of two so that
        # batches of varying lengths reuse a few tunings.
        seq_q, seq_k = triton.next_power_of_2(max(max_seqlen_q, 1)), triton.next_power_of_2(max(max_seqlen_k, 1))
        # Rows outside every document (cu_seqlens_*[-1] short of the tensor) get 0.
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    else:
        batch, seq_q, seq_k = q.shape[0], q.shape[2], k.shape[2]
        grid_q, grid_k = seq_q, seq_k
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if batch == 0 or grid_q == 0 or grid_k == 0 or q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    lse = lse.contiguous()
    delta = torch.empty_like(lse)
    cu_q, cu_k = (cu_seqlens_q, cu_seqlens_k) if varlen else (lse, lse)  # unread placeholders when not varlen
    block_dv = max(16, triton.next_power_of_2(head_dim_v))

    _bwd_preprocess[(triton.cdiv(grid_q, PREPROCESS_BLOCK_M), batch * heads)](
        out,
        do,
        delta,
        cu_q,
        *_layout_strides(out, varlen),
        *_layout_strides(do, varlen),
        *_layout_strides(lse, varlen),
        heads,
        grid_q,
        HEAD_DIM_V=head_dim_v,
        BLOCK_DV=block_dv,
        VARLEN=varlen,
        BLOCK_M=PREPROCESS_BLOCK_M,
    )

    # Triton's interpreter keeps bf16 as raw uint16 bits and its tl.dot multiplies those bits as
    # integers (triton-lang/triton#11584), so there bf16 operands are widened to fp32 first, as in
    # the forward; probabilities and dS are still rounded to bf16 before their matmuls.
    dot_in_fp32 = INTERPRETED and q.dtype == torch.bfloat16
    block_d = max(16, triton.next_power_of_2(head_dim))
    # sm_90 and later: q, k, v and do as tensor descriptors where their layout allows (as the
    # forward: never varlen); the gradients are stored by pointers either way.
    use_tma = not varlen and uses_descriptors(q, k, v, do)
    tiles = dict(BLOCK_M=block_m or INTERPRETER_BLOCK_M, BLOCK_N=block_n or INTERPRETER_BLOCK_N)
    autotuned = block_m is None and not INTERPRETED
    inputs = (q, k, v, do)
    if use_tma:  # do's box is the forward's out's: query rows by v's channels
        inputs = _descriptors(q, k, v, do, block_d, block_dv, *((None, None) if autotuned else tiles.values()))
    constants = dict(
        HEAD_DIM=head_dim,
        HEAD_DIM_V=head_dim_v,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        CAUSAL=bool(causal),
        BOTTOM_RIGHT=causal_align == "bottom_right",
        LOCAL=local_mask(window, chunk)[0],
        VARLEN=varlen,
        USE_TMA=use_tma,
        # fp32 inputs: full-precision products, not TF32 (10-bit mantissa), as the forward.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or dot_in_fp32 else "tf32",
        DOT_IN_FP32=dot_in_fp32,
    )
    common = (
        *_layout_strides(q, varlen),
        *_layout_strides(k, varlen),
        *_layout_strides(v, varlen),
        *_layout_strides(do, varlen),
        *_layout_strides(lse, varlen),
    )
    # the scales and the local mask's size, then the lengths' autotuning buckets
    # a local mask's size (1, unread, without one) and its autotuning bucket, as the forward's
    local_size = local_mask(window, chunk)[1]
    local_bucket = length_bucket(window or chunk) if window or chunk else 0
    scales = (scale, scale * LOG2E, local_size, length_bucket(seq_q), length_bucket(seq_k), local_bucket)
    dq_args = (
        *inputs,
        lse,
        delta,
        dq,
        cu_q,
        cu_k,
        *common,
        *_layout_strides(dq, varlen),
        heads,
        heads // kv_heads,
        seq_q,
        seq_k,
        *scales,
    )
    dkdv_args = (
        *inputs,
        lse,
        delta,
        dk,
        dv,
        cu_q,
        cu_k,
        *common,
        *_layout_strides(dk, varlen),
        *_layout_strides(dv, varlen),
        kv_heads,
        heads // kv_heads,
        seq_q,
        seq_k,
        *scales,
    )
    dq_grid = lambda meta: (triton.cdiv(grid_q, meta["BLOCK_M"]), batch * heads)
    dkdv_grid = lambda meta: (triton.cdiv(grid_k, meta["BLOCK_N"]), batch * kv_heads)
    for kernel, grid, args in ((_bwd_dq, dq_grid, dq_args), (_bwd_dkdv, dkdv_grid, dkdv_args)):
        if autotuned:
            TUNED[(kernel, use_tma)][grid](*args, **constants)
        else:
            kernel[grid(tiles)](*args, **constants, **tiles, num_warps=4, num_stages=2)
    return dq, dk, dv


class FlashAttentionFunction(torch.autograd.Function):
    """Differentiable flash attention: the forward kernel with ``return_lse=True``, saving q, k, v,
    out and lse (O(seq) extra, never the N x N probabilities), and the backward kernels above."""

    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        causal,
        scale,
        causal_align,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        window=0,
        chunk=0,
    ):
        local = dict(window=window, chunk=chunk)
        if cu_seqlens_q is None:
            out, lse = flash_attention_triton(
                q, k, v, causal, scale, causal_align=causal_align, return_lse=True, **local
            )
        else:
            out, lse = flash_attention_varlen_triton(
                q,
                k,
                v,
                cu_seqlens_q,
                cu_seqlens_k,
                max_seqlen_q,
                max_seqlen_k,
                causal,
                scale,
                causal_align=causal_align,
                return_lse=True,
                **local,
            )
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.options = dict(
            causal=causal,
            scale=scale,
            causal_align=causal_align,
            max_seqlen_q=max_seqlen_q,
            max_seqlen_k=max_seqlen_k,
            **local,
        )
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the kernels' gradients have no graph: say so, not 0
    def backward(ctx, do):
        q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
        dq, dk, dv = flash_attention_backward_triton(
            do, q, k, v, out, lse, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, **ctx.options
        )
        return dq, dk, dv, None, None, None, None, None, None, None, None, None


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    causal_align: str = "bottom_right",
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor:
    """softmax(q k^T * scale) v, differentiable, by the Triton kernels: q (B, H, Sq, D), k (B, Hkv, Sk, D),
    v (B, Hkv, Sk, Dv) -> (B, H, Sq, Dv). Causal aligned bottom-right by default (flash-attn >= 2.1);
    ``window`` / ``chunk`` a sliding window or chunked local attention (causal only)."""
    return FlashAttentionFunction.apply(q, k, v, causal, scale, causal_align, None, None, None, None, window, chunk)


def flash_attn_varlen_func(
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
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor:
    """:func:`flash_attn_func` over packed documents, flash-attn's varlen layout: q (Tq, H, D), k (Tk, Hkv, D),
    v (Tk, Hkv, Dv) -> (Tq, H, Dv); document b is rows cu_seqlens_*[b]:cu_seqlens_*[b + 1] and attends
    only to itself, with causal alignment per document."""
    return FlashAttentionFunction.apply(
        q, k, v, causal, scale, causal_align, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, window, chunk
    )
