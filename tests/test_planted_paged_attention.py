"""paged_attention: block-edge and chunk-merge bugs planted in the optimized path (the PyTorch chunk loop, which
plays it on a CPU) fail the run's own check against float64 attention on block-edge lengths."""

from __future__ import annotations

import pytest
from planted import caught, passed, run_planted, shipped
from planted import mutant as _mutant

import gpubench.optimizations.paged_attention as blockwise
import gpubench.techniques.paged_attention.decode as paged_decode

# One sequence per context length at and around block edges; the longest (250) is not on one.
DECODE_EDGES = dict(heads=8, kv_heads=2, context_len=250, lengths="edges")
# The bugs are planted in the PyTorch chunk loop: the baseline and the loop run, not the Triton
# kernel (checked in the interpreter, it took ~90% of each case's time and cannot reach the loop).
LOOP = ("gather", "torch_blocks")

LIVE = "live = token[None, :] < lens[:, None]"
# The live keys of a step as (block, slot) against the last block and its fill.
BY_BLOCK = (
    "last_block = (lens[:, None] - 1) // block_size; {fill}; "
    "live = (token[None, :] // block_size < last_block) "
    "| ((token[None, :] // block_size == last_block) & (token[None, :] % block_size < fill[:, None]))"
)
# The last block's fill taken as len % block_size, 0 for a full block: a context that ends on a
# block edge loses its whole last block.
FULL_LAST_BLOCK_SKIPPED = (LIVE, BY_BLOCK.format(fill="fill = lens % block_size"))
# A full last block's fill taken as its last slot index, block_size - 1: the last key of a
# context that ends on a block edge is masked.
LAST_SLOT_OF_A_FULL_BLOCK_MASKED = (
    LIVE,
    BY_BLOCK.format(fill="fill = torch.where(lens % block_size == 0, block_size - 1, lens % block_size)"),
)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(
    "bug",
    [FULL_LAST_BLOCK_SKIPPED, LAST_SLOT_OF_A_FULL_BLOCK_MASKED],
    ids=["full_last_block_skipped", "last_slot_of_a_full_block_masked"],
)
def test_block_loop_masking_a_full_last_block_wrongly_is_caught(monkeypatch, bug, dtype):
    assert passed(shipped("paged_attention", variants=LOOP, **DECODE_EDGES, dtype=dtype))  # control: as shipped
    monkeypatch.setattr(
        paged_decode, "paged_decode_attention_torch", _mutant(paged_decode.paged_decode_attention_torch, *bug)
    )
    record = run_planted("paged_attention", variants=LOOP, **DECODE_EDGES, dtype=dtype)
    assert record.role_variant("optimized") == "torch_blocks"
    assert caught(record), (record.status, record.failure)
    assert record.variants["torch_blocks"].check["metric"] == "max_rel_l2"
    assert record.variants["gather"].status == "ok"  # the baseline, checked against float64 too


@pytest.mark.parametrize("block_size", [16, 32])
def test_chunk_merge_that_forgets_to_rescale_the_earlier_chunks_is_caught(monkeypatch, block_size):
    """The CPU path walks a context in chunks and merges their softmaxes by log-sum-exp: a merge
    that keeps the earlier chunks' sums at their own max (no rescale to the common one) weights
    them wrongly. Caught once contexts span several chunks (4 blocks a chunk here); with one
    chunk per context (the default at smoke sizes) the merge has nothing to rescale and passes."""
    params = dict(batch=4, heads=8, kv_heads=2, head_dim=64, context_len=260, block_size=block_size)
    monkeypatch.setattr(blockwise, "CHUNK_ELEMENTS", 4 * 4 * block_size * 2 * 64)  # 4 blocks of 4 sequences
    assert passed(shipped("paged_attention", variants=LOOP, **params))
    monkeypatch.setattr(
        blockwise,
        "merge_partials",
        _mutant(
            blockwise.merge_partials,
            "torch.exp(a.m - shift), torch.exp(b.m - shift)",
            "torch.ones_like(a.m), torch.exp(b.m - shift)",
        ),
    )
    record = run_planted("paged_attention", variants=LOOP, **params)
    assert record.role_variant("optimized") == "torch_blocks" and caught(record), (record.status, record.failure)
    monkeypatch.setattr(blockwise, "CHUNK_ELEMENTS", 1 << 22)
    assert passed(run_planted("paged_attention", variants=LOOP, **params))
