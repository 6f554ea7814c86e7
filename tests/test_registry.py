"""What a technique needs is declared in its module, and the tests iterate the registry: every
built-in declares benchmark sizes its params accept and imports without a DeprecationWarning, and
benchmarks/test_bench_techniques.py times every registered technique (plug-ins too) at each size,
each variant that runs here, and fails a variant whose output fails the technique's check."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpubench import techniques
from gpubench.contract import Bench, CheckResult, Param, Technique, Workload

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "benchmarks" / "test_bench_techniques.py"
CPU = torch.device("cpu")


def built_ins() -> dict[str, Technique]:
    return {n: t for n, t in techniques.all_techniques().items() if t.source.startswith("gpubench.techniques.")}


def generic_suite():
    """benchmarks/test_bench_techniques.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("gpubench_bench_techniques", SUITE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_built_in_declares_benchmark_sizes_its_params_and_rules_accept():
    assert built_ins()  # the registry loaded, or the loop below proves nothing
    for name, tech in built_ins().items():
        assert tech.benchmarks, f"{name} declares no benchmark sizes"
        assert tech.bench_problems() == [], name
        for bench in tech.benchmarks:
            rules = tech.validate_fn(tech.bench_params(bench)) if tech.validate_fn else []
            assert rules == [], (name, bench.name, rules)


def test_importing_every_built_in_raises_no_deprecation_warning():
    # A fresh process: the modules are imported once per process, and this one has them already.
    code = """if True:
        import importlib, json, pkgutil, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import gpubench.techniques as package
            for info in pkgutil.iter_modules(package.__path__):
                importlib.import_module(f"gpubench.techniques.{info.name}")
        print(json.dumps([[w.filename, f"{w.filename}:{w.lineno}: {w.message}"] for w in caught
                          if issubclass(w.category, DeprecationWarning)]))
    """
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = [str(ROOT / folder) for folder in ("suite", "baselines", "optimizations", "reports")]
    found = [
        text
        for filename, text in json.loads(proc.stdout.strip().splitlines()[-1])
        if any(filename.startswith(folder) for folder in ours)
    ]
    assert found == []


def test_the_generic_benchmark_suite_collects_every_built_in_at_each_declared_size_and_variant():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITE), "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    collected = {line.split("::", 1)[1] for line in proc.stdout.splitlines() if "::" in line}
    expected = {
        f"test_technique[{name}-{bench.name}-{variant}]"
        for name, tech in built_ins().items()
        for bench in tech.benchmarks
        for variant in tech.variants
    }
    assert expected - collected == set()


# -- the generic suite, on small techniques of its own --------------------------------------------
def toy(name: str, *, wrong: bool = False, benchmarks=(Bench("n-64", {"n": 64}),), train: bool = False) -> Technique:
    """A pair summing a vector; ``wrong``: the optimized side is off by one; ``train``: a
    training step whose state must be restored before each call (it counts resets and calls)."""
    t = Technique(
        name,
        summary="sum",
        shape="training_step" if train else "kernel",
        params=[Param("n", int, 1 << 20, min=1)],
        benchmarks=benchmarks,
    )
    state = {"resets": 0, "calls": 0, "since_reset": 0}

    @t.build
    def build(params, device, seed):
        def reset():
            state["resets"] += 1
            state["since_reset"] = 0

        x = torch.randn(params["n"], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        return Workload(params, device, seed, {"x": x, "state": state}, reset=reset if train else None)

    def once(w, value):
        state["calls"] += 1
        state["since_reset"] += 1
        return value + (10 * state["since_reset"] if train and state["since_reset"] > 1 else 0)

    t.variant("python", role="baseline")(lambda w: once(w, sum(w.x.tolist())))
    t.variant("torch", role="optimized")(lambda w: once(w, w.x.sum().item() + (1.0 if wrong else 0.0)))
    t.variant("kernel", unavailable=lambda d: "needs CUDA")(lambda w: once(w, 0.0))
    t.variant("interpreted", checked_only=lambda d: "checked in an interpreter")(lambda w: once(w, 0.0))
    t.check(lambda ref, out: CheckResult(abs(out - ref) < 1e-9, abs(out - ref), 1e-9, "abs"))
    return t


class FakeBenchmark:
    """pytest-benchmark's fixture, as far as the suite uses it: a timed call, or fixed rounds each
    after its setup."""

    def __init__(self):
        self.group, self.extra_info, self.rounds = None, {}, 0

    def __call__(self, fn, *args):
        self.rounds += 1
        return fn(*args)

    def pedantic(self, fn, args=(), setup=None, rounds=1, warmup_rounds=0):
        for _ in range(warmup_rounds + rounds):
            setup()
            out = fn(*args)
            self.rounds += 1
        return out


def test_a_plug_in_is_benchmarked_at_its_sizes_and_one_without_sizes_is_listed_as_skipped_with_why():
    suite = generic_suite()
    sized = toy("sized", benchmarks=(Bench("small", {"n": 8}), Bench("large", {"n": 64})))
    params = suite.bench_params({"sized": sized, "unsized": toy("unsized", benchmarks=())})
    ids = [p.id for p in params]
    variants = ("python", "torch", "kernel", "interpreted")
    assert ids == [f"sized-{size}-{v}" for size in ("small", "large") for v in variants] + ["unsized"]
    (skip,) = params[-1].marks
    assert skip.name == "skip" and "declares no benchmark sizes" in skip.kwargs["reason"]


def test_each_timed_output_is_checked_against_the_baseline_and_a_wrong_one_fails_the_benchmark():
    suite = generic_suite()
    tech = toy("wrong", wrong=True)
    case = suite.CurrentCase(CPU)
    bench = FakeBenchmark()
    suite.time_and_check(bench, case, tech, "n-64", "python")
    assert bench.group == "wrong" and bench.extra_info["params"] == {"n": 64} and bench.rounds == 1
    with pytest.raises(AssertionError, match="wrong torch at n-64"):
        suite.time_and_check(FakeBenchmark(), case, tech, "n-64", "torch")


def test_a_training_step_is_reset_before_its_reference_and_every_timed_round():
    suite = generic_suite()
    tech = toy("train", train=True)
    bench = FakeBenchmark()
    suite.time_and_check(bench, suite.CurrentCase(CPU), tech, "n-64", "torch")  # a missed reset adds 10
    state = tech.build_fn({"n": 1}, CPU, 0).state
    rounds = suite.RESET_ROUNDS + suite.RESET_WARMUP_ROUNDS
    assert bench.rounds == rounds and state["resets"] == 1 + rounds and state["calls"] == 1 + rounds


def test_the_workload_is_built_once_per_size_for_all_its_variants():
    suite = generic_suite()
    tech = toy("built")
    built = []
    build = tech.build_fn
    tech.build_fn = lambda params, device, seed: built.append(params["n"]) or build(params, device, seed)
    case = suite.CurrentCase(CPU)
    for variant in ("python", "torch", "python"):
        suite.time_and_check(FakeBenchmark(), case, tech, "n-64", variant)
    assert built == [64]


@pytest.mark.parametrize(
    "variant,why",
    [
        ("kernel", "kernel cannot run on cpu: needs CUDA"),
        ("interpreted", "interpreted is checked, never timed, on cpu"),
    ],
)
def test_a_variant_that_cannot_run_or_is_only_checked_here_is_skipped_with_its_reason(variant, why):
    bench = FakeBenchmark()
    with pytest.raises(pytest.skip.Exception, match=why):
        generic_suite().time_and_check(bench, generic_suite().CurrentCase(CPU), toy("skips"), "n-64", variant)
    assert bench.rounds == 0
