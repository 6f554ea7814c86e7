"""The public contract: roles cast per device, the shared checks, the recorder hand-off."""
from __future__ import annotations

import pytest
import torch

from gpubench.contract import (DTYPE_TOLERANCE, Plot, Recorder, Technique, Workload, relative_l2_check,
                               tensors_check)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def pair() -> Technique:
    t = Technique("t", summary="s", shape="kernel", params=[])
    t.variant("eager", role="baseline")(lambda w: 0)
    t.variant("kernel", role="optimized", unavailable=lambda d: None if d.type == "cuda" else "needs CUDA")(lambda w: 1)
    t.variant("loop", role="optimized")(lambda w: 2)
    t.variant("other", role="peer")(lambda w: 3)
    return t


def test_the_first_runnable_variant_plays_each_role_and_the_rest_are_peers():
    t = pair()
    assert t.cast(CPU) == {"eager": ("baseline", None), "kernel": ("peer", "needs CUDA"),
                           "loop": ("optimized", None), "other": ("peer", None)}
    assert t.cast(CUDA)["kernel"] == ("optimized", None) and t.cast(CUDA)["loop"] == ("peer", None)
    assert t.playing("optimized", CPU).name == "loop" and t.playing("optimized", CUDA).name == "kernel"
    assert t.optimized.name == "kernel"  # the declared first, as before


def test_a_role_nobody_can_play_stays_with_the_first_declared_so_the_case_fails_visibly():
    t = Technique("t", summary="s", shape="kernel", params=[])
    t.variant("eager", role="baseline")(lambda w: 0)
    t.variant("kernel", role="optimized", unavailable=lambda d: "needs CUDA")(lambda w: 1)
    assert t.cast(CPU)["kernel"] == ("optimized", "needs CUDA") and t.playing("optimized", CPU) is None


def test_scenario_role_names_resolve_to_the_variant_playing_them_on_the_device():
    t = pair()
    assert t.resolve(["baseline", "optimized", "other"], CPU) == ["eager", "loop", "other"]
    assert t.resolve(["baseline", "optimized"], CUDA) == ["eager", "kernel"]


def test_a_variant_cannot_be_named_after_another_role():
    t = Technique("t", summary="s", shape="kernel", params=[])
    with pytest.raises(ValueError, match="role's name"):
        t.variant("optimized", role="peer")


def test_variants_taking_two_arguments_get_a_recorder_and_old_style_ones_do_not():
    t = Technique("t", summary="s", shape="kernel", params=[])
    t.variant("old", role="baseline")(lambda w: "no recorder")
    t.variant("new", role="optimized")(lambda w, rec: rec.record(seen=True) or "recorded")
    t.variant("defaulted", role="peer")(lambda w, extra=None: extra)
    w = Workload({}, CPU, 0)
    rec = Recorder()
    assert t.variants["old"].call(w, rec) == "no recorder"
    assert t.variants["new"].call(w, rec) == "recorded" and rec.values == {"seen": True}
    assert t.variants["defaulted"].call(w, rec) is None  # an optional second parameter is not a recorder


def test_recorder_sets_and_accumulates():
    rec = Recorder()
    rec.record(a=1.0)
    rec.add("n")
    rec.add("n", 2)
    assert rec.values == {"a": 1.0, "n": 3}


def test_tensors_check_reports_the_worst_named_tensor_against_the_dtype_tolerance():
    ref = {"out": torch.ones(4), "grad": torch.full((3,), 2.0)}
    close = {"out": torch.ones(4), "grad": torch.full((3,), 2.0) * (1 + 1e-7)}
    result = tensors_check(ref, close)
    assert result.passed and result.tolerance == DTYPE_TOLERANCE[torch.float32] and result.detail == "worst: grad"
    far = {"out": torch.ones(4), "grad": torch.full((3,), 2.5)}
    result = tensors_check(ref, far)
    assert not result.passed and "grad" in result.detail and result.error == pytest.approx(0.25)


@pytest.mark.parametrize("output,expected", [
    ({"out": torch.ones(4)}, "grad is missing"),
    ({"out": torch.ones(5), "grad": torch.ones(3)}, "out: shape (5,) != reference (4,)"),
    ({"out": torch.tensor([1.0, float("nan"), 1.0, float("inf")]), "grad": torch.ones(3)}, "1 NaN and 1 Inf"),
])
def test_tensors_check_fails_missing_misshapen_and_non_finite_tensors(output, expected):
    result = tensors_check({"out": torch.ones(4), "grad": torch.ones(3)}, output)
    assert not result.passed and expected in result.detail


def test_a_zero_reference_is_compared_by_absolute_error_everywhere():
    zero = torch.zeros(3)
    assert tensors_check({"g": zero}, {"g": zero}).error == 0.0
    assert tensors_check({"g": zero}, {"g": torch.full((3,), 1e-3)}).error == pytest.approx(3 ** 0.5 * 1e-3)
    assert relative_l2_check(zero, torch.full((3,), 1e-3)).error == pytest.approx(3 ** 0.5 * 1e-3)


def test_exact_checks_demand_bit_equality():
    ref = {"loss": torch.tensor(1.0)}
    assert tensors_check(ref, {"loss": torch.tensor(1.0)}, exact=True).passed
    result = tensors_check(ref, {"loss": torch.tensor(1.0 + 2**-23)}, exact=True)
    assert not result.passed and result.metric == "max_abs_diff" and result.tolerance is None


def test_relative_l2_check_uses_the_output_dtype_tolerance():
    ref = torch.randn(64, dtype=torch.float64)
    assert relative_l2_check(ref, ref.to(torch.bfloat16)).passed
    bad = relative_l2_check(ref, (ref * 1.1).float())
    assert not bad.passed and "exceeds 1e-05 for torch.float32" in bad.detail


def test_plots_refuse_an_unknown_kind_or_a_line_without_x():
    with pytest.raises(ValueError, match="kind"):
        Plot("t", y="tflops", x="n", kind="pie")
    with pytest.raises(ValueError, match="needs x"):
        Plot("t", y="tflops")
    assert Plot("t", y=("a", "b"), kind="bars").ys == ("a", "b")
