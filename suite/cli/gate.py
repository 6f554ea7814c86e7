"""``gpubench compare`` (the regression gate) and ``gpubench baseline save`` (the store it reads)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from gpubench.cli.console import make_console
from gpubench.errors import BadInput
from gpubench.records.atomic import DiskFull


@click.command(name="compare")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path), metavar="[BASELINE] CURRENT")
@click.option(
    "--threshold",
    default="5%",
    show_default=True,
    metavar="PERCENT",
    help="Slowdown tolerated before a case can regress: a percentage (5%) or a fraction (0.05); "
    "scenario thresholds per technique win.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the Markdown summary here (e.g. for $GITHUB_STEP_SUMMARY).",
)
@click.option("--allow-missing", is_flag=True, help="A case missing from CURRENT does not fail the gate.")
@click.option(
    "--force",
    is_flag=True,
    help="Compare runs of different GPU models or scenario definitions anyway "
    "(different definitions: the cases both runs hold; a case only in the baseline does not fail).",
)
@click.option(
    "--baseline-store",
    type=click.Path(file_okay=False, path_type=Path),
    help="Pick BASELINE from this store by CURRENT's GPU model and scenario (then give CURRENT only).",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Also fail on inconclusive cases (a slowdown the same-run baseline variant shows too).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.option(
    "--history",
    "use_history",
    is_flag=True,
    help="Judge CURRENT against its history since the last change point (the history store), "
    "not against one baseline run.",
)
@click.option(
    "--store",
    metavar="PATH|URL",
    default=None,
    help="With --history: the history store (default: $GPUBENCH_HISTORY, else ~/.local/share/gpubench/history.sqlite).",
)
@click.option(
    "--since",
    metavar="RUN|COMMIT|TAG",
    default=None,
    help="With --history: also report the base branch's regression change points since this run id, "
    "stored commit (or prefix), or else git revision of the repository here, e.g. the last release's tag "
    "(runs of that commit and its descendants).",
)
@click.option(
    "--branch",
    "base_branch",
    metavar="NAME",
    default=None,
    help="With --history: the branch whose runs make the level CURRENT is judged against (a pull "
    "request's base; its own runs never count). Default: main, else master, else the branch with the "
    "most runs of the device model; runs that recorded no branch count as main's (or that default's). A "
    "branch the store holds no run of is exit 2.",
)
def compare_cmd(
    paths: tuple[Path, ...],
    threshold: str,
    markdown_path: Path | None,
    allow_missing: bool,
    force: bool,
    baseline_store: Path | None,
    strict: bool,
    as_json: bool,
    use_history: bool,
    store: str | None,
    since: str | None,
    base_branch: str | None,
) -> None:
    """The regression gate: exit 0 pass, 1 regression or correctness failure, 2 bad input.

    BASELINE and CURRENT are run directories, results.json files or pytest-benchmark JSON files.
    With --history, CURRENT alone: each case against the store's runs since its last change point."""
    with _shape_errors_are_bad_input(paths):
        _compare(
            paths,
            threshold,
            markdown_path,
            allow_missing,
            force,
            baseline_store,
            strict,
            as_json,
            use_history,
            store,
            since,
            base_branch,
        )


@contextlib.contextmanager
def _shape_errors_are_bad_input(paths: tuple[Path, ...]):
    """A results file that parses but holds a value of the wrong type (a scenario given as text,
    samples as a string) fails deep in the gate; exit 1 would read as a regression in CI, so it is
    bad input naming the files (and, if they are gpubench's own, a bug to report)."""
    try:
        yield
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise BadInput(
            f"compare: {', '.join(map(str, paths))}: a value of the wrong type or shape in a results file "
            f"({type(exc).__name__}: {exc}). Give files gpubench or pytest-benchmark wrote; if they are, "
            f"this is a bug in gpubench: report it with this message."
        ) from None


def _compare(
    paths,
    threshold,
    markdown_path,
    allow_missing,
    force,
    baseline_store,
    strict,
    as_json,
    use_history,
    store,
    since,
    base_branch,
) -> None:
    from gpubench.gate import compare as gate
    from gpubench.reports import gate as gate_report

    if use_history:
        if len(paths) != 1 or baseline_store:
            raise BadInput(
                "compare --history: give CURRENT alone (a run directory, results.json or "
                "pytest-benchmark JSON); its history comes from --store."
            )
        sys.exit(
            _compare_history(
                paths[0], gate.parse_threshold(threshold), store, since, base_branch, as_json, markdown_path
            )
        )
    if since or store or base_branch:
        raise BadInput("compare: --store, --since and --branch go with --history.")
    expected = 1 if baseline_store else 2
    if len(paths) != expected:
        raise BadInput(
            "compare: give BASELINE and CURRENT (run directories, results.json or pytest-benchmark "
            "JSON), or --baseline-store DIR and CURRENT alone."
        )
    current = gate.load_any(paths[-1])
    if baseline_store:
        baseline, stored = gate.load_from_store(baseline_store, current)
        baseline_path = ", ".join(map(str, stored))
    else:
        baseline_path = paths[0]
        baseline = gate.load_any(baseline_path)
    result = gate.compare(
        baseline,
        current,
        threshold=gate.parse_threshold(threshold),
        allow_missing=allow_missing,
        force=force,
        strict=strict,
    )
    if markdown_path is not None:
        from gpubench.records.atomic import atomic_write_text

        atomic_write_text(markdown_path, gate_report.to_markdown(result))
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        out = make_console()
        out.print(f"baseline: {baseline_path}")
        gate_report.print_table(result, out)
        if markdown_path is not None:
            out.print(f"markdown: {markdown_path}")
    sys.exit(result.exit_code)


def _compare_history(
    current: Path,
    threshold: float,
    store: str | None,
    since: str | None,
    base_branch: str | None,
    as_json: bool,
    markdown_path: Path | None = None,
) -> int:
    """``compare --history``: print each case's verdict against its base branch's current level,
    and the regressions since ``since`` (also as Markdown at ``markdown_path``); 1 on a regression."""
    from dataclasses import asdict

    from gpubench.cli.history import pick_branch
    from gpubench.gate import history
    from gpubench.gate.history import judge
    from gpubench.gate.history import since as since_mod

    rows = history.rows_of_file(current)
    run = _run_record(current)  # its failed cases too, some of which recorded no rows
    models = {row.device_model for row in rows} | (
        {history.rows.device_model(run, c) for c in run.cases} if run is not None else set()
    )
    verdicts, found, branches, start = [], [], {}, None
    with history.open_store(store, read_only=True) as opened:
        for model in sorted(models):
            # A base branch the store holds no run of would leave every case inconclusive and the
            # gate passing: a typo, or a base with no history yet, is bad input naming those held.
            branches[model] = (
                pick_branch(opened, model, base_branch)
                if model in opened.device_models()
                else base_branch or opened.default_branch(model)
            )
            verdicts += judge.judge_run(
                opened,
                [r for r in rows if r.device_model == model],
                threshold,
                branch=branches[model],
                run=run,
                model=model,
            )
        if since:
            # The runs before CURRENT, as each case's level is read: the change points listed are
            # those the levels start at (runs stored after CURRENT never judge it).
            histories = [
                h
                for model, branch in branches.items()
                for h in judge.histories_before(opened, [r for r in rows if r.device_model == model], branch)
            ]
            start = since_mod.resolve(
                since, [p for h in histories for p in h.points], where=f"{opened.where} ({_on(branches)})"
            )
            found = judge.changes_since(histories, start)
    if markdown_path is not None:
        from gpubench.records.atomic import atomic_write_text

        atomic_write_text(markdown_path, _history_markdown(current, branches, verdicts, start, found))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "branches": branches,
                    "cases": [asdict(v) for v in verdicts],
                    "since": None if start is None else {"text": start.text, "how": start.how, "commit": start.commit},
                    "regressions_since": [
                        {**asdict(r.change), "case_id": r.case_id, "variant": r.variant}
                        for r in found
                        if r.change.kind == "regression"
                    ],
                    "improvements_since": [
                        {**asdict(r.change), "case_id": r.case_id, "variant": r.variant}
                        for r in found
                        if r.change.kind == "improvement"
                    ],
                },
                indent=2,
            )
        )
    else:
        _print_history_verdicts(opened.where, threshold, branches, verdicts, start, found)
    return 1 if any(v.verdict in ("regressed", "failed") for v in verdicts) else 0


def _run_record(current: Path):
    """The run CURRENT records (rows_of_file has read it already, so it is one gpubench reads)."""
    from gpubench.gate.compare import load_any

    try:
        return load_any(current)
    except BadInput:
        return None


def _history_markdown(current: Path, branches, verdicts, start, found) -> str:
    """The job summary of ``compare --history``: a row per case, then the regressions since the release."""
    regressed = sum(v.verdict == "regressed" for v in verdicts)
    failed = regressed + sum(v.verdict == "failed" for v in verdicts)
    not_passed = f", {failed - regressed} failed" if failed > regressed else ""
    lines = [
        f"### History gate: {'FAIL' if failed else 'PASS'} ({regressed} regressed{not_passed} of {len(verdicts)} "
        f"cases)",
        "",
        f"`{current}` against the runs of {_on(branches)} since each case's last change point.",
        "",
        "| verdict | case | variant | figure | against the level | level since |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {v.verdict} | `{v.case_id}` | {v.variant} | {v.metric} | {v.reason} | {(v.since_commit or '')[:12]} |"
        for v in verdicts
    ]
    if start is not None:
        for kind in ("regression", "improvement"):
            listed = [r for r in found if r.change.kind == kind]
            lines += ["", f"{kind.capitalize()}s since {start.describe()}: {len(listed) or 'none'}"]
            lines += [
                f"- `{r.case_id}` [{r.variant}]: {r.change.magnitude_text} from "
                f"{(r.change.commit or '?')[:12]} ({r.change.run_id})"
                for r in listed
            ]
    return "\n".join(lines) + "\n"


def _on(branches: dict[str, str | None]) -> str:
    return "; ".join(
        f"{model}: branch {branch or '(all runs: none recorded a branch)'}" for model, branch in branches.items()
    )


def _print_history_verdicts(where, threshold, branches, verdicts, start, found) -> None:
    from gpubench.gate.history import judge

    click.echo(
        f"history: {where}, {_on(branches)} (rule: above the current level's 95% CI of the median x "
        f"(1 + {threshold:.0%}) regresses; fewer than {judge.MIN_RUNS} runs since the last change: "
        f"inconclusive)"
    )
    for v in verdicts:
        click.echo(
            f"{v.verdict:>12}  {v.case_id} [{v.variant}, {v.metric}]: {v.reason}"
            + (f" (level since {v.since_commit[:12]})" if v.since_commit else "")
        )
    if start is not None:
        for kind in ("regression", "improvement"):
            listed = [r for r in found if r.change.kind == kind]
            click.echo(f"{kind}s since {start.describe()}: {len(listed) or 'none'}")
            for r in listed:
                click.echo(
                    f"  {r.case_id} [{r.variant}]: {r.change.magnitude_text} from "
                    f"{(r.change.commit or '?')[:12]} ({r.change.run_id})"
                )


@click.group(name="baseline")
def baseline_group() -> None:
    """Keep stored baselines for the regression gate, one per GPU model and scenario."""


@baseline_group.command(name="save")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "--baseline-dir",
    default="baselines-store",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The store (commit it to the repository).",
)
@click.option("--name", metavar="NAME", help="Stored name (default: the run's scenario name).")
def baseline_save(run_dir: Path, baseline_dir: Path, name: str | None) -> None:
    """Store RUN_DIR's results as the baseline for its GPU model: DIR/<GPU>/<scenario>.json (one per
    model for a run over several)."""
    from gpubench.gate import compare as gate
    from gpubench.records.atomic import atomic_write_text
    from gpubench.records.results import json_safe, load_run

    run = load_run(run_dir)
    failed = run.summary["failed"]
    if run.status != "complete" or failed:
        raise BadInput(
            f"{run_dir}: only a complete run with no failed case can be a baseline "
            f"(status {run.status!r}, {failed} failed)."
        )
    for label in run.device_labels():  # a run over several device models: one baseline each
        part = gate.for_device(run, label)
        target = gate.store_path(baseline_dir, part, name)
        try:
            atomic_write_text(target, json.dumps(json_safe(part.to_dict()), indent=1) + "\n")
        except DiskFull:
            raise  # not bad input: exit 74
        except OSError as exc:
            raise BadInput(f"--baseline-dir {baseline_dir}: cannot write {target} ({exc.strerror or exc}).") from None
        click.echo(f"baseline saved: {target}")
