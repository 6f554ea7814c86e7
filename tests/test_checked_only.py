"""Variants that run on a device only to be checked (a Triton kernel in Triton's interpreter on a
CPU): checked like any other, so a wrong one fails the case; never timed, so none of their figures
is compared with anything (no samples, no speedup, no role); the record says why."""

from __future__ import annotations

import torch
from planted import QUICK, _NoTelemetry

from gpubench import techniques
from gpubench.contract import CheckResult, Technique, Workload, relative_l2_check
from gpubench.lib.triton_support import INTERPRETER, INTERPRETER_NOTE
from gpubench.measure import timing
from gpubench.run import runner
from gpubench.run.scenario import Case

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def interpreted_on_cpu(device: torch.device) -> str | None:
    return INTERPRETER_NOTE if device.type != "cuda" else None


def toy(kernel_output: float) -> Technique:
    """A pair whose ``kernel`` (declared first for optimized) is checked only off CUDA."""
    t = Technique("checked_only_toy", summary="s", shape="kernel", params=[])
    t.build(lambda params, device, seed: Workload(params, device, seed, inputs={"x": torch.arange(1.0, 9.0)}))
    t.variant("eager", role="baseline")(lambda w: w.x * 2)
    t.variant("kernel", role="optimized", checked_only=interpreted_on_cpu)(lambda w: w.x * kernel_output)
    t.variant("loop", role="optimized")(lambda w: w.x * 2)
    t.check(
        lambda ref, out: (
            relative_l2_check(ref, out)
            if isinstance(out, torch.Tensor)
            else CheckResult(False, None, None, "type", "not a tensor")
        )
    )
    return t


def run(t: Technique):
    techniques.register(t)
    try:
        case = Case(t.name, {}, QUICK, 0)
        return runner.run_case(case, CPU, timing.Clock(CPU, flush_l2=False), _NoTelemetry(), None)
    finally:
        techniques.unregister(t.name)


def test_a_checked_only_variant_never_plays_a_role_there_and_plays_it_where_it_is_timed():
    t = toy(2.0)
    assert t.cast(CPU) == {"eager": ("baseline", None), "kernel": ("peer", None), "loop": ("optimized", None)}
    assert t.cast(CUDA)["kernel"] == ("optimized", None) and t.cast(CUDA)["loop"] == ("peer", None)


def test_a_checked_only_variant_is_checked_and_never_timed_and_says_so():
    record = run(toy(2.0))
    assert record.status == "passed", record.failure
    kernel = record.variants["kernel"]
    assert kernel.status == "ok" and kernel.check is not None and kernel.check.passed
    assert kernel.samples_s == [] and kernel.stats is None and kernel.metrics == {}
    assert "kernel" not in record.speedups and "loop" in record.speedups
    assert (
        INTERPRETER in kernel.reason
        and kernel.timing is not None
        and kernel.timing.to_dict() == {"method": "none", "not_timed": INTERPRETER_NOTE}
    )
    assert record.variants["loop"].samples_s  # the variant playing optimized is timed as ever


def test_a_wrong_checked_only_variant_fails_the_case_by_its_check():
    record = run(toy(3.0))
    assert record.status == "failed" and record.failure.kind == "check"
    assert record.variants["kernel"].status == "check_failed" and "peer kernel" in record.failure.message


PROBE = """
import os, torch
from gpubench.lib import triton_support
from gpubench.optimizations.flash_attention import KERNEL
print(os.environ.get("TRITON_INTERPRET"), triton_support.interpreted(),
      triton_support.kernel_problem(KERNEL[0], "cpu", interpreter_ok=True) is None)
"""


def _start_probe(**env_changes: str | None):
    """PROBE in a fresh process, the environment changed so (None: removed)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in {**os.environ, **env_changes}.items() if v is not None}
    return subprocess.Popen(
        [sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _words(probe) -> list[str]:
    out, err = probe.communicate(timeout=300)
    assert probe.returncode == 0, err[-2000:]
    return out.split()


def test_without_cuda_gpubench_turns_the_interpreter_on_unless_the_environment_says_no():
    """A process (a run's worker) that imports gpubench's Triton plumbing before Triton, on a
    machine without CUDA, gets TRITON_INTERPRET=1 and can run the kernels; TRITON_INTERPRET=0
    stays off, and the kernel then says why it cannot run on a CPU."""
    if torch.cuda.is_available():
        return  # with CUDA nothing is switched on
    unset, off = _start_probe(TRITON_INTERPRET=None), _start_probe(TRITON_INTERPRET="0")  # side by side
    assert _words(unset) == ["1", "True", "True"]
    assert _words(off) == ["0", "False", "False"]
