"""The forward kernel's two load paths, tensor descriptors (TMA, sm_90 and later) and pointers, give
the same exact attention, and each call takes the path its layout allows. Triton's interpreter runs
descriptors as masked loads of the same boxes, so both paths run here against the float64
reference, for every head dim (64, 96, 128, MLA's 192 / 128, 256), GQA / MQA, both causal
alignments, odd lengths, seq_q != seq_k and tiles with BLOCK_M below, equal to and above BLOCK_N.
Whether the copies are real TMA on sm_90 is the compile test's (test_flash_attention_sm90_compile).
The causal split (_key_ranges: whole tiles unmasked, exactly the tiles crossing the diagonal
masked) is checked tile by tile against brute force. Sizes are tiny: the interpreter runs numpy."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import gpubench.lib.kernels.flash_attention_triton as fwd
import gpubench.lib.kernels.flash_attention_triton_bwd as bwd
import gpubench.lib.kernels.flash_attention_triton_tiles as tiles
from gpubench.lib.attention import attention_reference

TOL = {torch.float16: 1e-2, torch.bfloat16: 1e-2}


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def qkv(heads, kv_heads, seq_q, seq_k, head_dim, head_dim_v, dtype, seed=0, batch=2):
    gen = torch.Generator().manual_seed(seed)
    shapes = ((batch, heads, seq_q, head_dim), (batch, kv_heads, seq_k, head_dim), (batch, kv_heads, seq_k, head_dim_v))
    return [torch.randn(s, generator=gen).to(dtype) for s in shapes]


@pytest.fixture(params=["descriptors", "pointers"])
def path(request, monkeypatch):
    monkeypatch.setattr(fwd, "DESCRIPTORS", request.param == "descriptors")
    return request.param


def run_both_ways(q, k, v, **kwargs):
    """The kernel's output (into a NaN-poisoned buffer: an unwritten element shows) and lse."""
    out = torch.full((*q.shape[:3], v.shape[3]), float("nan"), dtype=q.dtype)
    return fwd.flash_attention_triton(q, k, v, out=out, return_lse=True, **kwargs)


@pytest.mark.parametrize("head_dim,head_dim_v", [(64, 64), (96, 96), (128, 128), (192, 128), (256, 256)])
@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 1)])
def test_both_paths_are_exact_for_every_head_dim_and_grouping(path, head_dim, head_dim_v, heads, kv_heads):
    """Every head dim (96 and 192 pad to the next power of two: descriptors zero-fill the padding
    channels as the pointer masks do), GQA and MQA, causal over odd lengths with seq_q < seq_k."""
    q, k, v = qkv(heads, kv_heads, 21, 37, head_dim, head_dim_v, torch.bfloat16)
    out_like = torch.empty(2, heads, 21, head_dim_v, dtype=q.dtype)
    assert fwd.uses_descriptors(q, k, v, out_like) == (path == "descriptors")
    out, lse = run_both_ways(q, k, v, causal=True)
    ref, ref_lse = attention_reference(q, k, v, causal=True, return_lse=True)
    assert not out.isnan().any()
    assert rel_err(out, ref) <= TOL[torch.bfloat16]
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-2


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("seq_q,seq_k", [(45, 19), (19, 45), (33, 33), (1, 50)])
@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16), (16, 16)])
def test_both_paths_split_the_causal_diagonal_exactly(path, align, seq_q, seq_k, block_m, block_n):
    """Both alignments with seq_q above and below seq_k, a single query row, and tiles taller,
    shorter and as tall as wide: rows that see no key are 0 with lse -inf on either path."""
    q, k, v = qkv(2, 1, seq_q, seq_k, 32, 32, torch.float16, seed=1)
    out, lse = run_both_ways(q, k, v, causal=True, causal_align=align, block_m=block_m, block_n=block_n)
    ref, ref_lse = attention_reference(q, k, v, causal=True, causal_align=align, return_lse=True)
    empty = torch.isneginf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty)
    assert (out[empty] == 0).all()
    assert rel_err(out, ref) <= TOL[torch.float16]


def test_not_causal_ragged_edges_on_both_paths(path):
    """Not causal: ragged query and key tiles (77 and 50, not multiples of any tile), zero-filled
    by the descriptor's box past the tensor's end and masked by the pointer path alike."""
    q, k, v = qkv(2, 2, 77, 50, 64, 32, torch.bfloat16, seed=2)
    out, _ = run_both_ways(q, k, v, causal=False)
    assert not out.isnan().any()
    assert rel_err(out, attention_reference(q, k, v)) <= TOL[torch.bfloat16]


@pytest.mark.parametrize("scale", [0.3, -0.7, 0.0])
def test_a_scale_of_either_sign_or_zero_is_exact_on_both_paths(path, scale):
    """A positive scale takes the row maximum of the raw scores and scales inside the exponent's
    multiply-add; zero and negative ones (which reverse or flatten the order) scale first. Causal
    and ragged, so the masked tiles' -inf meets each form, and lse follows the scale."""
    q, k, v = qkv(2, 1, 29, 41, 64, 64, torch.float16, seed=4)
    out, lse = run_both_ways(q, k, v, causal=True, scale=scale)
    ref, ref_lse = attention_reference(q, k, v, causal=True, scale=scale, return_lse=True)
    assert rel_err(out, ref) <= TOL[torch.float16]
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-2


def test_layouts_tma_cannot_address_take_the_pointer_path_and_stay_exact(monkeypatch):
    """Descriptors need 16-bit data, contiguous channels and 16-byte aligned strides and base:
    a transposed (channels-strided) q, an odd row stride and fp32 all fall back to pointers."""
    monkeypatch.setattr(fwd, "DESCRIPTORS", True)
    q, k, v = qkv(2, 2, 24, 24, 32, 32, torch.float16, seed=3)
    out = torch.empty_like(q)
    assert fwd.uses_descriptors(q, k, v, out)
    odd_rows = torch.randn(2, 2, 24, 33, dtype=torch.float16)[..., :32]  # rows 66 bytes apart
    strided_channels = q.transpose(2, 3).contiguous().transpose(2, 3)
    for name, case in (
        ("odd row stride", (odd_rows, k, v)),
        ("channels strided", (strided_channels, k, v)),
        ("fp32", tuple(t.float() for t in (q, k, v))),
    ):
        assert not fwd.uses_descriptors(*case, torch.empty_like(case[0])), name
        got = fwd.flash_attention_triton(*case, causal=True)
        assert rel_err(got, attention_reference(*case, causal=True)) <= 1e-2, name


def test_an_expanded_tensor_or_a_gpu_too_small_for_every_candidate_takes_the_pointer_path(monkeypatch):
    """A stride-0 axis (k broadcast over the batch) is no tensor map; and a compute-capability-9+
    GPU whose shared memory no descriptor candidate fits (consumer Blackwell, 99 KiB a block)
    would leave the autotuner with no config (it raises): both use the pointer path."""
    monkeypatch.setattr(fwd, "DESCRIPTORS", True)
    q, k, v = qkv(2, 2, 24, 24, 32, 32, torch.float16, seed=3)
    expanded = k[:1].expand(2, -1, -1, -1)
    assert expanded.stride(0) == 0 and not fwd.uses_descriptors(q, expanded, v, torch.empty_like(q))
    got = fwd.flash_attention_triton(q, expanded, v, causal=True)
    assert rel_err(got, attention_reference(q, expanded, v, causal=True)) <= 1e-2
    q, k, v = qkv(2, 2, 16, 16, 128, 128, torch.float16, seed=4)
    monkeypatch.setattr(tiles, "shared_memory_limit", lambda t: 101376)
    assert not fwd.uses_descriptors(q, k, v, torch.empty_like(q))
    assert tiles.descriptor_configs_fit(q, 32, 32)  # small heads still have a candidate that fits
    monkeypatch.setattr(tiles, "shared_memory_limit", lambda t: 232448)
    assert fwd.uses_descriptors(q, k, v, torch.empty_like(q)) and tiles.descriptor_configs_fit(q, 256, 256)


def test_varlen_never_builds_descriptors(monkeypatch):
    """A descriptor box crossing a document's end would read (and store into) the next document:
    packed varlen calls stay on the pointer path, padded 16-bit calls build four descriptors."""
    built = []

    class Counting(fwd.TensorDescriptor):
        def __post_init__(self):
            built.append(self)
            super().__post_init__()

    monkeypatch.setattr(fwd, "TensorDescriptor", Counting)
    monkeypatch.setattr(fwd, "DESCRIPTORS", True)
    q, k, v = qkv(2, 2, 30, 30, 32, 32, torch.float16, batch=1)
    packed = [t[0].transpose(0, 1).contiguous() for t in (q, k, v)]
    cu = torch.tensor([0, 11, 30], dtype=torch.int32)
    fwd.flash_attention_varlen_triton(*packed, cu, cu, 19, 19, causal=True)
    assert built == []
    fwd.flash_attention_triton(q, k, v, causal=True)
    assert len(built) == 4


# -- the causal split, tile by tile -------------------------------------------------------------------


@triton.jit
def _ranges_kernel(
    out_ptr,
    seq_q,
    seq_k,
    local_size,
    CAUSAL: tl.constexpr,
    BOTTOM_RIGHT: tl.constexpr,
    LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    m_block = tl.program_id(0)
    _, n_first, full_start, full_end, masked_end = fwd._key_ranges(
        m_block * BLOCK_M, seq_q, seq_k, local_size, CAUSAL, BOTTOM_RIGHT, LOCAL, BLOCK_M, BLOCK_N
    )
    tl.store(out_ptr + 4 * m_block, n_first)
    tl.store(out_ptr + 4 * m_block + 1, full_start)
    tl.store(out_ptr + 4 * m_block + 2, full_end)
    tl.store(out_ptr + 4 * m_block + 3, masked_end)


def sees(i, j, seq_q, seq_k, causal, diagonal, window, chunk):
    """Whether query i sees key j, from the definitions (gpubench.lib.attention's module docstring)."""
    p = i + diagonal
    if not causal:
        return True
    if window:
        return 0 <= p - j < window
    if chunk:
        return 0 <= j <= p and p // chunk == j // chunk
    return j <= p


def brute_force_ranges(m_start, seq_q, seq_k, causal, diagonal, block_m, block_n, window=0, chunk=0):
    """(whole, seen) key tiles of the query tile from the definition: the tiles every existing row
    sees whole, and those any row sees a key of."""
    rows = range(m_start, min(m_start + block_m, seq_q))
    visible = [{j for j in range(seq_k) if sees(i, j, seq_q, seq_k, causal, diagonal, window, chunk)} for i in rows]
    tiles = range(0, seq_k, block_n)
    whole = [n for n in tiles if n + block_n <= seq_k and all(set(range(n, n + block_n)) <= keys for keys in visible)]
    seen = [n for n in tiles if any(n <= j < n + block_n for keys in visible for j in keys)]
    return whole, seen


def tiles_in(lo, hi, block_n):
    """The key tiles a loop over [lo, hi) runs (those starting there)."""
    return list(range(lo, hi, block_n))


# (causal, causal_align, window, chunk): not causal; causal either way, plain and local
LOCAL_MASKS = [(0, 0), (1, 0), (7, 0), (20, 0), (0, 5), (0, 16)]
SPLIT_MASKS = [(False, "bottom_right", 0, 0)] + [
    (True, align, window, chunk) for align in ("bottom_right", "top_left") for window, chunk in LOCAL_MASKS
]


@pytest.mark.parametrize("seq_q,seq_k", [(45, 19), (19, 45), (33, 33), (64, 64), (1, 50)])
@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16), (16, 16), (64, 16)])
@pytest.mark.parametrize("causal,align,window,chunk", SPLIT_MASKS)
def test_masked_tiles_are_exactly_those_crossing_the_diagonal(
    causal, align, seq_q, seq_k, block_m, block_n, window, chunk
):
    """Per query tile, the unmasked range is every key tile all its rows see whole, the masked ranges
    hold the others any row sees (a local mask's lower edge first, then the diagonal), and a tile no
    row sees is never loaded: no tile is masked that needs no mask, none is skipped that a row needs,
    none runs twice. With a window or a chunk, that is where the work shrinks to the band."""
    diagonal = seq_k - seq_q if (causal and align == "bottom_right") else 0
    blocks = triton.cdiv(seq_q, block_m)
    got = torch.zeros(4 * blocks, dtype=torch.int32)
    kind, size = fwd.local_mask(window, chunk)
    _ranges_kernel[(blocks,)](
        got,
        seq_q,
        seq_k,
        size,
        CAUSAL=causal,
        BOTTOM_RIGHT=align == "bottom_right",
        LOCAL=kind,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
    )
    for b in range(blocks):
        whole, seen = brute_force_ranges(b * block_m, seq_q, seq_k, causal, diagonal, block_m, block_n, window, chunk)
        n_first, full_start, full_end, masked_end = got[4 * b : 4 * b + 4].tolist()
        full = tiles_in(full_start, full_end, block_n)
        masked = tiles_in(n_first, full_start, block_n) + tiles_in(full_end, masked_end, block_n)
        assert full == whole, (b, full, whole)
        assert sorted(full + masked) == seen, (b, full, masked, seen)


@triton.jit
def _query_ranges_kernel(
    out_ptr,
    seq_q,
    seq_k,
    diagonal,
    local_size,
    CAUSAL: tl.constexpr,
    LOCAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    n_block = tl.program_id(0)
    m_lo, m_full, m_full_end, m_end = bwd._query_ranges(
        n_block * BLOCK_N, seq_q, seq_k, diagonal, local_size, CAUSAL, LOCAL, BLOCK_M, BLOCK_N
    )
    tl.store(out_ptr + 4 * n_block, m_lo)
    tl.store(out_ptr + 4 * n_block + 1, m_full)
    tl.store(out_ptr + 4 * n_block + 2, m_full_end)
    tl.store(out_ptr + 4 * n_block + 3, m_end)


@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
@pytest.mark.parametrize("seq_q,seq_k", [(45, 19), (19, 45), (33, 33), (64, 64), (1, 50)])
@pytest.mark.parametrize("block_m,block_n", [(16, 32), (32, 16), (16, 16)])
@pytest.mark.parametrize("window,chunk", LOCAL_MASKS)
def test_backward_query_tiles_of_a_key_tile_are_exactly_those_that_see_it(
    align, seq_q, seq_k, block_m, block_n, window, chunk
):
    """The dK/dV kernel's mirror of the split: per key tile, a query tile runs unmasked only if
    every row of it sees every key of the tile, masked if some row sees some key, never if none
    does, and each runs once. (Causal only: without it every query tile runs unmasked.)"""
    diagonal = seq_k - seq_q if align == "bottom_right" else 0
    blocks = triton.cdiv(seq_k, block_n)
    got = torch.zeros(4 * blocks, dtype=torch.int32)
    kind, size = fwd.local_mask(window, chunk)
    _query_ranges_kernel[(blocks,)](
        got, seq_q, seq_k, diagonal, size, CAUSAL=True, LOCAL=kind, BLOCK_M=block_m, BLOCK_N=block_n
    )
    for b in range(blocks):
        n_start = b * block_n
        keys = range(n_start, min(n_start + block_n, seq_k))
        tiles = range(0, seq_q, block_m)
        rows = lambda m: range(m, min(m + block_m, seq_q))
        seeing = lambda i, j: sees(i, j, seq_q, seq_k, True, diagonal, window, chunk)
        whole = [m for m in tiles if all(seeing(i, j) for i in rows(m) for j in keys)]
        seen = [m for m in tiles if any(seeing(i, j) for i in rows(m) for j in keys)]
        m_lo, m_full, m_full_end, m_end = got[4 * b : 4 * b + 4].tolist()
        full = list(range(m_full, m_full_end, block_m))
        masked = list(range(m_lo, m_full, block_m)) + list(range(m_full_end, m_end, block_m))
        assert set(full) <= set(whole), (b, full, whole)
        assert sorted(full + masked) == seen, (b, full, masked, seen)


@triton.jit
def _order_kernel(out_ptr, CAUSAL: tl.constexpr):
    tl.store(out_ptr + tl.program_id(0), fwd._heavy_first(CAUSAL))


@pytest.mark.parametrize("causal", [True, False])
def test_causal_query_tiles_start_longest_first(causal):
    """Causal, the grid's first programs take the last query tiles (the most keys), so the short
    ones fill the end of the launch; every tile is still taken exactly once. Not causal: in order."""
    got = torch.full((7,), -1, dtype=torch.int32)
    _order_kernel[(7,)](got, CAUSAL=causal)
    assert got.tolist() == (list(range(6, -1, -1)) if causal else list(range(7)))


# -- the autotuner's side of the descriptor path -----------------------------------------------------


def candidates(configs):
    return {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages) for c in configs}


def test_descriptor_configs_that_overflow_shared_memory_are_pruned_before_tuning(monkeypatch):
    """On a GPU with sm_90's 227 KiB a block, the descriptor path's candidates are the head dim's
    list less those whose query tile and K/V stages do not fit: at head_dim 128 the 128 x 128 tile
    keeps 3 stages; at 256 the 3-stage 128 x 64 one goes, at MLA's 192 / 128 it stays. The pointer
    path is pruned by head dim only (the autotuner skips what fails to compile)."""
    monkeypatch.setattr(tiles, "shared_memory_limit", lambda t: 232448)
    every = tiles.GPU_CONFIGS_TMA + tiles.GPU_CONFIGS_TMA_LARGE_HEAD
    lse = torch.empty(1)

    def kept(block_d, block_dv, use_tma=True, configs=every):
        pruned = tiles.prune_forward(configs, {"lse_ptr": lse}, BLOCK_D=block_d, BLOCK_DV=block_dv, USE_TMA=use_tma)
        return candidates(pruned)

    assert kept(128, 128) == candidates(tiles.GPU_CONFIGS_TMA)  # every narrow candidate fits at 128
    assert (128, 128, 8, 3) in kept(128, 128)
    assert (128, 64, 8, 3) not in kept(256, 256) and (128, 64, 8, 2) in kept(256, 256)
    assert (128, 64, 8, 3) in kept(256, 128)
    for block_d, block_dv in ((64, 64), (128, 128), (256, 128), (256, 256)):
        for bm, bn, _, stages in kept(block_d, block_dv):
            assert tiles.descriptor_shared_bytes(bm, bn, block_d, block_dv, stages) <= 232448
    pointer = tiles.GPU_CONFIGS + tiles.GPU_CONFIGS_LARGE_HEAD
    assert kept(256, 256, False, pointer) == candidates(tiles.GPU_CONFIGS_LARGE_HEAD)


def test_the_pre_hook_sets_each_descriptors_box_to_its_configs_tile():
    """Autotuning changes the tiles between trials; each descriptor's box must follow (query rows
    for q, out and do, key rows for k and v; v's channels for v, out and do)."""
    q, k, v = qkv(2, 1, 40, 40, 64, 32, torch.float16)
    out = torch.empty(2, 2, 40, 32, dtype=torch.float16)
    q_d, k_d, v_d, o_d = fwd._descriptors(q, k, v, out, 64, 32, None, None)
    nargs = {
        "q_ptr": q_d,
        "k_ptr": k_d,
        "v_ptr": v_d,
        "out_ptr": o_d,
        "do_ptr": o_d,
        "lse_ptr": q,
        "BLOCK_M": 128,
        "BLOCK_N": 32,
        "BLOCK_D": 64,
        "BLOCK_DV": 32,
    }
    tiles.set_descriptor_boxes(nargs)
    assert (q_d.block_shape, k_d.block_shape, v_d.block_shape, o_d.block_shape) == (
        [1, 1, 128, 64],
        [1, 1, 32, 64],
        [1, 1, 32, 32],
        [1, 1, 128, 32],
    )


def test_the_path_is_part_of_every_autotuning_key():
    """A tuning found for one path is never reused for the other (their tiles and pipelines differ)."""
    import gpubench.lib.kernels.flash_attention_triton_bwd as bwd

    assert "USE_TMA" in tiles.AUTOTUNE_KEY and "USE_TMA" in bwd.AUTOTUNE_KEY


def test_the_environment_can_turn_the_descriptor_path_off():
    """GPUBENCH_FLASH_DESCRIPTORS=0 sends every call down the pointer path (so one GPU session can
    time both paths of one build); unset, the descriptor path is on."""
    import os
    import subprocess
    import sys

    script = (
        "import torch, gpubench.lib.kernels.flash_attention_triton as m; q = torch.randn(1, 1, 16, 16)"
        ".half(); print(m.DESCRIPTORS, m.uses_descriptors(q, q, q, q))"
    )
    env = {k: v for k, v in os.environ.items() if k != "GPUBENCH_FLASH_DESCRIPTORS"}
    env["TRITON_INTERPRET"] = "1"
    for value, expected in ((None, "True True"), ("0", "False False")):
        if value is not None:
            env["GPUBENCH_FLASH_DESCRIPTORS"] = value
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert result.stdout.strip() == expected, result.stderr[-2000:]
