"""combined_training: every variant (all off, all on, each optimization alone) gives the plain
step's loss and gradients in float32 and bf16; each peer changes only its own optimization (the
builds, the MoE host reads and the staging buffers it records); the host-sync counts are what the
three optimizations promise; build / validate / metrics behave as the harness relies on."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from gpubench import contract
from gpubench.contract import Measured, Recorder
from gpubench.lib import packing
from gpubench.models import llama, moe_decoder
from gpubench.models.moe import route
from gpubench.techniques import combined_training as ct
from gpubench.techniques.combined_training import correctness as ct_correctness
from gpubench.techniques.combined_training import figures as ct_figures
from gpubench.techniques.combined_training import step as ct_step
from gpubench.techniques.combined_training import workload as ct_workload

CPU = torch.device("cpu")
SMALL = dict(
    layers=2,
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


def make_workload(seed: int = 0, **overrides):
    params = {**ct.TECHNIQUE.defaults(), **SMALL, **overrides}
    assert ct.validate(params) == []
    return ct.build(params, CPU, seed)


def run(w, name):
    """One call of variant ``name`` after a reset, as the harness makes it: (output, record)."""
    w.reset()
    rec = Recorder()
    return ct.TECHNIQUE.variants[name].call(w, rec), rec.values


def test_roles_baseline_all_off_optimized_all_on_and_one_peer_per_optimization():
    t = ct.TECHNIQUE
    assert t.baseline.name == "all_off" and t.optimized.name == "all_on"
    peers = [v.name for v in t.variants.values() if v.role == "peer"]
    assert sorted(peers) == ["cached_metadata", "sort_group", "two_buffers"]
    assert ct_workload.VARIANTS["all_off"].options == ct_workload.OFF
    on = ct_workload.VARIANTS["all_on"].options
    assert on.cached_metadata and on.moe == "sort_group" and on.buffers == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("seed", [0, 3])
def test_every_variant_agrees_with_the_plain_step(dtype, seed):
    """Loss and every gradient against the plain step (no checkpointing, no offload, metadata
    built once) within the stated tolerance; float32 against both MoE paths' plain steps."""
    w = make_workload(seed, dtype=dtype)
    ref = ct.reference(w)
    for name in ct_workload.VARIANTS:
        out, _ = run(w, name)
        result = ct.check(ref, out)
        assert result.passed, (name, result)
        assert result.error is not None and result.error <= ct_correctness.TOLERANCE[getattr(torch, dtype)]
        assert len(out.grads) == len(w.weights.parameters())
        if dtype == "float32":
            assert "plain step: max_rel_l2" in result.detail, result.detail  # the other path was compared


def test_plain_steps_of_the_two_moe_paths_agree_in_float32():
    """The cross-path comparison the check makes in float32 is a real agreement, not a tautology."""
    ref = ct.reference(make_workload(1))
    errors = contract.tensors_check(
        ref.plain["where_loop"].flat(),
        ref.plain["sort_group"].flat(),
        ct_correctness.CROSS_PATH_TOLERANCE,
        dtype=torch.float32,
    )
    assert errors.passed and errors.error > 0, errors


def _moe_reads_where_loop(w) -> int:
    """Host reads the per-expert loop makes in one step: per MoE call (forward and recompute of
    every layer) one for the experts hit, one per expert hit. Counted from the routing of a plain
    forward here, independently of the technique's log."""
    return sum(1 + n for n in _experts_hit_per_layer(w)) * 2


def _experts_hit_per_layer(w) -> list[int]:
    hits = []
    with torch.no_grad():

        def spy(x, experts, config, log):
            _, chosen = route(x, experts.router_weight, experts.router_bias, config.top_k)
            hits.append(int(chosen.unique().numel()))
            return ct_step.FORWARDS["sort_group"](x, experts, config, None)

        rows, seq = w.tokens.shape
        meta = packing.build_metadata(w.doc_lens, rows, seq, ct_workload.BACKEND, w.weights.dtype)
        cos, sin = llama.rope_cos_sin(w.weights, meta.position_ids)
        x = torch.nn.functional.embedding(w.tokens, w.weights.embed)
        for i in range(w.weights.config.num_layers):
            x = moe_decoder.moe_decoder_layer(
                w.weights, i, x, cos, sin, lambda _, q, k, v: packing.packed_attention(meta, q, k, v), spy
            )
    return hits


@pytest.mark.parametrize("layers", [1, 3])
def test_each_peer_changes_only_its_own_optimization(layers):
    """Metadata builds (2 per layer rebuilt: forward and recompute; 1 per step cached), MoE host
    reads (the loop's per expert hit; sort-and-group's one per call) and staging buffers (1 or 2):
    each variant shows exactly the options it declares."""
    w = make_workload(layers=layers)
    loop_reads = _moe_reads_where_loop(w)
    for name, (_, options, _) in ct_workload.VARIANTS.items():
        _, rec = run(w, name)
        assert rec["builds"] == (1 if options.cached_metadata else 2 * layers), name
        assert rec["metadata_syncs"] == rec["builds"], name
        assert rec["cache_hits"] == (2 * layers if options.cached_metadata else 0), name
        assert rec["moe_host_reads"] == (2 * layers if options.moe == "sort_group" else loop_reads), name
        assert rec["buffers"] == options.buffers, name
        assert rec["bytes_h2d"] == rec["bytes_d2h"] > 0, name  # every layer input offloaded and reloaded
    assert w.cache.held is None  # the cached variants released the step's metadata


def test_metrics_count_host_syncs_and_split_the_step():
    w = make_workload()
    for name in ("all_off", "all_on"):
        out, rec = run(w, name)
        measured = Measured(name, [0.01, 0.01], 0.01, out, CPU, records=[rec, rec])
        m = ct.metrics(w, measured)
        assert m["host_syncs_per_step"] == rec["metadata_syncs"] + rec["moe_host_reads"]
        assert m["metadata_builds_per_step"] == rec["builds"] and m["buffers"] == rec["buffers"]
        assert all(m[key] >= 0 for key in ct_figures.SPLIT[:-1])
        assert m["tokens"] == w.tokens.numel() and m["ms_per_step"] == pytest.approx(10.0)
    assert m["host_syncs_per_step"] == 1 + 2 * w.weights.config.num_layers  # all_on: one build, one read per call


def test_the_step_is_repeatable_after_reset():
    """reset restores the weights and clears the gradients: two calls give the same step."""
    w = make_workload()
    first, _ = run(w, "all_on")
    second, _ = run(w, "all_on")
    assert contract.tensors_check(first.flat(), second.flat(), exact=True).passed


def test_a_wrong_output_fails_the_check():
    w = make_workload()
    ref = ct.reference(w)
    out, _ = run(w, "all_on")
    out.grads["layers.1.experts.down"] = out.grads["layers.1.experts.down"] * 1.01
    assert not ct.check(ref, out).passed
    assert not ct.check(ref, dataclasses.replace(out, moe="dense")).passed


@pytest.mark.parametrize(
    "bad, words",
    [
        (dict(hidden=30, heads=4), "not a multiple of heads"),
        (dict(head_dim=9), "head_dim 9 must be even"),
        (dict(hidden=36, heads=4, kv_heads=2), "must be even"),
        (dict(heads=4, kv_heads=3), "kv_heads"),
        (dict(experts=2, top_k=3), "top_k"),
        (dict(seq_len=16, mean_doc_len=16), "mean_doc_len"),
    ],
)
def test_validate_names_the_param(bad, words):
    problems = ct.validate({**ct.TECHNIQUE.defaults(), **SMALL, **bad})
    assert any(words in p for p in problems), problems


def test_on_cuda_only_the_router_gradients_get_the_wider_bf16_limit():
    """CUDA's atomics make bf16 router gradients of two identical sort-and-group steps differ by up
    to ~0.1 (measured on an H200); every other tensor keeps CUDA_TOLERANCE."""
    ref = {"loss": torch.ones(()), "layers.0.experts.router_bias": torch.ones(8), "layers.0.wq": torch.ones(8)}
    off = lambda name, by: {**ref, name: ref[name] * (1 + by)}
    bf16 = torch.bfloat16
    assert ct_correctness.same_path_check(ref, off("layers.0.experts.router_bias", 0.2), bf16, cuda=True).passed
    assert not ct_correctness.same_path_check(ref, off("layers.0.experts.router_bias", 0.5), bf16, cuda=True).passed
    assert not ct_correctness.same_path_check(ref, off("layers.0.wq", 0.2), bf16, cuda=True).passed
    assert not ct_correctness.same_path_check(ref, off("layers.0.experts.router_bias", 0.05), bf16, cuda=False).passed


def test_head_dim_apart_from_hidden_over_heads_keeps_every_variant_right():
    """gpt-oss's attention is 64 heads of 64 on a hidden of 2880: head_dim is its own param. At
    head_dim 16 (4 heads: 64 wide on a hidden of 32) every variant still gives the plain step's
    loss and gradients, and 0 keeps today's hidden / heads."""
    assert ct.TECHNIQUE.defaults()["head_dim"] == 0 and make_workload().weights.config.head_dim == 32 // 4
    w = make_workload(head_dim=16)
    assert w.weights.config.head_dim == 16 and w.weights.layers[0].wq.shape == (4 * 16, 32)
    ref = ct.reference(w)
    for name in ct_workload.VARIANTS:
        out, _ = run(w, name)
        result = ct.TECHNIQUE.check_fn(ref, out)
        assert result.passed, (name, result.detail)
