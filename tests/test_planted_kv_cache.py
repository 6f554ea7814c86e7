"""kv_cache: bugs planted in the paged allocator's block arithmetic fail the run's own check
(bytes against the calculator, tokens read back) on block-edge lengths, not by an exception."""
from __future__ import annotations


import pytest
from planted import caught, passed, run_planted
from planted import mutant as _mutant

import gpubench.optimizations.kv_cache as paged_allocator

# One sequence per length at and around block (and window) edges; gpt-oss-20b's layer 0 slides
# over 128 tokens.
KV_EDGES = dict(model="llama-3.1-8b", layers=2, max_len=256, lengths="edges")
KV_WINDOW_EDGES = dict(model="gpt-oss-20b", layers=2, max_len=256, lengths="edges")

# The last block counted only when partly filled: a length that is a multiple of the block size
# gets one block too few (the allocator).
ONE_BLOCK_SHORT = ("return first, (length - 1) // block_size - first + 1",
                   "return first, (length - 1) // block_size - first + (length % block_size != 0)")
# A sliding layer keeps length-1-window .. length-1 (window + 1 tokens): when the window starts on
# a block edge, the block before it is kept as well.
WINDOW_KEEPS_ONE_MORE = ("first = max(0, length - window) // block_size",
                         "first = max(0, length - 1 - window) // block_size")


@pytest.mark.parametrize("params,bug", [(KV_EDGES, ONE_BLOCK_SHORT), (KV_WINDOW_EDGES, WINDOW_KEEPS_ONE_MORE)],
                         ids=["one_block_short_on_a_full_last_block", "window_keeps_the_block_before_it"])
def test_paged_allocator_block_count_off_by_one_is_caught_by_the_bytes_check(monkeypatch, params, bug):
    assert passed(run_planted("kv_cache", **params))  # control: the same case as shipped
    monkeypatch.setattr(paged_allocator, "held_blocks", _mutant(paged_allocator.held_blocks, *bug))
    record = run_planted("kv_cache", **params)
    assert caught(record), (record.status, record.failure)
    check = record.variants["paged"].check
    assert check["metric"] == "bytes_off_prediction" and check["error"] > 0, check  # not an exception
    assert record.variants["contiguous"].status == "ok"


def test_allocator_one_block_short_also_reads_back_tokens_not_stored_at_block_multiples(monkeypatch):
    monkeypatch.setattr(paged_allocator, "held_blocks", _mutant(paged_allocator.held_blocks, *ONE_BLOCK_SHORT))
    detail = run_planted("kv_cache", **KV_EDGES).variants["paged"].check["detail"]
    assert "tokens not stored), at lengths [16, 32, 256]" in detail, detail
