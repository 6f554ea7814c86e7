"""``gpubench report``: a run's HTML report and summary.md, from its run directory (and, with
``--compare``, another run or several). It imports what a report needs and no more (not the
scenario parser, the runner or torch): a report of a run whose figures are cached starts and
ends in well under a second on a quiet machine (``benchmarks/cli_startup.py``)."""

from __future__ import annotations

from pathlib import Path

import click

from gpubench import techniques
from gpubench.cli.console import OldSpellings
from gpubench.errors import BadInput


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option(
    "-o",
    "--out",
    "--output",
    "output",
    cls=OldSpellings,
    old=("--output",),
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The HTML file to write (default RUN_DIR/report.html); summary.md goes beside it.",
)
@click.option(
    "--compare",
    "others",
    type=click.Path(path_type=Path),
    multiple=False,
    default=None,
    metavar="OTHER_RUN_DIR",
    help="Another run to compare with: per case the change with its CI, "
    "regressions first. Further runs may follow RUN_DIR: then a technique x device matrix of all.",
)
@click.argument("more", nargs=-1, type=click.Path(path_type=Path))
@click.option(
    "--store",
    "history_store",
    metavar="PATH|URL",
    default=None,
    help="The history store each case's "
    "sparkline is read from (default $GPUBENCH_HISTORY, else ~/.local/share/gpubench/history.sqlite).",
)
@click.option("--no-history", is_flag=True, help="Do not read the history store: no sparklines.")
def report(
    run_dir: Path,
    output: Path | None,
    others: Path | None,
    more: tuple[Path, ...],
    history_store: str | None,
    no_history: bool,
) -> None:
    """Write a self-contained HTML report of a run directory, and summary.md (Markdown) beside it.

    gpubench report RUN --compare OTHER: the two runs side by side.
    gpubench report RUN --compare RUN2 RUN3 ...: the technique x device matrix of all the runs."""
    from gpubench.reports import html as html_report

    compare = ([others] if others is not None else []) + list(more)
    if more and others is None:
        raise BadInput("report: give further runs after --compare (gpubench report RUN --compare RUN2 RUN3 ...).")
    written = html_report.write_report(
        run_dir, output, compare=compare, history_store=history_store, read_history=not no_history, registry=techniques
    )
    click.echo(f"report: {written.html}")
    click.echo(f"summary: {written.markdown}")
