"""Does the harness's device time agree with ``triton.testing.do_bench``? (issue 33, point 4)

One small flash_attention case and one paged_attention decode case (batch 8: a sub-100 us
kernel, where launch work used to be most of a sample), each technique's optimized variant on
this GPU, timed by ``do_bench`` (its median, L2 flushed before every call) and by the harness's
:class:`gpubench.measure.timing.Clock` through :func:`gpubench.measure.timing.measure_interleaved` on device
time (the start event queued behind the flush, no host sync in between). The two are taken
alternately, twice each, and compared by their means: within 5% passes. The harness's wall time
(launch work and syncs included) is printed beside them. A few seconds a case.

    python benchmarks/do_bench_check.py --device cuda --out do_bench_check.json

Exit 0 when every case agrees within 5% (or there is no GPU: then it says so, times nothing and
writes a record saying it skipped), 1 when a case does not, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from gpubench import techniques
from gpubench.contract import Recorder
from gpubench.measure import timing

TOLERANCE = 0.05
CASES: dict[str, dict[str, Any]] = {
    "flash_attention": {
        "batch": 4,
        "seq_len": 1024,
        "heads": 16,
        "head_dim": 128,
        "dtype": "bfloat16",
        "causal": False,
    },
    "paged_attention": {
        "batch": 8,
        "heads": 32,
        "kv_heads": 8,
        "head_dim": 128,
        "context_len": 1024,
        "block_size": 16,
        "dtype": "bfloat16",
    },
}
POLICY = timing.Policy(
    warmup_s=0.1, min_reps=20, max_reps=300, min_time_s=0.3, max_time_s=3.0, target_iqr=0.02, flush_l2=True
)
ROUNDS = 2  # do_bench, harness, do_bench, harness: drift of the clocks hits both alike

Call = Callable[[], Any]


def optimized_call(name: str, params: dict[str, Any], device: torch.device, seed: int = 0) -> tuple[str, Call]:
    """(the variant playing optimized on ``device``, a call of it on the case's seeded workload,
    already made once)."""
    tech = techniques.get(name)
    if tech is None:
        raise SystemExit(f"do_bench_check: technique {name} is not registered here")
    full = {**tech.defaults(), **params}
    cast = tech.cast(device, full)
    player = next(n for n, (role, reason) in cast.items() if role == "optimized")
    if cast[player][1] is not None:
        raise RuntimeError(f"{name}: optimized variant {player} cannot run here: {cast[player][1]}")
    workload = tech.build_fn(full, device, seed)
    call = functools.partial(tech.variants[player].call, workload, Recorder())
    call()  # compile and autotune outside either timer
    timing.synchronize(device)
    return player, call


def harness_times(call: Call, clock: timing.Clock, policy: timing.Policy = POLICY) -> dict[str, Any]:
    """The harness's median device time (its headline for a kernel) and wall time, seconds."""
    timed = timing.measure_interleaved({"x": lambda _: call()}, clock, policy, basis="device")["x"]
    if timed.error is not None:
        raise timed.error
    return {
        "device_s": statistics.median(timed.samples_s),
        "n": timed.n,
        "wall_s": statistics.median(timed.other_s) if timed.other_s else None,
        "launch_outlasted_flush": timed.launch_outlasted_flush,
    }


def do_bench_s(call: Call) -> float:
    """``triton.testing.do_bench``'s median, in seconds."""
    from triton.testing import do_bench

    return do_bench(call, warmup=25, rep=200, return_mode="median") * 1e-3


def check_case(
    name: str,
    params: dict[str, Any],
    device: torch.device,
    *,
    build: Callable[..., tuple[str, Call]] = optimized_call,
    harness: Callable[[Call], dict[str, Any]] | None = None,
    bench: Callable[[Call], float] = do_bench_s,
) -> dict[str, Any]:
    """One case: both timers, alternately (:data:`ROUNDS` each), and whether their means agree."""
    variant, call = build(name, params, device)
    if harness is None:
        clock = timing.Clock(device, flush_l2=True)
        harness = functools.partial(harness_times, clock=clock)
    benched, harnessed = [], []
    for _ in range(ROUNDS):
        benched.append(bench(call))
        harnessed.append(harness(call))
    do_bench_mean = statistics.fmean(benched)
    device_mean = statistics.fmean(h["device_s"] for h in harnessed)
    walls = [h["wall_s"] for h in harnessed if h.get("wall_s") is not None]
    ratio = device_mean / do_bench_mean
    return {
        "case": name,
        "params": params,
        "variant": variant,
        "do_bench_s": benched,
        "harness_device_s": [h["device_s"] for h in harnessed],
        "harness_n": [h["n"] for h in harnessed],
        "harness_launch_outlasted_flush": [h.get("launch_outlasted_flush") for h in harnessed],
        "harness_wall_s": walls,
        "ratio": ratio,
        "within": abs(ratio - 1.0) <= TOLERANCE,
    }


def line(result: dict[str, Any]) -> str:
    wall = (
        f"; harness wall {statistics.fmean(result['harness_wall_s']) * 1e6:.1f} us" if result["harness_wall_s"] else ""
    )
    counts = [c for c in result.get("harness_launch_outlasted_flush", []) if c is not None]
    if counts:
        wall += f"; launch outlasted the flush in {sum(counts)} of {sum(result['harness_n'])} harness samples"
    return (
        f"{result['case']} ({result['variant']}): do_bench {statistics.fmean(result['do_bench_s']) * 1e6:.1f} us, "
        f"harness device {statistics.fmean(result['harness_device_s']) * 1e6:.1f} us "
        f"(ratio {result['ratio']:.3f}: {'within' if result['within'] else 'NOT within'} "
        f"{TOLERANCE:.0%}){wall}"
    )


def main(
    argv: list[str] | None = None,
    *,
    check: Callable[..., dict[str, Any]] = check_case,
    cuda_available: Callable[[], bool] = torch.cuda.is_available,
    device_name: Callable[[torch.device], str] = torch.cuda.get_device_name,
) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (anything else: nothing is timed)")
    parser.add_argument("--out", type=Path, help="the JSON record to write")
    args = parser.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a device; allowed: cuda or cuda:N")
    if device.type != "cuda" or not cuda_available():
        reason = (
            f"--device {args.device} is not a GPU"
            if device.type != "cuda"
            else "no CUDA device here (torch.cuda.is_available() is False)"
        )
        print(f"do_bench_check: {reason}: do_bench times CUDA kernels only; nothing was timed")
        record: dict[str, Any] = {"status": "skipped", "reason": reason, "cases": []}
    else:
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        results = [check(name, params, device) for name, params in CASES.items()]
        for result in results:
            print(line(result))
        record = {
            "status": "passed" if all(r["within"] for r in results) else "failed",
            "device": device_name(device),
            "tolerance": TOLERANCE,
            "cases": results,
        }
        print(f"do_bench_check: {record['status']}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return 1 if record["status"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main())
