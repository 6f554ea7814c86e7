"""The public contract: roles cast per device, the shared checks, the recorder hand-off, one
declaration per idea (headline figures, plots, benchmark sizes) with the older spellings still
working behind a DeprecationWarning."""

from __future__ import annotations

import warnings

import pytest
import torch

from gpubench.contract import (
    DTYPE_TOLERANCE,
    Bench,
    Headline,
    Param,
    Plot,
    Recorder,
    Technique,
    Workload,
    relative_l2_check,
    tensors_check,
)
from gpubench.reports import sweep

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
    assert t.cast(CPU) == {
        "eager": ("baseline", None),
        "kernel": ("peer", "needs CUDA"),
        "loop": ("optimized", None),
        "other": ("peer", None),
    }
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


@pytest.mark.parametrize(
    "output,expected",
    [
        ({"out": torch.ones(4)}, "grad is missing"),
        ({"out": torch.ones(5), "grad": torch.ones(3)}, "out: shape (5,) != reference (4,)"),
        ({"out": torch.tensor([1.0, float("nan"), 1.0, float("inf")]), "grad": torch.ones(3)}, "1 NaN and 1 Inf"),
    ],
)
def test_tensors_check_fails_missing_misshapen_and_non_finite_tensors(output, expected):
    result = tensors_check({"out": torch.ones(4), "grad": torch.ones(3)}, output)
    assert not result.passed and expected in result.detail


def test_a_zero_reference_is_compared_by_absolute_error_everywhere():
    zero = torch.zeros(3)
    assert tensors_check({"g": zero}, {"g": zero}).error == 0.0
    assert tensors_check({"g": zero}, {"g": torch.full((3,), 1e-3)}).error == pytest.approx(3**0.5 * 1e-3)
    assert relative_l2_check(zero, torch.full((3,), 1e-3)).error == pytest.approx(3**0.5 * 1e-3)


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


# -- one mechanism per idea: the older spellings warn and become the new declarations ----------
def test_a_headline_string_warns_with_its_replacement_and_becomes_a_figure_beside_the_speedup():
    replacement = r"headline_figures=\(Headline\('syncs', replaces_time=False\),\)"
    with pytest.warns(DeprecationWarning, match=replacement) as got:
        t = Technique("t", summary="s", shape="kernel", params=[], headline="syncs")
    assert got[0].filename == __file__  # points at the declaration (tests/test_registry.py filters by file)
    assert t.headline_figures == (Headline("syncs", replaces_time=False),)
    assert t.headline == "syncs"  # what case records keep, read back as given
    assert sweep.headline_figures(t) == ()  # still read by time


def test_a_headline_string_beside_declared_figures_reads_back_first_and_keeps_the_figures_the_win_is_read_by():
    tokens = Headline("tokens_per_s", "tokens/s")
    with pytest.warns(DeprecationWarning):
        t = Technique("t", summary="s", shape="serving_run", params=[], headline="syncs", headline_figures=(tokens,))
    assert t.headline == "syncs" and sweep.headline_figures(t) == (tokens,)
    with pytest.warns(DeprecationWarning):  # a metric already declared stays as declared, read by
        same = Technique(
            "t", summary="s", shape="serving_run", params=[], headline="tokens_per_s", headline_figures=(tokens,)
        )
    assert same.headline_figures == (tokens,) and same.headline == "tokens_per_s"


def test_headline_figures_alone_raise_no_warning_and_the_first_is_the_headline_metric():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        beside = Technique(
            "t", summary="s", shape="kernel", params=[], headline_figures=(Headline("syncs", replaces_time=False),)
        )
        plain = Technique("t", summary="s", shape="kernel", params=[])
    assert beside.headline == "syncs" and plain.headline == "" and sweep.headline_figures(beside) == ()


def test_a_figures_hook_warns_to_declare_plots_and_still_works_both_ways():
    def hook(cases):
        return [("n", None)]

    t = Technique("t", summary="s", shape="kernel", params=[])
    with pytest.warns(DeprecationWarning, match="declare Plot") as decorated:
        assert t.figures(hook) is hook
    assert t.figures_fn is hook
    with pytest.warns(DeprecationWarning, match="declare Plot") as given_warning:
        given = Technique("t", summary="s", shape="kernel", params=[], figures_fn=hook)
    assert given.figures_fn is hook
    assert decorated[0].filename == given_warning[0].filename == __file__


# -- params: what a policy key needs too ----------------------------------------------------------
def test_an_exclusive_minimum_refuses_the_minimum_itself_and_says_so():
    timeout = Param("case_timeout_s", float, 300.0, "seconds", min=0, min_exclusive=True)
    assert timeout.problem(0) == "0 is not above 0 (the minimum, excluded)"
    assert timeout.problem(1e-9) is None and timeout.allowed() == "float > 0"
    assert Param("x", float, 1.0, min=0, max=2, min_exclusive=True).allowed() == "float in (0, 2]"
    assert Param("warmup_s", float, 0.0, min=0).problem(0.0) is None  # inclusive by default
    with pytest.raises(ValueError, match="default 0"):
        Param("x", float, 0, min=0, min_exclusive=True)
    with pytest.raises(ValueError, match="needs a min"):
        Param("x", float, 1.0, min_exclusive=True)


def test_a_value_check_named_by_a_param_refuses_what_its_function_refuses():
    """``Param.value_check`` names a torch-free function of one value ("module:function"): a value
    it refuses is refused with its words; a default it refuses, a name not of that form, or one that
    cannot be imported fails the declaration, so a plug-in's typo shows when it loads."""
    model = Param("model", str, "tiny", value_check="gpubench.models.stand_in:model_name_problem")
    assert model.problem("tiny") is None and model.problem("llama-2-7b") is None
    refusal = model.problem("lama-2-7b")
    assert refusal is not None and refusal.startswith("'lama-2-7b' names nothing known (did you mean 'llama-2-7b'")
    assert model.problem(3) == "3 is not a str"  # the type first: the function sees only strings
    with pytest.raises(ValueError, match="default 'nope'"):
        Param("model", str, "nope", value_check="gpubench.models.stand_in:model_name_problem")
    with pytest.raises(ValueError, match="'module:function'"):
        Param("model", str, "tiny", value_check="gpubench.models.stand_in.model_name_problem")
    with pytest.raises(ValueError, match="cannot be loaded .*AttributeError"):
        Param("model", str, "tiny", value_check="gpubench.models.stand_in:no_such_function")


def raises_on_odd_sizes(value):  # a plug-in's check with a bug: int() of what it did not expect
    return None if int(value.split("x")[0]) > 0 else "not positive"


def test_a_value_check_that_raises_refuses_the_value_and_says_why():
    """A check that raises is a refusal of that value naming the check and the error (exit 2
    with the scenario's file:line), never a traceback out of scenario validation."""
    size = Param("size", str, "4x4", value_check=f"{__name__}:raises_on_odd_sizes")
    assert size.problem("8x8") is None
    assert size.problem("abc") == (
        f"'abc': its check {__name__}:raises_on_odd_sizes failed "
        "(ValueError: invalid literal for int() with base 10: 'abc')"
    )


def test_value_check_is_keyword_only_so_a_subclass_keeps_its_positional_fields():
    """Adding value_check to Param must not shift a subclass's own fields: PolicyParam's ``above``
    is still its tenth positional argument."""
    from gpubench.records.policy import PolicyParam

    timeout = PolicyParam("t", float, 1.0, "h", None, 0, None, False, False, 0)
    assert timeout.above == 0 and timeout.value_check is None and timeout.problem(0.0) == "0.0 is not above 0"


def test_a_model_param_takes_an_existing_config_and_refuses_what_names_none(tmp_path):
    """kv_cache's and the stand-ins' ``model``: a config.json or a directory holding one passes the
    value check (whether it is a config the reader takes is the technique's rule); a missing file, a
    directory without config.json, an empty value or a name the file system refuses (too long) is
    refused by its value, naming the presets, without a traceback."""
    from gpubench.techniques import all_techniques

    config = tmp_path / "config.json"
    config.write_text("{}")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    for name in ("kv_cache", "packed_metadata", "paged_kv_serving", "continuous_batching"):
        param = next(p for p in all_techniques()[name].params if p.name == "model")
        assert param.problem(str(config)) is None and param.problem(str(tmp_path)) is None, name
        for bad in (str(tmp_path / "missing.json"), str(empty_dir), "", "x" * 300):
            refusal = param.problem(bad)
            assert refusal is not None and "llama-2-7b" in refusal and "failed" not in refusal, (name, bad, refusal)


# -- declared benchmark sizes ---------------------------------------------------------------------
def test_benchmark_sizes_are_checked_against_the_params_when_declared():
    params = [Param("n", int, 4, min=1), Param("mode", str, "a", choices=["a", "b"])]
    t = Technique("t", summary="s", shape="kernel", params=params, benchmarks=[Bench("small", {"n": 2})])
    assert t.bench_params(t.benchmarks[0]) == {"n": 2, "mode": "a"}
    with pytest.raises(ValueError) as err:
        Technique(
            "t",
            summary="s",
            shape="kernel",
            params=params,
            benchmarks=[Bench("x", {"n": 0}), Bench("x", {"size": 3, "mode": "c"})],
        )
    text = str(err.value)
    assert "'x' declared twice" in text and "n: 0 is below the minimum 1" in text
    assert "size: unknown param; allowed: n, mode" in text and "mode: 'c' is not one of ['a', 'b']" in text
    with pytest.raises(TypeError, match="Bench"):
        Technique("t", summary="s", shape="kernel", params=params, benchmarks=[{"n": 2}])
    with pytest.raises(ValueError, match="letters, digits"):
        Bench("two words")


def test_a_two_argument_availability_gets_the_case_params_and_decides_per_case():
    """``unavailable=(device, params)``: a case the variant cannot take skips it with the reason
    (the runner passes each case's params); asked about the device alone it gets None. A
    one-argument function keeps working as before."""
    from gpubench.contract import Technique

    seen = []

    def odd_only(device, params):
        seen.append(params)
        return None if params is None or params["n"] % 2 else f"n={params['n']} is even"

    t = Technique("per_case", summary="s", shape="kernel", params=[])
    t.variant("base", role="baseline", unavailable=lambda d: None)(lambda w: 1)
    t.variant("opt", role="optimized", unavailable=odd_only)(lambda w: 2)
    cpu = torch.device("cpu")
    assert t.cast(cpu) == {"base": ("baseline", None), "opt": ("optimized", None)}
    assert t.cast(cpu, {"n": 4})["opt"] == ("optimized", "n=4 is even")
    assert t.cast(cpu, {"n": 3})["opt"] == ("optimized", None)
    assert seen == [None, {"n": 4}, {"n": 3}]
    assert t.playing("optimized", cpu) is t.variants["opt"]
