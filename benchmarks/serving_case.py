"""Shared by the serving benchmarks: 16 requests all at once (offline throughput) through the tiny
model, and each run's greedy tokens checked against one-request-at-a-time generation."""
from gpubench.contract import Recorder

SMALL = {"requests": 16, "arrival": "all", "prompt_len": "uniform:8:32", "output_len": "exp:24:64", "max_len": 96,
         "kv_budget_mib": 0.5}


def run_and_check(benchmark, technique, case, variant):
    w, ref = case
    out = benchmark(technique.variants[variant].call, w, Recorder())
    assert technique.check_fn(ref, out).passed


def build_case(technique, device):
    w = technique.build_fn({**technique.defaults(), **SMALL}, device, 0)
    return w, technique.reference_fn(w)
