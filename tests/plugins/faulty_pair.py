"""A plug-in technique (public contract only) whose optimized variant fails the ways a new kernel
does on its first day: a native call that never returns, a segfault, a process that exits, an
exception. ``mode: ok`` is a healthy case."""

import ctypes
import os
import signal

import torch

from gpubench.contract import CheckResult, Param, Technique, Workload

TECHNIQUE = Technique(
    "faulty_pair",
    summary="a pair whose optimized side fails on purpose",
    shape="kernel",
    params=[
        Param("mode", str, "ok", choices=["ok", "native_hang", "segfault", "exit", "raise"]),
        Param("n", int, 64, min=1),
    ],
)


@TECHNIQUE.build
def build(params, device, seed):
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


@TECHNIQUE.variant("fails", role="optimized")
def fails(w):
    """torch.cumsum, or the failure the case asks for"""
    mode = w.params["mode"]
    if os.environ.get("FAULTY_PAIR_LOG"):  # tests count how often a failing call was made
        with open(os.environ["FAULTY_PAIR_LOG"], "a") as f:
            f.write(f"{mode}\n")
    if mode == "native_hang":
        # Native code that defers signals (as a driver spinning on a kernel does): the worker's
        # SIGALRM cannot interrupt it; only killing the process can.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        ctypes.CDLL(None).sleep(600)
    elif mode == "segfault":
        ctypes.string_at(0)
    elif mode == "exit":
        os._exit(3)
    elif mode == "raise":
        raise RuntimeError("kernel launch failed: invalid configuration")
    return torch.cumsum(w.x, 0)


@TECHNIQUE.check
def check(reference, output):
    error = float((output - reference).abs().max())
    return CheckResult(error <= 1e-9, error, 1e-9, "max_abs_diff")
