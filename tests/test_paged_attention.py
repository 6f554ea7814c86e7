"""paged_attention: the PyTorch block loop and the Triton kernel (in Triton's interpreter here)
both compute the attention of the contiguous cache while reading K/V only through the block
table, and the technique's build / check / cast / metrics / plots behave as the harness relies on."""

from __future__ import annotations

import math

import pytest
import torch

from gpubench.baselines.paged_attention import paged_decode_attention as gather_then_attend
from gpubench.contract import Measured, relative_l2_check
from gpubench.lib.kernels.paged_attention_triton import paged_decode_attention_triton
from gpubench.lib.kvmath import block_edge_lengths
from gpubench.lib.paged_decode import decode_token_slots, paged_decode_attention, paged_decode_attention_gathered
from gpubench.optimizations.paged_attention import paged_decode_attention_torch
from gpubench.reports import figures
from gpubench.techniques.paged_attention import TECHNIQUE, reference
from gpubench.techniques.paged_attention.workload import build_block_tables

CPU = torch.device("cpu")
TOL = {"float32": 1e-5, "bfloat16": 1e-2}


def make_workload(seed: int = 0, **overrides):
    params = TECHNIQUE.defaults()
    params.update(batch=3, heads=4, context_len=40)  # tiny: the kernel runs in the interpreter
    params.update(overrides)
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def args(w):
    return w.args()


def rel_err(output: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((output.double() - ref).norm() / ref.norm()).item()


def torch_path(*a, **kw):
    return paged_decode_attention_torch(*a, chunk_tokens=16, **kw)  # several chunks even when short


def kernel(*a, **kw):
    return paged_decode_attention_triton(*a, tokens_per_step=16, **kw)


PATHS = {"torch": torch_path, "triton": kernel, "gathered": paged_decode_attention_gathered}

CASES = [
    # (batch, heads, kv_heads, head_dim, block_size, context_len, dtype)
    (3, 4, 0, 64, 16, 40, "float32"),  # MHA, mixed lengths, partial last blocks
    (3, 4, 2, 64, 8, 40, "float32"),  # GQA (2 query heads per kv head), two blocks per step
    (2, 4, 1, 128, 32, 50, "float32"),  # MQA, a block bigger than a step
    (3, 4, 0, 128, 16, 1, "float32"),  # every context is one token
    (3, 4, 2, 64, 16, 40, "bfloat16"),
    (2, 4, 1, 128, 8, 30, "bfloat16"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("batch,heads,kv_heads,head_dim,block_size,context_len,dtype", CASES)
def test_paged_paths_equal_contiguous_cache_attention(
    path, batch, heads, kv_heads, head_dim, block_size, context_len, dtype
):
    w = make_workload(
        batch=batch,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        context_len=context_len,
        dtype=dtype,
    )
    out = PATHS[path](*args(w))
    assert out.dtype == w.q.dtype and out.shape == w.q.shape
    assert rel_err(out, reference(w)) <= TOL[dtype]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("context_len", [64, 70])  # the longest context on a block edge, and past one
def test_paged_paths_equal_contiguous_cache_attention_at_block_edge_lengths(path, block_size, context_len):
    w = make_workload(kv_heads=2, block_size=block_size, context_len=context_len, lengths="edges")
    assert w.lens == block_edge_lengths(block_size, context_len)
    ref, out = reference(w), PATHS[path](*args(w))
    assert TECHNIQUE.check_fn(ref, out).passed
    for b, n in enumerate(w.lens):  # every sequence, not only the batch as a whole
        assert rel_err(out[b], ref[b]) <= 1e-5, n


def test_edges_give_one_sequence_per_edge_length_with_exactly_its_blocks():
    w = make_workload(batch=2, block_size=16, context_len=70, lengths="edges")
    assert w.lens == [1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 69, 70] and w.q.shape[0] == len(w.lens)
    assert w.context_lens.tolist() == w.lens and w.triton_out.shape == w.q.shape
    held = [w.block_tables[b, : -(-n // 16)].tolist() for b, n in enumerate(w.lens)]
    assert [len(h) for h in held] == [1, 1, 1, 2, 2, 2, 3, 4, 4, 5, 5, 5]
    flat = [x for h in held for x in h]
    assert len(set(flat)) == len(flat)  # no block shared, a full last block included
    assert TECHNIQUE.metrics_fn(w, Measured("torch_blocks", [0.5], 0.5, None, CPU))["sequences"] == 12


def test_check_takes_the_worst_sequence_so_one_long_context_is_not_diluted():
    # A 3% error in the longest context's output alone: the batch's relative L2 stays under the
    # bf16 tolerance (short contexts' outputs are larger), the worst sequence's does not.
    w = make_workload(context_len=512, lengths="edges", dtype="bfloat16")
    ref = reference(w)
    out = ref.clone()
    out[-1] *= 1.03
    assert relative_l2_check(ref, out.bfloat16()).passed
    result = TECHNIQUE.check_fn(ref, out.bfloat16())
    assert not result.passed and result.metric == "max_rel_l2" and f"sequence {len(w.lens) - 1}" in result.detail


def test_workload_exercises_shuffled_blocks_partial_tails_and_mixed_lengths():
    # What the equality test above relies on to mean anything.
    w = make_workload(batch=6, context_len=100, block_size=16, seed=3)
    lens, tables = w.lens, w.block_tables
    assert max(lens) == 100 and len(set(lens)) > 1 and min(lens) >= 1
    assert any(n % 16 for n in lens)  # some last block is only partly filled
    live = [tables[b, : -(-n // 16)] for b, n in enumerate(lens)]
    used = torch.cat(live)
    assert len(set(used.tolist())) == len(used)  # no block shared
    assert not torch.equal(used, torch.arange(len(used), dtype=used.dtype))  # not in pool order
    spare = set(range(w.k_cache.shape[0])) - set(used.tolist())
    assert spare  # unreferenced blocks exist...
    assert all(w.k_cache[s].abs().sum() > 0 for s in spare)  # ...and hold data, not zeros
    for b, n in enumerate(lens):  # table entries past a sequence's end name spare blocks
        assert set(tables[b, -(-n // 16) :].tolist()) <= spare


@pytest.mark.parametrize("path", PATHS)
def test_slots_past_each_context_and_spare_blocks_are_never_used(path):
    w = make_workload(kv_heads=2, block_size=8)
    ref = reference(w)
    k, v = w.k_cache.clone(), w.v_cache.clone()
    keep = torch.zeros(k.shape[:2], dtype=torch.bool)
    for b, n in enumerate(w.lens):
        for t in range(n):
            keep[w.block_tables[b, t // 8], t % 8] = True
    assert (~keep).sum() > 0
    k[~keep] = float("nan")  # an engine's unwritten slots may hold anything, NaN included
    v[~keep] = float("nan")
    out = PATHS[path](w.q, k, v, w.block_tables, w.context_lens)
    assert not out.isnan().any()
    assert rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("variant", ["torch_blocks", "triton"])
def test_corrupted_block_table_is_caught_by_check(variant):
    w = make_workload()
    ref = reference(w)
    fn = TECHNIQUE.variants["torch_blocks"].fn if variant == "torch_blocks" else (lambda w: kernel(*args(w)))
    assert TECHNIQUE.check_fn(ref, fn(w)).passed
    # Point one live entry of the longest sequence at a spare block.
    b = max(range(len(w.lens)), key=lambda i: w.lens[i])
    live = set(torch.cat([w.block_tables[i, : -(-n // 16)] for i, n in enumerate(w.lens)]).tolist())
    spare = next(s for s in range(w.k_cache.shape[0]) if s not in live)
    w.block_tables[b, 0] = spare
    result = TECHNIQUE.check_fn(ref, fn(w))
    assert not result.passed and result.error > 1e-3


def test_kernel_overwrites_every_element_of_a_poisoned_output():
    w = make_workload(kv_heads=2)
    out = torch.full_like(w.q, float("nan"))
    returned = kernel(*args(w), out=out)
    assert returned is out
    assert not out.isnan().any()
    assert rel_err(out, reference(w)) <= 1e-5


def test_kernel_handles_head_dim_not_a_power_of_two():
    # DIM_PAD > HEAD_DIM: the padded channels are masked on load and store.
    gen = torch.Generator().manual_seed(0)
    lens = [5, 19]
    tables, num_blocks = build_block_tables(lens, 8, gen)
    q = torch.randn(2, 4, 96, generator=gen)
    k, v = (torch.randn(num_blocks, 8, 2, 96, generator=gen) for _ in range(2))
    a = (q, k, v, tables, torch.tensor(lens, dtype=torch.int32))
    assert rel_err(kernel(*a), gather_then_attend(*a)) <= 1e-5


@pytest.mark.parametrize(
    "fn",
    [torch_path, kernel, gather_then_attend, paged_decode_attention_gathered],
    ids=["torch", "triton", "gather", "gathered"],
)
def test_empty_context_gives_zeros_not_nan(fn):
    w = make_workload()
    lens = w.context_lens.clone()
    lens[0] = 0
    out = fn(w.q, w.k_cache, w.v_cache, w.block_tables, lens)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert not out.isnan().any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gather_and_torch_blocks_equal_float64_reference(dtype):
    w = make_workload(kv_heads=2, dtype=dtype)
    ref = reference(w)
    for name in ("gather", "torch_blocks"):
        result = TECHNIQUE.check_fn(ref, TECHNIQUE.variants[name].fn(w))
        assert result.passed and result.error <= TOL[dtype], name
    assert rel_err(paged_decode_attention(*args(w)), ref) <= TOL[dtype]  # CPU dispatch -> PyTorch path
    # the PyTorch path with its default step (one step covers this whole context)
    assert rel_err(paged_decode_attention_torch(*args(w)), ref) <= TOL[dtype]


def test_reference_equals_attention_over_the_contiguous_cache():
    # The reference is independent of the paged layout: the same keys stored contiguously.
    w = make_workload(heads=2, kv_heads=1, batch=2)
    ref = reference(w)
    for b, n in enumerate(w.lens):
        blocks = w.block_tables[b].long()
        k = w.k_cache[blocks].flatten(0, 1)[:n, 0].double()
        v = w.v_cache[blocks].flatten(0, 1)[:n, 0].double()
        for h in range(2):
            p = torch.softmax(k @ w.q[b, h].double() / 8.0, dim=0)
            assert torch.allclose(ref[b, h], p @ v, atol=1e-12)


def test_check_fails_on_nan_and_beyond_tolerance():
    w = make_workload()
    ref = reference(w)
    out = TECHNIQUE.playing("optimized", CPU).fn(w)
    poisoned = out.clone()
    poisoned[1, 2, 3] = float("nan")
    result = TECHNIQUE.check_fn(ref, poisoned)
    assert not result.passed and "NaN" in result.detail
    off = TECHNIQUE.check_fn(ref, (ref * (1 + 1e-3)).float())
    assert not off.passed and off.error == pytest.approx(1e-3, rel=1e-2)
    assert TECHNIQUE.check_fn(ref, ref.bfloat16()).passed


def test_build_is_deterministic_per_seed_and_differs_across_seeds():
    a, b, c = make_workload(seed=7), make_workload(seed=7), make_workload(seed=8)
    for name in ("q", "k_cache", "v_cache", "block_tables", "context_lens"):
        assert torch.equal(getattr(a, name), getattr(b, name))
    assert not torch.equal(a.q, c.q) and not torch.equal(a.k_cache[0], c.k_cache[0])
    assert a.block_tables.dtype == a.context_lens.dtype == torch.int32


def test_validate_rejects_heads_not_divisible_by_kv_heads():
    params = dict(TECHNIQUE.defaults(), heads=8, kv_heads=3)
    assert TECHNIQUE.validate_fn(params) == ["heads (8) must be divisible by kv_heads (3)"]
    assert TECHNIQUE.validate_fn(dict(params, kv_heads=2)) == []
    assert TECHNIQUE.validate_fn(dict(params, kv_heads=0)) == []
    assert TECHNIQUE.param("block_size").problem(12) is not None
    assert TECHNIQUE.param("head_dim").problem(96) is not None


def test_metrics_count_kv_bytes_read_once_and_decode_steps():
    w = make_workload(batch=3, heads=4, kv_heads=2, head_dim=64, dtype="bfloat16")
    m = TECHNIQUE.metrics_fn(w, Measured("torch_blocks", [0.5], 0.5, None, CPU))
    kv = sum(w.lens) * 2 * 64 * 2 * 2  # tokens x kv_heads x head_dim x (K, V) x 2 bytes
    assert m["bytes_moved"] == kv + 2 * (3 * 4 * 64 * 2)  # + q read + output written
    assert m["tokens_per_s"] == 3 / 0.5
    assert m["context_tokens"] == sum(w.lens) and m["sequences"] == 3


def test_metrics_count_decode_flops_once_per_query_head_so_the_roofline_can_place_the_case():
    """Two matmuls (q.k, p.v) of head_dim per query head and context token, whatever the grouping:
    the roofline reads the case at FLOPs / bytes, so a count per KV head would misplace it."""
    w = make_workload(batch=3, heads=4, kv_heads=2, head_dim=64, dtype="bfloat16")
    m = TECHNIQUE.metrics_fn(w, Measured("torch_blocks", [0.5], 0.5, None, CPU))
    assert m["flops"] == 2 * 2 * 4 * 64 * sum(w.lens)


def _case(context_len, batch, gather_s, kernel_s):
    def variant(role, s):
        return {"role": role, "stats": {"median": s}, "metrics": {"gbps": 1.0 / s}}

    params = {**TECHNIQUE.defaults(), "context_len": context_len, "batch": batch}
    return {
        "technique": "paged_attention",
        "params": params,
        "variants": {
            "gather": variant("baseline", gather_s),
            "triton": variant("optimized", kernel_s),
            "torch_blocks": {"role": "peer", "status": "skipped"},
        },
    }


def _drawn(cases):
    return {
        plot.title.split(" (")[0]: fig
        for plot in TECHNIQUE.plots
        for fig in [figures.declared(plot, cases)]
        if fig is not None
    }


def _lines(fig):
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in fig.axes
        for line in ax.get_lines()
        if len(line.get_xdata())
    }


def test_plots_bandwidth_against_context_and_time_against_batch_only_when_batch_varies():
    one_batch = [_case(256, 4, 2.0, 1.0), _case(512, 4, 3.0, 1.5)]
    drawn = _drawn(one_batch)
    assert list(drawn) == ["Decode bandwidth"]
    assert _lines(drawn["Decode bandwidth"]) == {
        "gather": ([256, 512], [0.5, 1 / 3]),
        "triton": ([256, 512], [1.0, 1 / 1.5]),
    }

    drawn = _drawn(one_batch + [_case(256, 16, 4.0, 2.0)])
    assert list(drawn) == ["Decode bandwidth", "Time per decode step"]
    # at context 256 the batch sweep is one line per variant, in milliseconds
    time_lines = _lines(drawn["Time per decode step"])
    assert time_lines["gather (context_len=256)"] == ([4, 16], [2000.0, 4000.0])
    assert time_lines["triton (context_len=256)"] == ([4, 16], [1000.0, 2000.0])
    assert _drawn([]) == {}
    no_data = [
        {
            "technique": "paged_attention",
            "params": TECHNIQUE.defaults(),
            "variants": {"gather": {"role": "baseline", "status": "failed"}},
        }
    ]
    assert _drawn(no_data) == {}


def test_kernel_plays_optimized_on_cuda_and_torch_blocks_stands_in_on_cpu(monkeypatch):
    """On a CPU the kernel runs in Triton's interpreter (tests have it on): a peer, checked only,
    with torch_blocks playing optimized; compiled on CUDA, the kernel plays optimized."""
    from gpubench import techniques
    from gpubench.lib.paged_decode import KERNEL
    from gpubench.lib.triton_support import INTERPRETER_NOTE, kernel_module

    assert techniques.get("paged_attention") is TECHNIQUE
    assert TECHNIQUE.incomplete() == [] and TECHNIQUE.gpu_specific and TECHNIQUE.anchor
    assert TECHNIQUE.variants["triton"].unavailable_reason(CPU) is None
    assert TECHNIQUE.variants["triton"].checked_only_reason(CPU) == INTERPRETER_NOTE
    assert TECHNIQUE.playing("baseline", CPU).name == "gather"
    assert TECHNIQUE.playing("optimized", CPU).name == "torch_blocks"
    assert TECHNIQUE.cast(CPU)["triton"] == ("peer", None)
    monkeypatch.setattr(kernel_module(KERNEL[0]), "INTERPRETED", False)  # as compiled on a GPU
    assert TECHNIQUE.variants["triton"].unavailable_reason(CPU)  # says why: the kernel needs CUDA
    cast = TECHNIQUE.cast(torch.device("cuda"))
    assert cast["triton"] == ("optimized", None) and cast["torch_blocks"] == ("peer", None)


def test_optimized_variant_writes_into_a_poisoned_buffer_so_unwritten_elements_fail(monkeypatch):
    """The checked call's output starts as NaN: a kernel that skips a sequence cannot pass by
    inheriting a correct value from reused memory."""
    import gpubench.techniques.paged_attention.decode as module

    w = make_workload()
    for buffer in (w.triton_out, w.torch_out):
        assert buffer.isnan().all() and buffer.shape == w.q.shape

    def skips_last_sequence(q, k_cache, v_cache, block_tables, context_lens, scale=None, *, out):
        out[:-1] = paged_decode_attention_torch(q, k_cache, v_cache, block_tables, context_lens)[:-1]
        return out

    monkeypatch.setattr(module, "paged_decode_attention_torch", skips_last_sequence)
    result = TECHNIQUE.check_fn(TECHNIQUE.reference_fn(w), TECHNIQUE.variants["torch_blocks"].fn(w))
    assert not result.passed and "NaN" in result.detail


def test_triton_and_torch_blocks_write_separate_buffers_so_each_check_sees_its_own_output():
    # The harness makes every variant's checked call before checking any of them: a buffer shared
    # by the kernel and its stand-in would show the kernel's check the stand-in's values.
    w = make_workload()
    from_kernel = TECHNIQUE.variants["triton"].fn(w)  # in Triton's interpreter here
    from_loop = TECHNIQUE.variants["torch_blocks"].fn(w)
    assert from_kernel.data_ptr() != from_loop.data_ptr()
    ref = reference(w)
    assert TECHNIQUE.check_fn(ref, from_kernel).passed and TECHNIQUE.check_fn(ref, from_loop).passed


def test_torch_path_writes_into_out_and_returns_it():
    w = make_workload(kv_heads=2)
    out = torch.full_like(w.q, float("nan"))
    assert torch_path(*args(w), out=out) is out
    assert rel_err(out, reference(w)) <= 1e-5


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (8, 2), (4, 1)])
def test_vectorized_cpu_decode_equals_float64_reference_with_garbage_past_every_context(heads, kv_heads):
    """The CPU fallback (one gather through a per-token slot index, one SDPA with GQA by grouping,
    no loop over blocks) in float64 against the float64 reference to 1e-12, MHA, GQA and MQA,
    contexts ending inside their last block, with NaN in every slot no context covers and
    garbage block numbers in the table past each sequence's last block; and it agrees with the
    block walk it replaced."""
    w = make_workload(heads=heads, kv_heads=kv_heads, block_size=8, dtype="float32", batch=4)
    q, k, v = (t.double() for t in (w.q, w.k_cache, w.v_cache))
    tables = w.block_tables.clone()
    keep = torch.zeros(k.shape[:2], dtype=torch.bool)
    for b, n in enumerate(w.lens):
        for t in range(n):
            keep[tables[b, t // 8], t % 8] = True
        tables[b, -(-n // 8) :] = 10_000  # never followed
    assert any(n % 8 for n in w.lens)  # so some NaN lies in the tail of a partial last block
    k[~keep], v[~keep] = float("nan"), float("nan")
    slots, live = decode_token_slots(tables, w.context_lens, 8)
    assert live.sum(1).tolist() == list(w.lens)
    out = paged_decode_attention_gathered(q, k, v, tables, w.context_lens)
    ref = TECHNIQUE.reference_fn(replace_cache(w, q, k.nan_to_num(0.0), v.nan_to_num(0.0)))
    assert (out - ref).abs().max() <= 1e-12
    walk = paged_decode_attention_torch(q, k, v, tables.clamp_max(k.shape[0] - 1), w.context_lens, chunk_tokens=16)
    assert (out - walk).abs().max() <= 1e-12


def replace_cache(w, q, k, v):
    from dataclasses import replace

    return replace(w, q=q, k_cache=k, v_cache=v)


@pytest.mark.parametrize("chunk_tokens", [None, 8, 16, 40, 1000])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_path_equals_float64_reference_whatever_the_chunk(chunk_tokens, dtype):
    """The vectorized CPU path gives the float64 attention whether a context is one chunk (the
    default here), many (8, 16: one or two blocks), chunks that are not whole blocks (40, rounded
    down to 32), or one chunk wider than the table (1000), block-edge lengths included."""
    w = make_workload(kv_heads=2, block_size=8, context_len=70, lengths="edges", dtype=dtype)
    out = paged_decode_attention_torch(*args(w), chunk_tokens=chunk_tokens)
    assert TECHNIQUE.check_fn(reference(w), out).passed
    assert rel_err(out, reference(w)) <= TOL[dtype]


def test_cpu_path_loops_over_chunks_of_many_blocks_not_over_blocks(monkeypatch):
    """No Python loop over blocks: a context fits one chunk when its K is under CHUNK_ELEMENTS, and
    a bigger one takes ceil(blocks / blocks per chunk) chunks, each one gather for every sequence."""
    import gpubench.optimizations.paged_attention as blockwise

    calls = []
    real = blockwise.attend_chunk
    monkeypatch.setattr(blockwise, "attend_chunk", lambda *a: calls.append(a[3].shape) or real(*a))
    w = make_workload(batch=4, heads=8, kv_heads=2, context_len=512, block_size=16)
    assert rel_err(paged_decode_attention_torch(*args(w)), reference(w)) <= 1e-5
    assert calls == [(4, 32)]  # all 32 blocks of all 4 sequences in one chunk
    calls.clear()
    monkeypatch.setattr(blockwise, "CHUNK_ELEMENTS", 4 * 16 * 2 * 64 * 10)  # 10 blocks of 4 sequences
    assert rel_err(paged_decode_attention_torch(*args(w)), reference(w)) <= 1e-5
    assert calls == [(4, 10), (4, 10), (4, 10), (4, 2)]


def test_merging_partials_is_exact_and_empty_parts_add_nothing():
    """Two parts' softmaxes merged by log-sum-exp equal the softmax over all their keys, in either
    order; an empty part (-inf, 0, 0) changes nothing and two empty ones stay empty, not NaN."""
    from gpubench.optimizations.paged_attention import Partial, attend_chunk, merge_partials

    gen = torch.Generator().manual_seed(0)
    qg = torch.randn(1, 1, 2, 64, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(3, 4, 1, 64, generator=gen, dtype=torch.float64) for _ in range(2))
    everything = torch.ones(1, 12, dtype=torch.bool)
    whole = attend_chunk(qg, k, v, torch.tensor([[0, 1, 2]]), everything)
    first = attend_chunk(qg, k, v, torch.tensor([[0]]), everything[:, :4])
    rest = attend_chunk(qg, k, v, torch.tensor([[1, 2]]), everything[:, :8])
    empty = Partial(torch.full_like(whole.m, -math.inf), torch.zeros_like(whole.l), torch.zeros_like(whole.acc))
    in_order, reversed_, with_empty = (
        merge_partials(first, rest),
        merge_partials(rest, first),
        merge_partials(merge_partials(empty, first), rest),
    )
    for merged in (in_order, reversed_, with_empty):
        assert torch.allclose(merged.acc / merged.l[..., None], whole.acc / whole.l[..., None], atol=1e-12)
    both_empty = merge_partials(empty, empty)
    assert not both_empty.l.isnan().any() and (both_empty.l == 0).all() and (both_empty.m == -math.inf).all()


def test_sdpa_contiguous_peer_reads_a_contiguous_copy_made_at_build_and_matches_the_reference():
    """sdpa_contiguous's cache holds each sequence's keys in order, zero past its context, masked:
    the same attention as the paged cache (checked like every variant)."""
    w = make_workload(kv_heads=2, dtype="float32")
    longest = max(w.lens)
    assert w.contiguous_k.shape == (len(w.lens), 2, longest, 64)
    assert w.contiguous_mask.shape == (len(w.lens), 1, 1, longest)
    for b, n in enumerate(w.lens):
        blocks = w.block_tables[b, : -(-n // 16)].long()
        assert torch.equal(w.contiguous_k[b, :, :n], w.k_cache[blocks].flatten(0, 1)[:n].transpose(0, 1))
        assert (w.contiguous_v[b, :, n:] == 0).all() and w.contiguous_mask[b, 0, 0].sum() == n
    out = TECHNIQUE.variants["sdpa_contiguous"].fn(w)
    assert TECHNIQUE.check_fn(reference(w), out).passed and rel_err(out, reference(w)) <= 1e-5


def test_flashinfer_peer_says_why_it_cannot_run_off_cuda_or_in_float32():
    """FlashInfer runs only on CUDA, with fp16 / bf16 caches and the package importable; elsewhere
    the variant is skipped with that reason instead of failing."""
    flashinfer = TECHNIQUE.variants["flashinfer"]
    assert "CUDA" in flashinfer.unavailable_reason(CPU, dict(TECHNIQUE.defaults(), dtype="bfloat16"))
    reason = flashinfer.unavailable_reason(torch.device("cuda"), dict(TECHNIQUE.defaults(), dtype="float32"))
    assert "float32" in reason
    bf16 = flashinfer.unavailable_reason(torch.device("cuda"), dict(TECHNIQUE.defaults(), dtype="bfloat16"))
    assert bf16 is None or "flashinfer" in bf16  # None only where flashinfer imports


def test_full_lengths_give_every_sequence_the_whole_context():
    """lengths: full is the bandwidth case (the issue's batch 64 x 8192): every sequence at
    context_len, so no split idles and the bytes are batch x context."""
    w = make_workload(batch=3, context_len=40, lengths="full")
    assert w.lens == [40, 40, 40] and w.context_lens.tolist() == [40, 40, 40]
