"""flash_attention's local masks (issue 37): a sliding ``window`` (Mistral, Gemma 2/3, gpt-oss) and
Llama 4's ``chunk``. Every variant that runs here (eager, torch_tiled, Triton in its interpreter,
SDPA) is exact against float64 attention under them, at ragged lengths crossing tiles and
window / chunk edges, forward and train, padded and varlen; the tiled paths never load keys outside
every row's window; FLOPs and bytes count only what is attended; bad params are refused clearly;
peers that cannot take a mask are skipped with their reason."""

from __future__ import annotations

import math

import pytest
import torch

from gpubench.checks import rel_l2
from gpubench.contract import Measured
from gpubench.lib.attention import (
    attention_bytes,
    attention_flops,
    attention_reference,
    causal_offset,
    check_local,
    keys_seen,
    score_area_x2,
    sees_no_key,
    visible_keys,
)
from gpubench.lib.kernels.flash_attention_triton import flash_attention_triton
from gpubench.lib.kernels.flash_attention_triton_bwd import flash_attn_func
from gpubench.optimizations.flash_attention import flash_attention_torch
from gpubench.techniques.flash_attention import TECHNIQUE, check, metrics, reference

CPU = torch.device("cpu")
FORWARD_VARIANTS = ("eager", "torch_tiled", "triton", "sdpa")


def spec_sees(i: int, j: int, seq_q: int, seq_k: int, align: str, window: int, chunk: int) -> bool:
    """The brief's definitions, written out on their own: p is query i's position aligned as
    causal_align says; a window: 0 <= p - j < window; a chunk: j <= p and p // chunk == j // chunk."""
    p = i + (seq_k - seq_q if align == "bottom_right" else 0)
    if window:
        return 0 <= p - j < window
    if chunk:
        return 0 <= j <= p and p // chunk == j // chunk
    return j <= p


def spec_mask(seq_q: int, seq_k: int, align: str, window: int, chunk: int) -> torch.Tensor:
    return torch.tensor(
        [[spec_sees(i, j, seq_q, seq_k, align, window, chunk) for j in range(seq_k)] for i in range(seq_q)],
        dtype=torch.bool,
    ).reshape(seq_q, seq_k)


def make_workload(seed: int = 0, **overrides):
    params = dict(TECHNIQUE.defaults(), batch=2, heads=4, kv_heads=2, head_dim=32, causal=True)
    params.update(overrides)
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def run_checked(name: str, w) -> None:
    result = check(reference(w), TECHNIQUE.variants[name].fn(w))
    assert result.passed, f"{name}: {result.detail}"


# -- the conventions --------------------------------------------------------------------------


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize(
    "seq_q,seq_k", [(9, 9), (4, 13), (13, 4), (1, 7)], ids=["square", "q-chunk", "more-q", "decode"]
)
@pytest.mark.parametrize("window,chunk", [(1, 0), (3, 0), (20, 0), (0, 1), (0, 4), (0, 20)])
def test_visible_keys_is_the_definition_of_a_window_and_a_chunk(align, seq_q, seq_k, window, chunk):
    pos_q, pos_k = torch.arange(seq_q), torch.arange(seq_k)
    got = visible_keys(pos_q[:, None], pos_k[None, :], causal_offset(seq_q, seq_k, align), window, chunk)
    expected = spec_mask(seq_q, seq_k, align, window, chunk)
    assert torch.equal(got, expected)
    # and what the other helpers derive from the mask: whether a row is empty, how many keys are read
    assert sees_no_key(seq_q, seq_k, True, align, window, chunk) == bool((~expected.any(dim=1)).any())
    assert keys_seen(seq_q, seq_k, True, align, window, chunk) == int(expected.any(dim=0).sum())


@pytest.mark.parametrize("window,chunk", [(5, 0), (0, 6)])
def test_float64_reference_is_sdpa_math_under_the_written_out_mask(window, chunk):
    # The reference every variant is checked against, against torch's own masked attention in
    # float64 with the mask built from the definition above (not from gpubench.lib.attention).
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen, dtype=torch.float64) for n in (11, 23, 23))
    mask = spec_mask(11, 23, "bottom_right", window, chunk)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = attention_reference(q, k, v, causal=True, window=window, chunk=chunk)
    assert torch.allclose(got, expected, atol=1e-12)


# -- every variant against float64 -------------------------------------------------------------

# (seq_len, seq_len_q, causal_align, window, chunk, block_m, block_n): ragged lengths (never a tile
# multiple) crossing several 32 x 16 / 16 x 16 tiles; window 1 (each query sees only itself);
# windows and chunks whose edges fall inside tiles; a chunk not dividing seq_len; queries at the end
# of a longer cache; more queries than keys top-left (the last rows' windows pass the last key:
# they see nothing and give 0).
LOCAL_CASES = [
    (77, 0, "bottom_right", 1, 0, 32, 16),
    (77, 0, "bottom_right", 19, 0, 32, 16),
    (77, 0, "bottom_right", 0, 24, 16, 32),
    (77, 0, "bottom_right", 0, 1, 16, 16),
    (70, 23, "bottom_right", 9, 0, 16, 16),
    (70, 23, "bottom_right", 0, 16, 32, 16),
    (70, 23, "top_left", 9, 0, 16, 16),
    (30, 61, "top_left", 7, 0, 16, 16),
    (30, 61, "top_left", 0, 11, 32, 16),
]
CASE_IDS = [f"k{c[0]}-q{c[1]}-{c[2][:3]}-w{c[3]}-c{c[4]}" for c in LOCAL_CASES]


@pytest.mark.parametrize("seq_len,seq_len_q,align,window,chunk,block_m,block_n", LOCAL_CASES, ids=CASE_IDS)
@pytest.mark.parametrize("name", FORWARD_VARIANTS)
def test_every_variant_is_exact_under_a_window_or_chunk(
    name, seq_len, seq_len_q, align, window, chunk, block_m, block_n
):
    params = dict(seq_len=seq_len, seq_len_q=seq_len_q, causal_align=align, window=window, chunk=chunk)
    w = make_workload(**params, block_m=block_m, block_n=block_n)
    reason = TECHNIQUE.variants[name].unavailable_reason(CPU, w.params)
    if name == "sdpa" and sees_no_key(seq_len_q or seq_len, seq_len, True, align, window, chunk):
        assert reason and "see no key" in reason  # skipped with its reason, never run into NaN
        return
    assert reason is None, reason
    run_checked(name, w)


@pytest.mark.parametrize("name", ["eager", "torch_tiled", "triton"])
@pytest.mark.parametrize("window,chunk", [(5, 0), (0, 7)], ids=["window", "chunk"])
def test_varlen_windows_and_chunks_count_from_each_documents_start(name, window, chunk):
    # Packed documents of random lengths (1..45): each document's positions start at 0, so its
    # window / chunk edges are its own, checked against each document run alone in float64.
    w = make_workload(seq_len=45, batch=4, varlen=True, window=window, chunk=chunk, block_m=16, block_n=16)
    run_checked(name, w)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", ["eager", "torch_tiled", "triton", "sdpa"])
def test_16_bit_windows_stay_within_their_tolerance(name, dtype):
    # 16-bit contiguous inputs take the Triton kernel's descriptor (TMA) path in the interpreter
    w = make_workload(seq_len=70, dtype=dtype, window=13, head_dim=64, block_m=16, block_n=16)
    run_checked(name, w)


@pytest.mark.parametrize(
    "seq_len,seq_len_q,align,window,chunk",
    [
        (77, 0, "bottom_right", 2, 0),
        (77, 0, "bottom_right", 19, 0),
        (77, 0, "bottom_right", 0, 24),
        (70, 23, "bottom_right", 0, 16),
        (30, 61, "top_left", 7, 0),
    ],
)
@pytest.mark.parametrize("name", ["triton", "eager", "torch_tiled"])
def test_train_mode_gradients_are_exact_under_a_window_or_chunk(name, seq_len, seq_len_q, align, window, chunk):
    # Triton: its backward kernels (dq per query tile, dk/dv per key tile) narrow their loops to the
    # same window; out, dq, dk and dv against float64. (Window 1 is refused in train mode, below.)
    w = make_workload(
        seq_len=seq_len,
        seq_len_q=seq_len_q,
        causal_align=align,
        window=window,
        chunk=chunk,
        mode="train",
        block_m=16,
        block_n=16,
    )
    run_checked(name, w)


@pytest.mark.parametrize("name", ["triton", "eager"])
def test_train_mode_varlen_under_a_window(name):
    w = make_workload(seq_len=40, batch=3, varlen=True, window=6, mode="train", block_m=16, block_n=16)
    run_checked(name, w)


@pytest.mark.parametrize("name", FORWARD_VARIANTS)
def test_a_window_or_chunk_as_long_as_the_keys_is_plain_causal(name):
    plain = TECHNIQUE.variants[name].fn(make_workload(seq_len=50, block_m=16, block_n=16)).clone()
    for local in ({"window": 50}, {"window": 10_000}, {"chunk": 50}, {"chunk": 64}):
        w = make_workload(seq_len=50, block_m=16, block_n=16, **local)
        assert torch.allclose(TECHNIQUE.variants[name].fn(w), plain, atol=1e-6, rtol=0), local


# -- the win: key tiles outside every row's window are never loaded -----------------------------


# the causal-only call below reads the NaN on purpose; NumPy (the interpreter) warns of it
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning", "ignore:invalid value:RuntimeWarning")
def test_triton_and_the_tile_loop_never_read_keys_outside_every_window():
    # 16 queries at the end of 200 keys, window 16: keys 0..168 are seen by no query. NaN there
    # would reach the output of any path that loads them (0 * NaN is NaN in P @ V); causal alone
    # loads them all. Forward, and the Triton backward's both kernels.
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 16, 32, generator=gen)
    k, v = torch.randn(1, 2, 200, 32, generator=gen), torch.randn(1, 2, 200, 32, generator=gen)
    first = 200 - 16 - 16 + 1  # the first query's first visible key
    k_poisoned, v_poisoned = k.clone(), v.clone()
    k_poisoned[:, :, : first // 16 * 16] = float("nan")
    v_poisoned[:, :, : first // 16 * 16] = float("nan")
    expected = attention_reference(q, k, v, causal=True, window=16)
    for out in (
        flash_attention_triton(q, k_poisoned, v_poisoned, causal=True, window=16, block_m=16, block_n=16),
        flash_attention_torch(q, k_poisoned, v_poisoned, causal=True, window=16, block_m=16, block_n=16),
    ):
        assert rel_l2(expected, out) <= 1e-5
    assert flash_attention_triton(q, k_poisoned, v_poisoned, causal=True, block_m=16, block_n=16).isnan().any()
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k_poisoned, v_poisoned))
    out = flash_attn_func(qg, kg, vg, causal=True, window=16)
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), torch.randn_like(out))
    assert dq.isfinite().all()
    # the unread keys' gradients are exactly 0 (written, never computed from NaN)
    seen = slice(first // 16 * 16, None)
    assert torch.equal(dk[:, :, : first // 16 * 16], torch.zeros_like(dk[:, :, : first // 16 * 16]))
    assert dk[:, :, seen].isfinite().all() and dv[:, :, seen].isfinite().all()


# -- what is counted ----------------------------------------------------------------------------


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("seq_q,seq_k", [(64, 64), (17, 90), (90, 17), (1, 33)])
@pytest.mark.parametrize("window,chunk", [(1, 0), (7, 0), (40, 0), (0, 1), (0, 5), (0, 32)])
def test_flops_count_only_the_pairs_attended(align, seq_q, seq_k, window, chunk):
    # As causal is counted (the continuous triangle, its diagonal's pairs half), a local mask's
    # count is within half a pair per query row of the pairs it attends, never above them.
    pairs = int(spec_mask(seq_q, seq_k, align, window, chunk).sum())
    area_x2 = score_area_x2(seq_q, seq_k, True, align, window, chunk)
    assert 2 * pairs - seq_q <= area_x2 <= 2 * pairs
    assert attention_flops(2, 3, seq_q, seq_k, 64, 32, True, align, window, chunk) == 2 * 3 * 96 * area_x2


def test_a_window_covering_every_key_counts_as_causal_and_a_small_one_as_its_band():
    causal = score_area_x2(4096, 4096, True)
    assert score_area_x2(4096, 4096, True, window=4096) == causal
    assert score_area_x2(4096, 4096, True, chunk=4096) == causal
    # gpt-oss's window at 4096 tokens: 128 keys a query after the first 128, about 1/16 of causal
    band = score_area_x2(4096, 4096, True, window=128) / 2
    assert band == 128 * 4096 - 128 * 128 / 2
    assert math.isclose(band / (causal / 2), 128 / 2048, rel_tol=0.02)


def test_metrics_count_a_windows_flops_and_only_the_keys_it_reads():
    measured = Measured("x", [1e-3], 1e-3, None, CPU)
    causal = metrics(make_workload(seq_len=256, seq_len_q=32), measured)
    windowed = metrics(make_workload(seq_len=256, seq_len_q=32, window=16), measured)
    assert windowed["flops"] == 2 * 4 * 64 * score_area_x2(32, 256, True, window=16)
    assert windowed["flops"] < causal["flops"] / 10
    # keys read: 32 + 16 - 1 of 256 per sequence; q and the output in full
    q_bytes = out_bytes = 2 * 4 * 32 * 32 * 4
    assert windowed["bytes_moved"] == q_bytes + out_bytes + 2 * (2 * 2 * 47 * 32 * 4)
    assert causal["bytes_moved"] == q_bytes + out_bytes + 2 * (2 * 2 * 256 * 32 * 4)
    train = metrics(make_workload(seq_len=256, seq_len_q=32, window=16, mode="train"), measured)
    assert train["forward_flops"] == windowed["flops"]
    w = make_workload(seq_len=256, seq_len_q=32, window=16)
    assert attention_bytes(w.q, w.k, w.v, keys_read=2 * 47) == windowed["bytes_moved"]


# -- bad params, skipped peers --------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,words",
    [
        ({"window": 8, "causal": False}, ["window 8 needs causal: true"]),
        ({"chunk": 8, "causal": False}, ["chunk 8 needs causal: true"]),
        ({"window": 8, "chunk": 8}, ["window (8) and chunk (8)", "give one"]),
        ({"window": 1, "mode": "train"}, ["window 1 in train mode", "dq and dk are exactly 0"]),
        ({"chunk": 1, "mode": "train"}, ["chunk 1 in train mode"]),
    ],
)
def test_bad_local_params_are_refused_naming_the_param(overrides, words):
    params = {**TECHNIQUE.defaults(), "causal": True, **overrides}
    problems = " ".join(TECHNIQUE.validate_fn(params))
    assert all(word in problems for word in words), problems
    for name in ("window", "chunk"):
        assert TECHNIQUE.param(name).problem(-1)  # negative sizes refused by the param itself


def test_window_1_gradients_of_q_and_k_are_zero_and_of_v_exact():
    # Why train mode refuses window 1: each query's softmax is over one key, constant, so dq and dk
    # are 0 (here, to rounding) and dv is the upstream gradient summed into each query's own key.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=gen).requires_grad_() for _ in range(3))
    out = flash_attn_func(q, k, v, causal=True, window=1)
    grad = torch.randn_like(out)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    assert torch.allclose(out, v, atol=1e-6)
    assert dq.abs().max() < 1e-5 and dk.abs().max() < 1e-5
    assert torch.allclose(dv, grad, atol=1e-6)


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, **kw: attention_reference(q, q, q, **kw),
        lambda q, **kw: flash_attention_torch(q, q, q, **kw),
        lambda q, **kw: flash_attention_triton(q, q, q, **kw),
    ],
    ids=["reference", "torch_tiled", "triton"],
)
def test_the_functions_refuse_a_local_mask_without_causal_both_or_negative(fn):
    q = torch.randn(1, 1, 8, 16)
    for kwargs, message in (
        ({"window": 4}, "needs causal"),
        ({"causal": True, "window": 4, "chunk": 4}, "not both"),
        ({"causal": True, "window": -1}, "int >= 0"),
    ):
        with pytest.raises(ValueError, match=message):
            fn(q, **kwargs)
    check_local(True, 4, 0)  # and takes a valid one


def test_peers_without_a_local_mask_are_skipped_with_their_reason():
    cuda = torch.device("cuda")
    windowed = dict(TECHNIQUE.defaults(), causal=True, window=128)
    chunked = dict(TECHNIQUE.defaults(), causal=True, chunk=128)
    flash = TECHNIQUE.variants["sdpa_flash"].unavailable_reason(cuda, windowed)
    assert "flash backend takes no attention mask" in flash
    for name in ("sdpa_efficient", "sdpa_cudnn", "sdpa_math"):  # these take an explicit mask
        assert TECHNIQUE.variants[name].unavailable_reason(cuda, windowed) is None
    assert TECHNIQUE.variants["sdpa_flash"].unavailable_reason(cuda, dict(TECHNIQUE.defaults())) is None
    empty_rows = dict(windowed, seq_len=32, seq_len_q=300, causal_align="top_left", window=8)
    assert "see no key" in TECHNIQUE.variants["sdpa"].unavailable_reason(CPU, empty_rows)
    # flash-attn: a window is its window_size; it has no chunk (reason only when it is installed)
    reason = TECHNIQUE.variants["flash_attn"].unavailable_reason(cuda, chunked)
    assert reason and ("chunk" in reason or "flash_attn" in reason)


def test_the_published_throughput_claims_never_read_a_windows_band():
    # FA2's and FA3's TFLOP/s were measured on full and causal attention: a window's or a chunk's
    # case is another workload; a case from results written before these params still compares.
    from gpubench.records.claims import _param_problem

    params = {**TECHNIQUE.defaults(), "dtype": "bfloat16", "seq_len": 4096, "head_dim": 128, "causal": True}
    for claim in TECHNIQUE.claims:
        assert _param_problem(claim, params) is None
        assert "sliding window" in _param_problem(claim, {**params, "window": 128})
        assert "chunked" in _param_problem(claim, {**params, "chunk": 8192})
        older = {k: v for k, v in params.items() if k not in ("window", "chunk")}
        assert _param_problem(claim, older) is None
