"""Flash attention forward as one Triton kernel: each (query tile, head) is one program.

A program loads its tile of queries once and keeps it in registers, then streams the K/V tiles
past it; scores, softmax weights and the running row statistics exist only on chip. Supports any
strides, GQA by index (query head h reads kv head h // (heads // kv_heads)), any sequence lengths,
head_dim up to 128, fp16 / bf16 / fp32 in with fp32 accumulation, causal top-left aligned as SDPA's
``is_causal``. Forward only. Tiles are autotuned on a GPU; under Triton's interpreter
(``TRITON_INTERPRET=1`` before import) one small fixed tile is used instead.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpubench.triton_support import interpreted

INTERPRETED = interpreted()  # fixed when the kernels below are decorated

# Tiles for the interpreter: small so tests stay fast, and BLOCK_M != BLOCK_N so the causal
# split (full tiles, then diagonal tiles) is exercised in its general form.
INTERPRETER_BLOCK_M = 32
INTERPRETER_BLOCK_N = 16

# Autotuning candidates for Hopper/Ampere-class GPUs. 128 x 64 with 4-8 warps is where
# 16-bit attention usually lands; the smaller tiles are there for short sequences (more
# programs to fill the SMs) and for fp32 at head_dim 128, whose tiles are twice the bytes and
# may not fit shared memory at the bigger sizes (the autotuner skips configs that fail to fit).
GPU_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)
    for bm, bn, warps, stages in (
        (128, 128, 8, 3),
        (128, 64, 8, 3),
        (128, 64, 4, 3),
        (128, 32, 4, 4),
        (64, 64, 4, 4),
        (64, 32, 4, 3),
        (64, 32, 4, 2),
    )
]
AUTOTUNE_KEY = ["seq_q", "seq_k", "HEAD_DIM", "CAUSAL"]  # Triton adds the tensors' dtypes


@triton.jit
def _attend_key_tiles(acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
                      offs_m, offs_d, d_mask, n_lo, n_hi, seq_k, qk_scale_log2,
                      BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr):
    """Fold the key tiles starting in [n_lo, n_hi) into one query tile's running state.

    MASKED is a compile-time flag: the caller runs the tiles that every query of the tile can
    fully see with MASKED=False, so only the ragged last tile and the tiles crossing the causal
    diagonal pay for building and applying a mask.
    """
    for n_start in range(n_lo, n_hi, BLOCK_N):
        offs_n = n_start + tl.arange(0, BLOCK_N)

        # Load K already transposed, (head_dim, keys), by pointer arithmetic over its strides,
        # so q @ k is a plain tile matmul. Positions past seq_k (ragged edge) and channels past
        # head_dim (96 padded to 128) read as zero: a zero channel adds nothing to a dot product,
        # and the ragged keys are masked to -inf below.
        k_ptrs = k_base + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
        if MASKED:
            k = tl.load(k_ptrs, mask=d_mask[:, None] & (offs_n[None, :] < seq_k), other=0.0)
        else:
            k = tl.load(k_ptrs, mask=d_mask[:, None], other=0.0)
        if DOT_IN_FP32:
            k = k.to(tl.float32)

        # Scores in fp32, already multiplied by scale * log2(e): exp2 of these equals exp of
        # the scaled scores, and exp2 is what the hardware computes natively.
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * qk_scale_log2
        if MASKED:
            visible = offs_n[None, :] < seq_k
            if CAUSAL:
                visible = visible & (offs_n[None, :] <= offs_m[:, None])
            scores = tl.where(visible, scores, float("-inf"))

        # Online softmax update. What was accumulated so far was exponentiated against the old
        # row maximum; when this tile raises the maximum, the old sum and output are too large
        # by exp(old - new), so both are rescaled by that factor before this tile's weights,
        # taken against the new maximum (never above 1, so nothing overflows), are added.
        # Every row has a finite maximum after its first tile: key 0 is visible to every
        # query, causal or not, and the first tile processed always contains it. So a row that
        # sees nothing of a later tile gets new_max == row_max and weights exp2(-inf) = 0,
        # never the NaN of (-inf) - (-inf).
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        correction = tl.exp2(row_max - new_max)
        weights = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * correction + tl.sum(weights, 1)

        # The weights go back to V's dtype for the second matmul (16-bit tensor-core inputs),
        # accumulated into the fp32 output.
        v_ptrs = v_base + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd
        if MASKED:
            v = tl.load(v_ptrs, mask=(offs_n[:, None] < seq_k) & d_mask[None, :], other=0.0)
        else:
            v = tl.load(v_ptrs, mask=d_mask[None, :], other=0.0)
        weights = weights.to(v.dtype)
        if DOT_IN_FP32:
            weights = weights.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * correction[:, None]
        acc = tl.dot(weights, v, acc, input_precision=DOT_PRECISION)
        row_max = new_max
    return acc, row_max, row_sum


@triton.jit
def _flash_attention_fwd(q_ptr, k_ptr, v_ptr, out_ptr,
                         stride_qb, stride_qh, stride_qm, stride_qd,
                         stride_kb, stride_kh, stride_kn, stride_kd,
                         stride_vb, stride_vh, stride_vn, stride_vd,
                         stride_ob, stride_oh, stride_om, stride_od,
                         heads, group, seq_q, seq_k, qk_scale_log2,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                         DOT_PRECISION: tl.constexpr, DOT_IN_FP32: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    m_block = tl.program_id(0)
    batch_head = tl.program_id(1)
    b = batch_head // heads
    h = batch_head % heads
    # GQA by indexing: the query heads h of one group all read kv head h // group.
    kv_h = h // group

    # Batch and head offsets in int64: batch * heads * seq * head_dim can pass 2^31 elements.
    q_base = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = k_ptr + b.to(tl.int64) * stride_kb + kv_h.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + kv_h.to(tl.int64) * stride_vh
    o_base = out_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh

    m_start = m_block * BLOCK_M
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    m_mask = offs_m < seq_q

    # Load the query tile once; it stays in registers while every K/V tile it needs streams
    # past. Rows past seq_q read as zero (they are computed, harmlessly, and never stored).
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=m_mask[:, None] & d_mask[None, :], other=0.0)
    if DOT_IN_FP32:
        q = q.to(tl.float32)

    # Running state per query row, fp32 whatever the input dtype: the largest (log2-scaled)
    # score so far, the softmax denominator relative to it, and the unnormalised output.
    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Split the keys into tiles every row can fully see (no mask) and the rest (masked).
    # Causal: a key tile is fully visible when its last key is <= this tile's first query;
    # tiles starting at or after the tile's last query + 1 are invisible to every row and are
    # never loaded, which is what halves causal attention's work. Only the tiles in between,
    # those crossing the diagonal, are masked. Not causal: only the ragged last tile is.
    if CAUSAL:
        full_end = tl.minimum((m_start + 1) // BLOCK_N, seq_k // BLOCK_N) * BLOCK_N
        masked_end = tl.minimum(m_start + BLOCK_M, seq_k)
    else:
        full_end = (seq_k // BLOCK_N) * BLOCK_N
        masked_end = seq_k
    acc, row_max, row_sum = _attend_key_tiles(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, d_mask, 0, full_end, seq_k, qk_scale_log2,
        BLOCK_N=BLOCK_N, MASKED=False, CAUSAL=CAUSAL, DOT_PRECISION=DOT_PRECISION,
        DOT_IN_FP32=DOT_IN_FP32)
    acc, row_max, row_sum = _attend_key_tiles(
        acc, row_max, row_sum, q, k_base, v_base, stride_kn, stride_kd, stride_vn, stride_vd,
        offs_m, offs_d, d_mask, full_end, masked_end, seq_k, qk_scale_log2,
        BLOCK_N=BLOCK_N, MASKED=True, CAUSAL=CAUSAL, DOT_PRECISION=DOT_PRECISION,
        DOT_IN_FP32=DOT_IN_FP32)

    # Normalise once at the end, by the complete denominator, rather than on every tile; then
    # store in the output's dtype, leaving out padded rows and channels.
    acc = acc / row_sum[:, None]
    tl.store(o_base + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od,
             acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & d_mask[None, :])


_flash_attention_fwd_tuned = (None if INTERPRETED else
                              triton.autotune(configs=GPU_CONFIGS, key=AUTOTUNE_KEY)(_flash_attention_fwd))

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128


def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                           scale: float | None = None, *, block_m: int | None = None,
                           block_n: int | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v by the Triton kernel. q (batch, heads, seq_q, head_dim), k and v
    (batch, kv_heads, seq_k, head_dim), heads a multiple of kv_heads; any strides.

    ``block_m`` / ``block_n`` (powers of two >= 16) fix the tiles instead of the autotuned ones
    (GPU) or the interpreter's fixed ones; give both or neither.
    ``out``: write into this tensor (q's shape, dtype and device; any strides) and return it.
    """
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if k.shape != v.shape or k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must be (batch={batch}, kv_heads, seq_k, "
                         f"head_dim={head_dim})")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"q, k, v must share one dtype of {SUPPORTED_DTYPES} (got {q.dtype}, {k.dtype}, {v.dtype})")
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} is not supported (1..{MAX_HEAD_DIM})")
    if (block_m is None) != (block_n is None):
        raise ValueError("give both block_m and block_n, or neither")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block is not None and (block < 16 or block & (block - 1)):
            raise ValueError(f"{name} must be a power of two >= 16 (got {block})")
    if not q.is_cuda and not INTERPRETED:
        raise RuntimeError("the Triton flash-attention kernel needs CUDA tensors, or TRITON_INTERPRET=1 set "
                           "before gpubench.optimizations.flash_attention_triton is imported")
    if seq_k == 0 and seq_q > 0:
        raise ValueError("attention over zero keys is undefined (seq_k == 0)")
    if scale is None:
        scale = head_dim ** -0.5

    if out is None:
        out = torch.empty(batch, heads, seq_q, head_dim, dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must match q: {tuple(q.shape)} {q.dtype} on {q.device} "
                         f"(got {tuple(out.shape)} {out.dtype} on {out.device})")
    if out.numel() == 0:
        return out
    args = (q, k, v, out, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
            heads, heads // kv_heads, seq_q, seq_k, scale * math.log2(math.e))
    # Triton's interpreter keeps bf16 as raw uint16 bits and its tl.dot multiplies those bits as
    # integers (triton-lang/triton#11584; its debugging guide says to cast bf16 to fp32 there),
    # so under the interpreter the bf16 operands are widened to fp32 first. The products are the
    # same (a bf16 x bf16 product is exact in fp32, as on tensor cores) and the weights are still
    # rounded to bf16 before the second matmul; only the interpreter takes this path.
    dot_in_fp32 = INTERPRETED and q.dtype == torch.bfloat16
    constants = dict(
        HEAD_DIM=head_dim,
        # tl.dot needs power-of-two tiles of at least 16; head_dim 96 runs as 128, masked.
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        CAUSAL=bool(causal),
        # fp32 inputs: full-precision products ("ieee"), not the default TF32 tensor-core
        # path, whose 10-bit mantissa would miss fp32's tolerance by orders of magnitude.
        DOT_PRECISION="ieee" if q.dtype == torch.float32 or dot_in_fp32 else "tf32",
        DOT_IN_FP32=dot_in_fp32,
    )
    if block_m is None and _flash_attention_fwd_tuned is not None:
        grid = lambda meta: (triton.cdiv(seq_q, meta["BLOCK_M"]), batch * heads)  # noqa: E731
        _flash_attention_fwd_tuned[grid](*args, **constants)
    else:
        block_m = block_m or INTERPRETER_BLOCK_M
        block_n = block_n or INTERPRETER_BLOCK_N
        grid = (triton.cdiv(seq_q, block_m), batch * heads)
        _flash_attention_fwd[grid](*args, **constants, BLOCK_M=block_m, BLOCK_N=block_n,
                                   num_warps=4, num_stages=2)
    return out
