"""The report's "published claims on this device" table: every claim every technique declares
(:class:`gpubench.records.claims.Claim`), read against this run's cases, one row per claim.

:func:`claim_rows` turns a run into rows of plain strings (the HTML template and
:func:`markdown_lines` format them); it reads the run only: the claims its techniques declared
when it ran, and those of the techniques it left out, as the run recorded them. Those still have
their rows ("not in this run"), so every report lists every claim; :func:`split` sets them apart,
and :func:`not_in_run_line` folds them into one line.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpubench.records.claims import FALLBACK_CLAIMS, Claim, Reading, format_value, read_cases
from gpubench.records.declarations import Registry
from gpubench.records.results import CaseRecord, RunRecord, as_run
from gpubench.reports.terminal import case_params, shown_by_technique

TITLE = "Published claims on this device"
NOT_IN_RUN = "not in this run"
# The CSS class of each verdict (the report's pass / fail colours).
VERDICT_CLASS = {
    "holds": "pass",
    "falls short": "fail",
    "exceeds": "improved",
    "mixed": "",
    "inconclusive": "not-comparable",
    "not comparable": "not-comparable",
    "unverified": "not-comparable",
}
_MAX_REASONS = 2
_MAX_NAMED = 5  # cases named in a "2 of 10 cases failed: ..." why
_SHARED_WHY = re.compile(r"(.*?) \((.*)\)")


def _claims_of(run: RunRecord, name: str) -> tuple[Claim, ...]:
    tech = run.technique(name)
    return (tech.claims if tech is not None else ()) or FALLBACK_CLAIMS.get(name, ())


def _figure(reading: Reading, unit: str, predicted: bool) -> str:
    if reading.value is None:  # (a comparable reading carries its value: never so)
        return "-"
    text = format_value(reading.value, unit)
    if reading.low is not None and reading.high is not None and reading.high > reading.low:
        text += f" [{format_value(reading.low, unit)}, {format_value(reading.high, unit)}]"
    elif reading.n is not None and reading.verdict == "unverified":  # the count in place of a CI
        text += f" (n={reading.n})"
    else:
        text += " (exact)" if unit == "fraction" else " (no CI)"
    if predicted and reading.claimed is not None:
        text += f" vs predicted {format_value(reading.claimed[0], unit)}"
    return text


def _distinct(reasons: list[str]) -> str:
    """The cases' reasons once each; "what (why)" reasons that share the why are joined
    ("other sizes: max_len=256, max_len=72 (why)")."""
    grouped: dict[str, list[str]] = {}
    for reason in filter(None, reasons):
        shared = _SHARED_WHY.fullmatch(reason)
        what, why = shared.groups() if shared else (reason, "")
        grouped.setdefault(why, [])
        if what not in grouped[why]:
            grouped[why].append(what)
    texts = [_joined(whats) + (f" ({why})" if why else "") for why, whats in grouped.items()]
    more = len(texts) - _MAX_REASONS
    return "; ".join(texts[:_MAX_REASONS]) + (f" (and {more} more reasons)" if more > 0 else "")


def _joined(whats: list[str]) -> str:
    """'other sizes: a=1', 'other sizes: a=2' -> 'other sizes: a=1, a=2'."""
    head = whats[0].split(": ", 1)[0] + ": "
    if len(whats) > 1 and all(w.startswith(head) for w in whats):
        return head + ", ".join(w[len(head) :] for w in whats)
    return "; ".join(whats)


def _did_not_pass(readings: list[Reading], unpassed: Mapping[str, tuple[str, str]]) -> tuple[str, list[Reading]]:
    """Which of the claim's cases did not pass, by name: "2 of 10 cases failed: #3 (seq_len=128),
    #7 (seq_len=512)" (by status, at most :data:`_MAX_NAMED` named each), and the other readings.
    ``unpassed``: the run's cases that did not pass, by id: (status, the report's name of it)."""
    stopped = [r for r in readings if r.case_id in unpassed]
    if not stopped:
        return "", readings
    by_status: dict[str, list[str]] = {}
    for r in stopped:
        status, label = unpassed[r.case_id]
        by_status.setdefault(status, []).append(label)
    n = len(readings)
    texts = []
    for status, labels in by_status.items():
        named = ", ".join(labels[:_MAX_NAMED]) + (
            f" and {len(labels) - _MAX_NAMED} more" if len(labels) > _MAX_NAMED else ""
        )
        texts.append(f"its case {status}: {named}" if n == 1 else f"{len(labels)} of {n} cases {status}: {named}")
    return "; ".join(texts), [r for r in readings if r.case_id not in unpassed]


def _row(
    name: str, claim: Claim, readings: list[Reading] | None, unpassed: Mapping[str, tuple[str, str]] | None = None
) -> dict[str, Any]:
    row = {
        "technique": name,
        "claim": claim.text,
        "source": claim.source,
        "url": claim.url,
        "claimed": claim.figure_text,
        "conditions": claim.conditions,
        "measures": claim.measures,
        "measured": "-",
        "cases": 0,
    }
    if readings is None:
        return {**row, "verdict": "not comparable", "reason": NOT_IN_RUN}
    stopped, readings_left = _did_not_pass(readings, unpassed or {})
    comparable = [r for r in readings if r.comparable]
    if not comparable:
        reason = "; ".join(filter(None, (stopped, _distinct([r.reason for r in readings_left]))))
        return {**row, "verdict": "not comparable", "reason": reason}
    predicted = claim.figure is None
    ordered = sorted(comparable, key=lambda r: r.value or 0.0)  # (a comparable reading has a value)
    measured = _figure(ordered[0], claim.unit, predicted)
    if len(ordered) > 1:
        measured = f"{measured} to {_figure(ordered[-1], claim.unit, predicted)} over {len(ordered)} cases"
    counts = Counter(r.verdict for r in comparable)
    if len(counts) == 1:
        verdict = comparable[0].verdict
        reason = _distinct([r.reason for r in comparable])
    else:
        verdict = "mixed"
        reason = ", ".join(f"{v} in {n}" for v, n in counts.most_common()) + f" of {len(comparable)} cases"
    if stopped:
        reason += f"; {stopped}"
    left_out = len(readings_left) - len(comparable)
    if left_out:
        why_not = _distinct([r.reason for r in readings_left if not r.comparable])
        reason += f"; {left_out} case{'s' if left_out > 1 else ''} not comparable ({why_not})"
    if claim.caveat:
        reason += f". Still differs: {claim.caveat}"
    return {**row, "measured": measured, "cases": len(comparable), "verdict": verdict, "reason": reason}


def claim_rows(doc: RunRecord | dict[str, Any], registry: Registry | None = None) -> list[dict[str, Any]]:
    """One row per declared claim of every technique in the run and of every technique it left
    out (as the run recorded them): claim, source, the claimed figure, this run's comparable
    figure with its 95% CI, the verdict and why (:mod:`gpubench.records.claims`); the claims with a
    verdict first."""
    run = as_run(doc, registry)
    grouped: dict[str, list[CaseRecord]] = {}
    for case in run.cases:
        grouped.setdefault(case.technique, []).append(case)
    shown = shown_by_technique(run)
    unpassed = {
        c.id: (c.status or "did not pass", f"#{number} ({params})" if params else f"#{number}")
        for number, c in enumerate(run.cases, 1)
        if c.status != "passed"
        for params in [case_params(c, shown.get(c.technique))]
    }
    rows = []
    for name, cases in grouped.items():
        as_written = [c.to_dict() for c in cases]  # the verdict's rule reads case records as results.json holds them
        rows += [
            _row(name, claim, read_cases(claim, as_written, run.device), unpassed) for claim in _claims_of(run, name)
        ]
    for name, claims in run.claims_elsewhere().items():
        rows += [_row(name, claim, None) for claim in claims if name not in grouped]
    for row in rows:
        row["verdict_class"] = VERDICT_CLASS.get(row["verdict"], "")
    # Verdicts first, then claims this run's cases could not check, then techniques it left out.
    return sorted(rows, key=lambda r: (r["verdict"] == "not comparable") + (r["reason"] == NOT_IN_RUN))


def case_claim_rows(doc: RunRecord | dict[str, Any], case: CaseRecord) -> list[dict[str, Any]]:
    """The rows of :func:`claim_rows` for one case of the run: each claim its technique declares,
    read against that case alone (the same rule and reasons), for a table of one row per case."""
    run = as_run(doc)
    label = case_params(case, shown_by_technique(run).get(case.technique))
    unpassed = {case.id: (case.status or "did not pass", label or case.id)} if case.status != "passed" else {}
    rows = [
        _row(case.technique, claim, read_cases(claim, [case.to_dict()], run.device), unpassed)
        for claim in _claims_of(run, case.technique)
    ]
    for row in rows:
        row["verdict_class"] = VERDICT_CLASS.get(row["verdict"], "")
    return rows


def split(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the rows this run read against its cases, the rows of techniques it did not include)."""
    return [r for r in rows if r["reason"] != NOT_IN_RUN], [r for r in rows if r["reason"] == NOT_IN_RUN]


def not_in_run_line(rows: list[dict[str, Any]]) -> str:
    """The claims of techniques the run did not include, in one line: "9 published claims not
    judged by this run (their techniques did not run): kv_cache, paged_kv_serving (3), ..."; empty
    when there are none."""
    left_out = Counter(r["technique"] for r in split(rows)[1])
    if not left_out:
        return ""
    n = sum(left_out.values())
    names = ", ".join(name + (f" ({k})" if k > 1 else "") for name, k in sorted(left_out.items()))
    return (
        f"{n} published claim{'s' if n > 1 else ''} not judged by this run "
        f"({'their techniques' if len(left_out) > 1 else 'its technique'} did not run): {names}"
    )


def markdown_lines(rows: list[dict[str, Any]], cell: Any) -> list[str]:
    """The table in GitHub Markdown (``cell`` escapes a cell's text), the claims of techniques
    the run did not include folded into one line under it."""
    if not rows:
        return []
    judged, _ = split(rows)
    folded = [f"_{cell(not_in_run_line(rows))}._", ""] if len(judged) < len(rows) else []
    if not judged:
        return [f"**{TITLE}**", ""] + folded
    lines = [
        f"**{TITLE}**",
        "",
        "| technique | claim | source | claimed | this run [95% CI] | verdict | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in judged:
        lines.append(
            "| "
            + " | ".join(
                cell(v)
                for v in (
                    r["technique"],
                    r["claim"],
                    f"{r['source']} ({r['url']})",
                    r["claimed"],
                    r["measured"],
                    f"**{r['verdict']}**",
                    r["reason"],
                )
            )
            + " |"
        )
    return lines + [""] + folded
