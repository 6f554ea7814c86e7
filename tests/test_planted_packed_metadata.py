"""packed_metadata, planted bugs: one case run as the harness runs it (tests/planted.py) fails by
its own check when the shared builder's position ids do not restart per document (the same on
both variants, so only the documents-alone reference can see it; on either backend) and when the
optimized path's cache is keyed by the batch's geometry (the next micro-batch gets stale metadata);
each case passes without its bug."""

from __future__ import annotations

import pytest
import torch
from planted import caught, mutant, passed, run_planted

from gpubench.lib import packing
from gpubench.models.llama import causal_attention
from gpubench.optimizations.packed_metadata import PackedMetadataCache
from gpubench.techniques.packed_metadata import training as packed_training

SMALL = dict(model="tiny", layers=1, rows=1, seq_len=128, mean_doc_len=16)


def positions_along_the_row(cu_seqlens: torch.Tensor, rows: int, seq: int) -> torch.Tensor:
    """The bug: position ids counted along the row, as for unpacked rows, never restarting."""
    return torch.arange(seq, device=cu_seqlens.device).expand(rows, seq)


def geometry_key(doc_lens: torch.Tensor, rows: int, seq: int, backend: str, dtype: torch.dtype) -> tuple:
    """The bug: the cache keyed like a causal-mask cache, by the batch's shape, not its lengths."""
    return (rows, seq, backend, dtype)


@pytest.fixture
def varlen_on_cpu(monkeypatch):
    """The varlen backend's path on a CPU: flash-attn's kernel stood in for by what it computes
    (causal attention within each cu_seqlens segment), so only cu_seqlens reaches attention."""

    def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal):
        assert causal and torch.equal(cu_q, cu_k)
        bounds = cu_q.tolist()
        assert max_q == max(b - a for a, b in zip(bounds, bounds[1:]))
        return torch.cat([causal_attention(q[a:b], k[a:b], v[a:b]) for a, b in zip(bounds, bounds[1:])])

    monkeypatch.setattr(packing, "optional_import", lambda module, name: flash_attn_varlen_func)
    monkeypatch.setattr(packing, "flash_varlen_unavailable", lambda device, dtype: None)


@pytest.mark.parametrize(
    "backend, dtype", [("sdpa", "float32"), ("flash_attn_varlen", "bfloat16")], ids=["sdpa", "varlen"]
)
def test_shared_builder_with_positions_not_restarting_fails_the_runs_check(request, monkeypatch, backend, dtype):
    """Both variants get the same wrong position ids (SDPA's mask, derived from them, lets each
    document see the ones before it; the loss's labels cross into the next document; RoPE alone
    would not show it, being relative), so their steps stay bit-identical: the documents-alone
    reference fails both. On the varlen backend only the labels read the position ids."""
    if backend == "flash_attn_varlen":
        request.getfixturevalue("varlen_on_cpu")
    params = dict(SMALL, backend=backend, dtype=dtype)
    control = run_planted("packed_metadata", **params)
    assert passed(control), control.failure
    assert control.variants["cached"].metrics["backend"] == backend

    monkeypatch.setattr(packing, "position_ids_of", positions_along_the_row)
    record = run_planted("packed_metadata", **params)
    assert caught(record) and caught(record, "per_layer")
    for name in ("per_layer", "cached"):
        check = record.variants[name].check
        assert check["metric"] == packed_training.ALONE_METRIC and check["error"] > 10 * check["tolerance"]
        assert "bit-identical to the per_layer step" in check["detail"]  # the old check would have passed


def test_cache_keyed_by_batch_geometry_serves_stale_metadata_and_fails_the_runs_check(monkeypatch):
    """With two micro-batches per step, a cache keyed by rows, seq, backend and dtype hands the
    second batch the first one's metadata (one miss per step instead of two): the cached step
    differs from the per-layer one, which still passes."""
    params = dict(SMALL, micro_batches=2)
    control = run_planted("packed_metadata", **params)
    assert passed(control), control.failure
    assert control.variants["cached"].metrics["cache_misses_per_step"] == 2

    monkeypatch.setattr(PackedMetadataCache, "_key_of", staticmethod(geometry_key))
    record = run_planted("packed_metadata", **params)
    assert caught(record)
    assert record.variants["per_layer"].check["passed"]
    assert record.variants["cached"].check["metric"] == "max_abs_diff"
    assert record.variants["cached"].metrics["cache_misses_per_step"] == 1


@pytest.mark.parametrize("rows", [2, 3])
def test_mask_built_from_the_first_rows_positions_is_caught_with_several_rows(monkeypatch, rows):
    """The block-causal mask reads the first row's position ids for every row (a mask built for
    one row and broadcast): later rows attend across their own documents' boundaries. A batch of
    one packed row, all smoke had before, cannot tell; smoke's 2- and 3-row entry does."""
    buggy = mutant(packing.block_causal_mask, "back <= position_ids[:, :, None]", "back <= position_ids[:1, :, None]")
    params = dict(SMALL, rows=rows, mean_doc_len=24)
    assert passed(run_planted("packed_metadata", **params))
    monkeypatch.setattr(packing, "block_causal_mask", buggy)
    record = run_planted("packed_metadata", **params)
    assert caught(record) and caught(record, "per_layer")
    assert passed(run_planted("packed_metadata", **SMALL))  # one row: blind to it
