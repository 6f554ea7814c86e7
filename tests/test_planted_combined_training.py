"""combined_training, planted bugs: a case run as the harness runs it (tests/planted.py) fails by its
own check when the double-buffered schedule skips a reload (a layer recomputes from whatever its
staging buffer held), and when sort-and-group drops the routing weights (the same bug in the
variant and in its plain step: only the float32 comparison with the loop's plain step sees it);
a metadata cache that ignores its key and outlives its step serves the next batch stale metadata,
which the check catches; each passes without its bug."""
from __future__ import annotations

import pytest
import torch

import gpubench.optimizations.activation_offload as two_buffers
from gpubench.contract import Recorder
from gpubench.optimizations import moe_grouping as sort_group_module
from gpubench.optimizations.packed_metadata import PackedMetadataCache
from gpubench.techniques import combined_training as ct
from planted import caught, mutant, passed, run_planted

SMALL = dict(layers=3, hidden=32, heads=4, kv_heads=2, vocab=64, experts=4, top_k=2, expert_dim=16, rows=1,
             seq_len=64, mean_doc_len=12)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_skipped_reload_is_caught(monkeypatch, dtype):
    """The next layer's reload is never issued: its wait is on the reload already landed, and the
    recompute reads the staging buffer's stale contents (the input of the layer two above)."""
    params = dict(SMALL, dtype=dtype)
    assert passed(run_planted("combined_training", **params))
    buggy = mutant(two_buffers.train_step, "reload(i - 1)  # into the other buffer", "landed[i - 1] = landed[i]  #")
    monkeypatch.setattr(two_buffers, "train_step", buggy)
    record = run_planted("combined_training", **params)
    assert caught(record), (record.status, record.failure)
    assert caught(record, "two_buffers")
    assert record.variants["sort_group"].check["passed"]  # one buffer: untouched


def test_sort_group_without_routing_weights_is_caught_by_the_other_paths_plain_step(monkeypatch):
    params = dict(SMALL, dtype="float32")
    assert passed(run_planted("combined_training", **params))
    buggy = mutant(sort_group_module.moe_forward, "return _scatter_back(x, y * scale, g)",
                   "return _scatter_back(x, y, g)")
    monkeypatch.setitem(ct.FORWARDS, "sort_group", buggy)
    record = run_planted("combined_training", **params)
    assert caught(record), (record.status, record.failure)
    assert "where_loop plain step" in record.variants["all_on"].check["detail"]


def _cached_step_on(w, cache):
    w.cache = cache
    w.reset()
    return ct.TECHNIQUE.variants["all_on"].call(w, Recorder())


def test_a_stale_metadata_cache_is_caught(monkeypatch):
    """Two batches with other document lengths share one cache. As shipped the cache is released
    after each step and keyed by the lengths, so the second step passes; with a key that matches
    anything and a scope that keeps the entry, the second step runs on the first's metadata."""
    first, second = (ct.build({**ct.TECHNIQUE.defaults(), **SMALL}, torch.device("cpu"), seed) for seed in (0, 1))
    assert not torch.equal(first.doc_lens, second.doc_lens)
    reference = ct.reference(second)

    cache = PackedMetadataCache()
    _cached_step_on(first, cache)
    assert ct.check(reference, _cached_step_on(second, cache)).passed

    monkeypatch.setattr(PackedMetadataCache, "_key_of", staticmethod(lambda *args: "any batch"))
    monkeypatch.setattr(PackedMetadataCache, "release", lambda self: None)
    cache = PackedMetadataCache()
    _cached_step_on(first, cache)
    result = ct.check(reference, _cached_step_on(second, cache))
    assert not result.passed, result
