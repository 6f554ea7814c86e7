"""A plug-in technique (public contract only) whose ``held`` cases wait, in Python, until the test
lets them go: a test stops a run (Ctrl-C, SIGTERM, SIGKILL) while a case is surely in flight, or
makes a later case finish first, on an event it can see instead of a sleep it has to guess.

Nothing waits unless HELD_PAIR_DIR names a directory. A held case then writes ``started-<n>``
there (its process id) as it builds its workload, and waits for a file ``release`` there, ten
minutes at most. A case that is not held is a plain healthy pair."""

import os
import time
from pathlib import Path

import torch

from gpubench.contract import CheckResult, Param, Technique, Workload

TECHNIQUE = Technique(
    "held_pair",
    summary="a pair whose held cases wait for the test to let them go",
    shape="kernel",
    params=[Param("n", int, 64, min=1), Param("held", bool, False)],
)

HOLD_LIMIT_S = 600.0


def _hold(n: int) -> None:
    where = os.environ.get("HELD_PAIR_DIR")
    if not where:
        return
    gate = Path(where)
    mark = gate / f"started-{n}"
    (gate / f"{mark.name}.tmp").write_text(str(os.getpid()))
    os.replace(gate / f"{mark.name}.tmp", mark)  # the test never reads half a pid
    end = time.monotonic() + HOLD_LIMIT_S
    while not (gate / "release").exists() and time.monotonic() < end:
        time.sleep(0.02)  # Python code: Ctrl-C, SIGTERM and the case's own alarm interrupt it


@TECHNIQUE.build
def build(params, device, seed):
    if params["held"]:
        _hold(params["n"])
    x = torch.randn(params["n"], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return Workload(params, device, seed, {"x": x})


@TECHNIQUE.variant("loop", role="baseline")
def loop(w):
    """a Python running sum"""
    out, acc = torch.empty_like(w.x), 0.0
    for i, v in enumerate(w.x.tolist()):
        acc += v
        out[i] = acc
    return out


@TECHNIQUE.variant("cumsum", role="optimized")
def cumsum(w):
    """torch.cumsum"""
    return torch.cumsum(w.x, 0)


@TECHNIQUE.check
def check(reference, output):
    error = float((output - reference).abs().max())
    return CheckResult(error <= 1e-9, error, 1e-9, "max_abs_diff")
