"""flash attention's Triton backward (run by Triton's interpreter without a GPU) gives the gradients
float64 autograd of the reference gives, for every mask alignment, length pair, GQA grouping, head
dim pair, packing and dtype the kernels accept; it writes every gradient element (rows that see no
key, keys no query sees: exactly 0) and is deterministic. Each case is tiny: the interpreter runs
the kernels in numpy."""

from __future__ import annotations

import pytest
import torch

from gpubench.lib.attention import attention_reference, attention_reference_varlen
from gpubench.lib.kernels.flash_attention_triton_bwd import (
    flash_attention_backward_triton,
    flash_attn_func,
    flash_attn_varlen_func,
)

# Relative L2 error against float64 autograd (relative_error). Worst measured here (AMD EPYC,
# torch 2.13.0+cpu, Triton 3.9 interpreter) over this file's cases: fp32 7.6e-7, bf16 3.6e-3,
# fp16 9.8e-5. 16-bit rounds P and dS to 8 (bf16) or 11 (fp16) bits before their matmuls, as
# FlashAttention-2 does on tensor cores.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}


def random_problem(
    batch=1, heads=2, kv_heads=1, seq_q=37, seq_k=53, head_dim=32, head_dim_v=None, dtype=torch.float32, seed=0
):
    """q, k, v and an upstream gradient, drawn in float32 and rounded to ``dtype`` (so the float64
    reference sees exactly the kernel's inputs)."""
    gen = torch.Generator().manual_seed(seed)
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    shapes = (
        (batch, heads, seq_q, head_dim),
        (batch, kv_heads, seq_k, head_dim),
        (batch, kv_heads, seq_k, head_dim_v),
        (batch, heads, seq_q, head_dim_v),
    )
    return [torch.randn(*shape, generator=gen).to(dtype) for shape in shapes]


def reference_gradients(q, k, v, do, reference=attention_reference, **options):
    """(out, lse, (dq, dk, dv)) of the float64 reference, gradients by autograd."""
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, lse = reference(*leaves, **options, return_lse=True)
    out.backward(do.double())
    return out, lse, tuple(t.grad for t in leaves)


def relative_error(got, want):
    """L2 error relative to the reference's norm, floored at an RMS of 1 (the scale of the unit-normal
    inputs and upstream gradient): with a single key the softmax is constant, dq and dk are exactly
    0, and fp32 rounding leaves ~1e-7 per element that no relative measure of a zero tensor accepts."""
    return ((got.double() - want).norm() / want.norm().clamp_min(want.numel() ** 0.5)).item()


def assert_gradients_close(got, want, inputs):
    """(dq, dk, dv) finite, in their inputs' shapes and dtypes, within the dtype's tolerance."""
    tolerance = TOLERANCE[inputs[0].dtype]
    for name, g, w, x in zip(("dq", "dk", "dv"), got, want, inputs):
        assert g.shape == x.shape and g.dtype == x.dtype, name
        assert torch.isfinite(g).all(), f"{name} has non-finite elements"
        error = relative_error(g, w)
        assert error < tolerance, f"{name}: relative error {error:.2e} >= {tolerance:.0e}"


def assert_gradients_match(q, k, v, do, causal=False, causal_align="bottom_right", **kernel_options):
    """The kernel's (dq, dk, dv) from the reference's out and lse against float64 autograd."""
    out, lse, want = reference_gradients(q, k, v, do, causal=causal, causal_align=causal_align)
    got = flash_attention_backward_triton(
        do, q, k, v, out.to(q.dtype), lse.float(), causal, causal_align=causal_align, **kernel_options
    )
    assert_gradients_close(got, want, (q, k, v))
    return got


@pytest.mark.parametrize(
    "seq_q,seq_k",
    [(40, 40), (37, 53), (53, 37), (1, 45), (45, 1)],
    ids=["equal", "fewer_queries", "more_queries", "one_query", "one_key"],
)
@pytest.mark.parametrize(
    "causal,causal_align",
    [(False, "bottom_right"), (True, "bottom_right"), (True, "top_left")],
    ids=["full", "causal_bottom_right", "causal_top_left"],
)
def test_gradients_match_float64_autograd_for_both_alignments_and_length_pairs(seq_q, seq_k, causal, causal_align):
    # None of these lengths is a multiple of the interpreter's tiles (16 x 32); with seq_q != seq_k
    # the two alignments put the diagonal in different places, and bottom-right with more queries
    # than keys leaves the first rows with no visible key.
    assert_gradients_match(*random_problem(seq_q=seq_q, seq_k=seq_k), causal, causal_align)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (4, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_sums_each_kv_heads_gradient_over_its_query_heads(heads, kv_heads, causal):
    q, k, v, do = random_problem(batch=2, heads=heads, kv_heads=kv_heads, seq_q=29, seq_k=41)
    dq, dk, dv = assert_gradients_match(q, k, v, do, causal)
    # An upstream gradient on the last kv head's query heads only reaches that kv head.
    group = heads // kv_heads
    do_last = torch.zeros_like(do)
    do_last[:, heads - group :] = do[:, heads - group :]
    _, dk_last, dv_last = assert_gradients_match(q, k, v, do_last, causal)
    assert not dk_last[:, -1].eq(0).all() and not dv_last[:, -1].eq(0).all()
    assert dk_last[:, :-1].eq(0).all() and dv_last[:, :-1].eq(0).all()


@pytest.mark.parametrize(
    "head_dim,head_dim_v", [(16, 16), (64, 64), (96, 96), (128, 128), (256, 256), (192, 128), (32, 80), (8, 24)]
)
def test_every_head_dim_pair_up_to_256_including_mla_192_128(head_dim, head_dim_v):
    # 96, 192, 80, 8 and 24 are not powers of two: their channels are padded, masked, on chip.
    problem = random_problem(seq_q=21, seq_k=35, head_dim=head_dim, head_dim_v=head_dim_v)
    assert_gradients_match(*problem, causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_16_bit_gradients_within_stated_tolerance(dtype, causal):
    assert_gradients_match(*random_problem(heads=4, kv_heads=2, seq_q=45, seq_k=61, head_dim=64, dtype=dtype), causal)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 16), (16, 64), (64, 16)])
@pytest.mark.parametrize("causal_align", ["bottom_right", "top_left"])
def test_causal_tile_split_is_exact_for_any_tile_shape(block_m, block_n, causal_align):
    # Which tiles are skipped, masked or run whole depends on block_m vs block_n and on where the
    # diagonal starts; the GPU autotuner picks tiles on both sides of square.
    problem = random_problem(seq_q=50, seq_k=77)
    assert_gradients_match(*problem, True, causal_align, block_m=block_m, block_n=block_n)
    problem = random_problem(seq_q=77, seq_k=50)
    assert_gradients_match(*problem, True, causal_align, block_m=block_m, block_n=block_n)


def test_causal_boundaries_are_exact_for_every_diagonal_position():
    # Which tiles run unmasked is decided by integer arithmetic on the diagonal; an off-by-one
    # there shows only when the diagonal falls on a particular row or column of a tile. 24
    # queries against 1..57 keys put the bottom-right diagonal at every offset -23..33: every
    # residue of the interpreter's 16 x 32 tiles, on both sides of square.
    for seq_k in range(1, 58):
        q, k, v, do = random_problem(heads=1, kv_heads=1, seq_q=24, seq_k=seq_k, head_dim=16, seed=seq_k)
        assert_gradients_match(q, k, v, do, True, "bottom_right")


def test_rows_without_keys_and_keys_without_queries_get_exact_zero_gradients():
    # Bottom-right with 50 queries and 20 keys: queries 0..29 see nothing (lse -inf). Top-left with
    # 20 queries and 50 keys: keys 20..49 are seen by no query. Both must be 0, not NaN or garbage.
    q, k, v, do = random_problem(seq_q=50, seq_k=20)
    dq, _, _ = assert_gradients_match(q, k, v, do, True, "bottom_right")
    assert dq[:, :, :30].eq(0).all() and not dq[:, :, 30:].eq(0).all()
    q, k, v, do = random_problem(seq_q=20, seq_k=50)
    _, dk, dv = assert_gradients_match(q, k, v, do, True, "top_left")
    assert dk[:, :, 20:].eq(0).all() and dv[:, :, 20:].eq(0).all()


def test_follows_strides_and_overwrites_every_element():
    # (batch, seq, heads, dim) storage viewed as (batch, heads, seq, dim), as a model produces
    # after splitting heads; an upstream gradient expanded from one value (stride 0, what
    # out.sum().backward() passes); outputs allocated by the kernel (empty, so any element the
    # kernels skipped would be garbage, not 0).
    q, k, v, _ = random_problem(batch=2, heads=4, kv_heads=2, seq_q=33, seq_k=33)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    do = torch.ones(1, 1, 1, 1).expand(2, 4, 33, 32)
    assert not q.is_contiguous() and do.stride() == (0, 0, 0, 0)
    assert_gradients_match(q, k, v, do, causal=True)


def test_gradients_are_deterministic():
    # dQ has its own kernel instead of atomic adds: the same inputs give the same bits.
    q, k, v, do = random_problem(heads=4, kv_heads=1, seq_q=40, seq_k=40)
    out, lse, _ = reference_gradients(q, k, v, do, causal=True)
    first = flash_attention_backward_triton(do, q, k, v, out.float(), lse.float(), True)
    second = flash_attention_backward_triton(do, q, k, v, out.float(), lse.float(), True)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def packed_problem(
    doc_lengths_q, doc_lengths_k, heads=4, kv_heads=2, head_dim=32, head_dim_v=None, dtype=torch.float32
):
    """Packed q, k, v, do (tokens, heads, dim) and int32 cu_seqlens from per-document lengths."""
    gen = torch.Generator().manual_seed(1)
    head_dim_v = head_dim if head_dim_v is None else head_dim_v
    total_q, total_k = sum(doc_lengths_q), sum(doc_lengths_k)
    tensors = [
        torch.randn(*shape, generator=gen).to(dtype)
        for shape in (
            (total_q, heads, head_dim),
            (total_k, kv_heads, head_dim),
            (total_k, kv_heads, head_dim_v),
            (total_q, heads, head_dim_v),
        )
    ]
    cu = [
        torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        for lengths in (doc_lengths_q, doc_lengths_k)
    ]
    return tensors, cu


@pytest.mark.parametrize(
    "causal,causal_align",
    [(False, "bottom_right"), (True, "bottom_right"), (True, "top_left")],
    ids=["full", "causal_bottom_right", "causal_top_left"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_varlen_gradients_match_each_document_run_alone(causal, causal_align, dtype):
    # Ragged documents: one spans several tiles, one is a single token, one has no queries (its keys
    # must get 0), and queries and keys differ in length per document (chunked prefill).
    lengths_q = [37, 1, 0, 20, 9]
    lengths_k = [37, 5, 7, 44, 3]
    (q, k, v, do), (cu_q, cu_k) = packed_problem(lengths_q, lengths_k, head_dim_v=48, dtype=dtype)
    out, lse, want = reference_gradients(
        q,
        k,
        v,
        do,
        reference=attention_reference_varlen,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        causal=causal,
        causal_align=causal_align,
    )
    got = flash_attention_backward_triton(
        do,
        q,
        k,
        v,
        out.to(dtype),
        lse.float(),
        causal,
        causal_align=causal_align,
        cu_seqlens_q=cu_q,
        cu_seqlens_k=cu_k,
        max_seqlen_q=max(lengths_q),
        max_seqlen_k=max(lengths_k),
    )
    assert_gradients_close(got, want, (q, k, v))
    empty_doc_keys = slice(cu_k[2].item(), cu_k[3].item())
    assert got[1][empty_doc_keys].eq(0).all() and got[2][empty_doc_keys].eq(0).all()


def test_varlen_documents_do_not_attend_across_each_other():
    # Changing the keys and values of one document changes no other document's dq, and no other
    # document's dk / dv.
    (q, k, v, do), (cu_q, cu_k) = packed_problem([17, 23], [17, 23])
    options = dict(cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=23, max_seqlen_k=23)
    out, lse, _ = reference_gradients(
        q, k, v, do, reference=attention_reference_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True
    )
    before = flash_attention_backward_triton(do, q, k, v, out.float(), lse.float(), True, **options)
    k2, v2 = k.clone(), v.clone()
    k2[17:] += 1.0
    v2[17:] -= 1.0
    out2, lse2, _ = reference_gradients(
        q, k2, v2, do, reference=attention_reference_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True
    )
    after = flash_attention_backward_triton(do, q, k2, v2, out2.float(), lse2.float(), True, **options)
    for b, a in zip(before, after):
        assert torch.equal(b[:17], a[:17]) and not torch.equal(b[17:], a[17:])


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(causal_align="middle"), "causal_align"),
        (dict(lse_shape=(1, 2, 5)), "lse must be float32"),
        (dict(head_dim=320), "head_dim 320 is not supported"),
        (dict(cu_only_k=True), "need cu_seqlens_q"),
        (dict(block_m=24, block_n=16), "block_m must be a power of two"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_allowed(change, message):
    q, k, v, do = random_problem(seq_q=8, seq_k=8, head_dim=change.get("head_dim", 32))
    lse = torch.zeros(change.get("lse_shape", q.shape[:3]))
    kwargs = {key: change[key] for key in ("causal_align", "block_m", "block_n") if key in change}
    if change.get("cu_only_k"):
        kwargs["cu_seqlens_k"] = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        flash_attention_backward_triton(do, q, k, v, torch.zeros_like(do), lse, True, **kwargs)


def autograd_gradients(function, q, k, v, do, *args, **kwargs):
    """function(q, k, v, *args, **kwargs) and the gradients autograd gives its inputs for ``do``."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = function(*leaves, *args, **kwargs)
    out.backward(do)
    return out, tuple(t.grad for t in leaves)


@pytest.mark.parametrize(
    "problem,causal_align",
    [
        (dict(seq_q=29, seq_k=45), "bottom_right"),
        (dict(seq_q=45, seq_k=29), "bottom_right"),
        (dict(seq_q=29, seq_k=45), "top_left"),
        (dict(heads=4, kv_heads=1, seq_q=33, seq_k=33, head_dim=192, head_dim_v=128), "bottom_right"),
        (dict(heads=4, kv_heads=2, seq_q=40, seq_k=52, head_dim=64, dtype=torch.bfloat16), "bottom_right"),
    ],
    ids=["chunk_of_queries", "more_queries", "top_left", "mqa_mla_192_128", "gqa_bf16"],
)
def test_flash_attn_func_trains_like_float64_attention(problem, causal_align):
    # The autograd function end to end: the forward kernel's own out and lse feed the backward.
    q, k, v, do = random_problem(**problem)
    out, got = autograd_gradients(flash_attn_func, q, k, v, do, causal=True, causal_align=causal_align)
    want_out, _, want = reference_gradients(q, k, v, do, causal=True, causal_align=causal_align)
    assert relative_error(out, want_out) < TOLERANCE[q.dtype]
    assert_gradients_close(got, want, (q, k, v))


def test_flash_attn_func_default_alignment_is_bottom_right():
    q, k, v, do = random_problem(seq_q=16, seq_k=40)
    _, default = autograd_gradients(flash_attn_func, q, k, v, do, True)
    _, bottom_right = autograd_gradients(flash_attn_func, q, k, v, do, True, causal_align="bottom_right")
    _, top_left = autograd_gradients(flash_attn_func, q, k, v, do, True, causal_align="top_left")
    assert all(torch.equal(a, b) for a, b in zip(default, bottom_right))
    assert not torch.equal(default[1], top_left[1])


def test_flash_attn_varlen_func_trains_like_each_document_alone():
    lengths_q, lengths_k = [30, 1, 12], [30, 9, 40]
    (q, k, v, do), (cu_q, cu_k) = packed_problem(lengths_q, lengths_k, head_dim=64, head_dim_v=32)
    out, got = autograd_gradients(
        flash_attn_varlen_func, q, k, v, do, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=True
    )
    want_out, _, want = reference_gradients(
        q, k, v, do, reference=attention_reference_varlen, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, causal=True
    )
    assert relative_error(out, want_out) < TOLERANCE[q.dtype]
    assert_gradients_close(got, want, (q, k, v))


def test_double_backward_is_refused_rather_than_silently_zero():
    q, k, v, _ = random_problem(seq_q=8, seq_k=8)
    q.requires_grad_()
    (dq,) = torch.autograd.grad(flash_attn_func(q, k, v).square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        dq.sum().backward()


def test_training_api_is_exported_from_flash_attention_module():
    from gpubench.lib.kernels import flash_attention_triton_bwd
    from gpubench.optimizations import flash_attention

    for name in flash_attention.TRAINING_API:
        assert getattr(flash_attention, name) is getattr(flash_attention_triton_bwd, name)
