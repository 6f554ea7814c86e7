"""packed_metadata: the per_layer (baseline) and cached (optimized) variants give the same training
step bit for bit on a CPU, and both the losses of each document run alone (the reference, built
without the shared builder); the metadata is right (no attention across documents, positions
restarting per document, loss never crossing a boundary); the cache never serves a stale entry and
releases what it holds; build / check / metrics / declared figures behave as the harness relies on."""

from __future__ import annotations

import gc
import weakref

import matplotlib
import pytest
import torch

from gpubench.baselines import packed_metadata as per_layer
from gpubench.contract import Measured, Recorder
from gpubench.errors import BadInput
from gpubench.lib import packing
from gpubench.lib.packing import draw_doc_lens, resolve_backend
from gpubench.optimizations import packed_metadata as cached
from gpubench.reports import figures
from gpubench.reports.figures import SERIES
from gpubench.techniques.packed_metadata import TECHNIQUE
from gpubench.techniques.packed_metadata.training import ALONE_METRIC, documents_alone

CPU = torch.device("cpu")
SMALL = dict(model="tiny", layers=2, rows=2, seq_len=64, mean_doc_len=12)


def make_workload(seed: int = 0, **overrides):
    params = dict(TECHNIQUE.defaults(), **SMALL)
    params.update(overrides)
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def run(w, name):
    """One call of variant ``name`` after a reset, as the harness makes it: (output, record)."""
    w.reset()
    rec = Recorder()
    return TECHNIQUE.variants[name].call(w, rec), rec.values


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


@pytest.mark.parametrize(
    "overrides",
    [{}, dict(layers=3, rows=3, seq_len=48, mean_doc_len=5), dict(micro_batches=3, seq_len=32, mean_doc_len=6)],
    ids=["2x64", "3x48-short-docs", "3-micro-batches"],
)
def test_cached_step_is_bitwise_the_per_layer_step_and_matches_documents_alone(overrides):
    """Caching changes nothing numerically: loss, each token's loss, every gradient and every
    updated parameter are identical to the per-layer step's; the check says so, and records the
    losses' error against each document run alone in float64 (float32 rounding, within 1e-5)."""
    w = make_workload(**overrides)
    (base, _), (out, _) = run(w, "per_layer"), run(w, "cached")
    names = ["loss", "token_losses", *(f"grad {n}" for n in w.names), *(f"param {n}" for n in w.names)]
    assert list(base) == list(out) == names
    assert torch.isfinite(base["loss"]) and base["token_losses"].shape == (len(w.batches), *w.batches[0].tokens.shape)
    for name, tensor in base.items():
        assert tensor is not None and torch.equal(tensor, out[name]), name
    reference = TECHNIQUE.reference_fn(w)
    for output in (base, out):
        result = TECHNIQUE.check_fn(reference, output)
        assert result.passed and result.metric == ALONE_METRIC and result.tolerance == 1e-5
        assert 0 < result.error < 1e-6 and "bit-identical to the per_layer step" in result.detail


def test_reference_reads_nothing_of_the_shared_builder(monkeypatch):
    """The documents-alone losses come from the drawn lengths and the model only: with every
    piece of gpubench.lib.packing that derives metadata, labels or the loss made to raise, the
    reference is still computed, and equals the step's losses to float32 rounding; the loss is
    the mean of the token losses over the tokens that have a target."""
    w = make_workload(micro_batches=2)
    out, _ = run(w, "per_layer")
    for name in (
        "cu_seqlens_of",
        "position_ids_of",
        "document_positions",
        "block_causal_mask",
        "build_metadata",
        "packed_attention",
        "next_token_labels",
        "packed_loss",
    ):
        monkeypatch.setattr(packing, name, lambda *a, **k: pytest.fail("the reference used the shared builder"))
    w.reset()
    alone = documents_alone(w)
    assert alone["token_losses"].dtype == torch.float64
    torch.testing.assert_close(alone["token_losses"], out["token_losses"].double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(alone["loss"], out["loss"].double(), rtol=1e-6, atol=0)
    targets = [sum(n - 1 for row in lens for n in row) for lens in w.lens]
    means = [alone["token_losses"][m].sum() / targets[m] for m in range(2)]
    assert alone["loss"].item() == pytest.approx(sum(means).item() / 2, rel=1e-12)
    for m, lens in enumerate(w.lens):
        for r, a, b in spans_of(lens):
            assert alone["token_losses"][m, r, b - 1] == 0 and (alone["token_losses"][m, r, a : b - 1] > 0).all()


def test_check_fails_when_both_steps_agree_but_not_with_documents_alone():
    """Agreeing with the per-layer step is not enough: a step whose token losses differ from the
    documents-alone ones (here a loss at a document's last token, as when a label crosses into
    the next document) fails, with the error against documents alone and its tolerance, and says
    that the step was bit-identical to the per-layer one."""
    w = make_workload()
    reference = TECHNIQUE.reference_fn(w)
    out, _ = run(w, "cached")
    r, a, b = spans_of(w.lens[0])[0]
    crossed = dict(out, token_losses=out["token_losses"].clone())
    crossed["token_losses"][0, r, b - 1] = 5.0
    reference.step = dict(reference.step, token_losses=crossed["token_losses"])
    result = TECHNIQUE.check_fn(reference, crossed)
    assert not result.passed and result.metric == ALONE_METRIC and result.tolerance == 1e-5
    assert result.error > 1e-3 and "token_losses" in result.detail and "bit-identical" in result.detail


def test_check_fails_on_any_difference_from_the_per_layer_step_and_names_it():
    """Against the per-layer step the check is exact on a CPU: one gradient element off by 1e-6
    (far inside the documents-alone tolerance) fails it, and the detail names the tensor; a NaN
    loss or a missing gradient fails it too."""
    w = make_workload()
    reference = TECHNIQUE.reference_fn(w)
    out, _ = run(w, "cached")
    name = f"grad {w.names[5]}"
    bad = dict(out, **{name: out[name].clone()})
    bad[name].view(-1)[3] += 1e-6
    result = TECHNIQUE.check_fn(reference, bad)
    assert not result.passed and result.metric == "max_abs_diff" and result.error == pytest.approx(1e-6, rel=0.1)
    assert name in result.detail and "per_layer step" in result.detail
    assert not TECHNIQUE.check_fn(reference, dict(out, loss=torch.tensor(float("nan")))).passed
    missing = {k: v for k, v in out.items() if k != name}
    assert not TECHNIQUE.check_fn(reference, missing).passed


def test_reset_makes_every_call_the_same_step():
    """reset restores weights and optimizer state (untimed), so repeated calls repeat the same
    step, and a call's returned tensors are not overwritten by the next call."""
    w = make_workload()
    param0 = f"param {w.names[0]}"
    first, _ = run(w, "cached")
    loss, p0 = first["loss"].clone(), first[param0].clone()
    second, _ = run(w, "cached")
    assert torch.equal(second["loss"], loss) and torch.equal(second[param0], p0)
    assert torch.equal(first[param0], p0)  # untouched by the second call
    # Without reset the weights have moved: the next step differs.
    again = TECHNIQUE.variants["cached"].call(w)
    assert not torch.equal(again["loss"], loss)


# -- packing correctness --------------------------------------------------------------------


@pytest.mark.parametrize("module", [per_layer, cached], ids=["per_layer", "cached"])
def test_a_token_never_attends_to_another_document(module):
    """Perturbing one document's tokens changes that document's logits and no other's, in its
    own row or the next (documents after it are the ones a leaky causal mask would expose)."""
    w = make_workload(rows=2, seq_len=64, mean_doc_len=10)
    batch, docs = w.batches[0], spans_of(w.lens[0])
    with torch.no_grad():
        logits, _ = module.packed_forward(w.weights, batch.tokens, batch.doc_lens)
        target = next(i for i, (r, a, b) in enumerate(docs) if r == 0 and b < 64)  # not a row's last
        r, a, b = docs[target]
        tokens = batch.tokens.clone()
        tokens[r, a:b] = (tokens[r, a:b] + 1 + torch.arange(b - a)) % w.config.vocab_size
        changed, _ = module.packed_forward(w.weights, tokens, batch.doc_lens)
    assert not torch.allclose(changed[r, a:b], logits[r, a:b])
    for i, (rr, aa, bb) in enumerate(docs):
        if i != target:
            assert torch.equal(changed[rr, aa:bb], logits[rr, aa:bb]), f"document {i} saw document {target}"


def test_packed_logits_equal_each_document_run_alone():
    """Packing is invisible: every document's logits equal those of the document run on its own
    (positions from 0, plain causal attention) to float rounding."""
    from gpubench.models.llama import causal_attention, forward

    w = make_workload(rows=2, seq_len=48, mean_doc_len=9)
    batch = w.batches[0]
    with torch.no_grad():
        packed, _ = cached.packed_forward(w.weights, batch.tokens, batch.doc_lens)
        for r, a, b in spans_of(w.lens[0]):
            alone = forward(
                w.weights, batch.tokens[r, a:b], torch.arange(b - a), lambda layer, q, k, v: causal_attention(q, k, v)
            )
            torch.testing.assert_close(packed[r, a:b], alone, rtol=1e-4, atol=1e-4)


def test_metadata_positions_restart_and_cu_seqlens_is_the_running_sum():
    """cu_seqlens is int32 with a leading 0 and the running sum of the lengths; max_seqlen the
    longest document; position ids count 0.. within every document."""
    lens = [[5, 1, 7, 3], [2, 14]]
    doc_lens = torch.tensor([n for row in lens for n in row], dtype=torch.int32)
    meta = packing.build_metadata(doc_lens, 2, 16, "sdpa", torch.float32)
    assert meta.cu_seqlens.dtype == torch.int32
    assert meta.cu_seqlens.tolist() == [0, 5, 6, 13, 16, 18, 32]
    assert meta.max_seqlen == 14
    assert meta.position_ids.tolist() == [[p for n in row for p in range(n)] for row in lens]
    varlen = packing.build_metadata(doc_lens, 2, 16, "flash_attn_varlen", torch.float32)
    assert varlen.mask is None and torch.equal(varlen.position_ids, meta.position_ids)


def test_mask_is_block_diagonal_causal():
    """Query i sees key j exactly when both are in one document and j <= i (0 there, -inf
    elsewhere), checked element by element against the document spans."""
    lens = [[3, 6, 1, 6], [9, 7]]
    doc_lens = torch.tensor([n for row in lens for n in row], dtype=torch.int32)
    mask = packing.build_metadata(doc_lens, 2, 16, "sdpa", torch.bfloat16).mask
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
    batch = w.batches[0]
    labels = packing.next_token_labels(batch.tokens, packing.document_positions(batch.doc_lens, 2, 64))
    for r, a, b in spans_of(w.lens[0]):
        assert labels[r, b - 1].item() == packing.IGNORE_INDEX
        assert torch.equal(labels[r, a : b - 1], batch.tokens[r, a + 1 : b])


def test_document_lengths_are_random_per_row_and_fill_each_row():
    """Every row is filled exactly with at least two documents of random lengths, different per
    row, per micro-batch and per seed; tokens are random, not zeros."""
    w = make_workload(seed=3, rows=4, seq_len=128, mean_doc_len=16, micro_batches=2)
    other = make_workload(seed=4, rows=4, seq_len=128, mean_doc_len=16)
    for lens in (*w.lens, *other.lens):
        assert all(sum(row) == 128 and len(row) >= 2 and min(row) >= 1 for row in lens)
        assert len({tuple(row) for row in lens}) == 4
    assert w.lens[0] != other.lens[0] and w.lens[0] != w.lens[1]
    for batch, lens in zip(w.batches, w.lens):
        assert batch.doc_lens.tolist() == [n for row in lens for n in row] and batch.doc_lens.dtype == torch.int32
        assert batch.tokens.shape == (4, 128) and batch.tokens.unique().numel() > 50
    assert not torch.equal(w.batches[0].tokens, w.batches[1].tokens)
    gen = torch.Generator().manual_seed(0)
    assert all(len(row) >= 2 for row in draw_doc_lens(50, 8, 100, gen))  # mean past the row: still packed


# -- the per-layer rebuild vs the cache ------------------------------------------------------


@pytest.mark.parametrize("layers, micro", [(1, 1), (3, 1), (2, 3)])
def test_per_layer_builds_per_layer_cached_once_per_batch(layers, micro):
    """What each call records: the per-layer variant builds the metadata (and makes the
    max_seqlen host sync) once per layer of each micro-batch and holds one mask per layer for the
    backward pass; the cached one builds once per micro-batch (each new batch's lengths miss the
    cache), serves every layer from the cache and holds one mask."""
    w = make_workload(layers=layers, micro_batches=micro)
    (_, b), (_, o) = run(w, "per_layer"), run(w, "cached")
    mask_bytes = 2 * 64 * 64 * 4  # rows x seq x seq float32
    n = layers * micro
    assert (b["builds"], b["host_syncs"], b["mask_bytes_built"]) == (n, n, n * mask_bytes)
    assert (o["builds"], o["host_syncs"], o["mask_bytes_built"]) == (micro, micro, micro * mask_bytes)
    assert (o["cache_misses"], o["cache_hits"]) == (micro, n) and (b["cache_misses"], b["cache_hits"]) == (0, 0)
    assert b["mask_bytes_held"] == layers * mask_bytes and o["mask_bytes_held"] == mask_bytes
    for record in (b, o):
        assert 0 < record["build_ms"] < record["forward_ms"]
        assert record["backward_ms"] > 0 and record["optimizer_ms"] > 0


def test_cache_never_serves_a_stale_entry():
    """A new lengths tensor (even with equal values), an in-place change to the cached one, or a
    different shape, backend or dtype is a miss and a rebuild; only the very same request hits."""
    cache = cached.PackedMetadataCache()
    lens = torch.tensor([3, 5, 8, 2, 14], dtype=torch.int32)
    first = cache.get(lens, 2, 16, "sdpa", torch.float32)
    assert cache.get(lens, 2, 16, "sdpa", torch.float32) is first and cache.hits == 1
    assert cache.get(lens.clone(), 2, 16, "sdpa", torch.float32) is not first
    lens2 = cache._lens
    lens2[0], lens2[1] = 4, 4  # the next batch written into the same buffer
    rebuilt = cache.get(lens2, 2, 16, "sdpa", torch.float32)
    assert rebuilt.position_ids[0, :8].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    for other in [
        (lens2, 1, 32, "sdpa", torch.float32),
        (lens2, 1, 32, "flash_attn_varlen", torch.float32),
        (lens2, 1, 32, "flash_attn_varlen", torch.bfloat16),
    ]:
        misses = cache.misses
        cache.get(*other)
        assert cache.misses == misses + 1
    assert cache.misses == 6 and cache.hits == 1


@pytest.mark.parametrize("module", [per_layer, cached], ids=["per_layer", "cached"])
def test_step_releases_the_batch_metadata_when_done(module):
    """After a step nothing of the batch's metadata is alive: not in a cache, not in autograd;
    the mask held through the backward pass is freed."""
    w = make_workload(micro_batches=2)
    stats = packing.StepStats(CPU)
    cache = cached.PackedMetadataCache()
    extra = {"cache": cache} if module is cached else {}
    out = module.train_step(w.weights, w.optimizer, w.batches, stats=stats, **extra)
    assert stats.mask_bytes_held > 0  # it was held through the backward pass ...
    del out
    gc.collect()
    assert stats.alive_bytes() == 0  # ... and is gone now
    assert cache.held is None


def test_cache_batch_scope_releases_its_entry():
    w = make_workload()
    cache = cached.PackedMetadataCache()
    with cache.batch():
        meta = cache.get(w.batches[0].doc_lens, 2, 64, "sdpa", torch.float32)
        mask = weakref.ref(meta.mask)
        del meta
        assert mask() is not None
    assert cache.held is None and mask() is None


# -- the technique --------------------------------------------------------------------------


def test_variants_are_named_by_what_they_run():
    assert TECHNIQUE.playing("baseline", CPU).name == "per_layer"
    assert TECHNIQUE.playing("optimized", CPU).name == "cached"
    assert TECHNIQUE.incomplete() == [] and TECHNIQUE.figures_fn is None and TECHNIQUE.anchor


def test_metrics_report_split_syncs_memory_and_flops():
    """metrics over recorded calls: the backend that ran, tokens/s, the median split (build,
    forward and the rest of it, backward, optimizer), builds and host syncs per step, mask
    memory held, cache hits, 6 N T flops; no CUDA sync count on a CPU."""
    w = make_workload(layers=3)
    got = {}
    for name in ("per_layer", "cached"):
        records = [run(w, name)[1] for _ in range(3)]
        got[name] = TECHNIQUE.metrics_fn(w, Measured(name, [0.02] * 3, 0.02, None, CPU, records=records))
    b, o = got["per_layer"], got["cached"]
    assert b["backend"] == o["backend"] == "sdpa" and b["layers"] == 3
    assert b["tokens_per_s"] == pytest.approx(128 / 0.02) and b["ms_per_step"] == pytest.approx(20.0)
    assert (b["host_syncs_per_step"], o["host_syncs_per_step"]) == (3, 1)
    assert (b["metadata_builds_per_step"], o["metadata_builds_per_step"]) == (3, 1)
    assert b["mask_bytes_held"] == 3 * o["mask_bytes_held"] == 3 * 2 * 64 * 64 * 4
    for m in (b, o):
        assert 0 < m["build_ms"] < m["forward_ms"] and m["backward_ms"] > 0 and m["optimizer_ms"] > 0
        assert 0 < m["forward_rest_ms"] < m["forward_ms"]
        assert m["flops"] == 6 * (w.config.num_params() - w.config.vocab_size * w.config.hidden_size) * 128
    assert o["cache_hits_per_step"] == 3 and "host_syncs_observed" not in b  # CUDA only


def test_metrics_come_from_the_timed_calls_records_only():
    """The split and the counts are medians over Measured.records (the timed calls), nothing
    kept on the workload; forward_rest_ms is the median of each call's forward minus its build."""
    w = make_workload()
    counts = dict(
        builds=2,
        host_syncs=2,
        cache_hits=0,
        cache_misses=0,
        mask_bytes_built=64,
        mask_bytes_held=64,
        metadata_bytes_held=80,
    )
    records = [
        dict(counts, build_ms=build, forward_ms=forward, backward_ms=backward, optimizer_ms=1.0)
        for build, forward, backward in ((1.0, 5.0, 9.0), (2.0, 4.0, 7.0), (9.0, 20.0, 8.0))
    ]
    m = TECHNIQUE.metrics_fn(w, Measured("per_layer", [0.1] * 3, 0.1, None, CPU, records=records))
    assert (m["build_ms"], m["forward_ms"], m["backward_ms"], m["optimizer_ms"]) == (2.0, 5.0, 8.0, 1.0)
    assert m["forward_rest_ms"] == 4.0  # median of 4, 2, 11
    assert (m["metadata_builds_per_step"], m["host_syncs_per_step"], m["mask_bytes_held"]) == (2, 2, 64)
    empty = TECHNIQUE.metrics_fn(w, Measured("per_layer", [0.1], 0.1, None, CPU))
    assert "build_ms" not in empty and empty["ms_per_step"] == pytest.approx(100.0)


def test_validate_and_backend_resolution():
    """flash_attn_varlen needs a half dtype; a row must hold two documents; auto runs SDPA on a
    CPU and our Triton varlen kernels on CUDA; an explicit flash_attn_varlen or triton_varlen on a
    CPU is refused with the reason."""
    params = dict(TECHNIQUE.defaults(), **SMALL)
    assert TECHNIQUE.validate_fn(dict(params, backend="flash_attn_varlen"))[0].startswith(
        "backend flash_attn_varlen needs dtype float16 or bfloat16"
    )
    assert TECHNIQUE.validate_fn(dict(params, backend="flash_attn_varlen", dtype="bfloat16")) == []
    assert "must be below seq_len" in TECHNIQUE.validate_fn(dict(params, mean_doc_len=64))[0]
    assert resolve_backend("auto", CPU, "bfloat16") == "sdpa"
    assert resolve_backend("sdpa", CPU, "float32") == "sdpa"
    with pytest.raises(BadInput, match="flash_attn_varlen cannot run here"):
        resolve_backend("flash_attn_varlen", CPU, "bfloat16")
    assert resolve_backend("auto", torch.device("cuda"), "float32") == "triton_varlen"
    with pytest.raises(BadInput, match="triton_varlen cannot run here: needs CUDA"):
        resolve_backend("triton_varlen", CPU, "float32")
    assert "auto (triton_varlen on CUDA, else sdpa)" in TECHNIQUE.param("backend").help


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_step_runs_and_matches(dtype):
    """The mask and the step follow the model dtype: a half-precision step updates every
    parameter to finite values (AdamW's eps is 0 in float16: no second moment may be 0), is still
    bitwise the baseline's, and its losses are within the dtype's tolerance (1e-2) of each
    document run alone in float64."""
    w = make_workload(dtype=dtype, seq_len=32, mean_doc_len=6)
    out, _ = run(w, "cached")
    assert out[f"grad {w.names[0]}"].dtype == getattr(torch, dtype)
    assert all(out[f"param {n}"].isfinite().all() for n in w.names)
    result = TECHNIQUE.check_fn(TECHNIQUE.reference_fn(w), out)
    assert result.passed and result.tolerance == 1e-2 and 0 < result.error < 1e-2
    assert "bit-identical" in result.detail


# -- declared figures -----------------------------------------------------------------------


def _case(layers: int, seq_len: int, scale: float) -> dict:
    def record(role: str, build: float) -> dict:
        return {
            "role": role,
            "metrics": {
                "layers": layers,
                "build_ms": build,
                "forward_ms": 10 * scale + build,
                "forward_rest_ms": 10 * scale,
                "backward_ms": 20 * scale,
                "optimizer_ms": 1.0,
            },
        }

    return {
        "technique": "packed_metadata",
        "params": dict(TECHNIQUE.defaults(), layers=layers, seq_len=seq_len),
        "variants": {"per_layer": record("baseline", 0.5 * layers), "cached": record("optimized", 0.5)},
    }


def _drawn(cases):
    return [(plot, fig) for plot in TECHNIQUE.plots for fig in [figures.declared(plot, cases)] if fig is not None]


def _lines(fig) -> dict[str, list[float]]:
    return {
        line.get_label(): list(line.get_ydata())
        for line in fig.axes[0].get_lines()
        if len(line.get_xdata()) and line.get_gid() != figures.REFERENCE
    }


def test_report_figures_break_step_time_down_by_layers():
    """The step split stacked per layer count, per_layer beside cached, a panel per other setting
    (seq_len here); the build time against layers; the forward / backward speedups of cached."""
    cases = [_case(n, s, n) for n in (1, 2, 4) for s in (128, 256)]
    drawn = _drawn(cases)
    assert [plot.kind for plot, _ in drawn] == ["stacked", "line", "line"]
    breakdown = drawn[0][1]
    assert [ax.get_title() for ax in breakdown.axes if ax.get_visible()] == ["seq_len=128", "seq_len=256"]
    ax = breakdown.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["layers=1", "layers=2", "layers=4"]
    assert len(ax.patches) == 3 * 2 * 4  # layer counts x variants x phases
    build_color = ax.patches[0].get_facecolor()
    assert build_color == pytest.approx(matplotlib.colors.to_rgba(SERIES[0]))
    widths = sorted(p.get_width() for p in ax.patches if p.get_facecolor() == build_color)
    assert widths == sorted([0.5, 1.0, 2.0] + [0.5] * 3)  # the build segments
    build = _lines(drawn[1][1])
    assert build["per_layer (seq_len=128)"] == [0.5, 1.0, 2.0] and build["cached (seq_len=128)"] == [0.5] * 3
    speedups = _lines(drawn[2][1])
    assert set(speedups) == {f"cached {y} (seq_len={s})" for y in ("forward_ms", "backward_ms") for s in (128, 256)}
    assert speedups["cached forward_ms (seq_len=128)"] == pytest.approx([10.5 * n / (10 * n + 0.5) for n in (1, 2, 4)])
    assert speedups["cached backward_ms (seq_len=128)"] == pytest.approx([1.0] * 3)
    assert _drawn([]) == []
    failed = {"technique": "packed_metadata", "params": TECHNIQUE.defaults(), "variants": {}}
    assert _drawn([failed]) == []


def test_triton_varlen_backend_attends_as_sdpa_forward_and_backward():
    """The triton_varlen backend (gpubench's Triton varlen kernels through flash_attn_varlen_func,
    what a CUDA step runs by default; here in Triton's interpreter) gives SDPA's block-causal output
    and gradients on a packed batch with grouped-query heads."""
    from gpubench.lib.triton_support import kernel_problem

    problem = kernel_problem(packing.TRITON_VARLEN[0], CPU, interpreter_ok=True)
    if problem:
        pytest.skip(problem)
    gen = torch.Generator().manual_seed(0)
    doc_lens = torch.tensor([5, 11, 3, 13], dtype=torch.int32)  # two rows of 16
    q, k, v = (torch.randn(2, 16, h, 16, generator=gen).requires_grad_(True) for h in (4, 2, 2))
    results = []
    for backend in ("sdpa", "triton_varlen"):
        out = packing.packed_attention(packing.build_metadata(doc_lens, 2, 16, backend, torch.float32), q, k, v)
        results.append((out, *torch.autograd.grad(out, (q, k, v), torch.ones_like(out))))
    for name, want, got in zip(("out", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=name)


def test_a_step_on_the_triton_varlen_backend_passes_its_check_against_each_document_alone(monkeypatch):
    """The pair as a CUDA run has it by default (our varlen kernels; here in Triton's interpreter, a
    one-layer model, about 8 s): both variants' losses match each document run alone in float64
    and the cached step is bit-identical to the per-layer one (the kernels are deterministic)."""
    from planted import passed, run_planted

    from gpubench.lib.triton_support import kernel_problem

    problem = kernel_problem(packing.TRITON_VARLEN[0], CPU, interpreter_ok=True)
    if problem:
        pytest.skip(problem)
    monkeypatch.setattr(packing, "triton_varlen_unavailable", lambda device: None)
    record = run_planted(
        "packed_metadata", model="tiny", layers=1, rows=1, seq_len=64, mean_doc_len=16, backend="triton_varlen"
    )
    assert passed(record), record.failure
    assert record.variants["cached"].metrics["backend"] == "triton_varlen"
    assert "bit-identical to the per_layer step" in record.variants["cached"].check["detail"]
