"""The history page of one device model: a self-contained HTML file in the report's style (its
CSS, inline SVG figures) with a table of the cases and their latest change point, then a small
trend chart per case (:mod:`~gpubench.reports.trend_chart`), cases grouped by technique, each with
its runs in a collapsed table. Commits are links when the repository's remote is a GitHub or GitLab
one (:mod:`gpubench.gate.history.links`). Everything taken from the store is escaped by jinja2's
autoescaping; only matplotlib's SVG is inserted as it is.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from gpubench.gate.history import changepoints, links
from gpubench.gate.history.changepoints import CaseHistory
from gpubench.gate.history.trends import TechniqueHistories, points_by_run
from gpubench.reports import figure_cache
from gpubench.reports import html as report_html
from gpubench.reports.sections import figure
from gpubench.reports.sparkline import figure_text
from gpubench.reports.trend_chart import run_key, short_commit, trend_figure


@dataclass(frozen=True)
class PageInput:
    """What the page shows: a device model's histories by technique, the store they came from,
    and the repository's remote (None: commits unlinked)."""

    device_model: str
    where: str  # the store and the branch, as the page prints them (:func:`store_text`)
    techniques: Sequence[TechniqueHistories]
    remote: str | None


_SCP_REMOTE = re.compile(r"^[\w.-]+@[\w.-]+:")  # git@github.com:o/r.git


def store_text(where: str) -> str:
    """The store as the page names it: a database URL without its user and password, a file by
    its name only (the page is shared; the folders of whoever made it are not its business)."""
    if "://" in where:
        return links.shown(where)
    return PurePath(where).name or where


def remote_text(remote: str) -> str:
    """The remote as the page names it: a URL without credentials, ``git@host:o/r`` as it is, a
    local path (a clone of a clone) by its folder's name only."""
    if "://" in remote and not remote.startswith("file://"):
        return links.shown(remote)
    if _SCP_REMOTE.match(remote):
        return remote
    return f"{PurePath(remote.removeprefix('file://').rstrip('/')).name} (a local folder)"


def report_css() -> str:
    """The run report's stylesheet, read from its template, so both pages share one."""
    loader = report_html._TEMPLATES.loader
    assert loader is not None  # (the report's Environment is made with its package's loader)
    source = loader.get_source(report_html._TEMPLATES, "report.html.j2")[0]
    found = re.search(r"<style>(.*?)</style>", source, re.S)
    if found is None:
        raise RuntimeError("reports/templates/report.html.j2 has no <style> block for the history page to share")
    return found.group(1)


def _commit(commit: str | None, link: Callable[[str | None], str | None]) -> dict[str, Any]:
    return {"text": short_commit(commit) if commit else "-", "full": commit or "", "url": link(commit)}


def _change_cells(h: CaseHistory, link: Callable[[str | None], str | None]) -> dict[str, Any]:
    last = h.latest
    if last is None:
        return {"change": None}
    return {
        "change": {
            "commit": _commit(last.commit, link),
            "run": last.run_id,
            "magnitude": last.magnitude_text,
            "kind": last.kind,
        }
    }


def _runs_table(histories: Sequence[CaseHistory], link: Callable[[str | None], str | None]) -> dict[str, Any]:
    """One row per run of the case: its commit, branch and each variant's figure [CI]."""
    runs = points_by_run(histories)
    by_variant = {h.variant: {run_key(p): p for p in h.points} for h in histories}
    rows = []
    for number, run in enumerate(runs, 1):
        cells = []
        for h in histories:
            p = by_variant[h.variant].get(run_key(run))
            cells.append("-" if p is None else _figure_ci(p.median, p.ci_low, p.ci_high, h.metric))
        rows.append(
            {
                "number": number,
                "run": run.run_id,
                "commit": _commit(run.commit, link),
                "branch": run.branch or "-",
                "started": run.started_at,
                "cells": cells,
            }
        )
    return {"variants": [h.variant for h in histories], "rows": rows}


def _figure_ci(median: float, low: float | None, high: float | None, metric: str) -> str:
    text = figure_text(median, metric)
    if low is None or high is None or low == high == median:
        return text
    return f"{text} [{figure_text(low, metric)}, {figure_text(high, metric)}]"


def _case_entry(
    number: int,
    case_id: str,
    histories: Sequence[CaseHistory],
    group: TechniqueHistories,
    link: Callable[[str | None], str | None],
) -> dict[str, Any]:
    runs = points_by_run(histories)
    roles = {h.variant: group.roles.get((case_id, h.variant)) for h in histories}
    params = group.params.get(case_id) or {}
    chart = figure(
        " ".join(f"{k}={v}" for k, v in params.items()) or case_id, trend_figure(histories, runs, roles, link)
    )
    one_run = len(runs) == 1
    return {
        "anchor": f"case-{number}",
        "case_id": case_id,
        "figure": chart,
        "runs": len(runs),
        "note": "one run so far: its point is shown; a trend needs more runs." if one_run else "",
        "table": _runs_table(histories, link),
        "metric": histories[0].metric,
        "changes": sum(len(h.changes) for h in histories),
    }


def _change_first(row: dict[str, Any]) -> int:
    """The table's order: regressions, then improvements, then cases without a change (stable
    within each: by technique and case)."""
    order: dict[str | None, int] = {"regression": 0, "improvement": 1}
    return order.get((row["change"] or {}).get("kind"), 2)


def page_context(page: PageInput) -> dict[str, Any]:
    """The template's context: the table of latest changes and the charts, by technique."""
    figure_cache.new_page()
    base = links.commit_url_base(page.remote)
    link = lambda commit: links.commit_url(base, commit)
    numbers = itertools.count(1)
    table, sections = [], []
    for group in page.techniques:
        entries = [_case_entry(next(numbers), case_id, histories, group, link) for case_id, histories in group.cases]
        sections.append({"technique": group.technique, "cases": entries})
        table += [
            {
                "anchor": entry["anchor"],
                "case_id": case_id,
                "variant": h.variant,
                "metric": h.metric,
                "runs": len(h.points),
                **_change_cells(h, link),
            }
            for entry, (case_id, histories) in zip(entries, group.cases)
            for h in histories
        ]
    table.sort(key=_change_first)
    runs = {
        run_key(p) for group in page.techniques for _, histories in group.cases for h in histories for p in h.points
    }
    return {
        "model": page.device_model,
        "where": page.where,
        "rows": table,
        "techniques": sections,
        "changed": [r for r in table if r["change"]],
        "unchanged": [r for r in table if not r["change"]],
        "runs": len(runs),
        "remote": remote_text(page.remote) if page.remote else None,
        "linked": base is not None,
        "css": report_css(),
        "method": changepoints.METHOD,
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def render_page(page: PageInput) -> str:
    """The history page as one HTML string."""
    return report_html._TEMPLATES.get_template("history.html.j2").render(**page_context(page))
