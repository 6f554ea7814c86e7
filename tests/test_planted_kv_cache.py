"""kv_cache: bugs planted in the paged allocator's block arithmetic fail the run's own check
(bytes against the calculator, tokens read back) on block-edge lengths, not by an exception."""

from __future__ import annotations

import pytest
from planted import caught, passed, run_planted
from planted import mutant as _mutant

import gpubench.optimizations.kv_cache as paged_allocator
from gpubench.lib import kvmath

# One sequence per length at and around block (and window) edges; gpt-oss-20b's layer 0 slides
# over 128 tokens.
KV_EDGES = dict(model="llama-3.1-8b", layers=2, max_len=256, lengths="edges")
KV_WINDOW_EDGES = dict(model="gpt-oss-20b", layers=2, max_len=256, lengths="edges")

# The last block counted only when partly filled: a length that is a multiple of the block size
# gets one block too few (the allocator).
ONE_BLOCK_SHORT = (
    "return first, (length - 1) // block_size - first + 1",
    "return first, (length - 1) // block_size - first + (length % block_size != 0)",
)
# A sliding layer keeps length-1-window .. length-1 (window + 1 tokens): when the window starts on
# a block edge, the block before it is kept as well.
WINDOW_KEEPS_ONE_MORE = (
    "first = max(0, length - window) // block_size",
    "first = max(0, length - 1 - window) // block_size",
)


@pytest.mark.parametrize(
    "params,bug",
    [(KV_EDGES, ONE_BLOCK_SHORT), (KV_WINDOW_EDGES, WINDOW_KEEPS_ONE_MORE)],
    ids=["one_block_short_on_a_full_last_block", "window_keeps_the_block_before_it"],
)
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


# Sliding layers forgotten in the bytes that hold tokens: every layer counted as holding the whole
# sequence (issue 25: gpt-oss-20b's paged utilization 0.94 -> 1.19, waste -27.7%).
WINDOWS_FORGOTTEN = ("min(n, w) if w else n for n in lengths", "n for n in lengths")
KV_WINDOW_RANDOM = dict(model="gpt-oss-20b", layers=2, max_len=1024)


def test_holding_bytes_that_forget_sliding_windows_fail_both_allocators_against_the_live_count(monkeypatch):
    """The storage and every read-back are right; only the figure the metrics (utilization, the
    waste vLLM's claim reads) are built on is wrong. The check counts the live tokens' bytes it
    read back and fails the case; the paged allocator's utilization above 1.0 is named."""
    assert passed(run_planted("kv_cache", **KV_WINDOW_RANDOM))
    monkeypatch.setattr(kvmath, "token_bytes", _mutant(kvmath.token_bytes, *WINDOWS_FORGOTTEN))
    record = run_planted("kv_cache", **KV_WINDOW_RANDOM)
    assert caught(record), (record.status, record.failure)
    assert caught(record, "contiguous")
    paged = record.variants["paged"].check
    assert paged["metric"] == "holding_bytes_off_live_count" and paged["error"] > 0, paged
    utilization = float(paged["detail"].split("(utilization ")[1].split(",")[0])
    assert utilization > 1.0 and "waste -" in paged["detail"], paged["detail"]


def test_a_full_attention_model_is_untouched_by_the_same_bug(monkeypatch):
    """Control: without sliding layers the mutant computes the same figure, and the case passes."""
    monkeypatch.setattr(kvmath, "token_bytes", _mutant(kvmath.token_bytes, *WINDOWS_FORGOTTEN))
    assert passed(run_planted("kv_cache", model="llama-3.1-8b", layers=2, max_len=1024))
