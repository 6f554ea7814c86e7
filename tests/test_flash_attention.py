"""flash_attention: the tiled online-softmax PyTorch path (what runs on a CPU) is exact attention,
never stores N x N, and the technique's build / check / validate / peers behave as the harness relies on."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gpubench.baselines.flash_attention import attention
from gpubench.contract import Measured
from gpubench.optimizations.flash_attention import flash_attention, flash_attention_torch
from gpubench.reports import figures
from gpubench.techniques.flash_attention import TECHNIQUE, reference

CPU = torch.device("cpu")
TOL = {"float32": 1e-5, "bfloat16": 1e-2}


def make_workload(seed: int = 0, **overrides):
    params = TECHNIQUE.defaults()
    params.update(overrides)
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def rel_err(output: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((output.double() - ref).norm() / ref.norm()).item()


CASES = [
    # (seq_len, heads, kv_heads, head_dim, dtype)
    (1, 4, 0, 64, "float32"),
    (77, 4, 0, 32, "float32"),
    (77, 8, 2, 96, "float32"),
    (77, 8, 2, 128, "bfloat16"),
    (130, 4, 0, 64, "bfloat16"),
    (1, 8, 2, 32, "bfloat16"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len,heads,kv_heads,head_dim,dtype", CASES)
def test_optimized_matches_float64_reference_and_baseline(seq_len, heads, kv_heads, head_dim, dtype, causal):
    # Small blocks so even short sequences span several query and key tiles, with ragged edges.
    w = make_workload(
        seq_len=seq_len, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=dtype, causal=causal, batch=2
    )
    out = flash_attention_torch(w.q, w.k, w.v, causal=causal, block_m=32, block_n=16)
    assert out.dtype == w.q.dtype and out.shape == w.q.shape
    assert rel_err(out, reference(w)) <= TOL[dtype]
    assert rel_err(out, attention(w.q, w.k, w.v, causal=causal)) <= TOL[dtype]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_optimized_exact_at_1000_tokens_with_default_blocks(causal):
    # 1000 is not a multiple of either default block, and causal skips whole key tiles.
    w = make_workload(seq_len=1000, heads=2, batch=1, causal=causal)
    assert rel_err(flash_attention(w.q, w.k, w.v, causal=causal), reference(w)) <= 1e-5
    # and with more query tiles than key tiles and the other way round
    for block_m, block_n in ((128, 512), (512, 96)):
        out = flash_attention_torch(w.q, w.k, w.v, causal=causal, block_m=block_m, block_n=block_n)
        assert rel_err(out, reference(w)) <= 1e-5


def test_causal_query_does_not_see_later_keys():
    w = make_workload(seq_len=40, heads=2, causal=True)
    out = flash_attention_torch(w.q, w.k, w.v, causal=True, block_m=16, block_n=8)
    # Changing keys and values after position 20 must leave queries 0..20 untouched.
    k, v = w.k.clone(), w.v.clone()
    k[:, :, 21:] += 5.0
    v[:, :, 21:] -= 5.0
    changed = flash_attention_torch(w.q, k, v, causal=True, block_m=16, block_n=8)
    assert torch.equal(out[:, :, :21], changed[:, :, :21])
    assert not torch.allclose(out[:, :, 21:], changed[:, :, 21:])


class LargestTensor(TorchDispatchMode):
    """Records the largest numel among the tensors every aten op returns."""

    def __init__(self):
        super().__init__()
        self.max_numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for t in tree_leaves(result):
            if isinstance(t, torch.Tensor):
                self.max_numel = max(self.max_numel, t.numel())
        return result


@pytest.mark.parametrize(
    "seq_len,causal,kv_heads,blocks",
    [
        (512, False, 0, {"block_m": 128, "block_n": 64}),
        (512, True, 1, {"block_m": 128, "block_n": 64}),
        (2048, True, 0, {}),  # the default blocks
    ],
)
def test_optimized_never_allocates_n_by_n(seq_len, causal, kv_heads, blocks):
    w = make_workload(seq_len=seq_len, heads=2, kv_heads=kv_heads, batch=1, head_dim=32, causal=causal)
    n_by_n = 1 * 2 * seq_len * seq_len
    with LargestTensor() as seen_baseline:
        attention(w.q, w.k, w.v, causal=causal)
    assert seen_baseline.max_numel >= n_by_n  # the detector does see the baseline's scores
    with LargestTensor() as seen_optimized:
        flash_attention_torch(w.q, w.k, w.v, causal=causal, **blocks)
    assert seen_optimized.max_numel < n_by_n
    block_m, block_n = blocks.get("block_m", 1024), blocks.get("block_n", 512)
    batch_heads = w.q.shape[0] * w.q.shape[1]
    assert seen_optimized.max_numel <= max(batch_heads * block_m * block_n, w.q.numel())


def test_check_fails_on_nan_and_inf_with_detail():
    w = make_workload(seq_len=16)
    ref = reference(w)
    out = flash_attention(w.q, w.k, w.v)
    assert TECHNIQUE.check_fn(ref, out).passed
    poisoned = out.clone()
    poisoned[0, 0, 3, 5] = float("nan")
    result = TECHNIQUE.check_fn(ref, poisoned)
    assert not result.passed and "NaN" in result.detail
    poisoned[0, 0, 3, 5] = float("inf")
    assert not TECHNIQUE.check_fn(ref, poisoned).passed


def test_check_records_error_and_fails_beyond_tolerance():
    w = make_workload(seq_len=16)
    ref = reference(w)
    result = TECHNIQUE.check_fn(ref, flash_attention(w.q, w.k, w.v))
    assert result.metric == "rel_l2" and result.tolerance == 1e-5 and 0 <= result.error <= 1e-5
    off = TECHNIQUE.check_fn(ref, (ref * (1 + 1e-3)).float())
    assert not off.passed and off.error == pytest.approx(1e-3, rel=1e-2)
    bf16 = TECHNIQUE.check_fn(ref, ref.bfloat16())
    assert bf16.passed and bf16.tolerance == 1e-2


def test_validate_rejects_heads_not_divisible_by_kv_heads():
    params = dict(TECHNIQUE.defaults(), heads=8, kv_heads=3)
    assert TECHNIQUE.validate_fn(params) == ["heads (8) must be divisible by kv_heads (3)"]
    assert TECHNIQUE.validate_fn(dict(params, kv_heads=2)) == []
    assert TECHNIQUE.validate_fn(dict(params, kv_heads=0)) == []  # 0 means kv_heads = heads


def test_validate_wants_both_tiles_or_neither_as_powers_of_two_of_at_least_16():
    params = TECHNIQUE.defaults()
    assert TECHNIQUE.validate_fn(dict(params, block_m=64, block_n=32)) == []
    assert TECHNIQUE.validate_fn(dict(params, block_m=64)) == ["give both block_m and block_n, or neither (got 64, 0)"]
    assert TECHNIQUE.validate_fn(dict(params, block_m=48, block_n=8)) == [
        "block_m must be a power of two >= 16, or 0 (got 48)",
        "block_n must be a power of two >= 16, or 0 (got 8)",
    ]


@pytest.mark.parametrize("name", ["torch_tiled", "triton"])
def test_block_params_set_the_tiles_of_both_tiled_variants(monkeypatch, name):
    """block_m / block_n reach the loop and the kernel; 0 (the default) leaves them their own tiles."""
    import types

    import gpubench.techniques.flash_attention.attend as module

    seen = []

    def spy(q, k, v, causal=False, *, out, **options):
        seen.append({name: options[name] for name in ("block_m", "block_n") if name in options})
        return out

    monkeypatch.setattr(module, "flash_attention_torch", spy)
    monkeypatch.setattr(module, "kernel_module", lambda name: types.SimpleNamespace(flash_attention_triton=spy))
    TECHNIQUE.variants[name].fn(make_workload(seq_len=40, block_m=64, block_n=32))
    TECHNIQUE.variants[name].fn(make_workload(seq_len=40))
    assert seen == [{"block_m": 64, "block_n": 32}, {}]


def test_build_is_deterministic_per_seed_and_differs_across_seeds():
    a, b, c = make_workload(seed=7), make_workload(seed=7), make_workload(seed=8)
    for name in ("q", "k", "v"):
        assert torch.equal(getattr(a, name), getattr(b, name))
        assert not torch.equal(getattr(a, name), getattr(c, name))
    assert not torch.equal(a.q, a.k)  # q, k, v are independent draws
    assert a.q.abs().sum() > 0  # never timed on zeros


def test_build_shapes_dtype_and_kv_heads_default():
    w = make_workload(batch=3, heads=8, kv_heads=2, seq_len=5, head_dim=96, dtype="bfloat16")
    assert w.q.shape == (3, 8, 5, 96) and w.k.shape == (3, 2, 5, 96) and w.v.shape == (3, 2, 5, 96)
    assert w.q.dtype == torch.bfloat16
    assert make_workload(heads=4, kv_heads=0).k.shape[1] == 4


@pytest.mark.parametrize("kv_heads", [0, 2], ids=["mha", "gqa"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_sdpa_peers_agree_with_baseline(kv_heads, causal):
    w = make_workload(seq_len=50, heads=4, kv_heads=kv_heads, causal=causal)
    baseline = TECHNIQUE.variants["eager"].fn(w)
    ref = reference(w)
    # sdpa_math is CUDA-only as a peer, but the MATH backend also runs on the CPU: exercise it.
    for name in ("sdpa", "sdpa_math"):
        out = TECHNIQUE.variants[name].fn(w)
        assert rel_err(out, baseline) <= 1e-5
        assert TECHNIQUE.check_fn(ref, out).passed


def test_cuda_only_variants_say_why_on_cpu_and_the_tiled_loop_plays_optimized_there(monkeypatch):
    """On a CPU the kernels run only in Triton's interpreter (tests have it on): triton is a peer,
    checked and never timed, and the tiled loop plays optimized; compiled on CUDA, the kernel
    plays optimized with the loop timed beside it."""
    from gpubench.lib.triton_support import INTERPRETER_NOTE

    for name in ("sdpa_flash", "sdpa_efficient", "sdpa_cudnn", "sdpa_math", "flash_attn"):
        assert TECHNIQUE.variants[name].unavailable_reason(CPU)
    for name in ("eager", "torch_tiled", "sdpa", "triton"):
        assert TECHNIQUE.variants[name].unavailable_reason(CPU) is None
    assert TECHNIQUE.variants["triton"].checked_only_reason(CPU) == INTERPRETER_NOTE
    assert TECHNIQUE.playing("optimized", CPU).name == "torch_tiled" and TECHNIQUE.cast(CPU)["triton"][0] == "peer"
    for name in (flash.KERNEL[0], flash.TRAIN_KERNELS):
        monkeypatch.setattr(kernel_module(name), "INTERPRETED", False)  # as compiled on a GPU
    assert TECHNIQUE.variants["triton"].unavailable_reason(CPU)  # needs CUDA
    cast = TECHNIQUE.cast(torch.device("cuda"))
    assert cast["triton"] == ("optimized", None) and cast["torch_tiled"][0] == "peer"


def test_metrics_count_flops_bytes_and_tokens():
    w = make_workload(batch=2, heads=4, kv_heads=2, seq_len=64, head_dim=32, dtype="bfloat16")
    m = TECHNIQUE.metrics_fn(w, Measured("optimized", [0.5], 0.5, None, CPU))
    assert m["flops"] == 4 * 2 * 64 * 64 * 4 * 32
    # read q (2x4 heads), k and v (2x2 heads each), write out (like q); 2 bytes each
    assert m["bytes_moved"] == 2 * (2 * 4 * 64 * 32 * 2 + 2 * 2 * 2 * 64 * 32)
    assert m["tokens_per_s"] == 2 * 64 / 0.5
    causal = TECHNIQUE.metrics_fn(
        make_workload(batch=2, heads=4, kv_heads=2, seq_len=64, head_dim=32, dtype="bfloat16", causal=True),
        Measured("optimized", [0.5], 0.5, None, CPU),
    )
    assert causal["flops"] == m["flops"] // 2


def test_technique_registered_and_complete():
    from gpubench import techniques

    assert techniques.get("flash_attention") is TECHNIQUE
    assert TECHNIQUE.incomplete() == []
    assert TECHNIQUE.gpu_specific and TECHNIQUE.anchor


def _case(seq_len, head_dim, causal, tflops, peak_bytes, dtype="bfloat16"):
    # As gpu-quick sweeps: 16k tokens per call (batch moves with seq_len), model dim 2048.
    params = dict(
        TECHNIQUE.defaults(),
        seq_len=seq_len,
        head_dim=head_dim,
        causal=causal,
        dtype=dtype,
        batch=16384 // seq_len,
        heads=2048 // head_dim,
    )
    return {
        "technique": "flash_attention",
        "params": params,
        "variants": {
            name: {
                "role": role,
                "metrics": {"tflops": tflops * (2 if role == "optimized" else 1)},
                "peak_memory_bytes": None if peak_bytes is None else peak_bytes * (1 if role == "optimized" else 4),
            }
            for name, role in (("eager", "baseline"), ("triton", "optimized"))
        },
    }


def _drawn(cases):
    return [(plot.title, fig) for plot in TECHNIQUE.plots for fig in [figures.declared(plot, cases)] if fig is not None]


def test_report_figures_draw_tflops_and_peak_memory_per_head_dim_and_causal():
    cases = [
        _case(s, d, c, tflops=s / 100, peak_bytes=s * 2**20)
        for s in (512, 1024, 2048)
        for d in (64, 128)
        for c in (False, True)
    ]
    figs = _drawn(cases)
    assert [title.split(" (")[0] for title, _ in figs] == ["Attention throughput", "Peak memory of one call"]
    for _, fig in figs:
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert len(panels) == 4  # (64, 128) x (full, causal)
        for ax in panels:
            # batch and heads vary across the run but move with seq_len and head_dim: one line each
            lines = {line.get_label(): line for line in ax.get_lines() if len(line.get_xdata())}
            assert set(lines) == {"eager", "triton"}
            assert list(lines["triton"].get_xdata()) == [512, 1024, 2048]
    tflops_panel = figs[0][1].axes[0]
    triton_line = next(line for line in tflops_panel.get_lines() if line.get_label() == "triton")
    assert list(triton_line.get_ydata()) == [2 * s / 100 for s in (512, 1024, 2048)]


def test_report_figures_leave_out_what_has_no_data():
    # On a CPU peak memory is null: only the TFLOP/s figure, and a dtype sweep labels its lines.
    cases = [
        _case(s, 64, False, tflops=1.0, peak_bytes=None, dtype=d) for s in (256, 512) for d in ("float32", "bfloat16")
    ]
    figs = _drawn(cases)
    assert [title.split(" (")[0] for title, _ in figs] == ["Attention throughput"]
    labels = {line.get_label() for line in figs[0][1].axes[0].get_lines() if len(line.get_xdata())}
    assert labels == {f"{v} (dtype={d})" for v in ("eager", "triton") for d in ("float32", "bfloat16")}
    assert _drawn([]) == []
    failed = {"technique": "flash_attention", "params": TECHNIQUE.defaults(), "variants": {}}
    assert _drawn([failed]) == []


def test_optimized_variant_writes_into_a_poisoned_buffer_so_unwritten_elements_fail(monkeypatch):
    """The checked call's output starts as NaN: a kernel that skips an element cannot pass by
    inheriting a correct value from reused memory."""
    import gpubench.techniques.flash_attention.attend as module

    w = make_workload(seq_len=33, causal=True)
    assert w.tiled_out.isnan().all() and w.triton_out.isnan().all() and w.tiled_out.shape == w.q.shape
    assert w.tiled_out.data_ptr() != w.triton_out.data_ptr()  # checked calls all run before any check

    def skips_last_row(q, k, v, causal=False, scale=None, *, out, **options):
        out[:, :, :-1] = flash_attention_torch(q, k, v, causal=causal, **options)[:, :, :-1]
        return out

    monkeypatch.setattr(module, "flash_attention_torch", skips_last_row)
    result = TECHNIQUE.check_fn(reference(w), TECHNIQUE.variants["torch_tiled"].fn(w))
    assert not result.passed and "NaN" in result.detail
    monkeypatch.undo()
    w = make_workload(seq_len=33, causal=True)
    assert TECHNIQUE.check_fn(reference(w), TECHNIQUE.variants["torch_tiled"].fn(w)).passed


# -- train mode, varlen, causal alignment, head dims (issue 20) ---------------------------------

from planted import mutant  # noqa: E402

import gpubench.lib.attention as attention_module  # noqa: E402
import gpubench.techniques.flash_attention.attend as flash  # noqa: E402
import gpubench.techniques.flash_attention.workload as flash_workload  # noqa: E402
from gpubench.lib.attention import attention_reference  # noqa: E402
from gpubench.lib.triton_support import kernel_module, kernel_problem  # noqa: E402

TRAIN_CASES = [
    # small sizes, tiles of 32 x 16 so each crosses several query and key tiles
    dict(seq_len=45, heads=4, kv_heads=2, head_dim=32, causal=True),  # GQA
    dict(seq_len=40, seq_len_q=13, heads=2, head_dim=32, causal=True),  # a query chunk at the cache's end
    dict(seq_len=21, seq_len_q=34, heads=2, head_dim=32, causal=True),  # more queries than keys: empty rows
    dict(seq_len=33, seq_len_q=20, heads=2, head_dim=32, causal=True, causal_align="top_left"),
    dict(seq_len=30, heads=4, kv_heads=1, head_dim=192, head_dim_v=128, causal=True),  # MLA's split dims, MQA
    dict(seq_len=24, heads=2, head_dim=256, causal=False),  # Gemma's head_dim
    dict(seq_len=40, batch=3, heads=4, kv_heads=2, head_dim=32, causal=True, varlen=True),
    dict(seq_len=30, seq_len_q=20, batch=3, heads=2, head_dim=32, causal=True, varlen=True),
]
TRAIN_IDS = ["gqa", "chunk", "more-queries", "top-left", "mla", "hd256", "varlen", "varlen-chunk"]


def train_workload(seed: int = 0, **overrides):
    return make_workload(seed, **{"mode": "train", "block_m": 32, "block_n": 16, **overrides})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("params", TRAIN_CASES, ids=TRAIN_IDS)
def test_train_mode_output_and_gradients_match_float64_for_the_cpu_variants(params, dtype):
    """Forward and backward of each variant that runs on a CPU (the eager baseline, the tiled loop
    under autograd, SDPA where the case is padded) against the float64 reference: out, dq, dk,
    dv by name, in one check."""
    w = train_workload(dtype=dtype, **params)
    ref = reference(w)
    assert set(ref) == {"out", "dq", "dk", "dv"} and ref["dv"].shape == w.v.shape
    sdpa = w.docs is None and not (w.q.shape[2] > w.k.shape[2] and w.causal_align == "bottom_right")
    names = ["eager", "torch_tiled"] + (["sdpa"] if sdpa else [])
    for name in names:
        out = TECHNIQUE.variants[name].fn(w)
        assert set(out) == set(ref) and all(out[key].shape == ref[key].shape for key in ref), name
        result = TECHNIQUE.check_fn(ref, out)
        assert result.passed, (name, result)
        assert result.tolerance == flash_workload.TRAIN_TOLERANCE[w.q.dtype]


@pytest.mark.parametrize(
    "params",
    [dict(TRAIN_CASES[0], seq_len_q=29), TRAIN_CASES[2], TRAIN_CASES[4], TRAIN_CASES[7]],
    ids=["gqa-chunk", "more-queries", "mla", "varlen"],
)
def test_reference_backward_equals_float64_autograd_in_several_row_chunks(monkeypatch, params):
    """The technique's chunked float64 backward (what checks every train case, at any length) gives
    autograd's gradients of the float64 reference attention, with chunks of 7 query rows."""
    w = train_workload(**params)
    longest_k = max(w.docs.lens_k) if w.docs is not None else w.k.shape[2]
    monkeypatch.setattr(attention_module, "REFERENCE_CHUNK_ELEMENTS", 7 * w.q.shape[1] * longest_k)
    ref = reference(w)
    leaves = [t.detach().double().requires_grad_(True) for t in (w.q, w.k, w.v)]
    if w.docs is None:
        out = attention_reference(*leaves, causal=True, causal_align=w.causal_align)
    else:
        out = torch.cat(
            [
                attention_reference(
                    *(t[rows].transpose(0, 1)[None] for t, rows in zip(leaves, (rows_q, rows_k, rows_k))),
                    causal=True,
                    causal_align=w.causal_align,
                )[0].transpose(0, 1)
                for rows_q, rows_k in w.docs.spans()
            ]
        )
    grads = torch.autograd.grad(out, leaves, w.grad_out.double())
    torch.testing.assert_close(ref["out"], out.detach(), rtol=1e-12, atol=1e-12)
    for name, grad in zip(("dq", "dk", "dv"), grads):
        torch.testing.assert_close(ref[name], grad, rtol=1e-10, atol=1e-12, msg=name)


WRONG_GRADIENTS = {
    # FlashAttention-2's dS = P * (dP - rowsum(dO * O)) without the row term: dq and dk wrong
    "delta-dropped": (".sub_(delta[..., at, None])", ""),
    # dk and dv of a kv head from its first query head only, not summed over the group
    "gqa-not-summed": (
        'dk += torch.einsum("bkgqn,bkgqd->bknd", dscores, qg[:, :, :, at])',
        'dk += torch.einsum("bkqn,bkqd->bknd", dscores[:, :, 0], qg[:, :, 0, at])',
    ),
    # the causal mask forgotten when recomputing P: future keys get gradient
    "mask-forgotten": ("if causal:  # also zeroes", "if False:  # also zeroes"),
    # dq without the softmax scale
    "dq-unscaled": ('"bkgqn,bknd->bkgqd", dscores, k) * scale', '"bkgqn,bknd->bkgqd", dscores, k)'),
}


@pytest.mark.parametrize("bug", list(WRONG_GRADIENTS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_train_check_fails_a_wrong_dq_dk_or_dv(bug, dtype):
    """The train check catches a backward with a classic bug (computed in float64, then rounded to
    the case's dtype, so only the bug separates it from a right answer): by far, naming the
    gradient."""
    w = train_workload(dtype=dtype, seq_len=45, seq_len_q=30, heads=4, kv_heads=2, head_dim=32, causal=True)
    ref = reference(w)
    right = {key: t.to(w.q.dtype) for key, t in ref.items()}
    assert TECHNIQUE.check_fn(ref, right).passed
    buggy = mutant(attention_module.reference_backward, *WRONG_GRADIENTS[bug])
    grads = buggy(w.q, w.k, w.v, ref["out"], reference_lse(w), w.grad_out, True, w.causal_align)
    wrong = dict(right, **{key: g.to(w.q.dtype) for key, g in zip(("dq", "dk", "dv"), grads)})
    result = TECHNIQUE.check_fn(ref, wrong)
    assert not result.passed and result.error > 5 * result.tolerance, result
    assert any(name in result.detail for name in ("dq", "dk", "dv"))


def reference_lse(w):
    return attention_reference(
        w.q.detach(), w.k.detach(), w.v.detach(), causal=w.causal, causal_align=w.causal_align, return_lse=True
    )[1]


def test_train_check_fails_a_missing_gradient_and_nan():
    w = train_workload(seq_len=20, causal=True)
    ref = reference(w)
    out = TECHNIQUE.variants["eager"].fn(w)
    assert not TECHNIQUE.check_fn(ref, {k: v for k, v in out.items() if k != "dk"}).passed
    poisoned = dict(out, dv=out["dv"].clone())
    poisoned["dv"][0, 0, 3, 1] = float("nan")
    result = TECHNIQUE.check_fn(ref, poisoned)
    assert not result.passed and "dv" in result.detail and "NaN" in result.detail


@pytest.mark.parametrize("name", ["eager", "torch_tiled"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_documents_never_see_each_other_and_each_equals_itself_alone(name, causal):
    """Changing one packed document's keys and values leaves every other document's output
    bit-identical; each document's rows equal that document run alone through the padded path."""
    w = make_workload(
        varlen=True, batch=4, seq_len=37, heads=4, kv_heads=2, head_dim=32, causal=causal, block_m=16, block_n=16
    )
    out = TECHNIQUE.variants[name].fn(w).clone()
    spans = w.docs.spans()
    rows_q, rows_k = spans[1]
    w.k[rows_k] += 3.0
    w.v[rows_k] -= 2.0
    changed = TECHNIQUE.variants[name].fn(w)
    for d, (other_q, _) in enumerate(spans):
        same = torch.equal(out[other_q], changed[other_q])
        assert same == (d != 1), d
    for rows_q, rows_k in spans:
        alone = attention(
            *(t[rows].transpose(0, 1)[None] for t, rows in ((w.q, rows_q), (w.k, rows_k), (w.v, rows_k))), causal=causal
        )
        assert rel_err(changed[rows_q], alone[0].transpose(0, 1)) <= 1e-5


@pytest.mark.parametrize("name", ["eager", "torch_tiled", "sdpa"])
def test_default_alignment_is_bottom_right_a_query_chunk_at_the_end_of_the_keys(name):
    """With the default causal_align a chunk of the last 9 queries against all 40 keys gives the
    last 9 rows of full causal attention (what chunked prefill needs); top_left gives SDPA's
    is_causal answer instead, which differs."""
    full = make_workload(seq_len=40, heads=2, causal=True, block_m=16, block_n=16)
    expected = attention(full.q, full.k, full.v, causal=True)[:, :, -9:]
    chunk = make_workload(seq_len=40, seq_len_q=9, heads=2, causal=True, block_m=16, block_n=16)
    assert TECHNIQUE.defaults()["causal_align"] == "bottom_right"
    chunk.q, chunk.k, chunk.v = full.q[:, :, -9:].contiguous(), full.k, full.v
    assert rel_err(TECHNIQUE.variants[name].fn(chunk), expected) <= 1e-5
    chunk.causal_align = "top_left"
    top_left = TECHNIQUE.variants[name].fn(chunk)
    assert rel_err(top_left, expected) > 0.1
    assert rel_err(top_left, attention(chunk.q, chunk.k, chunk.v, causal=True, causal_align="top_left")) <= 1e-5


def test_new_params_validate_and_build_the_shapes_they_name():
    assert TECHNIQUE.param("head_dim").choices == [32, 64, 96, 128, 192, 256]
    w = make_workload(batch=2, heads=4, kv_heads=1, seq_len=12, seq_len_q=5, head_dim=192, head_dim_v=128, mode="train")
    assert w.q.shape == (2, 4, 5, 192) and w.k.shape == (2, 1, 12, 192) and w.v.shape == (2, 1, 12, 128)
    assert w.grad_out.shape == (2, 4, 5, 128) and w.tiled_out.shape == (2, 4, 5, 128)
    assert w.q.requires_grad and not make_workload().q.requires_grad
    v = make_workload(varlen=True, batch=5, seq_len=30, seq_len_q=8, heads=4, kv_heads=2)
    tail = flash_workload.PACKED_TAIL_ROWS  # rows after the last document, as a packed buffer of fixed capacity has
    assert v.q.shape == (sum(v.docs.lens_q) + tail, 4, 64) and v.k.shape == (sum(v.docs.lens_k) + tail, 2, 64)
    assert all(1 <= n <= 30 for n in v.docs.lens_k) and all(1 <= n <= 8 for n in v.docs.lens_q)
    assert v.docs.cu_seqlens_q.dtype == torch.int32 and v.docs.cu_seqlens_k.tolist()[-1] == v.k.shape[0] - tail
    for bad in (dict(mode="backward"), dict(causal_align="center"), dict(head_dim=80), dict(head_dim_v=48)):
        name, value = next(iter(bad.items()))
        assert TECHNIQUE.param(name).problem(value), bad


def test_metrics_count_train_flops_as_3_5_forward_and_the_causal_area_of_unequal_lengths():
    measured = Measured("optimized", [0.5], 0.5, None, CPU)
    fwd = TECHNIQUE.metrics_fn(make_workload(batch=2, heads=4, seq_len=64, head_dim=32), measured)
    train = TECHNIQUE.metrics_fn(make_workload(batch=2, heads=4, seq_len=64, head_dim=32, mode="train"), measured)
    assert train["flops"] == fwd["flops"] * 7 // 2 and train["backward_flops"] == fwd["flops"] * 5 // 2
    assert train["forward_flops"] == fwd["flops"] and train["bytes_moved"] > 3 * fwd["bytes_moved"]
    # MLA: Q K^T at head_dim 192, P V at 128
    mla = TECHNIQUE.metrics_fn(make_workload(batch=1, heads=2, seq_len=64, head_dim=192, head_dim_v=128), measured)
    assert mla["flops"] == 2 * 2 * 64 * 64 * (192 + 128)
    # a causal chunk of 16 queries at the end of 64 keys computes 64 * 16 - 16^2 / 2 scores
    chunk = TECHNIQUE.metrics_fn(
        make_workload(batch=1, heads=1, seq_len=64, seq_len_q=16, head_dim=32, causal=True), measured
    )
    assert chunk["flops"] == 2 * 64 * (64 * 16 - 16 * 16 // 2) and chunk["tokens_per_s"] == 16 / 0.5
    top_left = make_workload(
        batch=1, heads=1, seq_len=64, seq_len_q=16, head_dim=32, causal=True, causal_align="top_left"
    )
    assert TECHNIQUE.metrics_fn(top_left, measured)["flops"] == 2 * 64 * 16 * 16 // 2
    # varlen: each document's own square
    v = make_workload(varlen=True, batch=3, seq_len=20, heads=2, head_dim=32)
    assert TECHNIQUE.metrics_fn(v, measured)["flops"] == sum(4 * n * n * 2 * 32 for n in v.docs.lens_k)


def _interpreter_problem():
    return kernel_problem(flash.KERNEL[0], "cpu", interpreter_ok=True) or kernel_problem(
        flash.TRAIN_KERNELS, "cpu", interpreter_ok=True
    )


@pytest.mark.parametrize(
    "params",
    [TRAIN_CASES[1], TRAIN_CASES[4], TRAIN_CASES[6], TRAIN_CASES[7]],
    ids=["chunk", "mla", "varlen", "varlen-chunk"],
)
@pytest.mark.parametrize("mode", ["forward", "train"])
def test_triton_variant_in_the_interpreter_matches_float64(params, mode):
    """The triton variant (forward kernels, or flash_attn_func / flash_attn_varlen_func's forward
    and backward) run by Triton's interpreter at tiny sizes passes the technique's own check."""
    problem = _interpreter_problem()
    if problem:
        pytest.skip(problem)
    w = make_workload(**{**params, "mode": mode, "block_m": 16, "block_n": 16})
    result = TECHNIQUE.check_fn(reference(w), TECHNIQUE.variants["triton"].fn(w))
    assert result.passed, result


@pytest.mark.parametrize("name", ["eager", "torch_tiled", "triton"])
def test_varlen_gradients_of_the_rows_after_the_last_document_are_exactly_zero(name):
    """The packed stream ends with a tail no document owns: nothing reads it, so dq, dk and dv
    there are exactly 0 in every variant and in the reference the check compares against, and
    the output is compared on the documents' rows only."""
    if name == "triton" and _interpreter_problem():
        pytest.skip(_interpreter_problem())
    w = make_workload(
        varlen=True,
        batch=3,
        seq_len=20,
        seq_len_q=0,
        heads=4,
        kv_heads=2,
        head_dim=32,
        causal=True,
        mode="train",
        block_m=16,
        block_n=16,
    )
    tail = flash_workload.PACKED_TAIL_ROWS
    assert w.q.shape[0] == w.docs.total_q + tail and w.k.shape[0] == w.docs.total_k + tail
    ref, got = reference(w), TECHNIQUE.variants[name].fn(w)
    assert got["out"].shape[0] == ref["out"].shape[0] == w.docs.total_q
    for key in ("dq", "dk", "dv"):
        assert bool((ref[key][-tail:] == 0).all()) and bool((got[key][-tail:] == 0).all()), (name, key)
    assert TECHNIQUE.check_fn(ref, got).passed
