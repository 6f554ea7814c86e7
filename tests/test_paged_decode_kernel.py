"""The split, GQA-grouped paged decode kernel and its reduce (in Triton's interpreter here) against
float64 attention over the same keys: every head grouping and head dim it serves, block sizes
smaller and larger than a step, splits that do not divide a context or are empty, a table whose
entries past each context hold garbage, strided q and out; the split-count rule; and the sm_90
compile of both kernels."""

from __future__ import annotations

import math

import pytest
import torch
from compile_sm90 import compile_script_output

from gpubench.lib.kernels.paged_attention_triton import (
    MAX_SPLITS,
    MIN_SPLIT_TOKENS,
    PROGRAMS_PER_SM,
    choose_splits,
    paged_decode_attention_triton,
    reduce_partials,
)

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
GARBAGE_BLOCK = 1 << 30  # a table entry past a context: following it would fault or read far away


def paged_case(lens, heads, kv_heads, head_dim, block_size, dtype=torch.float32, seed=0):
    """(q, k_cache, v_cache, tables, context_lens): each sequence's blocks shuffled through a pool
    with spare blocks; table entries past a sequence's last block are GARBAGE_BLOCK and every slot
    no context covers is NaN, so a kernel reading either fails."""
    gen = torch.Generator().manual_seed(seed)
    counts = [-(-n // block_size) for n in lens]
    num_blocks = sum(counts) + 2
    pool = torch.randperm(num_blocks, generator=gen)
    tables = torch.full((len(lens), max(1, max(counts))), GARBAGE_BLOCK, dtype=torch.int32)
    k, v = (torch.full((num_blocks, block_size, kv_heads, head_dim), math.nan) for _ in range(2))
    start = 0
    for b, (n, count) in enumerate(zip(lens, counts)):
        tables[b, :count] = pool[start : start + count].to(torch.int32)
        for t in range(n):
            k[tables[b, t // block_size], t % block_size] = torch.randn(kv_heads, head_dim, generator=gen)
            v[tables[b, t // block_size], t % block_size] = torch.randn(kv_heads, head_dim, generator=gen)
        start += count
    q = torch.randn(len(lens), heads, head_dim, generator=gen)
    return q.to(dtype), k.to(dtype), v.to(dtype), tables, torch.tensor(lens, dtype=torch.int32)


def reference(q, k_cache, v_cache, tables, context_lens):
    """float64 softmax(q k^T / sqrt(d)) v per sequence and head, keys read token by token."""
    batch, heads, head_dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(batch, heads, head_dim, dtype=torch.float64)
    for b, n in enumerate(context_lens.tolist()):
        if n == 0:
            continue
        rows = [(int(tables[b, t // block_size]), t % block_size) for t in range(n)]
        k = torch.stack([k_cache[i, s] for i, s in rows]).double()  # (n, kv_heads, d)
        v = torch.stack([v_cache[i, s] for i, s in rows]).double()
        for h in range(heads):
            kv = h // (heads // kv_heads)
            p = torch.softmax(k[:, kv] @ q[b, h].double() * head_dim**-0.5, dim=0)
            out[b, h] = p @ v[:, kv]
    return out


def worst_rel_err(out, ref):
    """The worst sequence's relative L2 error (a short context's large output cannot hide a long one's)."""
    return max(((o.double() - r).norm() / r.norm().clamp_min(1e-30)).item() for o, r in zip(out, ref))


SHAPES = [
    # (heads, kv_heads, head_dim, block_size, dtype)
    (4, 1, 64, 16, torch.float32),  # MQA
    (32, 8, 64, 16, torch.bfloat16),  # GQA 32/8
    (8, 1, 128, 8, torch.float16),  # 8 query heads on one KV head
    (4, 4, 80, 16, torch.float32),  # no GQA, head_dim padded to 128
    (4, 2, 96, 32, torch.bfloat16),  # a block two steps long, 96 padded
    (2, 1, 256, 16, torch.float32),  # head_dim 256
]


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("heads,kv_heads,head_dim,block_size,dtype", SHAPES)
def test_kernel_equals_float64_attention_for_every_grouping_and_head_dim(
    heads, kv_heads, head_dim, block_size, dtype, num_splits
):
    """Every query head of a group gets its own softmax over its KV head's keys, whichever the group
    size (1, 4, 8, all), head dim (padded and masked) and dtype, in one split or three (odd
    lengths: the splits do not divide them)."""
    case = paged_case([37, 5, 50], heads, kv_heads, head_dim, block_size, dtype)
    out = paged_decode_attention_triton(*case, tokens_per_step=16, num_splits=num_splits)
    assert out.dtype == dtype and not out.isnan().any()
    assert worst_rel_err(out, reference(*case)) <= TOL[dtype]


@pytest.mark.parametrize("block_size,tokens", [(1, 16), (12, 16), (16, 16), (32, 16), (64, 16), (256, 32)])
def test_blocks_smaller_and_larger_than_a_step_are_walked_exactly(block_size, tokens):
    """A step covers several blocks (1, 12: not a power of two, 16) or part of one (32, 64, 256):
    each key is read once from its own block and slot, and nothing past a context (NaN slots,
    garbage table entries)."""
    case = paged_case([45, 3, 70], 4, 2, 64, block_size)
    for splits in (1, 2):
        out = paged_decode_attention_triton(*case, tokens_per_step=tokens, num_splits=splits)
        assert worst_rel_err(out, reference(*case)) <= 1e-5, splits


def test_float64_inputs_are_computed_in_fp32_as_a_float64_engine_gets_them():
    """A float64 serving engine on CUDA calls this kernel too: float64 tiles are narrowed to fp32
    (as the kernel before the split did), so the result is the attention to fp32 accuracy, in
    float64, with or without splits."""
    case = paged_case([40, 7], 4, 2, 64, 16, torch.float64)
    for splits in (1, 2):
        out = paged_decode_attention_triton(*case, tokens_per_step=16, num_splits=splits)
        assert out.dtype == torch.float64 and worst_rel_err(out, reference(*case)) <= 1e-5


def test_one_long_sequence_among_short_ones_leaves_empty_splits_that_add_nothing():
    """Splits are cut over the longest context: the short sequences' later splits are empty (max
    -inf, sum 0) and must neither add to nor NaN their output; a context of 0 gives zeros."""
    case = paged_case([300, 3, 17, 0, 1], 8, 2, 64, 16)
    ref = reference(*case)
    for splits in (None, 2, 7, 40):  # 40 splits of 16 tokens: more splits than the long context has steps
        out = paged_decode_attention_triton(*case, tokens_per_step=16, num_splits=splits)
        assert not out.isnan().any(), splits
        assert torch.equal(out[3], torch.zeros_like(out[3])), splits
        live = [0, 1, 2, 4]
        assert worst_rel_err(out[live], ref[live]) <= 1e-5, splits


def test_split_count_changes_the_result_only_within_rounding():
    """One split and many give the same attention (fp32, to 1e-6 of each other): the reduce's
    log-sum-exp rescale is exact up to rounding."""
    case = paged_case([200, 129, 64], 8, 2, 64, 16)
    one = paged_decode_attention_triton(*case, tokens_per_step=16, num_splits=1)
    for splits in (2, 5, 13):
        many = paged_decode_attention_triton(*case, tokens_per_step=16, num_splits=splits)
        assert worst_rel_err(many, one.double()) <= 1e-6, splits


def test_strided_q_and_out_are_read_and_written_through_their_strides():
    """q a non-contiguous view (heads interleaved with another tensor's), out a strided view of a
    larger NaN buffer: the kernel follows both strides and writes only out's elements."""
    q, k, v, tables, lens = paged_case([33, 20], 8, 2, 64, 16)
    wide = torch.randn(2, 16, 64)
    wide[:, ::2] = q
    buffer = torch.full((2, 64, 8), math.nan)
    out = buffer.transpose(1, 2)  # (2, 8, 64), strides (512, 1, 8)
    for splits in (1, 2):
        buffer.fill_(math.nan)
        assert paged_decode_attention_triton(wide[:, ::2], k, v, tables, lens, out=out, num_splits=splits) is out
        assert worst_rel_err(out, reference(q, k, v, tables, lens)) <= 1e-5
        assert not buffer.isnan().any()  # (2, 64, 8) is all of out's elements


def _split_partials(q, k, v, bounds):
    """Hand-made partials (log2 units, as the kernel writes them) of one query (heads, d) over keys
    k, v (n, heads, d) cut at ``bounds``; an empty range gives (-inf, 0, 0)."""
    heads, head_dim = q.shape
    m = torch.full((1, heads, len(bounds) - 1), -math.inf)
    l, acc = torch.zeros_like(m), torch.zeros(1, heads, len(bounds) - 1, 128)
    for s, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        if hi > lo:
            scores = torch.einsum("hd,nhd->hn", q, k[lo:hi]) * head_dim**-0.5 * math.log2(math.e)
            m[0, :, s] = scores.amax(1)
            p = torch.exp2(scores - m[0, :, s, None])
            l[0, :, s] = p.sum(1)
            acc[0, :, s, :head_dim] = torch.einsum("hn,nhd->hd", p, v[lo:hi])
    return m, l, acc


def test_reduce_alone_combines_hand_made_partials_and_ignores_empty_splits():
    """The reduce kernel on partials built by hand (split ends 0, 7, 7, 30, 31, 40: an empty split
    in the middle, splits of one key): exactly the softmax over all keys; all splits empty gives
    zeros, not NaN. 20 splits: more than the reduce folds per step."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (
        torch.randn(4, 96, generator=gen),
        torch.randn(40, 4, 96, generator=gen),
        torch.randn(40, 4, 96, generator=gen),
    )
    want = torch.einsum("hn,nhd->hd", torch.softmax(torch.einsum("hd,nhd->hn", q, k) * 96**-0.5, dim=1), v)
    for bounds in ([0, 7, 7, 30, 31, 40], [0, *range(2, 40, 2), 40]):
        out = torch.full((1, 4, 96), math.nan)
        reduce_partials(*_split_partials(q, k, v, bounds), out, 96)
        assert (out[0] - want).abs().max() <= 1e-5, bounds
    out = torch.full((1, 4, 96), math.nan)
    reduce_partials(*_split_partials(q, k, v, [0, 0, 0, 0]), out, 96)
    assert torch.equal(out, torch.zeros_like(out))


def test_split_count_fills_the_sms_but_never_splits_short_contexts():
    """The rule: about PROGRAMS_PER_SM (sequence, KV head, split) programs per SM, never a split
    under MIN_SPLIT_TOKENS, never more than MAX_SPLITS."""
    assert choose_splits(4, 8, MIN_SPLIT_TOKENS, 132) == 1  # short: one split whatever the batch
    assert choose_splits(256, 8, 8192, 132) == 1  # 2048 programs already fill 132 SMs
    assert choose_splits(64, 8, 8192, 132) == 3  # the batch-64 case: 1536 programs
    splits = choose_splits(4, 8, 32768, 132)  # 32 programs: split to fill the SMs
    assert splits * 32 >= PROGRAMS_PER_SM * 132 and 32768 / splits >= MIN_SPLIT_TOKENS
    assert choose_splits(1, 1, 1 << 20, 132) == MAX_SPLITS
    assert choose_splits(1, 1, 3 * MIN_SPLIT_TOKENS, 132) == 3


def test_queries_over_a_cache_of_another_dtype_are_computed_in_fp32():
    """fp32 queries over an fp16 cache (the kernel before the split widened everything; tl.dot
    takes one dtype, and raised here before this was handled)."""
    q, k, v, tables, lens = paged_case([300, 40], 4, 2, 64, 16, dtype=torch.float16)
    out = paged_decode_attention_triton(q.float(), k, v, tables, lens, tokens_per_step=16, num_splits=3)
    want = reference(q.float(), k, v, tables, lens)
    # Within fp16's rounding of the softmax weights (the 16-bit tolerance is 1e-2).
    assert out.dtype == torch.float32 and worst_rel_err(out, want) < 1e-3


@pytest.mark.parametrize(
    "bad,message",
    [
        (dict(tokens_per_step=8), "power of two >= 16"),
        (dict(tokens_per_step=24), "power of two"),
        (dict(num_splits=0), "at least 1"),
    ],
)
def test_bad_tile_options_are_refused_with_the_allowed_values(bad, message):
    case = paged_case([5], 2, 1, 64, 16)
    with pytest.raises(ValueError, match=message):
        paged_decode_attention_triton(*case, **bad)


# Compiled for sm_90 (H100 / H200) by Triton's compiler and ptxas, no GPU needed, specialized as
# Triton's JIT specializes a launch on contiguous tensors (unit strides as constants, pointers and
# strides 16-divisible: without it every element gets its own 64-bit address and the decode kernel
# takes 255 registers instead of about 110); each kernel's shared memory, registers and spill
# bytes as ptxas reports them.
COMPILE_FOR_SM90 = r"""
import os, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import gpubench.lib.kernels.paged_attention_triton as m

UNIT_STRIDES = ("stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_tj")

def compile_sm90(fn, pointers, consts, num_warps):
    names = [n for i, n in enumerate(fn.arg_names) if not fn.params[i].is_constexpr]
    sig = {n: (pointers.get(n, "*fp32") if n.endswith("_ptr") else "fp32" if n == "scale_log2e" else "i32")
           for n in names}
    consts = dict(consts)
    for n in UNIT_STRIDES:
        if n in sig:
            sig[n], consts[n] = "constexpr", 1
    addressing = [n for n in names if n.endswith("_ptr") or n.startswith("stride_")]
    aligned = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in addressing
               if sig[n] != "constexpr" and n != "lens_ptr"}
    return triton.compile(ASTSource(fn, sig, consts, aligned), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps))

def resources(kernel):
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    return " ".join(w for w in usage.split() if w.startswith(("REG:", "LOCAL:")))

for form, dtype, group, dim, one_split in (("bf16 group 4 d128 block 16", "bf16", 4, 128, False),
                                           ("fp16 group 1 d64 block 16", "fp16", 1, 64, True),
                                           ("fp32 MQA group 8 d256 block 16", "fp32", 8, 256, False)):
    dim_pad = triton.next_power_of_2(dim)
    pointers = {"q_ptr": "*" + dtype, "k_ptr": "*" + dtype, "v_ptr": "*" + dtype, "out_ptr": "*" + dtype,
                "tables_ptr": "*i32", "lens_ptr": "*i32"}
    consts = dict(GROUP=group, GROUP_PAD=max(m.MIN_DOT, triton.next_power_of_2(group)), BLOCK_SIZE=16,
                  HEAD_DIM=dim, DIM_PAD=dim_pad, TOKENS=m.TOKENS_PER_STEP if dim <= 128 else m.TOKENS_PER_STEP_WIDE,
                  ONE_SPLIT=one_split, DOT_PRECISION="ieee" if dtype == "fp32" else "tf32", DOT_IN_FP32=False)
    kernel = compile_sm90(m._paged_decode_split_kernel, pointers, consts, m.NUM_WARPS)
    print("compiled decode", form, "shared", kernel.metadata.shared, resources(kernel))
    consts = dict(HEAD_DIM=dim, DIM_PAD=dim_pad, SPLITS_PAD=m.MAX_SPLITS, SPLITS_PER_STEP=m.REDUCE_SPLITS_PER_STEP)
    kernel = compile_sm90(m._paged_decode_reduce_kernel, {"out_ptr": "*" + dtype}, consts, m.REDUCE_NUM_WARPS)
    print("compiled reduce", form, "shared", kernel.metadata.shared, resources(kernel))
"""


def test_decode_and_reduce_kernels_compile_for_a_hopper_gpu(tmp_path):
    """The interpreter runs Python the compiler rejects: compile the decode kernel and the reduce
    for sm_90 with Triton's compiler and ptxas in their main forms (bf16 group 4 d128 split, fp16
    group 1 d64 one split, fp32 MQA d256 split), no GPU needed; none spills to local memory.
    Skipped where Triton has no CUDA backend."""
    lines = [
        line for line in compile_script_output(COMPILE_FOR_SM90, tmp_path).splitlines() if line.startswith("compiled")
    ]
    print("\n".join(lines))  # shared memory / registers per form, for the record (pytest -s)
    assert len(lines) == 6 and sum(line.startswith("compiled decode") for line in lines) == 3
    assert all("LOCAL:0" in line for line in lines), lines
