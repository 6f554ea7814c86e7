"""combined_training, planted bugs: a case run as the harness runs it (tests/planted.py) fails by its
own check when the double-buffered schedule skips a reload (a layer recomputes from whatever its
staging buffer held), and when sort-and-group drops the routing weights (the same bug in the
variant and in its plain step: only the float32 comparison with the loop's plain step sees it);
a metadata cache that ignores its key and outlives its step serves the next batch stale metadata,
which the check catches; each passes without its bug."""

from __future__ import annotations

import pytest
import torch
from planted import caught, mutant, passed, run_planted, shipped

import gpubench.optimizations.activation_offload as two_buffers
from gpubench import contract
from gpubench.contract import Recorder
from gpubench.models import moe_decoder
from gpubench.optimizations import moe_grouping as sort_group_module
from gpubench.optimizations.packed_metadata import PackedMetadataCache
from gpubench.techniques import combined_training as ct
from gpubench.techniques.combined_training import correctness as ct_correctness
from gpubench.techniques.combined_training import step as ct_step
from gpubench.techniques.combined_training import workload as ct_workload

SMALL = dict(
    layers=3,
    hidden=32,
    heads=4,
    kv_heads=2,
    vocab=64,
    experts=4,
    top_k=2,
    expert_dim=16,
    rows=1,
    seq_len=64,
    mean_doc_len=12,
)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_skipped_reload_is_caught(monkeypatch, dtype):
    """The next layer's reload is never issued: its wait is on the reload already landed, and the
    recompute reads the staging buffer's stale contents (the input of the layer two above)."""
    params = dict(SMALL, dtype=dtype)
    assert passed(shipped("combined_training", **params))
    buggy = mutant(two_buffers.train_step, "reload(i - 1)  # into the other buffer", "landed[i - 1] = landed[i]  #")
    monkeypatch.setattr(two_buffers, "train_step", buggy)
    record = run_planted("combined_training", **params)
    assert caught(record), (record.status, record.failure)
    assert caught(record, "two_buffers")
    assert record.variants["sort_group"].check["passed"]  # one buffer: untouched


def test_sort_group_without_routing_weights_is_caught_three_ways(monkeypatch):
    """The bug is in the variant and in its plain step alike. The router is then cut off from the
    loss (its gradients all zero: the check's first failure), sort_group's layer disagrees with its
    independent float64 reference, and in float32 the loop's plain step differs too."""
    params = dict(SMALL, dtype="float32")
    assert passed(shipped("combined_training", **params))
    buggy = mutant(
        sort_group_module.moe_forward, "return _scatter_back(x, y * scale, g)", "return _scatter_back(x, y, g)"
    )
    monkeypatch.setitem(ct_step.FORWARDS, "sort_group", buggy)
    record = run_planted("combined_training", **params)
    assert caught(record), (record.status, record.failure)
    detail = record.variants["all_on"].check["detail"]
    assert "all-zero gradient: layers.0.experts.router_weight, layers.0.experts.router_bias" in detail, detail
    loop = record.variants["all_off"].check  # its own path is untouched: only the cross-path comparison differs
    assert "against the sort_group plain step" in loop["detail"] and "own path" in loop["detail"], loop
    w = ct.build({**ct.TECHNIQUE.defaults(), **params}, torch.device("cpu"), 0)
    assert not ct_correctness.layer_check(w, "sort_group").passed and ct_correctness.layer_check(w, "where_loop").passed
    ref = ct.reference(w)
    w.reset()
    out = ct.TECHNIQUE.variants["sort_group"].call(w, Recorder())
    cross = contract.tensors_check(
        ref.plain["where_loop"].flat(), out.flat(), ct_correctness.CROSS_PATH_TOLERANCE, dtype=torch.float32
    )
    assert not cross.passed, cross


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


# The MoE half reads the attention's output without its norm: mlp_norm is cut off from the loss,
# in every variant and in the plain step alike (they run the same layer code).
MLP_NORM_SKIPPED = ("hs = rms_norm(x, layer.mlp_norm, c.rms_eps)", "hs = x")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_layer_that_skips_mlp_norm_is_caught_by_the_zero_gradient_and_the_independent_layer(monkeypatch, dtype):
    """Comparing a variant with its plain step cannot see it (both run the bug: every mlp_norm
    gradient is exactly 0 in each). The run's check fails every variant: mlp_norm learns nothing,
    and the layer disagrees with its independent float64 reference."""
    params = dict(SMALL, dtype=dtype)
    assert passed(shipped("combined_training", **params))
    buggy = mutant(moe_decoder.moe_decoder_layer, *MLP_NORM_SKIPPED)
    for module in (ct_step, ct_correctness):  # the variants' step, and the plain step and layer check
        monkeypatch.setattr(module, "moe_decoder_layer", buggy)
    record = run_planted("combined_training", **params)
    assert caught(record), (record.status, record.failure)
    for name in ct_workload.VARIANTS:
        check = record.variants[name].check
        assert not check["passed"] and check["metric"] == "zero_gradients", (name, check)
        assert "layers.0.mlp_norm, layers.1.mlp_norm, layers.2.mlp_norm" in check["detail"], check["detail"]
    w = ct.build({**ct.TECHNIQUE.defaults(), **params}, torch.device("cpu"), 0)
    layer = ct_correctness.layer_check(w, "where_loop")
    assert not layer.passed and "layer 0 (where_loop) against its independent float64 reference" in layer.detail
    assert layer.error == 1.0, layer  # the worst: mlp_norm's gradient, 0 where the reference's is not


def test_a_layer_bug_that_leaves_every_gradient_nonzero_is_caught_by_the_independent_layer(monkeypatch):
    """The MoE half's residual dropped in layer code shared by the variants and the plain step:
    every parameter still learns and every variant equals its plain step, but the layer no longer
    computes what the model defines; the independent float64 layer fails every variant."""
    params = dict(SMALL, dtype="float32")
    buggy = mutant(moe_decoder.moe_decoder_layer, "return x + moe_forward(", "return 0.5 * x + moe_forward(")
    for module in (ct_step, ct_correctness):  # the variants' step, and the plain step and layer check
        monkeypatch.setattr(module, "moe_decoder_layer", buggy)
    record = run_planted("combined_training", **params)
    assert caught(record), (record.status, record.failure)
    for name in ct_workload.VARIANTS:
        check = record.variants[name].check
        assert not check["passed"] and "against its independent float64 reference" in check["detail"], (name, check)
