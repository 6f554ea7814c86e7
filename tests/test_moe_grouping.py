"""moe_grouping: the gpt-oss MoE layer (router, interleaved clamped SwiGLU) is gpt-oss's; the
per-expert loop, sort-and-group and the grouped-GEMM path agree with a float64 reference in the
output and every gradient (experts with no tokens, all tokens on one expert, top-1, sizes that
are not powers of two, bf16); each path makes exactly the host reads it claims; and the
technique's build / check / metrics / plots / harness run behave as the report relies on."""

from __future__ import annotations

import math

import pytest
import torch
from inprocess import run_in_process
from torch.utils._python_dispatch import TorchDispatchMode

from gpubench.baselines.moe_grouping import moe_forward as per_expert_loop
from gpubench.contract import DTYPE_TOLERANCE, Measured, Recorder
from gpubench.models.moe import MoEConfig, SyncLog, init_weights, route, swiglu
from gpubench.optimizations.moe_grouping import group_by_expert, grouped_mm_problem, moe_forward_grouped_mm
from gpubench.optimizations.moe_grouping import moe_forward as sort_and_group
from gpubench.reports import figures
from gpubench.run import scenario
from gpubench.techniques import moe_grouping as module
from gpubench.techniques.moe_grouping import TECHNIQUE, reference
from gpubench.techniques.moe_grouping import training as moe_training
from gpubench.techniques.moe_grouping.training import OUTPUT_KEYS, TOLERANCE

CPU = torch.device("cpu")
VARIANTS = ("where_loop", "sort_group", "grouped_mm")
FORWARDS = {"where_loop": per_expert_loop, "sort_group": sort_and_group, "grouped_mm": moe_forward_grouped_mm}


def make_workload(seed: int = 0, **overrides):
    params = TECHNIQUE.defaults()
    params.update(overrides)
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def run_all(w) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, dict]]:
    """Each variant's output and what its call recorded."""
    outputs, recorded = {}, {}
    for name in VARIANTS:
        rec = Recorder()
        outputs[name] = TECHNIQUE.variants[name].call(w, rec)
        recorded[name] = rec.values
    return outputs, recorded


def assert_all_match_reference(w) -> tuple[dict[str, dict[str, torch.Tensor]], dict[str, dict]]:
    ref = reference(w)
    outputs, recorded = run_all(w)
    for name, out in outputs.items():
        result = TECHNIQUE.check_fn(ref, out)
        assert result.passed, f"{name}: {result.detail}"
    return outputs, recorded


def rows_per_expert(w) -> list[int]:
    with torch.no_grad():
        _, experts = route(w.x, w.weights.router_weight, w.weights.router_bias, w.config.top_k)
    return torch.bincount(experts.flatten(), minlength=w.config.experts).tolist()


# -- the layer --------------------------------------------------------------------------------


def test_swiglu_is_gpt_oss_interleaved_and_clamped():
    """Even columns are the gate (clamped above at 7), odd columns the linear part (clamped to
    +-7); out = gate * sigmoid(1.702 gate) * (linear + 1); a clamped entry gets no gradient."""
    h = torch.tensor([[8.0, -9.0, -3.0, 0.5, 1.0, 7.5, -20.0, 6.5]], dtype=torch.float64, requires_grad=True)
    gate = torch.tensor([7.0, -3.0, 1.0, -20.0], dtype=torch.float64)  # only the top is clamped
    linear = torch.tensor([-7.0, 0.5, 7.0, 6.5], dtype=torch.float64)
    expected = gate * torch.sigmoid(1.702 * gate) * (linear + 1)
    out = swiglu(h)
    torch.testing.assert_close(out, expected[None], rtol=0, atol=1e-15)
    (grad,) = torch.autograd.grad(out.sum(), h)
    clamped = [0, 1, 5]  # gate 8 > 7, linear -9 < -7, linear 7.5 > 7
    assert all(grad[0, i] == 0 for i in clamped)
    assert all(grad[0, i] != 0 for i in range(8) if i not in clamped)


def test_router_softmaxes_over_the_k_chosen_logits_only():
    """route: the experts are the top-k logits of a linear layer with bias; the weights are a
    softmax over those k logits (not over all experts), so they sum to 1 per token."""
    config = MoEConfig(experts=6, top_k=3, hidden=10, expert_dim=4)
    w = init_weights(config, torch.Generator().manual_seed(1), torch.float64)
    x = torch.randn(5, 10, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    weights, experts = route(x, w.router_weight, w.router_bias, 3)
    logits = x @ w.router_weight.T + w.router_bias
    top, idx = logits.sort(dim=-1, descending=True)
    assert torch.equal(experts, idx[:, :3])
    torch.testing.assert_close(weights, torch.softmax(top[:, :3], dim=-1))
    torch.testing.assert_close(weights.sum(-1), torch.ones(5, dtype=torch.float64))
    assert not torch.allclose(weights, torch.softmax(logits, -1).gather(1, experts))


def test_config_from_gpt_oss_presets():
    """The gpt-oss presets give the layer sizes the scenarios use (20b: 32 experts, 120b: 128,
    both top-4, hidden and expert_dim 2880); a dense model has no MoE layer."""
    assert MoEConfig.from_preset("gpt-oss-20b") == MoEConfig(experts=32, top_k=4, hidden=2880, expert_dim=2880)
    assert MoEConfig.from_preset("gpt-oss-120b") == MoEConfig(experts=128, top_k=4, hidden=2880, expert_dim=2880)
    with pytest.raises(ValueError, match="no MoE layer"):
        MoEConfig.from_preset("llama-3.1-8b")
    with pytest.raises(ValueError, match="exceeds"):
        MoEConfig(experts=2, top_k=3, hidden=4, expert_dim=4)
    assert MoEConfig(32, 4, 2880, 2880).expert_gemm_flops(10) == (6 * 10 * 4 * 2880 * 2880, 12 * 10 * 4 * 2880 * 2880)


def test_group_by_expert_is_a_stable_sort_into_contiguous_slices():
    """Sorted rows are every (token, slot) pair once, grouped by expert in expert order, tokens in
    ascending order within an expert; counts and offsets (int32) describe the slices, experts
    with no rows included."""
    experts = torch.tensor([[3, 0], [0, 5], [3, 5], [6, 0], [5, 3]])
    g = group_by_expert(experts, num_experts=8)
    assert g.counts.tolist() == [3, 0, 0, 3, 0, 3, 1, 0]
    assert g.offsets.dtype == torch.int32 and g.offsets.tolist() == [3, 3, 3, 6, 6, 9, 10, 10]
    assert g.expert.tolist() == [0, 0, 0, 3, 3, 3, 5, 5, 5, 6]
    assert g.token.tolist() == [0, 1, 3, 0, 2, 4, 1, 2, 4, 3]
    assert sorted(g.order.tolist()) == list(range(10))
    assert torch.equal(experts.flatten()[g.order], g.expert)
    assert torch.equal(torch.div(g.order, 2, rounding_mode="floor"), g.token)


def test_group_by_expert_keeps_token_order_within_an_expert_among_thousands_of_ties():
    """The sort must be stable where ties are many: 4,096 tokens routed top-4 over 8 experts (about
    2,000 rows per expert id). torch's default sort leaves 10 rows in order and scrambles ties at
    this scale, so an unstable argsort fails here (tests/test_planted_moe_grouping.py plants it)."""
    experts = torch.stack([torch.randperm(8, generator=torch.Generator().manual_seed(t))[:4] for t in range(4096)])
    assert_stable_grouping(group_by_expert(experts, num_experts=8), experts)


def assert_stable_grouping(g, experts: torch.Tensor) -> None:
    """Every (token, slot) row once, experts in order, and within each expert the rows in their
    flattened (token, slot) order: the positions ``order`` rise strictly inside every slice."""
    assert sorted(g.order.tolist()) == list(range(experts.numel()))
    assert torch.equal(g.expert, experts.flatten()[g.order]) and bool((g.expert.diff() >= 0).all())
    same_expert = g.expert[1:] == g.expert[:-1]
    assert bool((g.order.diff()[same_expert] > 0).all()), "ties out of token order: the sort is not stable"


# -- correctness of every path ----------------------------------------------------------------

CASES = {
    "default": dict(experts=8, top_k=2, hidden=64, expert_dim=64, tokens=96),
    "non_power_of_two": dict(experts=7, top_k=3, hidden=36, expert_dim=20, tokens=13),
    "top_1": dict(experts=5, top_k=1, hidden=44, expert_dim=28, tokens=31),
    "top_k_is_every_expert": dict(experts=3, top_k=3, hidden=12, expert_dim=8, tokens=9),
    "gpt_oss_20b_router_bf16": dict(experts=32, top_k=4, hidden=48, expert_dim=40, tokens=50, dtype="bfloat16"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_every_variant_matches_float64_in_output_and_all_gradients(case):
    """Output and the gradients of the input, router weight and bias, and every expert weight and
    bias match the float64 dense reference within the dtype's tolerance, for all three paths;
    sort_group and grouped_mm also match the where loop directly."""
    w = make_workload(seed=3, **CASES[case])
    outputs, _ = assert_all_match_reference(w)
    assert set(outputs["sort_group"]) == set(OUTPUT_KEYS)
    tolerance = TOLERANCE[w.x.dtype]
    for name in ("sort_group", "grouped_mm"):
        result = TECHNIQUE.check_fn(outputs["where_loop"], outputs[name])
        assert result.passed and result.error <= tolerance, f"{name} vs where_loop: {result.detail}"


def test_experts_that_receive_no_tokens_get_zero_gradients():
    """With 3 tokens and top-2 of 16 experts, at least 10 experts get nothing: every path still
    matches, and those experts' weight and bias gradients are exactly zero (not missing)."""
    w = make_workload(seed=5, experts=16, top_k=2, tokens=3, hidden=24, expert_dim=16)
    rows = rows_per_expert(w)
    idle = [e for e, n in enumerate(rows) if n == 0]
    assert len(idle) >= 10
    outputs, recorded = assert_all_match_reference(w)
    for name, out in outputs.items():
        for key in ("grad_gate_up", "grad_gate_up_bias", "grad_down", "grad_down_bias"):
            assert out[key].shape[0] == 16
            assert torch.count_nonzero(out[key][idle]) == 0, f"{name} {key}"
        busy = [e for e in range(16) if e not in idle]
        assert torch.count_nonzero(out["grad_down"][busy]) > 0
    assert recorded["where_loop"]["syncs_forward"] == 1 + (16 - len(idle))


@pytest.mark.parametrize("top_k", [1, 2])
def test_all_tokens_routed_to_one_expert(top_k):
    """A router bias that sends every token's first choice to expert 5: every path matches; with
    top-1 only expert 5 is hit, so the where loop reads the host twice, sort-and-group once and
    the grouped path never."""
    w = make_workload(seed=7, experts=8, top_k=top_k, tokens=40, hidden=32, expert_dim=24)
    with torch.no_grad():
        w.weights.router_bias[5] += 50.0
    rows = rows_per_expert(w)
    assert rows[5] == 40 and sum(rows) == 40 * top_k
    outputs, recorded = assert_all_match_reference(w)
    if top_k == 1:
        assert rows == [0] * 5 + [40] + [0] * 2
        assert [recorded[n]["syncs_forward"] for n in VARIANTS] == [2, 1, 0]
        for out in outputs.values():
            assert torch.count_nonzero(out["grad_gate_up"][[0, 1, 2, 3, 4, 6, 7]]) == 0


# -- host synchronizations --------------------------------------------------------------------


class HostReads(TorchDispatchMode):
    """Counts the aten ops a GPU could only run by reading device data on the host: nonzero
    (torch.where: its output size) and _local_scalar_dense (.item(), int(t)). one_hot checks
    its input's range with two such reads on a CPU only (on CUDA it leaves that to scatter's
    device asserts), so the reads that follow its aminmax are not counted."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    @property
    def reads(self) -> int:
        return self.ops.count("nonzero") + self.ops.count("_local_scalar_dense") - 2 * self.ops.count("aminmax")


@pytest.mark.parametrize("name", VARIANTS)
def test_counted_host_syncs_are_every_host_read_the_code_makes(name, monkeypatch):
    """The by-construction count (what the CPU reports as syncs per step) equals the host reads
    actually made, observed independently (tolist calls and data-dependent aten ops): where loop
    1 + experts hit, sort-and-group 1, grouped 0 in the forward pass; none in the backward."""
    config = MoEConfig(experts=12, top_k=3, hidden=20, expert_dim=12)
    gen = torch.Generator().manual_seed(11)
    weights = init_weights(config, gen).map(lambda t: t.requires_grad_(True))
    x = torch.randn(9, 20, generator=gen, requires_grad=True)
    tolists = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: tolists.append(1) or original(self))
    log = SyncLog()
    with HostReads() as forward_reads:
        out = FORWARDS[name](x, weights, config, log)
    with HostReads() as backward_reads:
        torch.autograd.grad(out, (x, *weights), torch.randn_like(out))
    assert backward_reads.ops and backward_reads.reads == 0
    _, experts = route(x, weights.router_weight, weights.router_bias, 3)
    hit = int((torch.bincount(experts.flatten(), minlength=12) > 0).sum())
    expected = {"where_loop": 1 + hit, "sort_group": 1, "grouped_mm": 0}[name]
    assert len(log) == expected == len(tolists) + forward_reads.reads


def test_every_call_records_phase_seconds_and_syncs_by_construction():
    """Each call records its forward and backward seconds and its host reads (forward, backward)
    by construction; torch's measured counts only on CUDA, and nothing is kept on the workload."""
    w = make_workload(experts=6, top_k=2, tokens=20, hidden=16, expert_dim=8)
    before = set(vars(w))
    hit = sum(n > 0 for n in rows_per_expert(w))
    for _ in range(2):
        _, recorded = run_all(w)
        assert {n: (r["syncs_forward"], r["syncs_backward"]) for n, r in recorded.items()} == {
            "where_loop": (1 + hit, 0),
            "sort_group": (1, 0),
            "grouped_mm": (0, 0),
        }
        for r in recorded.values():
            assert r["forward_s"] > 0 and r["backward_s"] > 0 and "measured_syncs_forward" not in r
    assert set(vars(w)) == before


def test_roles_on_cpu_and_grouped_mm_says_why_when_torch_lacks_it(monkeypatch):
    """The where loop plays baseline, sort_group optimized, grouped_mm is a peer; a torch without
    grouped_mm makes that peer unavailable with the reason, not a failure."""
    assert {n: TECHNIQUE.cast(CPU)[n] for n in VARIANTS} == {
        "where_loop": ("baseline", None),
        "sort_group": ("optimized", None),
        "grouped_mm": ("peer", None),
    }
    monkeypatch.setattr(module, "grouped_mm_function", lambda: None)
    assert "has no grouped_mm" in TECHNIQUE.variants["grouped_mm"].unavailable_reason(CPU)


def test_grouped_mm_names_misaligned_rows():
    """torch's grouped_mm needs 16-byte rows: the path says which size breaks that instead of
    failing inside torch."""
    assert grouped_mm_problem(MoEConfig(4, 2, 36, 20), torch.float32) is None
    problem = grouped_mm_problem(MoEConfig(4, 2, 36, 20), torch.bfloat16)
    assert "hidden 36 x 2 bytes" in problem and "expert_dim 20 x 2 bytes" in problem
    w = make_workload(experts=4, top_k=2, tokens=5, hidden=36, expert_dim=24, dtype="bfloat16")
    with pytest.raises(RuntimeError, match="hidden 36"):
        TECHNIQUE.variants["grouped_mm"].call(w)


MISALIGNED = dict(experts=4, top_k=2, tokens=5, hidden=36, expert_dim=24, dtype="bfloat16")


def test_grouped_mm_availability_consults_its_alignment_rule():
    """The variant's availability, given a case's params, is grouped_mm_problem's verdict: a
    misaligned layer is unavailable with the rule's reason, an aligned one (or the device alone)
    is available."""
    params = {**TECHNIQUE.defaults(), **MISALIGNED}
    reason = module.grouped_mm_unavailable(CPU, params)
    assert reason == grouped_mm_problem(MoEConfig(4, 2, 36, 24), torch.bfloat16) and "hidden 36" in reason
    assert module.grouped_mm_unavailable(CPU, {**params, "hidden": 32}) is None
    assert module.grouped_mm_unavailable(CPU) is None


def test_a_misaligned_case_skips_grouped_mm_with_its_reason():
    from planted import run_planted

    record = run_planted("moe_grouping", **MISALIGNED)
    v = record.variants["grouped_mm"]
    assert record.status == "passed" and v.status == "skipped" and "hidden 36 x 2 bytes" in v.reason


# -- check, metrics, build --------------------------------------------------------------------


def test_check_names_the_wrong_tensor_and_rejects_nan():
    """A gradient off for one expert fails the check, naming that gradient; NaN or a missing
    gradient fails too; the error recorded is the worst relative L2 over all tensors."""
    w = make_workload(experts=4, top_k=2, tokens=16, hidden=16, expert_dim=8)
    ref = reference(w)
    out = TECHNIQUE.variants["sort_group"].call(w)
    ok = TECHNIQUE.check_fn(ref, out)
    assert ok.passed and 0 < ok.error <= 1e-5 and ok.tolerance == 1e-5 and ok.metric == "max_rel_l2"
    wrong = dict(out, grad_down=out["grad_down"].clone())
    wrong["grad_down"][1] *= 1.01
    bad = TECHNIQUE.check_fn(ref, wrong)
    assert not bad.passed and "grad_down" in bad.detail and "grad_x" not in bad.detail
    poisoned = dict(out, grad_router_bias=out["grad_router_bias"].clone())
    poisoned["grad_router_bias"][0] = float("nan")
    assert "NaN" in TECHNIQUE.check_fn(ref, poisoned).detail
    missing = {k: v for k, v in out.items() if k != "grad_gate_up_bias"}
    assert "grad_gate_up_bias is missing" in TECHNIQUE.check_fn(ref, missing).detail


def test_bf16_tolerance_is_widened_to_5e2_and_the_others_are_the_shared_table():
    """Only bf16 is widened (a dozen rounded steps to each gradient); fp32 keeps the shared 1e-5."""
    assert TOLERANCE[torch.bfloat16] == 5e-2
    assert {k: v for k, v in TOLERANCE.items() if k != torch.bfloat16} == {
        k: v for k, v in DTYPE_TOLERANCE.items() if k != torch.bfloat16
    }
    w = make_workload(experts=4, top_k=2, tokens=16, hidden=16, expert_dim=8, dtype="bfloat16")
    result = TECHNIQUE.check_fn(reference(w), TECHNIQUE.variants["sort_group"].call(w))
    assert result.passed and result.tolerance == 5e-2


def test_build_is_seeded_and_validate_rejects_top_k_above_experts():
    """The same seed gives the same inputs, another seed others; nothing is zero; top_k larger
    than experts is refused before anything runs."""
    a, b, c = make_workload(seed=1), make_workload(seed=1), make_workload(seed=2)
    for name in ("x", "grad_out"):
        assert torch.equal(getattr(a, name), getattr(b, name)) and not torch.equal(getattr(a, name), getattr(c, name))
    for t in (a.x, a.grad_out, *a.weights):
        assert t.abs().max() > 0 and t.abs().mean() > 1e-3
    assert TECHNIQUE.validate_fn({**TECHNIQUE.defaults(), "experts": 2, "top_k": 3})


def _records(forward_s: list[float], backward_s: list[float], syncs: tuple[int, int]) -> list[dict]:
    return [
        {"forward_s": f, "backward_s": b, "syncs_forward": syncs[0], "syncs_backward": syncs[1]}
        for f, b in zip(forward_s, backward_s)
    ]


def test_metrics_take_phase_times_and_syncs_from_the_timed_calls_records_only():
    """Forward/backward seconds are the medians of the timed calls' records and sync counts come
    from them too (never from earlier calls on the workload); FLOPs are the expert GEMMs' (18
    tokens top_k hidden expert_dim per step); on a CPU no extra call is made; each variant names
    its GEMM path."""
    w = make_workload(experts=6, top_k=2, tokens=20, hidden=16, expert_dim=8)
    run_all(w)  # earlier calls (check, warm-up) must not leak into the metrics
    hit = sum(n > 0 for n in rows_per_expert(w))
    syncs = {"where_loop": (1 + hit, 0), "sort_group": (1, 0), "grouped_mm": (0, 0)}
    found = {}
    for name in VARIANTS:
        records = _records([0.001, 0.003, 0.002], [0.004, 0.005, 0.003], syncs[name])
        m = TECHNIQUE.metrics_fn(w, Measured(name, [0.01, 0.011, 0.012], 0.011, None, CPU, records=records))
        assert m["forward_s"] == 0.002 and m["backward_s"] == 0.004
        assert m["flops"] == 18 * 20 * 2 * 16 * 8
        assert math.isclose(m["forward_tflops"], 6 * 20 * 2 * 16 * 8 / 0.002 / 1e12)
        assert math.isclose(m["tokens_per_s"], 20 / 0.011)
        assert m["syncs_method"].startswith("by construction") and m["experts_hit"] == hit
        found[name] = (m["syncs_per_step"], m["gemm_path"])
    assert [s for s, _ in found.values()] == [1 + hit, 1, 0]
    assert all(isinstance(s, int) for s, _ in found.values())
    assert "grouped_mm" in found["grouped_mm"][1] and "loop" in found["where_loop"][1]
    bare = TECHNIQUE.metrics_fn(w, Measured("sort_group", [0.01], 0.01, None, CPU))
    assert not {"forward_s", "backward_s", "syncs_per_step"} & set(bare)


def test_metrics_make_no_extra_call_on_cpu(monkeypatch):
    """The untimed sync-counting call is CUDA-only: on a CPU the metrics never run the layer."""
    w = make_workload(experts=4, top_k=2, tokens=8, hidden=16, expert_dim=8)
    monkeypatch.setattr(module, "step", lambda *a, **k: pytest.fail("metrics ran a step on the CPU"))
    monkeypatch.setattr(moe_training, "cuda_syncs", lambda *a, **k: pytest.fail("metrics counted syncs on the CPU"))
    records = _records([0.001], [0.002], (1, 0))
    TECHNIQUE.metrics_fn(w, Measured("sort_group", [0.01], 0.01, None, CPU, records=records))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_metrics_on_cuda_measure_syncs_in_one_untimed_call():
    """On CUDA the syncs torch sees come from one extra call under sync debug mode, beside the
    by-construction count of the timed calls (sort_group: at least its one read of the counts)."""
    params = dict(TECHNIQUE.defaults(), experts=8, top_k=2, tokens=64, hidden=32, expert_dim=32)
    w = TECHNIQUE.build_fn(params, torch.device("cuda"), 0)
    records = _records([0.001], [0.002], (1, 0))
    m = TECHNIQUE.metrics_fn(w, Measured("sort_group", [0.01], 0.01, None, w.device, records=records))
    assert m["syncs_method"] == "torch.cuda sync debug mode" and m["syncs_by_construction"] == 1
    assert m["syncs_per_step"] >= 1 and m["syncs_forward"] + m["syncs_backward"] == m["syncs_per_step"]


def _case(tokens: int, fwd: dict[str, float], syncs: dict[str, int]) -> dict:
    roles = {"where_loop": "baseline", "sort_group": "optimized", "grouped_mm": "peer"}
    return {
        "technique": "moe_grouping",
        "params": {**TECHNIQUE.defaults(), "tokens": tokens, "experts": 8},
        "variants": {
            n: {
                "role": roles[n],
                "metrics": {"forward_s": fwd[n], "backward_s": 2 * fwd[n], "syncs_per_step": syncs[n]},
            }
            for n in fwd
        },
    }


def _lines(fig) -> dict[str, list[float]]:
    return {
        line.get_label(): list(line.get_ydata())
        for line in fig.axes[0].get_lines()
        if len(line.get_xdata()) and not line.get_label().startswith("_")
    }


def test_plots_draw_phase_speedups_and_syncs_against_tokens():
    """Declared plots: forward and backward speedup over the where loop (its time / the variant's,
    per phase) for sort_group and grouped_mm, and syncs per step for all three, against tokens;
    no metrics, no figures."""
    cases = [
        _case(
            64,
            {"where_loop": 4.0, "sort_group": 2.0, "grouped_mm": 1.0},
            {"where_loop": 9, "sort_group": 1, "grouped_mm": 0},
        ),
        _case(
            256,
            {"where_loop": 8.0, "sort_group": 2.0, "grouped_mm": 8.0},
            {"where_loop": 9, "sort_group": 1, "grouped_mm": 0},
        ),
    ]
    forward, backward, syncs = (figures.declared(plot, cases) for plot in TECHNIQUE.plots)
    assert _lines(forward) == {"sort_group": [2.0, 4.0], "grouped_mm": [4.0, 1.0]}
    assert _lines(backward) == {"sort_group": [2.0, 4.0], "grouped_mm": [4.0, 1.0]}
    assert list(forward.axes[0].get_lines()[0].get_xdata()) == [64, 256]
    assert _lines(syncs) == {"where_loop": [9.0, 9.0], "sort_group": [1.0, 1.0], "grouped_mm": [0.0, 0.0]}
    empty = [{"params": {"tokens": t}, "variants": {"where_loop": {"role": "baseline"}}} for t in (8, 16)]
    assert [figures.declared(plot, empty) for plot in TECHNIQUE.plots] == [None, None, None]


def test_harness_run_checks_every_variant_against_float64_and_records_metrics(write_scenario, tmp_path):
    """Through the runner: the case passes, where_loop, sort_group and grouped_mm are each checked
    against the float64 reference, and the metrics carry phases, syncs and the GEMM path."""
    body = (
        "name: t\ndevice: cpu\npolicy: {warmup_s: 0.0, min_reps: 3, max_reps: 5, min_time_s: 0.0, "
        "max_time_s: 0.3, target_iqr: 1.0, case_timeout_s: 600, energy_s: 0}\nentries:\n"
        "  - technique: moe_grouping\n    params: {experts: 8, top_k: 2, hidden: 32, expert_dim: 24, tokens: 48}\n"
    )
    outcome = run_in_process(scenario.load(write_scenario(body)), CPU, tmp_path / "runs", calibrate=False)
    (case,) = outcome.doc["cases"]
    assert case["status"] == "passed", case["failure"]
    for name in VARIANTS:
        v = case["variants"][name]
        assert v["status"] == "ok" and v["check"]["passed"] and v["check"]["metric"] == "max_rel_l2"
        assert v["metrics"]["forward_s"] > 0 and v["metrics"]["backward_s"] > 0 and "gemm_path" in v["metrics"]
    assert {n: case["variants"][n]["role"] for n in VARIANTS} == {
        "where_loop": "baseline",
        "sort_group": "optimized",
        "grouped_mm": "peer",
    }
    assert case["variants"]["sort_group"]["metrics"]["syncs_per_step"] == 1
    assert case["speedups"]["sort_group"]["ratio"] > 0
