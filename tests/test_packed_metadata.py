"""packed_metadata: the per-layer (baseline) and cached (optimized) packed-batch metadata give the
same training step bit for bit on a CPU; the metadata is right (no attention across documents,
positions restarting per document, loss never crossing a boundary); the cache never serves a
stale entry and releases what it holds; the technique's build / check / metrics / figures behave
as the harness relies on."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from gpubench.baselines import packed_metadata as base
from gpubench.contract import Measured
from gpubench.errors import BadInput
from gpubench.optimizations import packed_metadata as opt
from gpubench.techniques.packed_metadata import PHASE_COLORS, TECHNIQUE, draw_doc_lens, resolve_backend

CPU = torch.device("cpu")
SMALL = dict(model="tiny", layers=2, rows=2, seq_len=64, mean_doc_len=12)


def make_workload(seed: int = 0, **overrides):
    params = dict(TECHNIQUE.defaults(), **SMALL)
    params.update(overrides)
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def run(w, name):
    w.reset()
    return TECHNIQUE.variants[name].fn(w)


def spans_of(lens: list[list[int]]) -> list[tuple[int, int, int]]:
    """(row, start, stop) of every document."""
    out = []
    for r, row in enumerate(lens):
        start = 0
        for n in row:
            out.append((r, start, start + n))
            start += n
    return out


# -- same math ------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides", [{}, dict(layers=3, rows=3, seq_len=48, mean_doc_len=5)],
                         ids=["2x64", "3x48-short-docs"])
def test_optimized_step_is_bitwise_the_baseline_step(overrides):
    """Caching changes nothing numerically: loss, every gradient and every updated parameter are
    identical to the baseline's, and the technique's check says so with error 0."""
    w = make_workload(**overrides)
    ref, out = run(w, "baseline"), run(w, "optimized")
    assert torch.equal(ref["loss"], out["loss"]) and torch.isfinite(ref["loss"])
    assert len(ref["grads"]) == len(out["grads"]) == len(w.names)
    for g_ref, g_out in zip(ref["grads"], out["grads"]):
        assert g_ref is not None and torch.equal(g_ref, g_out)
    for p_ref, p_out in zip(ref["params"], out["params"]):
        assert torch.equal(p_ref, p_out)
    result = TECHNIQUE.check_fn(ref, out)
    assert result.passed and result.error == 0.0 and result.metric == "max_abs_diff" and result.tolerance is None


def test_check_fails_on_any_gradient_or_loss_difference_and_names_it():
    """The check is exact on a CPU: one gradient element off by 1e-6 fails it, and the detail
    names the tensor; a NaN fails it too."""
    w = make_workload()
    ref, out = run(w, "baseline"), run(w, "optimized")
    bad = dict(out, grads=[g.clone() for g in out["grads"]])
    bad["grads"][5].view(-1)[3] += 1e-6
    result = TECHNIQUE.check_fn(ref, bad)
    assert not result.passed and result.error == pytest.approx(1e-6, rel=0.1)
    assert f"grad {w.names[5]}" in result.detail
    nan = dict(out, loss=torch.tensor(float("nan")))
    assert not TECHNIQUE.check_fn(ref, nan).passed


def test_reset_makes_every_call_the_same_step():
    """reset restores weights and optimizer state (untimed), so repeated calls repeat the same
    step, and a call's returned tensors are not overwritten by the next call."""
    w = make_workload()
    first = run(w, "optimized")
    loss, param0 = first["loss"].clone(), first["params"][0].clone()
    second = run(w, "optimized")
    assert torch.equal(second["loss"], loss) and torch.equal(second["params"][0], param0)
    assert torch.equal(first["params"][0], param0)  # untouched by the second call
    # Without reset the weights have moved: the next step differs.
    again = TECHNIQUE.variants["optimized"].fn(w)
    assert not torch.equal(again["loss"], loss)


# -- packing correctness --------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_a_token_never_attends_to_another_document(variant):
    """Perturbing one document's tokens changes that document's logits and no other's, in its
    own row or the next (documents after it are the ones a leaky causal mask would expose)."""
    w = make_workload(rows=2, seq_len=64, mean_doc_len=10)
    forward = base.packed_forward if variant == "baseline" else opt.packed_forward
    docs = spans_of(w.lens)
    with torch.no_grad():
        logits, _ = forward(w.weights, w.tokens, w.doc_lens)
        target = next(i for i, (r, a, b) in enumerate(docs) if r == 0 and b < 64)  # not a row's last
        r, a, b = docs[target]
        tokens = w.tokens.clone()
        tokens[r, a:b] = (tokens[r, a:b] + 1 + torch.arange(b - a)) % w.config.vocab_size
        changed, _ = forward(w.weights, tokens, w.doc_lens)
    assert not torch.allclose(changed[r, a:b], logits[r, a:b])
    for i, (rr, aa, bb) in enumerate(docs):
        if i != target:
            assert torch.equal(changed[rr, aa:bb], logits[rr, aa:bb]), f"document {i} saw document {target}"


def test_packed_logits_equal_each_document_run_alone():
    """Packing is invisible: every document's logits equal those of the document run on its own
    (positions from 0, plain causal attention) to float rounding."""
    from gpubench.models.llama import causal_attention, forward

    w = make_workload(rows=2, seq_len=48, mean_doc_len=9)
    with torch.no_grad():
        packed, _ = opt.packed_forward(w.weights, w.tokens, w.doc_lens)
        for r, a, b in spans_of(w.lens):
            alone = forward(w.weights, w.tokens[r, a:b], torch.arange(b - a),
                            lambda layer, q, k, v: causal_attention(q, k, v))
            torch.testing.assert_close(packed[r, a:b], alone, rtol=1e-4, atol=1e-4)


def test_metadata_positions_restart_and_cu_seqlens_is_the_running_sum():
    """cu_seqlens is int32 with a leading 0 and the running sum of the lengths; max_seqlen the
    longest document; position ids count 0.. within every document."""
    lens = [[5, 1, 7, 3], [2, 14]]
    doc_lens = torch.tensor([n for row in lens for n in row], dtype=torch.int32)
    meta = base.build_metadata(doc_lens, 2, 16, "sdpa", torch.float32)
    assert meta.cu_seqlens.dtype == torch.int32
    assert meta.cu_seqlens.tolist() == [0, 5, 6, 13, 16, 18, 32]
    assert meta.max_seqlen == 14
    expected = [[p for n in row for p in range(n)] for row in lens]
    assert meta.position_ids.tolist() == expected
    varlen = base.build_metadata(doc_lens, 2, 16, "flash_attn_varlen", torch.float32)
    assert varlen.mask is None and torch.equal(varlen.position_ids, meta.position_ids)


def test_mask_is_block_diagonal_causal():
    """Query i sees key j exactly when both are in one document and j <= i (0 there, -inf
    elsewhere), checked element by element against the document spans."""
    lens = [[3, 6, 1, 6], [9, 7]]
    doc_lens = torch.tensor([n for row in lens for n in row], dtype=torch.int32)
    mask = base.build_metadata(doc_lens, 2, 16, "sdpa", torch.bfloat16).mask
    assert mask.shape == (2, 1, 16, 16) and mask.dtype == torch.bfloat16
    for r, row in enumerate(lens):
        doc = [d for d, n in enumerate(row) for _ in range(n)]
        for i in range(16):
            for j in range(16):
                visible = doc[i] == doc[j] and j <= i
                assert mask[r, 0, i, j].item() == (0.0 if visible else float("-inf")), (r, i, j)


def test_loss_targets_never_cross_a_document_boundary():
    """The last token of each document (and of each row) has no target; every other token's
    target is the next token of its own document."""
    w = make_workload()
    positions = base.position_ids_of(base.cu_seqlens_of(w.doc_lens), 2, 64)
    labels = base.next_token_labels(w.tokens, positions)
    for r, a, b in spans_of(w.lens):
        assert labels[r, b - 1].item() == base.IGNORE_INDEX
        assert torch.equal(labels[r, a:b - 1], w.tokens[r, a + 1:b])


def test_document_lengths_are_random_per_row_and_fill_each_row():
    """Every row is filled exactly with at least two documents of random lengths, different per
    row and per seed; tokens are random, not zeros."""
    w, other = make_workload(seed=3, rows=4, seq_len=128, mean_doc_len=16), make_workload(seed=4, rows=4, seq_len=128,
                                                                                          mean_doc_len=16)
    for lens in (w.lens, other.lens):
        assert all(sum(row) == 128 and len(row) >= 2 and min(row) >= 1 for row in lens)
        assert len({tuple(row) for row in lens}) == 4
    assert w.lens != other.lens
    assert w.doc_lens.tolist() == [n for row in w.lens for n in row] and w.doc_lens.dtype == torch.int32
    assert w.tokens.unique().numel() > 50
    gen = torch.Generator().manual_seed(0)
    assert all(len(row) >= 2 for row in draw_doc_lens(50, 8, 100, gen))  # mean past the row: still packed


# -- the per-layer rebuild vs the cache ------------------------------------------------------

@pytest.mark.parametrize("layers", [1, 3])
def test_baseline_builds_per_layer_optimized_once(layers):
    """The baseline builds the metadata (and makes the max_seqlen host sync) once per layer and
    holds one mask per layer for the backward pass; the optimized variant builds once, serves
    every layer from the cache and holds one mask."""
    w = make_workload(layers=layers)
    run(w, "baseline"), run(w, "optimized")
    b, o = w.records["baseline"][-1], w.records["optimized"][-1]
    mask_bytes = 2 * 64 * 64 * 4  # rows x seq x seq float32
    assert (b.builds, b.host_syncs, b.mask_bytes_built) == (layers, layers, layers * mask_bytes)
    assert (o.builds, o.host_syncs, o.mask_bytes_built) == (1, 1, mask_bytes)
    assert (o.cache_misses, o.cache_hits) == (1, layers)
    assert b.mask_bytes_held == layers * mask_bytes and o.mask_bytes_held == mask_bytes
    assert {"build", "forward", "backward", "optimizer"} <= set(b.totals()) == set(o.totals())


def test_cache_never_serves_a_stale_entry():
    """A new lengths tensor (even with equal values), an in-place change to the cached one, or a
    different shape, backend or dtype is a miss and a rebuild; only the very same request hits."""
    cache = opt.PackedMetadataCache()
    lens = torch.tensor([3, 5, 8, 2, 14], dtype=torch.int32)
    first = cache.get(lens, 2, 16, "sdpa", torch.float32)
    assert cache.get(lens, 2, 16, "sdpa", torch.float32) is first and cache.hits == 1
    assert cache.get(lens.clone(), 2, 16, "sdpa", torch.float32) is not first
    lens2 = cache._lens
    lens2[0], lens2[1] = 4, 4  # the next batch written into the same buffer
    rebuilt = cache.get(lens2, 2, 16, "sdpa", torch.float32)
    assert rebuilt.position_ids[0, :8].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    for other in [(lens2, 1, 32, "sdpa", torch.float32), (lens2, 1, 32, "flash_attn_varlen", torch.float32),
                  (lens2, 1, 32, "flash_attn_varlen", torch.bfloat16)]:
        misses = cache.misses
        cache.get(*other)
        assert cache.misses == misses + 1
    assert cache.misses == 6 and cache.hits == 1


def test_cache_releases_the_batch_when_the_step_is_done():
    """After a step nothing of the batch's metadata is alive: not in the cache, not in autograd;
    the mask held during the step is freed (in both variants)."""
    w = make_workload()
    for name in ("optimized", "baseline"):
        out = run(w, name)
        stats = w.records[name][-1]
        assert stats.mask_bytes_held > 0  # it was held through the backward pass ...
        del out
        gc.collect()
        assert stats.alive_bytes() == 0  # ... and is gone now
    assert w.cache.held is None
    cache = opt.PackedMetadataCache()
    with cache.batch():
        meta = cache.get(w.doc_lens, 2, 64, "sdpa", torch.float32)
        mask = weakref.ref(meta.mask)
        del meta
        assert mask() is not None
    assert cache.held is None and mask() is None


# -- the technique --------------------------------------------------------------------------

def test_metrics_report_split_syncs_memory_and_flops():
    """metrics: the backend that ran, tokens/s, the median build/forward/backward/optimizer split
    over the timed calls, builds and host syncs per step, mask memory held, 6 N T flops, and the
    optimized variant's forward/backward speedups over the baseline's split."""
    w = make_workload(layers=3)
    for _ in range(3):
        for name in ("baseline", "optimized"):
            run(w, name)
    got = {}
    for name in ("baseline", "optimized"):
        got[name] = TECHNIQUE.metrics_fn(w, Measured(name, [0.02, 0.02], 0.02, None, CPU))
    b, o = got["baseline"], got["optimized"]
    assert b["backend"] == o["backend"] == "sdpa" and b["layers"] == 3
    assert b["tokens_per_s"] == pytest.approx(128 / 0.02) and b["ms_per_step"] == pytest.approx(20.0)
    assert (b["host_syncs_per_step"], o["host_syncs_per_step"]) == (3, 1)
    assert (b["metadata_builds_per_step"], o["metadata_builds_per_step"]) == (3, 1)
    assert b["mask_bytes_held"] == 3 * o["mask_bytes_held"] == 3 * 2 * 64 * 64 * 4
    for m in (b, o):
        assert 0 < m["build_ms"] < m["forward_ms"] and m["backward_ms"] > 0 and m["optimizer_ms"] > 0
        assert m["split_calls"] == 2  # the first (checked) call is left out
        assert m["flops"] == 6 * (w.config.num_params() - w.config.vocab_size * w.config.hidden_size) * 128
    assert o["forward_speedup"] > 0 and o["backward_speedup"] > 0 and "forward_speedup" not in b
    assert o["cache_hits_per_step"] == 3 and "host_syncs_observed" not in b  # CUDA only


def test_validate_and_backend_resolution():
    """flash_attn_varlen needs a half dtype; a row must hold two documents; auto runs SDPA on a
    CPU and an explicit flash_attn_varlen there is refused with the reason."""
    params = dict(TECHNIQUE.defaults(), **SMALL)
    assert TECHNIQUE.validate_fn(dict(params, backend="flash_attn_varlen"))[0].startswith(
        "backend flash_attn_varlen needs dtype float16 or bfloat16")
    assert TECHNIQUE.validate_fn(dict(params, backend="flash_attn_varlen", dtype="bfloat16")) == []
    assert "must be below seq_len" in TECHNIQUE.validate_fn(dict(params, mean_doc_len=64))[0]
    assert resolve_backend("auto", CPU, "bfloat16") == "sdpa"
    assert resolve_backend("sdpa", CPU, "float32") == "sdpa"
    with pytest.raises(BadInput, match="flash_attn_varlen cannot run here"):
        resolve_backend("flash_attn_varlen", CPU, "bfloat16")
    assert "Triton flash attention has no varlen path" in TECHNIQUE.param("backend").help


def test_bfloat16_step_runs_and_matches():
    """The mask and the step follow the model dtype: a bf16 step is still bitwise the baseline's."""
    w = make_workload(dtype="bfloat16", seq_len=32, mean_doc_len=6)
    ref, out = run(w, "baseline"), run(w, "optimized")
    assert ref["grads"][0].dtype == torch.bfloat16
    assert TECHNIQUE.check_fn(ref, out).passed


def _case(layers: int, seq_len: int, scale: float) -> dict:
    def record(role: str, build: float) -> dict:
        return {"role": role, "metrics": {"layers": layers, "build_ms": build, "forward_ms": 10 * scale + build,
                                          "backward_ms": 20 * scale, "optimizer_ms": 1.0}}
    return {"technique": "packed_metadata", "params": dict(TECHNIQUE.defaults(), layers=layers, seq_len=seq_len),
            "variants": {"baseline": record("baseline", 0.5 * layers), "optimized": record("optimized", 0.5)}}


def test_report_figures_break_step_time_down_by_layers():
    """The hook draws the stacked split per layer count, baseline and optimized side by side, a
    panel per other setting (seq_len here), and the build time against layers; no data, no figure."""
    cases = [_case(n, s, n) for n in (1, 2, 4) for s in (128, 256)]
    from matplotlib.colors import to_rgba

    figs = TECHNIQUE.figures_fn(cases)
    assert [title.split(" (")[0].split(" vs")[0] for title, _ in figs] == ["Step-time breakdown",
                                                                          "Metadata build time per step"]
    breakdown = figs[0][1]
    assert [ax.get_title() for ax in breakdown.axes] == ["seq_len=128", "seq_len=256"]
    ax = breakdown.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4"]
    assert len(ax.patches) == 3 * 2 * 4  # layer counts x variants x phases
    build_color = to_rgba(PHASE_COLORS[0])
    heights = sorted(p.get_height() for p in ax.patches if p.get_facecolor() == build_color)
    assert heights == sorted([0.5, 1.0, 2.0] + [0.5] * 3)  # the build segments
    lines = {line.get_label(): list(line.get_ydata()) for line in figs[1][1].axes[0].get_lines()}
    assert lines["baseline seq_len=128"] == [0.5, 1.0, 2.0] and lines["optimized seq_len=128"] == [0.5] * 3
    assert TECHNIQUE.figures_fn([]) == []
    failed = {"technique": "packed_metadata", "params": TECHNIQUE.defaults(), "variants": {}}
    assert TECHNIQUE.figures_fn([failed]) == []
