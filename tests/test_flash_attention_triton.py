"""flash_attention's Triton kernel (run by Triton's interpreter without a GPU) is exact attention
for every dtype, length, head_dim, GQA grouping and layout the technique can ask for, and writes
every element of its output. Each case is tiny: the interpreter runs the kernel in numpy."""

from __future__ import annotations

import pytest
import torch

from gpubench.lib.kernels.flash_attention_triton import flash_attention_triton
from gpubench.techniques.flash_attention import TECHNIQUE, check, reference

CPU = torch.device("cpu")
# The technique's own tolerances (relative L2 against float64): fp32 1e-5, 16-bit 1e-2.
# Worst measured over seq 1/17/77/130 x head_dim 32/64/96/128 x MHA/GQA/MQA x causal or not:
# fp32 3.1e-7, fp16 2.7e-4, bf16 5.2e-3 (the tiled PyTorch path: 3.8e-7, 5.6e-4, 4.6e-3).


def make_workload(**overrides):
    params = dict(TECHNIQUE.defaults(), batch=1, heads=2, seq_len=33, head_dim=32)
    params.update(overrides)
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, 0)


def assert_matches_reference(w, out):
    assert out.shape == w.q.shape and out.dtype == w.q.dtype
    result = check(reference(w), out)
    assert result.passed, result.detail


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kernel_matches_float64_reference_in_every_dtype(dtype, causal):
    w = make_workload(seq_len=77, heads=2, head_dim=64, dtype=dtype, causal=causal, batch=2)
    assert_matches_reference(w, flash_attention_triton(w.q, w.k, w.v, causal=causal))


@pytest.mark.parametrize("seq_len", [1, 17, 77, 130])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kernel_masks_ragged_sequence_lengths(seq_len, causal):
    # None of these is a multiple of the interpreter's tiles (32 x 16): the last query and key
    # tiles are partial, and 1 token is a single partial tile.
    w = make_workload(seq_len=seq_len, causal=causal)
    assert_matches_reference(w, flash_attention_triton(w.q, w.k, w.v, causal=causal))


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
def test_kernel_handles_every_head_dim_including_96_padded_to_128(head_dim):
    w = make_workload(head_dim=head_dim, seq_len=40, causal=True)
    assert_matches_reference(w, flash_attention_triton(w.q, w.k, w.v, causal=True))


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_kernel_reads_the_right_kv_head_under_gqa(kv_heads, causal):
    w = make_workload(heads=4, kv_heads=kv_heads, seq_len=50, causal=causal, batch=2)
    assert_matches_reference(w, flash_attention_triton(w.q, w.k, w.v, causal=causal))
    # A kv head the kernel read for the wrong query heads would be caught here too: changing the
    # last kv head may only change the query heads of its group.
    group = 4 // kv_heads
    k = w.k.clone()
    k[:, -1] += 1.0
    before = flash_attention_triton(w.q, w.k, w.v, causal=causal)
    after = flash_attention_triton(w.q, k, w.v, causal=causal)
    assert torch.equal(before[:, : 4 - group], after[:, : 4 - group])
    assert not torch.equal(before[:, 4 - group :], after[:, 4 - group :])


@pytest.mark.parametrize("block_m,block_n", [(16, 32), (16, 16), (64, 16)])
def test_kernel_causal_split_is_exact_for_any_tile_shape(block_m, block_n):
    # The causal split into full and diagonal key tiles depends on block_m vs block_n; the GPU
    # autotuner picks shapes on both sides of square.
    w = make_workload(seq_len=77, heads=2, causal=True, batch=2)
    out = flash_attention_triton(w.q, w.k, w.v, causal=True, block_m=block_m, block_n=block_n)
    assert_matches_reference(w, out)


def test_kernel_follows_strides_of_non_contiguous_inputs():
    # (batch, seq, heads, head_dim) storage viewed as (batch, heads, seq, head_dim), as a model
    # produces after splitting heads; and a v that is a slice of a wider tensor.
    w = make_workload(heads=4, kv_heads=2, seq_len=45, head_dim=64, causal=True)
    q = w.q.transpose(1, 2).contiguous().transpose(1, 2)
    k = w.k.transpose(1, 2).contiguous().transpose(1, 2)
    v = torch.cat([w.v, torch.full_like(w.v, 1e4)], dim=-1)[..., :64]
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    assert_matches_reference(w, flash_attention_triton(q, k, v, causal=True))


def test_kernel_writes_every_output_element():
    # An output buffer poisoned with NaN must come back with no NaN left: every row (including
    # the ragged last tile) and every channel (head_dim 96 in a 128-wide tile) is stored, also
    # through a non-contiguous output.
    w = make_workload(seq_len=77, head_dim=96, heads=4, kv_heads=2, causal=True)
    for out in (torch.full_like(w.q, float("nan")), torch.full((1, 77, 4, 96), float("nan")).transpose(1, 2)):
        returned = flash_attention_triton(w.q, w.k, w.v, causal=True, out=out)
        assert returned is out and not out.isnan().any()
        assert_matches_reference(w, out)


def test_kernel_and_loop_variants_write_separate_buffers():
    """The harness makes every variant's checked call before checking any: the tiled loop (a peer
    on CUDA) must not write where the kernel left its output, or the kernel is checked on the
    loop's result."""
    w = make_workload(seq_len=40, heads=4, kv_heads=2, causal=True)
    kernel_out = TECHNIQUE.variants["triton"].fn(w)
    loop_out = TECHNIQUE.variants["torch_tiled"].fn(w)
    assert kernel_out.data_ptr() != loop_out.data_ptr()
    assert_matches_reference(w, kernel_out)


def test_kernel_causal_query_does_not_see_later_keys():
    w = make_workload(seq_len=40, causal=True)
    out = flash_attention_triton(w.q, w.k, w.v, causal=True)
    k, v = w.k.clone(), w.v.clone()
    k[:, :, 21:] += 5.0
    v[:, :, 21:] -= 5.0
    changed = flash_attention_triton(w.q, k, v, causal=True)
    assert torch.equal(out[:, :, :21], changed[:, :, :21])
    assert not torch.allclose(out[:, :, 21:], changed[:, :, 21:])


def test_kernel_honours_an_explicit_scale():
    w = make_workload(seq_len=20)
    out = flash_attention_triton(w.q, w.k, w.v, scale=0.05)
    expected = torch.softmax((w.q.double() @ w.k.double().transpose(-2, -1)) * 0.05, dim=-1) @ w.v.double()
    assert ((out.double() - expected).norm() / expected.norm()).item() <= 1e-5


def test_kernel_rejects_what_it_cannot_run():
    w = make_workload()
    with pytest.raises(ValueError, match="divisible"):
        flash_attention_triton(w.q, torch.randn(1, 3, 33, 32), torch.randn(1, 3, 33, 32))
    with pytest.raises(ValueError, match="power of two"):
        flash_attention_triton(w.q, w.k, w.v, block_m=24, block_n=16)
    with pytest.raises(ValueError, match="dtype"):
        flash_attention_triton(w.q.double(), w.k.double(), w.v.double())
    with pytest.raises(ValueError, match="out must match q"):
        flash_attention_triton(w.q, w.k, w.v, out=torch.empty(1, 2, 33, 32, dtype=torch.float16))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_kernel_on_equal_documents_is_the_padded_kernel_bit_for_bit(causal):
    # Packing only moves where each document starts: the same tiles, the same arithmetic, so the
    # same bits, output and log-sum-exp (a varlen offset or stride error shows here as any change).
    from gpubench.lib.kernels.flash_attention_triton import flash_attention_varlen_triton

    w = make_workload(batch=3, heads=4, kv_heads=2, seq_len=37, head_dim=64, causal=causal)
    out, lse = flash_attention_triton(w.q, w.k, w.v, causal=causal, return_lse=True)
    cu = torch.arange(0, 4 * 37, 37, dtype=torch.int32)
    q, k, v = (t.transpose(1, 2).flatten(0, 1) for t in (w.q, w.k, w.v))
    packed_out, packed_lse = flash_attention_varlen_triton(q, k, v, cu, cu, 37, 37, causal=causal, return_lse=True)
    assert torch.equal(packed_out, out.transpose(1, 2).flatten(0, 1))
    assert torch.equal(packed_lse, lse.transpose(0, 1).flatten(1, 2))
