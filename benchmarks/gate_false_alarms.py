"""The pairwise gate's false alarms on A/A data: runs of unchanged code, each compared with the one
before it (``gpubench compare`` at the default threshold, or --threshold). Every verdict other than
unchanged is a false alarm of some kind: regressed fails the gate, improved claims a win that is not
there, inconclusive passes but says the machine moved. Prints the verdicts per pair and in all.

    for i in $(seq 8); do gpubench run --scenario smoke --only kv_cache,paged_attention,moe_grouping \\
        --no-calibrate --out /tmp/aa_runs; done
    python benchmarks/gate_false_alarms.py /tmp/aa_runs/*-smoke [--threshold 5%] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from gpubench.errors import BadInput
from gpubench.gate import compare

JUDGED = ("regressed", "inconclusive", "improved", "unchanged")


def count_pairs(runs: list[str], threshold: float) -> list[dict]:
    """One row per consecutive pair: the runs, the gate's verdict counts, pass or fail."""
    docs = [compare.load_any(path) for path in runs]
    rows = []
    for (before, after), (doc_a, doc_b) in zip(zip(runs, runs[1:]), zip(docs, docs[1:])):
        comp = compare.compare(doc_a, doc_b, threshold=threshold)
        rows.append(
            {
                "baseline": before,
                "current": after,
                "passed": comp.passed,
                "counts": {v: n for v, n in comp.counts().items() if n},
                "flagged": [
                    f"{c.verdict}: {c.case_id} {(c.ratio - 1) * 100:+.1f}%"
                    for c in comp.changes
                    if c.verdict in ("regressed", "improved")
                ],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="run directories (or results.json) of unchanged code, in order")
    parser.add_argument("--threshold", default=str(compare.DEFAULT_THRESHOLD))
    parser.add_argument("--json", dest="json_path", help="also write the rows and totals to this file")
    args = parser.parse_args(argv)
    try:
        if len(args.runs) < 2:
            raise BadInput(
                f"runs: {len(args.runs)} given; allowed: two or more run directories or results.json "
                f"files of one scenario on one device, in the order they ran."
            )
        rows = count_pairs(args.runs, compare.parse_threshold(args.threshold))
    except BadInput as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    total = Counter()
    for row in rows:
        total.update(row["counts"])
        print(
            f"{'PASS' if row['passed'] else 'FAIL'} {row['current']} vs {row['baseline']}: "
            + ", ".join(f"{n} {v}" for v, n in row["counts"].items())
        )
        for line in row["flagged"]:
            print(f"    {line}")
    judged = sum(total[v] for v in JUDGED)
    failed = sum(not row["passed"] for row in rows)
    print(
        f"\n{len(rows)} pairs, {judged} case comparisons: "
        + ", ".join(f"{total[v]} {v} ({total[v] / judged:.1%})" for v in JUDGED if judged)
        + f"; the gate failed {failed} of {len(rows)} pairs"
    )
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as out:
            json.dump(
                {"threshold": args.threshold, "pairs": rows, "totals": dict(total), "pairs_failed": failed},
                out,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
