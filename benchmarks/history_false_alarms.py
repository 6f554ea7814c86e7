"""The history gate's false alarms and its detection of a 10% step, beside the pairwise gate's, on
the same A/A data (the method of gate_false_alarms.py: unchanged code, every verdict but a pass is
an alarm). Each judged run meets both gates: ``gpubench compare --history`` (judge.judge_run: the
run against the runs before it, since their last change point) and ``gpubench compare`` (the run
against the one just before it), at the default threshold unless --threshold.

Synthetic (default): seeded trials of a history of --history A/A runs and one more run; each run's
two variants are 30 calls drawn from 300 real timed calls (tests/data/cpu_noise.json), so the
noise is this machine's. The further run is judged as it is (A/A: an alarm is a false one), with
its optimized variant --step slower (a detection when called regressed), and on a machine that got
faster (issue 34): both variants x0.90, unchanged code (an alarm is a false one), and the baseline
variant x0.90 beside the optimized x0.99, a +10% optimized/baseline ratio that the optimized
variant's own time hides (a detection when called regressed).

    python benchmarks/history_false_alarms.py [--trials 200] [--history 20] [--step 10%] [--json out.json]

The pairwise rule's p alone (--p-rule N): N draws of 30 calls a side, each compared A/A and 10%
slower by compare.verdict_of, its p from the bootstrap of the CI it goes with (the gate's since
issue 34) and from a Mann-Whitney U test (before): A/A alarms and the step found, per p.

    python benchmarks/history_false_alarms.py --p-rule 4000

Real runs (--runs): run directories of unchanged code in the order they ran (as gate_false_alarms.py
takes them); each run from the --min-history + 1-th on is judged by both gates, every case of it.

    python benchmarks/history_false_alarms.py --runs /tmp/aa_runs/*-smoke [--min-history 5]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

from gpubench.errors import BadInput
from gpubench.gate import compare
from gpubench.gate.history import open_store, rows_of_file, rows_of_run
from gpubench.gate.history.judge import judge_run
from gpubench.records.results import SCHEMA_VERSION, RunRecord

POOL_PATH = Path(__file__).resolve().parent.parent / "tests" / "data" / "cpu_noise.json"
SAMPLES = 30  # calls a variant per run (the pool's run-to-run spread of medians: ~2.2%)
OPTIMIZED_SCALE = 0.8  # the optimized variant: its own draws, at another level than the baseline's
CASE_ID = "aa[pool=cpu_noise]"
START = _dt.datetime(2026, 12, 1, tzinfo=_dt.timezone.utc)


def load_pool(path: Path = POOL_PATH) -> np.ndarray:
    """The real timed calls the synthetic runs are drawn from (seconds)."""
    try:
        samples = json.loads(Path(path).read_text(encoding="utf-8"))["samples_s"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BadInput(
            f"{path}: cannot be read as a noise file ({exc}); allowed: a JSON file with "
            f"samples_s, a list of timed calls in seconds (tests/data/cpu_noise.json)."
        ) from None
    return np.asarray(samples, dtype=np.float64)


FASTER_MACHINE = 0.90  # issue 34: from run 9 on, the baseline variant x0.90 ...
FASTER_OPTIMIZED = 0.99  # ... and the optimized variant x0.99 (its ratio to the baseline variant +10%)


def synthetic_run(
    rng: np.random.Generator, pool: np.ndarray, index: int, slowdown: float = 1.0, machine: float = 1.0
) -> dict:
    """A results document of one case whose variants are SAMPLES calls drawn from ``pool``; both
    variants' times multiplied by ``machine`` (the machine's speed), the optimized variant's also
    by ``slowdown`` (the code's)."""
    variants = {}
    for name, role, scale in (
        ("loop", "baseline", machine),
        ("fused", "optimized", OPTIMIZED_SCALE * slowdown * machine),
    ):
        variants[name] = {"role": role, "status": "ok", "samples_s": (rng.choice(pool, SAMPLES) * scale).tolist()}
    return {
        "kind": "gpubench.results",
        "schema_version": SCHEMA_VERSION,
        "run_id": f"aa{index:03d}",
        "device": "cpu",
        "device_label": "CPU: cpu_noise.json",
        "status": "complete",
        "scenario": {"name": "aa", "entries": [{"technique": "aa"}]},
        "started_at": (START + _dt.timedelta(minutes=index)).isoformat(),
        "env": {"host": "aa", "git": {"commit": f"c{index:03d}", "branch": "main", "dirty": False}},
        "cases": [
            {
                "id": CASE_ID,
                "technique": "aa",
                "params": {},
                "seed": 0,
                "policy": {},
                "status": "passed",
                "gate_metric": "",
                "variants": variants,
            }
        ],
    }


def _rows(doc: dict) -> list:
    return rows_of_run(RunRecord.from_dict(doc), f"synthetic/{doc['run_id']}/results.json")


def history_verdicts(store_path: Path, history: list[dict], current: list[dict], threshold: float) -> list[list[str]]:
    """Each of ``current``'s runs judged against ``history`` (stored in a new store): its cases' verdicts."""
    with open_store(store_path) as store:
        store.add([row for doc in history for row in _rows(doc)])
        return [
            [v.verdict for v in judge_run(store, _rows(doc), threshold, run=RunRecord.from_dict(doc))]
            for doc in current
        ]


def pairwise_verdicts(before: dict, current: dict, threshold: float) -> list[str]:
    return [c.verdict for c in compare.compare(before, current, threshold=threshold).changes]


def synthetic_trials(
    trials: int, history: int, step: float, threshold: float, seed: int = 0, pool: np.ndarray | None = None
) -> list[dict]:
    """Per seeded trial: each gate's verdict on a further run (the same draws each time) as it is
    (``aa``), with its optimized variant ``step`` slower (``step``), on a machine that got faster
    with unchanged code (``faster_aa``: both variants x0.90) and with a regression it hides
    (``faster``: the baseline variant x0.90, the optimized x0.99)."""
    pool = load_pool() if pool is None else pool
    out = []
    with tempfile.TemporaryDirectory(prefix="history-false-alarms-") as tmp:
        for trial in range(trials):
            rng = np.random.default_rng(seed + trial)
            runs = [synthetic_run(rng, pool, i) for i in range(history)]
            state = rng.bit_generator.state  # every judged run: the same draws
            judged = {}
            for kind, slowdown, machine in (
                ("aa", 1.0, 1.0),
                ("step", 1.0 + step, 1.0),
                ("faster_aa", 1.0, FASTER_MACHINE),
                ("faster", FASTER_OPTIMIZED / FASTER_MACHINE, FASTER_MACHINE),
            ):
                rng.bit_generator.state = state
                judged[kind] = synthetic_run(rng, pool, history, slowdown=slowdown, machine=machine)
            by_history = history_verdicts(Path(tmp) / f"t{trial}.sqlite", runs, list(judged.values()), threshold)
            out.append(
                {
                    "seed": seed + trial,
                    **{
                        kind: {"history": h, "pairwise": pairwise_verdicts(runs[-1], doc, threshold)[0]}
                        for (kind, doc), (h,) in zip(judged.items(), by_history)
                    },
                }
            )
    return out


def p_rule_trials(trials: int, step: float, threshold: float, seed: int = 0, pool: np.ndarray | None = None) -> dict:
    """compare.verdict_of on ``trials`` draws of SAMPLES calls a side (A/A, and ``step`` slower),
    with the bootstrap p of the CI (the gate's) and with the Mann-Whitney U p (before issue 34):
    per p, A/A regressed / improved and the step found."""
    from gpubench.records import stats

    pool = load_pool() if pool is None else pool
    counts = {name: Counter() for name in ("bootstrap", "mann_whitney")}
    for trial in range(trials):
        rng = np.random.default_rng(seed + trial)
        base, cur = rng.choice(pool, SAMPLES), rng.choice(pool, SAMPLES)
        for kind, sample in (("aa", cur), ("step", cur * (1 + step))):
            ci, p = stats.bootstrap_ratio_test(sample, base, seed=seed + trial)
            for name, value in (("bootstrap", p), ("mann_whitney", stats.mann_whitney_u(sample, base))):
                counts[name][f"{kind}_{compare.verdict_of(ci, value, threshold)}"] += 1
    for name, found in counts.items():
        print(
            f"{name:>12} p: A/A regressed {_rate(found['aa_regressed'], trials)}, improved "
            f"{_rate(found['aa_improved'], trials)}; a {step:.0%} step found {_rate(found['step_regressed'], trials)}"
        )
    return {name: dict(found) for name, found in counts.items()}


def _gate_false_alarms():
    """The pairwise count of gate_false_alarms.py, loaded from beside this file (no package here)."""
    spec = importlib.util.spec_from_file_location("gate_false_alarms", Path(__file__).with_name("gate_false_alarms.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_runs(paths: list[str], min_history: int, threshold: float) -> list[dict]:
    """Per run from the ``min_history``-th on: each gate's verdict counts over its cases (history:
    the runs before it; pairwise: the run just before it, as gate_false_alarms.py counts)."""
    pairs = {row["current"]: row for row in _gate_false_alarms().count_pairs(paths, threshold)}
    rows = [rows_of_file(path) for path in paths]  # every file read before any judging
    out = []
    with (
        tempfile.TemporaryDirectory(prefix="history-false-alarms-") as tmp,
        open_store(Path(tmp) / "h.sqlite") as store,
    ):
        for k, path in enumerate(paths):
            if k >= min_history:
                verdicts = Counter(v.verdict for v in judge_run(store, rows[k], threshold))
                out.append(
                    {
                        "run": path,
                        "history_runs": k,
                        "history": dict(verdicts),
                        "pairwise": pairs[path]["counts"],
                        "pairwise_passed": pairs[path]["passed"],
                    }
                )
            store.add(rows[k])
    return out


def _rate(found: int, total: int) -> str:
    return f"{found} of {total} ({found / total:.1%})" if total else "none judged"


def report_synthetic(trials: list[dict], step: float) -> dict:
    """Totals of the trials, printed: false alarms on A/A (regressed: the gate fails; improved: a win
    that is not there), on A/A after the machine got faster, and detections of the step and of the
    regression a faster machine hides, per gate."""
    totals = {}
    for gate in ("history", "pairwise"):
        aa = Counter(t["aa"][gate] for t in trials)
        faster_aa = Counter(t["faster_aa"][gate] for t in trials)
        found = sum(t["step"][gate] == "regressed" for t in trials)
        hidden = sum(t["faster"][gate] == "regressed" for t in trials)
        totals[gate] = {
            "aa": dict(aa),
            "step_found": found,
            "faster_aa": dict(faster_aa),
            "faster_found": hidden,
            "trials": len(trials),
        }
        print(
            f"{gate:>8} gate: A/A regressed {_rate(aa['regressed'], len(trials))}, improved "
            f"{_rate(aa['improved'], len(trials))}, inconclusive {aa['inconclusive']}; a {step:.0%} step found "
            f"{_rate(found, len(trials))}; machine {1 - FASTER_MACHINE:.0%} faster, A/A regressed "
            f"{_rate(faster_aa['regressed'], len(trials))}, improved {_rate(faster_aa['improved'], len(trials))}, "
            f"inconclusive {faster_aa['inconclusive']}; the regression it hides (optimized x{FASTER_OPTIMIZED:g}, "
            f"ratio {FASTER_OPTIMIZED / FASTER_MACHINE - 1:+.0%}) found {_rate(hidden, len(trials))}"
        )
    return totals


def report_real(judged: list[dict]) -> dict:
    totals = {}
    for gate in ("history", "pairwise"):
        counts = Counter()
        for row in judged:
            counts.update(row[gate])
        failed = sum(
            (row["history"].get("regressed", 0) > 0) if gate == "history" else not row["pairwise_passed"]
            for row in judged
        )
        totals[gate] = {"counts": dict(counts), "runs_failed": failed, "runs": len(judged)}
        print(
            f"{gate:>8} gate: "
            + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
            + f"; failed {_rate(failed, len(judged))} runs"
        )
    return totals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--history", type=int, default=20, help="A/A runs before the judged one (synthetic)")
    parser.add_argument("--step", default="10%", help="the slowdown to detect (synthetic)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threshold", default=str(compare.DEFAULT_THRESHOLD))
    parser.add_argument("--runs", nargs="+", help="real run directories of unchanged code, in order (not synthetic)")
    parser.add_argument("--min-history", type=int, default=5, help="runs before the first judged one (--runs)")
    parser.add_argument(
        "--p-rule",
        type=int,
        metavar="N",
        help="only the pairwise rule's p, bootstrap vs Mann-Whitney, on N draws (synthetic)",
    )
    parser.add_argument("--json", dest="json_path", help="also write the rows and totals to this file")
    args = parser.parse_args(argv)
    try:
        threshold, step = compare.parse_threshold(args.threshold), compare.parse_threshold(args.step)
        if args.runs is not None and len(args.runs) <= args.min_history:
            raise BadInput(
                f"--runs: {len(args.runs)} given; allowed: more than --min-history "
                f"({args.min_history}) run directories of one scenario on one device, in run order."
            )
        if args.runs is None and (args.trials < 1 or args.history < 2):
            raise BadInput(
                f"--trials {args.trials}, --history {args.history}: allowed: at least 1 trial and a "
                f"history of at least 2 runs."
            )
        if args.p_rule is not None and args.p_rule < 1:
            raise BadInput(f"--p-rule {args.p_rule}: allowed: at least 1 draw.")
        if args.p_rule is not None:
            rows, totals = [], p_rule_trials(args.p_rule, step, threshold, args.seed)
        elif args.runs is not None:
            rows = real_runs(args.runs, args.min_history, threshold)
            totals = report_real(rows)
        else:
            rows = synthetic_trials(args.trials, args.history, step, threshold, args.seed)
            totals = report_synthetic(rows, step)
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump({"threshold": args.threshold, "step": args.step, "rows": rows, "totals": totals}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
