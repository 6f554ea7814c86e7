"""``gpubench compare`` (the regression gate) and ``gpubench baseline save`` (the store it reads)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from gpubench.atomic import DiskFull
from gpubench.cli_console import make_console
from gpubench.errors import BadInput


@click.command(name="compare")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path), metavar="[BASELINE] CURRENT")
@click.option("--threshold", default="5%", show_default=True,
              help="Slowdown tolerated before a case can regress (scenario thresholds per technique win).")
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the Markdown summary here (e.g. for $GITHUB_STEP_SUMMARY).")
@click.option("--allow-missing", is_flag=True, help="A case missing from CURRENT does not fail the gate.")
@click.option("--force", is_flag=True, help="Compare runs of different GPU models or scenario definitions anyway "
              "(different definitions: the cases both runs hold; a case only in the baseline does not fail).")
@click.option("--baseline-store", type=click.Path(file_okay=False, path_type=Path),
              help="Pick BASELINE from this store by CURRENT's GPU model and scenario (then give CURRENT only).")
@click.option("--strict", is_flag=True,
              help="Also fail on inconclusive cases (a slowdown the same-run baseline variant shows too).")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_cmd(paths: tuple[Path, ...], threshold: str, markdown_path: Path | None, allow_missing: bool,
                force: bool, baseline_store: Path | None, strict: bool, as_json: bool) -> None:
    """The regression gate: exit 0 pass, 1 regression or correctness failure, 2 bad input.

    BASELINE and CURRENT are run directories, results.json files or pytest-benchmark JSON files."""
    from gpubench import compare as gate
    from gpubench.reports import gate as gate_report

    expected = 1 if baseline_store else 2
    if len(paths) != expected:
        raise BadInput("compare: give BASELINE and CURRENT (run directories, results.json or pytest-benchmark "
                       "JSON), or --baseline-store DIR and CURRENT alone.")
    current = gate.load_any(paths[-1])
    if baseline_store:
        baseline, stored = gate.load_from_store(baseline_store, current)
        baseline_path = ", ".join(map(str, stored))
    else:
        baseline_path = paths[0]
        baseline = gate.load_any(baseline_path)
    result = gate.compare(baseline, current, threshold=gate.parse_threshold(threshold),
                          allow_missing=allow_missing, force=force, strict=strict)
    if markdown_path is not None:
        from gpubench.atomic import atomic_write_text

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


@click.group(name="baseline")
def baseline_group() -> None:
    """Keep stored baselines for the regression gate, one per GPU model and scenario."""


@baseline_group.command(name="save")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--baseline-dir", default="baselines-store", show_default=True,
              type=click.Path(file_okay=False, path_type=Path), help="The store (commit it to the repository).")
@click.option("--name", help="Stored name (default: the run's scenario name).")
def baseline_save(run_dir: Path, baseline_dir: Path, name: str | None) -> None:
    """Store RUN_DIR's results as the baseline for its GPU model: DIR/<GPU>/<scenario>.json (one per
    model for a run over several)."""
    from gpubench import compare as gate
    from gpubench.atomic import atomic_write_text
    from gpubench.results import load_results

    doc = load_results(run_dir)
    if doc.get("status") != "complete" or doc.get("summary", {}).get("failed"):
        raise BadInput(f"{run_dir}: only a complete run with no failed case can be a baseline "
                       f"(status {doc.get('status')!r}, {doc.get('summary', {}).get('failed', '?')} failed).")
    for label in gate.device_labels(doc):  # a run over several device models: one baseline each
        part = gate.for_device(doc, label)
        target = gate.store_path(baseline_dir, part, name)
        try:
            atomic_write_text(target, json.dumps(part, indent=1) + "\n")
        except DiskFull:
            raise  # not bad input: exit 74
        except OSError as exc:
            raise BadInput(f"--baseline-dir {baseline_dir}: cannot write {target} ({exc.strerror or exc}).") from None
        click.echo(f"baseline saved: {target}")
