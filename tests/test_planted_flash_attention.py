"""flash_attention: a bug planted in an optimized path fails the run's own check (against float64
attention), in at least two smoke-like cases each, so no single smoke case is the only catch."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from planted import caught, passed, run_planted, shipped
from planted import mutant as _mutant

import gpubench.techniques.flash_attention.attend as flash
from gpubench.lib.triton_support import kernel_module, kernel_problem

# Smoke's shapes: the default tiles (1024 x 512) cross a key tile only past 512 tokens (smoke's
# 1024; 513 is the fewest that does, a quarter of the work); the small-tile entry (64 x 32, grouped-query heads) crosses several query and key tiles at short,
# ragged lengths.
DEFAULT_TILES = dict(batch=1, heads=4, head_dim=64, dtype="float32")
SMALL_TILES = dict(batch=1, heads=4, kv_heads=2, head_dim=64, dtype="float32", block_m=64, block_n=32)
# Bugs planted in the PyTorch tiled loop (the optimized variant on a CPU) run it beside the
# baseline only: the Triton kernel, checked in the interpreter, cannot reach the loop and took
# most of each case's time (1024 tokens, train mode).
LOOP = ("eager", "torch_tiled")


def _assert_caught_only_with(monkeypatch, params: dict, name: str, buggy) -> None:
    """The case passes as shipped, and fails by its check on the optimized variant with ``buggy``
    in place of the variants module's ``name``."""
    assert passed(shipped("flash_attention", variants=LOOP, **params))
    monkeypatch.setattr(flash, name, buggy)
    record = run_planted("flash_attention", variants=LOOP, **params)
    assert record.role_variant("optimized") == "torch_tiled" and caught(record), (record.status, record.failure)


@pytest.mark.parametrize(
    "params",
    [
        dict(DEFAULT_TILES, seq_len=513, causal=True),
        dict(SMALL_TILES, seq_len=100, causal=True),
        dict(SMALL_TILES, seq_len=200, causal=True),
    ],
    ids=["513-default-tiles", "100-small-tiles", "200-small-tiles"],
)
def test_causal_mask_on_the_aligned_key_tile_only_is_caught(monkeypatch, params):
    """Written for square tiles: only the key tile that starts where the query tile starts gets
    the causal mask, so where a query tile spans several key tiles (block_m > block_n) the next
    ones' future keys are seen. Invisible while the diagonal fits in one key tile (smoke's 128
    and 512 at the default tiles)."""
    buggy = _mutant(
        flash.flash_attention_torch,
        "if causal and (n_end - 1 > m_start + offset or n_start < n_full):",
        "if causal and (n_start == m_start + offset or n_start < n_full):",
    )
    _assert_caught_only_with(monkeypatch, params, "flash_attention_torch", buggy)


@pytest.mark.parametrize(
    "params",
    [dict(SMALL_TILES, seq_len=100, causal=False), dict(SMALL_TILES, seq_len=200, causal=True)],
    ids=["100-full", "200-causal"],
)
def test_unrescaled_softmax_denominator_is_caught_below_1024_tokens(monkeypatch, params):
    """The running denominator is not rescaled when a later key tile raises the row maximum:
    caught wherever a row spans several key tiles, here without smoke's 1024-token cases."""
    buggy = _mutant(flash.flash_attention_torch, "row_sum.mul_(rescale).add_(", "row_sum.add_(")
    _assert_caught_only_with(monkeypatch, params, "flash_attention_torch", buggy)


def _kernel_with(tmp_path: Path, old: str, new: str):
    """A copy of the Triton kernel's module with ``old`` (found exactly once) replaced by ``new``."""
    return _module_with(tmp_path, flash.KERNEL[0], old, new)


@pytest.mark.parametrize(
    "params",
    [
        dict(batch=1, heads=4, kv_heads=2, seq_len=40, head_dim=32, dtype="float32", causal=False),
        dict(batch=1, heads=8, kv_heads=2, seq_len=50, head_dim=32, dtype="bfloat16", causal=True),
    ],
    ids=["gqa-fp32-full", "gqa-bf16-causal"],
)
def test_triton_kernel_reading_interleaved_kv_heads_is_caught(monkeypatch, tmp_path, params):
    """The kernel maps query head h to kv head h % kv_heads (interleaved, as a repeat() would
    lay them out) instead of h // group; run by Triton's interpreter as a CPU run has it (a peer,
    checked and never timed), with the tiled loop playing optimized beside it: the loop writes its
    own buffer, so it cannot overwrite the kernel's output before the check (it did: wherever both
    ran, the kernel was checked on the loop's output)."""
    problem = kernel_problem(flash.KERNEL[0], "cpu", interpreter_ok=True)
    if problem:
        pytest.skip(problem)
    assert passed(run_planted("flash_attention", **params))
    buggy = _kernel_with(tmp_path, "kv_h = h // group", "kv_h = h % (heads // group)")
    monkeypatch.setattr(flash, "kernel_module", lambda name: buggy)
    record = run_planted("flash_attention", **params)
    assert record.role_variant("optimized") == "torch_tiled" and caught(record, "triton"), (
        record.status,
        record.failure,
    )
    assert record.variants["torch_tiled"].check["passed"] and not record.variants["triton"].samples_s


def _module_with(tmp_path: Path, name: str, old: str, new: str):
    """A copy of module ``name`` with ``old`` (found exactly once) replaced by ``new``."""
    source = Path(kernel_module(name).__file__).read_text()
    assert source.count(old) == 1, old
    path = tmp_path / f"planted_{name.rsplit('.', 1)[-1]}.py"
    path.write_text(source.replace(old, new))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TRAIN = dict(
    batch=1, heads=4, kv_heads=2, seq_len=40, seq_len_q=29, head_dim=32, dtype="float32", causal=True, mode="train"
)
BACKWARD_BUGS = {
    # dQ's dS = P * (dP - delta) without FlashAttention-2's row term delta = rowsum(dO * O)
    "dq-without-delta": ("ds = (p * (dp - delta[:, None])).to(in_dtype)", "ds = (p * dp).to(in_dtype)"),
    # dK and dV from the first query head of each GQA group only, not summed over the group
    "gqa-not-summed": ("for g in range(group):", "for g in range(1):"),
}


@pytest.mark.parametrize(
    "params", [TRAIN, dict(TRAIN, batch=3, seq_len=30, seq_len_q=0, varlen=True)], ids=["padded", "varlen"]
)
@pytest.mark.parametrize("bug", list(BACKWARD_BUGS))
def test_triton_backward_with_a_wrong_gradient_is_caught_by_the_train_check(monkeypatch, tmp_path, bug, params):
    """A one-line bug in the Triton backward (run by the interpreter), in a train-mode case run as
    the harness runs it, fails the optimized variant's own check (out, dq, dk, dv against float64),
    while the same case passes with the shipped kernel."""
    problem = kernel_problem(flash.TRAIN_KERNELS, "cpu", interpreter_ok=True)
    if problem:
        pytest.skip(problem)
    assert passed(shipped("flash_attention", **params))
    buggy = _module_with(tmp_path, flash.TRAIN_KERNELS, *BACKWARD_BUGS[bug])
    real = flash.kernel_module
    monkeypatch.setattr(flash, "kernel_module", lambda name: buggy if name == flash.TRAIN_KERNELS else real(name))
    record = run_planted("flash_attention", **params)
    assert caught(record, "triton"), (record.status, record.failure)
    check = record.variants["triton"].check
    assert check["error"] > 5 * check["tolerance"] and any(g in check["detail"] for g in ("dq", "dk", "dv"))


# Smoke's entry of more queries than keys: 80 at the end of 48 keys, causal bottom-right, so the
# first 32 query rows (the whole first 32-row tile) see no key; forward and train.
MORE_QUERIES = dict(
    batch=1,
    heads=4,
    kv_heads=2,
    seq_len=48,
    seq_len_q=80,
    head_dim=64,
    dtype="float32",
    causal=True,
    block_m=32,
    block_n=16,
)


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_rows_that_see_no_key_left_unguarded_are_caught_with_more_queries_than_keys(monkeypatch, mode):
    """The loop forgets query tiles that see no key (it guards only an empty key set): their
    running maximum stays -inf and exp(-inf - -inf) is NaN, where the output (and its gradients)
    must be 0. Only more queries than keys under bottom-right causal reaches it; smoke's chunk of
    72 queries at the end of 200 keys does not."""
    buggy = _mutant(
        flash.flash_attention_torch,
        "empty_rows = causal and m_start + offset < 0 or seq_k == 0",
        "empty_rows = seq_k == 0",
    )
    _assert_caught_only_with(monkeypatch, dict(MORE_QUERIES, mode=mode), "flash_attention_torch", buggy)
    chunk = dict(SMALL_TILES, seq_len=200, seq_len_q=72, causal=True, mode=mode)
    assert passed(run_planted("flash_attention", variants=LOOP, **chunk))  # the smoke case before: blind to it


# Rows of the varlen stream after the last document (the technique packs PACKED_TAIL_ROWS there).
GRADS_ZEROED = "dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)"
GRADS_UNINITIALISED = "dq, dk, dv = (torch.full_like(t, float('nan')) for t in (q, k, v))"
# Smoke's MLA entry (q/k 192, v 128 channels, one kv head, 64 x 32 tiles) at 2 documents of up to
# 48 tokens, not 4 of up to 160: the tail rows after the last document are there at any length.
SMOKE_VARLEN_TRAIN = dict(
    batch=2,
    heads=4,
    kv_heads=1,
    seq_len=48,
    head_dim=192,
    head_dim_v=128,
    dtype="float32",
    causal=True,
    varlen=True,
    mode="train",
    block_m=64,
    block_n=32,
)


@pytest.mark.parametrize(
    "params",
    [dict(TRAIN, batch=3, seq_len=30, seq_len_q=0, varlen=True), SMOKE_VARLEN_TRAIN],
    ids=["small", "smoke-mla"],
)
def test_triton_varlen_gradients_left_unwritten_after_the_last_document_are_caught(monkeypatch, tmp_path, params):
    """The varlen backward allocates dq, dk, dv uninitialised (torch.empty_like, as the padded
    path may: its kernels write every row): the rows after cu_seqlens[-1], which no document owns
    and no kernel program visits, keep whatever the memory held (poisoned here with NaN, for a
    deterministic test). The workload packs a tail of rows after the last document, and their
    gradients must be 0, so the check sees it."""
    problem = kernel_problem(flash.TRAIN_KERNELS, "cpu", interpreter_ok=True)
    if problem:
        pytest.skip(problem)
    control = shipped("flash_attention", **params)
    assert passed(control) and control.variants["triton"].check["passed"]
    buggy = _module_with(tmp_path, flash.TRAIN_KERNELS, GRADS_ZEROED, GRADS_UNINITIALISED)
    real = flash.kernel_module
    monkeypatch.setattr(flash, "kernel_module", lambda name: buggy if name == flash.TRAIN_KERNELS else real(name))
    record = run_planted("flash_attention", **params)
    assert caught(record, "triton"), (record.status, record.failure)
    assert "NaN" in record.variants["triton"].check["detail"]


# -- local masks (issue 37) ------------------------------------------------------------------------

LOCAL = dict(batch=1, heads=4, kv_heads=2, seq_len=90, head_dim=32, dtype="float32", causal=True)
LOCAL_KERNEL_BUGS = {
    # the forward's masked tiles apply the causal bound but forget the window's or chunk's lower edge
    "forward-no-lower-edge": (flash.KERNEL[0], "visible = visible & (offs_n[None, :] >= first)", "visible = visible"),
    # the dK/dV program stops one query tile early: the last rows that see its keys add nothing
    "dkdv-range-one-tile-short": (
        flash.TRAIN_KERNELS,
        "m_end = tl.minimum(m_end, seq_q)",
        "m_end = tl.minimum(m_end - BLOCK_M, seq_q)",
    ),
}


@pytest.mark.parametrize("local", [dict(window=20), dict(chunk=24)], ids=["window", "chunk"])
@pytest.mark.parametrize("bug", list(LOCAL_KERNEL_BUGS))
def test_triton_kernel_with_a_wrong_local_mask_is_caught(monkeypatch, tmp_path, bug, local):
    """A one-line bug in the kernels' sliding-window / chunk handling (run by the interpreter, with
    tiles small enough that 90 tokens cross several), in a case run as the harness runs it, fails
    the Triton variant's check, while the shipped kernels pass."""
    module, old, new = LOCAL_KERNEL_BUGS[bug]
    problem = kernel_problem(module, "cpu", interpreter_ok=True)
    if problem:
        pytest.skip(problem)
    params = dict(LOCAL, **local, mode="train" if module == flash.TRAIN_KERNELS else "forward")
    if params["mode"] == "forward":
        params.update(block_m=32, block_n=16)
    assert passed(shipped("flash_attention", **params))
    buggy = _module_with(tmp_path, module, old, new)
    real = flash.kernel_module
    monkeypatch.setattr(flash, "kernel_module", lambda name: buggy if name == module else real(name))
    record = run_planted("flash_attention", **params)
    assert caught(record, "triton"), (record.status, record.failure, record.variants["triton"].check)


def test_tile_loop_skipping_the_tile_across_a_windows_edge_is_caught(monkeypatch):
    """The tile loop starts at the tile after the first row's first visible key (rounded up, not
    down), so that row's earliest keys are never seen: caught by the check on torch_tiled."""
    buggy = _mutant(
        flash.flash_attention_torch,
        "first_visible_key(m_start + offset, window, chunk)) // block_n * block_n",
        "first_visible_key(m_start + offset, window, chunk)) // block_n * block_n + block_n",
    )
    _assert_caught_only_with(
        monkeypatch, dict(SMALL_TILES, seq_len=150, causal=True, window=40), "flash_attention_torch", buggy
    )
