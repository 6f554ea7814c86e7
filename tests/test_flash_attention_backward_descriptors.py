"""The backward kernels' two load paths, tensor descriptors (TMA, sm_90 and later: q, k, v and dO
read by asynchronous box copies) and pointers, give the float64 gradients alike: every head dim (64,
96, 128, MLA's 192 / 128, 256), GQA and MQA, both causal alignments, seq_q above and below seq_k,
odd lengths and tiles taller and shorter than wide. Triton's interpreter runs the descriptor loads
as masked loads of the same boxes; whether they are TMA copies on sm_90 is the compile test's
(test_flash_attention_sm90_compile). Tiny sizes: the interpreter runs the kernels in numpy."""

from __future__ import annotations

import pytest
import torch
from test_flash_attention_backward import assert_gradients_match, random_problem

import gpubench.lib.kernels.flash_attention_triton as fwd
import gpubench.lib.kernels.flash_attention_triton_bwd as bwd


@pytest.fixture(params=["descriptors", "pointers"])
def path(request, monkeypatch):
    monkeypatch.setattr(fwd, "DESCRIPTORS", request.param == "descriptors")
    return request.param


@pytest.mark.parametrize("head_dim,head_dim_v", [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 1)])
def test_both_paths_give_the_gradients_for_every_head_dim_and_grouping(path, head_dim, head_dim_v, heads, kv_heads):
    """Causal, seq_q < seq_k, odd lengths, fp16: dq, dk, dv within the dtype's tolerance of float64
    autograd on either path, and the path is the one asked for."""
    q, k, v, do = random_problem(
        heads=heads,
        kv_heads=kv_heads,
        seq_q=21,
        seq_k=35,
        head_dim=head_dim,
        head_dim_v=head_dim_v,
        dtype=torch.float16,
    )
    assert bwd.uses_descriptors(q, k, v, do) == (path == "descriptors")
    assert_gradients_match(q, k, v, do, causal=True)


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("seq_q,seq_k", [(45, 19), (19, 45), (1, 30)])
@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16)])
def test_both_paths_split_the_causal_diagonal_in_the_backward(path, align, seq_q, seq_k, block_m, block_n):
    """Both alignments, rows that see no key and keys no query sees (their gradients exactly 0 on
    either path), tiles taller and shorter than wide, in bf16."""
    q, k, v, do = random_problem(
        heads=2, kv_heads=1, seq_q=seq_q, seq_k=seq_k, head_dim=32, dtype=torch.bfloat16, seed=1
    )
    assert_gradients_match(q, k, v, do, causal=True, causal_align=align, block_m=block_m, block_n=block_n)


def test_not_causal_ragged_tiles_on_both_paths(path):
    """Not causal, lengths that no tile divides: the descriptor's zero fill past the tensor's end
    and the pointer masks give the same gradients."""
    q, k, v, do = random_problem(
        heads=2, kv_heads=2, seq_q=47, seq_k=29, head_dim=64, head_dim_v=32, dtype=torch.float16, seed=2
    )
    assert_gradients_match(q, k, v, do, causal=False)
