"""flash_attention's forward for real models (issue 20): the Triton kernel (run by Triton's
interpreter here) returns the log-sum-exp the backward pass recomputes from, handles head_dim up to
256 and a v head dim of its own (MLA's 192 / 128), aligns the causal diagonal bottom-right (the
default, flash-attn's) or top-left (SDPA's) with seq_q != seq_k, and runs packed variable-length
documents that never attend across each other; the eager baseline and the tiled PyTorch loop follow
the same conventions. Everything is checked against the float64 references of
gpubench/attention.py, which are themselves checked against SDPA with an explicit mask.
Sizes are tiny: the interpreter runs the kernel in numpy."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gpubench.baselines.flash_attention import attention
from gpubench.lib.attention import attention_reference, attention_reference_varlen
from gpubench.lib.kernels.flash_attention_triton import flash_attention_triton, flash_attention_varlen_triton
from gpubench.optimizations.flash_attention import flash_attention, flash_attention_torch

# Relative L2 error against float64 (the technique's): fp32 1e-5; 16-bit 1e-2. log-sum-exp, an
# absolute quantity of size ~log(seq_k): fp32 within 1e-5, 16-bit inputs within 1e-2 (their
# scores are exact in fp32, only the inputs were rounded, and the reference sees the same rounded
# inputs). Measured worst here: fp32 out 3e-7 and lse 8e-7; bf16 out 5e-3.
TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
LSE_TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((out.double() - ref).norm() / ref.norm()).item()


def qkv(batch=2, heads=4, kv_heads=2, seq_q=33, seq_k=33, head_dim=32, head_dim_v=None, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shapes = (
        (batch, heads, seq_q, head_dim),
        (batch, kv_heads, seq_k, head_dim),
        (batch, kv_heads, seq_k, head_dim_v or head_dim),
    )
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


def assert_lse_matches(lse: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    assert lse.dtype == torch.float32 and lse.shape == ref.shape
    empty = torch.isneginf(ref)
    assert torch.equal(torch.isneginf(lse), empty), "rows that see no key must have lse -inf, and only those"
    assert (lse.double()[~empty] - ref[~empty]).abs().max().item() <= tol


def sdpa_masked(q, k, v, causal, offset):
    """Independent check of the reference: SDPA's math with an explicit boolean mask."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    mask = None
    if causal:
        i = torch.arange(q.shape[2])[:, None]
        mask = torch.arange(k.shape[2])[None, :] <= i + offset
    return F.scaled_dot_product_attention(q.double(), k, v, attn_mask=mask)


# -- the references ------------------------------------------------------------------------------


@pytest.mark.parametrize("seq_q,seq_k", [(20, 50), (50, 50), (37, 16)])
def test_reference_aligns_causal_as_documented(seq_q, seq_k):
    q, k, v = qkv(seq_q=seq_q, seq_k=seq_k, head_dim=32, head_dim_v=16, dtype=torch.float64)
    assert torch.allclose(
        attention_reference(q, k, v, causal=True, causal_align="top_left"), sdpa_masked(q, k, v, True, 0), atol=1e-12
    )
    out = attention_reference(q, k, v, causal=True)  # the default: bottom-right
    offset = seq_k - seq_q
    visible = torch.arange(seq_q) + offset >= 0
    assert torch.allclose(out[:, :, visible], sdpa_masked(q, k, v, True, offset)[:, :, visible], atol=1e-12)
    assert (out[:, :, ~visible] == 0).all()  # rows that see no key: 0 (SDPA gives NaN)


def test_reference_varlen_is_each_document_alone():
    q, k, v = qkv(batch=1, seq_q=30, seq_k=30, dtype=torch.float64)
    cu = torch.tensor([0, 7, 7, 30], dtype=torch.int32)
    packed = [t[0].transpose(0, 1) for t in (q, k, v)]
    out = attention_reference_varlen(*packed, cu, cu, causal=True)
    for lo, hi in ((0, 7), (7, 30)):
        alone = attention_reference(*(t[:, :, lo:hi] for t in (q, k, v)), causal=True)
        assert torch.allclose(out[lo:hi], alone[0].transpose(0, 1), atol=1e-12)


# -- log-sum-exp ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kernel_returns_the_natural_log_sum_exp_of_each_row(dtype, causal):
    q, k, v = qkv(seq_q=45, seq_k=45, dtype=dtype)
    out, lse = flash_attention_triton(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal, return_lse=True)
    assert rel_err(out, ref_out) <= TOL[dtype]
    assert_lse_matches(lse, ref_lse, LSE_TOL[dtype])
    # The same output whether or not the lse is asked for (one kernel, one more store).
    assert torch.equal(out, flash_attention_triton(q, k, v, causal=causal))


def test_kernel_lse_follows_an_explicit_scale_and_gqa_heads():
    q, k, v = qkv(heads=6, kv_heads=2, seq_q=30, seq_k=41)
    _, lse = flash_attention_triton(q, k, v, scale=0.3, return_lse=True)
    _, ref = attention_reference(q, k, v, scale=0.3, return_lse=True)
    assert_lse_matches(lse, ref, 1e-5)


# -- head dims -----------------------------------------------------------------------------------


@pytest.mark.parametrize("head_dim,head_dim_v", [(256, 256), (192, 128), (160, 256), (64, 24), (8, 200)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kernel_handles_head_dims_to_256_and_a_separate_v_head_dim(head_dim, head_dim_v, causal):
    q, k, v = qkv(heads=2, kv_heads=1, seq_q=40, seq_k=40, head_dim=head_dim, head_dim_v=head_dim_v)
    out, lse = flash_attention_triton(q, k, v, causal=causal, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=causal, return_lse=True)
    assert out.shape == (2, 2, 40, head_dim_v)
    assert rel_err(out, ref_out) <= 1e-5
    assert_lse_matches(lse, ref_lse, 1e-5)


def test_kernel_mla_dims_in_bf16_and_every_output_element_written():
    q, k, v = qkv(heads=4, kv_heads=4, seq_q=37, seq_k=37, head_dim=192, head_dim_v=128, dtype=torch.bfloat16)
    out = torch.full((2, 37, 4, 128), float("nan"), dtype=torch.bfloat16).transpose(1, 2)  # non-contiguous
    flash_attention_triton(q, k, v, causal=True, out=out)
    assert not out.isnan().any()
    assert rel_err(out, attention_reference(q, k, v, causal=True)) <= 1e-2


# -- causal alignment with seq_q != seq_k ----------------------------------------------------------


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("seq_q,seq_k", [(16, 77), (1, 40), (45, 45), (77, 20), (33, 1)])
def test_kernel_aligns_the_causal_diagonal_as_asked(align, seq_q, seq_k):
    q, k, v = qkv(seq_q=seq_q, seq_k=seq_k)
    out, lse = flash_attention_triton(q, k, v, causal=True, causal_align=align, return_lse=True)
    ref_out, ref_lse = attention_reference(q, k, v, causal=True, causal_align=align, return_lse=True)
    assert rel_err(out, ref_out) <= 1e-5
    assert_lse_matches(lse, ref_lse, 1e-5)


def test_default_alignment_is_bottom_right_a_query_chunk_at_the_end_of_a_cache():
    # Chunked prefill: the last 8 queries of a 40-token sequence against all 40 keys must equal
    # the last 8 rows of the full causal attention (top-left would hide the cache's last keys).
    q, k, v = qkv(seq_q=40, seq_k=40)
    full = flash_attention_triton(q, k, v, causal=True)
    chunk = flash_attention_triton(q[:, :, 32:], k, v, causal=True)
    assert torch.allclose(chunk, full[:, :, 32:], rtol=1e-5, atol=1e-6)
    top_left = flash_attention_triton(q[:, :, 32:], k, v, causal=True, causal_align="top_left")
    assert not torch.allclose(top_left, full[:, :, 32:], atol=1e-3)


def test_rows_that_see_no_key_are_zero_with_lse_minus_inf():
    q, k, v = qkv(seq_q=50, seq_k=20)  # bottom-right: queries 0..29 see nothing
    out, lse = flash_attention_triton(q, k, v, causal=True, return_lse=True)
    assert (out[:, :, :30] == 0).all() and torch.isneginf(lse[:, :, :30]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse[:, :, 30:]).all()


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (16, 16), (64, 16)])
def test_kernel_bottom_right_split_is_exact_for_any_tile_shape(block_m, block_n):
    # The split into full and diagonal key tiles shifted by seq_k - seq_q, on both sides of square.
    for seq_q, seq_k in ((29, 70), (70, 29)):
        q, k, v = qkv(seq_q=seq_q, seq_k=seq_k)
        out = flash_attention_triton(q, k, v, causal=True, block_m=block_m, block_n=block_n)
        assert rel_err(out, attention_reference(q, k, v, causal=True)) <= 1e-5


# -- variable length -----------------------------------------------------------------------------


def packed(lengths_q, lengths_k, heads=4, kv_heads=2, head_dim=32, head_dim_v=None, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(lengths_q), sum(lengths_k)
    q = torch.randn(total_q, heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(total_k, kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(total_k, kv_heads, head_dim_v or head_dim, generator=gen).to(dtype)
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32) for n in (lengths_q, lengths_k)]
    return q, k, v, cu[0], cu[1], max(lengths_q), max(lengths_k)


VARLEN_CASES = {
    "equal": ([17, 40, 1, 33], [17, 40, 1, 33]),
    "empty-doc": ([20, 0, 45], [20, 0, 45]),
    "fewer-queries": ([5, 16, 1], [30, 16, 40]),  # chunked prefill per document
    "more-queries": ([30, 9], [12, 9]),
}


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", VARLEN_CASES)
def test_varlen_kernel_is_each_document_alone(case, causal, align):
    q, k, v, cu_q, cu_k, max_q, max_k = packed(*VARLEN_CASES[case])
    out, lse = flash_attention_varlen_triton(
        q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, causal_align=align, return_lse=True
    )
    ref_out, ref_lse = attention_reference_varlen(
        q, k, v, cu_q, cu_k, causal=causal, causal_align=align, return_lse=True
    )
    assert out.shape == (q.shape[0], 4, 32) and lse.shape == (4, q.shape[0])
    assert rel_err(out, ref_out) <= 1e-5
    assert_lse_matches(lse, ref_lse, 1e-5)


def test_varlen_documents_do_not_see_each_other():
    q, k, v, cu_q, cu_k, max_q, max_k = packed([20, 30], [20, 30])
    out = flash_attention_varlen_triton(q, k, v, cu_q, cu_k, max_q, max_k)
    k2, v2 = k.clone(), v.clone()
    k2[20:] += 3.0
    v2[20:] -= 3.0
    changed = flash_attention_varlen_triton(q, k2, v2, cu_q, cu_k, max_q, max_k)
    assert torch.equal(out[:20], changed[:20]) and not torch.allclose(out[20:], changed[20:])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_varlen_kernel_mla_dims_in_16_bits(dtype):
    q, k, v, cu_q, cu_k, max_q, max_k = packed(
        [23, 40], [23, 40], heads=2, kv_heads=1, head_dim=192, head_dim_v=128, dtype=dtype
    )
    out = flash_attention_varlen_triton(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)
    assert rel_err(out, attention_reference_varlen(q, k, v, cu_q, cu_k, causal=True)) <= 1e-2


def test_varlen_kernel_follows_strides_and_writes_every_row():
    q, k, v, cu_q, cu_k, max_q, max_k = packed([17, 40], [17, 40], heads=4, kv_heads=2)
    # q and k as slices of one fused qkv projection, v a slice of a wider tensor.
    qk = torch.cat([q, torch.cat([k, k], dim=1)], dim=-1)
    q_view, k_view = qk[..., :32], qk[:, :2, 32:]
    v_view = torch.cat([v, torch.full_like(v, 1e4)], dim=-1)[..., :32]
    out = torch.full((57, 4, 32), float("nan"))
    flash_attention_varlen_triton(q_view, k_view, v_view, cu_q, cu_k, max_q, max_k, causal=True, out=out)
    assert not out.isnan().any()
    assert rel_err(out, attention_reference_varlen(q, k, v, cu_q, cu_k, causal=True)) <= 1e-5


def test_varlen_rejects_offsets_it_cannot_trust():
    q, k, v, cu_q, cu_k, max_q, max_k = packed([10, 20], [10, 20])
    with pytest.raises(ValueError, match="int32"):
        flash_attention_varlen_triton(q, k, v, cu_q.long(), cu_k, max_q, max_k)
    with pytest.raises(ValueError, match="same length"):
        flash_attention_varlen_triton(q, k, v, cu_q[:2], cu_k, max_q, max_k)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flash_attention_varlen_triton(q, k, v, cu_q, cu_k, 15, max_k)
    with pytest.raises(ValueError, match="cu_seqlens_k"):
        flash_attention_varlen_triton(q, k, v, cu_q, torch.tensor([0, 10, 31], dtype=torch.int32), max_q, 21)


def test_kernel_rejects_unknown_alignment_and_head_dims_past_256():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="causal_align"):
        flash_attention_triton(q, k, v, causal=True, causal_align="bottom-right")
    with pytest.raises(ValueError, match="1..256"):
        flash_attention_triton(*qkv(head_dim=264))
    with pytest.raises(ValueError, match="head_dim_v"):
        flash_attention_triton(q, k, torch.randn(2, 2, 33, 300))


# -- the eager baseline and the tiled PyTorch loop -------------------------------------------------

LOOP_CASES = [  # (seq_q, seq_k, head_dim, head_dim_v, align)
    (45, 45, 32, 32, "bottom_right"),
    (20, 77, 64, 32, "bottom_right"),
    (20, 77, 64, 32, "top_left"),
    (77, 20, 192, 128, "bottom_right"),  # rows 0..56 see no key
    (77, 20, 256, 256, "top_left"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_q,seq_k,head_dim,head_dim_v,align", LOOP_CASES)
def test_eager_and_tiled_loop_follow_the_same_conventions(seq_q, seq_k, head_dim, head_dim_v, align, causal):
    q, k, v = qkv(seq_q=seq_q, seq_k=seq_k, head_dim=head_dim, head_dim_v=head_dim_v)
    ref = attention_reference(q, k, v, causal=causal, causal_align=align)
    # Small tiles so the diagonal, the skipped tiles and the empty rows cross several tiles.
    tiled = flash_attention_torch(q, k, v, causal=causal, causal_align=align, block_m=16, block_n=8)
    assert rel_err(tiled, ref) <= 1e-5
    assert rel_err(attention(q, k, v, causal=causal, causal_align=align), ref) <= 1e-5
    assert rel_err(flash_attention(q, k, v, causal=causal, causal_align=align), ref) <= 1e-5  # dispatch, CPU
    assert torch.isfinite(tiled).all()


@pytest.mark.parametrize(
    "seq_q,seq_k,align", [(40, 40, "bottom_right"), (40, 23, "bottom_right"), (17, 40, "top_left")]
)
def test_tiled_loop_and_eager_are_differentiable_to_float64_gradients(seq_q, seq_k, align):
    # The training mode's stand-ins off CUDA: autograd through the loop's in-place tile updates
    # (and through rows that see no key: gradient 0, not NaN) must give the exact gradients.
    q, k, v = qkv(heads=4, kv_heads=2, seq_q=seq_q, seq_k=seq_k, head_dim=32, head_dim_v=16)
    grad = torch.randn(2, 4, seq_q, 16, generator=torch.Generator().manual_seed(1))
    inputs64 = [t.double().requires_grad_() for t in (q, k, v)]
    attention_reference(*inputs64, causal=True, causal_align=align).backward(grad.double())
    for fn in (
        lambda *t: flash_attention_torch(*t, causal=True, causal_align=align, block_m=16, block_n=8),
        lambda *t: attention(*t, causal=True, causal_align=align),
    ):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*inputs).backward(grad)
        for got, want in zip(inputs, inputs64):
            assert torch.isfinite(got.grad).all()
            assert rel_err(got.grad, want.grad) <= 1e-5


def test_zero_keys_give_zero_rows_and_lse_minus_inf_everywhere():
    q, k, v = qkv(seq_q=20, seq_k=0, head_dim=16, head_dim_v=8)
    out, lse = flash_attention_triton(q, k, v, return_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    for fn in (flash_attention_torch, attention, attention_reference):
        assert (fn(q, k, v) == 0).all(), fn.__name__


def test_tiled_loop_and_eager_reject_unknown_alignment():
    q, k, v = qkv()
    for fn in (flash_attention_torch, attention, attention_reference):
        with pytest.raises(ValueError, match="causal_align"):
            fn(q, k, v, causal=True, causal_align="top-left")
