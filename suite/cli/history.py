"""``gpubench history``: the cases of one device model's history with their latest change point;
``gpubench history html``: the same as an HTML page with a trend chart per case;
``gpubench history add RUN_DIR...``: import runs (run directories, results.json, pytest-benchmark
JSON) into the history store; and the hook by which ``gpubench run`` adds the run it made
(:func:`append_run`: a store that cannot be written costs a warning, never the run)."""

from __future__ import annotations

from pathlib import Path

import click

from gpubench.errors import BadInput
from gpubench.gate import history
from gpubench.records.results import RunRecord

STORE_HELP = (
    "The history store: an SQLite file, or a database URL (postgresql://..., through SQLAlchemy: "
    "pip install 'gpubench[history-server]'). Default: $GPUBENCH_HISTORY, else "
    "$XDG_DATA_HOME/gpubench/history.sqlite (~/.local/share/gpubench/history.sqlite)."
)


def store_option(f):
    return click.option("--store", "store", metavar="PATH|URL", default=None, help=STORE_HELP)(f)


def from_group(ctx: click.Context, name: str, value: str | None, flag: str | None = None) -> str | None:
    """A subcommand's option: its own value, else the ``history`` group's (``gpubench history
    --store X add`` and ``gpubench history add --store X`` both work; two different values are bad
    input)."""
    outer = (ctx.parent.params if ctx.parent is not None else {}).get(name)
    if value and outer and value != outer:
        raise BadInput(
            f"history: two values of {flag or '--' + name} given, {outer} before {ctx.info_name!r} and {value} "
            f"after it; give one."
        )
    return value or outer


BRANCH_HELP = (
    "The branch whose runs to read (default: main, else master, else the branch with the most runs of "
    "the device model). Runs that recorded no branch (pytest-benchmark JSON imported without "
    "--branch, runs of a detached checkout outside CI) count as that default branch's."
)


@click.group(name="history", invoke_without_command=True)
@store_option
@click.option(
    "--device",
    "device_model",
    metavar="MODEL",
    default=None,
    help="The device model whose history to read (default: the store's only one).",
)
@click.option("--branch", metavar="NAME", default=None, help=BRANCH_HELP)
@click.pass_context
def history_group(ctx: click.Context, store: str | None, device_model: str | None, branch: str | None) -> None:
    """The history store: every run's results, kept across runs (one row per run, case and variant).

    Alone: a table of the cases of one device model with their latest change point (Apache
    Otava's E-Divisive means and t-test, p <= 0.0001): the commit where it starts, its magnitude
    [95% CI], regression or improvement, over one branch's runs (a pull request's runs never move
    main's). gpubench history [--store PATH|URL] [--device MODEL] [--branch NAME]

    gpubench history html: the same as an HTML page, with a trend chart per case."""
    if ctx.invoked_subcommand is not None:
        return
    from gpubench.gate.history import changepoints

    with history.open_store(store, read_only=True) as opened:
        model = pick_device_model(opened, device_model)
        branch = pick_branch(opened, model, branch)
        found = changepoints.case_histories(opened, model, branch=branch)
    print_changes(opened.where, model, branch, found)


def pick_device_model(store: history.HistoryStore, device_model: str | None) -> str:
    """``device_model`` if the store holds it, else the store's only model (BadInput naming the
    models it holds otherwise)."""
    models = store.device_models()
    if device_model is not None and device_model in models:
        return device_model
    if device_model is None and len(models) == 1:
        return next(iter(models))
    held = ", ".join(f"{m!r} ({n} run{'s' if n != 1 else ''})" for m, n in models.items()) or "none: it is empty"
    raise BadInput(
        f"history store {store.where}: "
        + (f"no runs of device model {device_model!r}" if device_model else "several device models")
        + f"; give --device with one it holds: {held}."
    )


def pick_branch(store: history.HistoryStore, model: str, branch: str | None) -> str | None:
    """``branch`` if ``model``'s runs hold it, else (None given) the default branch; BadInput
    naming the branches held otherwise. None: no run recorded a branch (all runs are read)."""
    default = store.default_branch(model)
    held = store.branches(model)
    if branch is None or branch in held or (None in held and store.counts_unbranched(model, branch)):
        return branch or default
    listed = ", ".join(f"{b or '(none recorded)'} ({n} run{'s' if n != 1 else ''})" for b, n in held.items())
    raise BadInput(
        f"history store {store.where}: no runs of branch {branch!r} on {model}; give --branch with one "
        f"it holds: {listed} (runs that recorded none count as {default or 'any branch'}'s)."
    )


LOG_CASE_WIDTH = 100  # in a log, case ids are padded to at most this: a longer one pushes its line's other columns


def print_changes(where: str, model: str, branch: str | None, found: list) -> None:
    """The table of ``gpubench history``: a row per (case, variant) with its latest change. On a
    terminal, a case is labelled by the params that tell it apart from the others and every cell
    wraps rather than cuts; in a log, one plain line a row with the whole case id."""
    import itertools

    from rich.measure import Measurement
    from rich.table import Table
    from rich.text import Text

    from gpubench.cli.console import make_console
    from gpubench.reports.terminal import fit_fields, id_labels, plain_lines

    console = make_console()
    on = f"branch {branch}" if branch else "all runs (none recorded a branch)"
    title = f"{model}, {on}: change points ({where})"
    header = ("case", "variant", "metric", "runs", "latest change (commit, run)", "magnitude [95% CI]", "kind")
    rows = []
    for h in found:
        last = h.latest
        change = (
            ("none", "", "")
            if last is None
            else (f"{(last.commit or '?')[:12]} ({last.run_id})", last.magnitude_text, last.kind)
        )
        rows.append((h.case_id, h.variant, h.metric, str(len(h.points)), *change))
    if not console.is_terminal:
        for line in [title] + plain_lines(header, rows, right=(3, 5), widest=LOG_CASE_WIDTH):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        return
    labels = id_labels(h.case_id for h in found)
    table = Table(title=title, title_justify="left")
    for column in header:
        table.add_column(
            column, justify="right" if column in ("runs", "magnitude [95% CI]") else "left", overflow="fold"
        )
    for row in rows:
        # Text, not a markup string: a case id such as "kv_cache[model=...]" is no rich tag.
        table.add_row(Text(labels[row[0]]), *row[1:])
    if Measurement.get(console, console.options.update_width(10**6), table).maximum <= console.width:
        console.print(table)
        return
    # Too narrow for the table without folding its cells: a block per case, a line per variant.
    console.print(Text(title, style="italic"))
    pad = max(len(r[1]) for r in rows) if rows else 0
    for case_id, group in itertools.groupby(rows, key=lambda r: r[0]):
        console.print(Text(labels[case_id], style="bold"))
        for _, variant, metric, runs, change, magnitude, kind in group:
            said = "no change point" if change == "none" else f"latest change {change}: {magnitude} {kind}"
            for line in fit_fields(
                [variant.ljust(pad), metric, f"{runs} run{'s' if runs != '1' else ''}", said],
                console.width - 2,
                indent="",
            ):
                console.print("  " + line, markup=False, highlight=False, soft_wrap=True)


DEFAULT_PAGE = Path("history.html")


@history_group.command(name="html")
@store_option
@click.option(
    "--device",
    "device_model",
    metavar="MODEL",
    default=None,
    help="The device model whose history to show (default: the store's only one).",
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_PAGE,
    help="The HTML file to write (default: history.html in the current directory).",
)
@click.option(
    "--remote",
    metavar="URL",
    default=None,
    help="The repository's remote, for commit links (https://github.com/o/r, git@github.com:o/r.git, "
    "GitLab's too). Default: `git remote get-url origin` of the checkout gpubench runs from, "
    "whose commits the runs record. Another host, or none: commits are plain text.",
)
@click.option("--branch", metavar="NAME", default=None, help=BRANCH_HELP)
@click.pass_context
def html_cmd(
    ctx: click.Context, store: str | None, device_model: str | None, out: Path, remote: str | None, branch: str | None
) -> None:
    """Write the history page of one device model: a self-contained HTML file (the report's style)
    with the cases and their latest change point, then a trend chart per case (each run's median
    and 95% CI, runs in order by commit, change points marked), grouped by technique.

    One branch's runs, as ``gpubench history`` reads them (--branch).

    gpubench history html [--store PATH|URL] [--device MODEL] [--branch NAME] [-o history.html]"""
    from gpubench.gate.history import changepoints, links, trends
    from gpubench.reports.history_page import PageInput, render_page, store_text
    from gpubench.reports.html import write_pages

    store, device_model = from_group(ctx, "store", store), from_group(ctx, "device_model", device_model, "--device")
    with history.open_store(store, read_only=True) as opened:
        model = pick_device_model(opened, device_model)
        branch = pick_branch(opened, model, from_group(ctx, "branch", branch))
        grouped = trends.technique_histories(opened, model, changepoints.case_histories(opened, model, branch=branch))
        on = f"branch {branch}" if branch else "all runs (none recorded a branch)"
        where = f"{opened.where}, {on}"
    text = render_page(
        PageInput(model, f"{store_text(opened.where)}, {on}", grouped, remote or links.origin_remote(_checkout()))
    )
    write_pages([(out, text)], "the history page", "-o/--out")
    cases = sum(len(group.cases) for group in grouped)
    click.echo(f"history page: {out} ({model}: {cases} case{'s' if cases != 1 else ''} from {where})")


def _checkout() -> Path:
    """The folder gpubench runs from (its checkout, where `gpubench run` reads the commit)."""
    import gpubench

    return Path(gpubench.__file__).resolve().parent.parent


@history_group.command(name="add")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path), metavar="RUN_DIR...")
@store_option
@click.option(
    "--branch",
    metavar="NAME",
    default=None,
    help="The branch of runs that did not record theirs (runs of gpubench before it did, pytest-benchmark "
    "JSON without commit_info.branch); without it they count as the default branch's (see history --help).",
)
@click.pass_context
def add_cmd(ctx: click.Context, paths: tuple[Path, ...], store: str | None, branch: str | None) -> None:
    """Import runs into the history store: run directories, their results.json, or pytest-benchmark
    JSON files (--benchmark-json); a folder of runs (runs/) stands for the runs inside it. A run
    already there adds nothing.

    gpubench history add runs/* [--store PATH|URL]"""
    store, branch = from_group(ctx, "store", store), from_group(ctx, "branch", branch)
    found = [
        (path, history.rows_of_file(path, branch=branch)) for path in runs_inside(paths)
    ]  # every file read before any write
    with history.open_store(store) as opened:
        click.echo(f"history store: {opened.where}")
        for path, rows in found:
            if not rows:
                click.echo(f"{path}: no cases, nothing to add")
                continue
            for added in opened.add(rows):
                click.echo(
                    f"{path}: run {added.run_id}: {added.added} row{'s' if added.added != 1 else ''} added"
                    + (f", {added.present} already there" if added.present else "")
                )


def runs_inside(paths: tuple[Path, ...] | list[Path]) -> list[Path]:
    """``paths`` with each folder of runs (``runs/``: no results.json of its own, run directories
    inside) replaced by those runs in name order (their timestamps), as ``runs/*`` would name them;
    every other path as given. A folder with neither is BadInput saying what to give."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir() and not (path / "results.json").exists():
            inside = sorted(p for p in path.iterdir() if (p / "results.json").is_file())
            if not inside:
                raise BadInput(
                    f"{path}: a folder with no results.json and no run directories inside; give run "
                    f"directories (runs/<timestamp>-<scenario>/, or runs/* for all of them), their "
                    f"results.json, or pytest-benchmark JSON files."
                )
            out += inside
        else:
            out.append(path)
    return out


def append_run(run: RunRecord, run_dir: Path, store: str | None) -> str:
    """Add a finished run (complete or not) to the history store; the line to print. Whatever
    goes wrong with the store is a warning line naming it and why: the run is saved either way."""
    where = history.resolve_store(store)
    try:
        rows = history.rows_of_run(run, Path(run_dir) / "results.json", branch=None)
        if not rows:
            return f"history: no cases to add to {where}"
        with history.open_store(where) as opened:
            added = sum(a.added for a in opened.add(rows))
        return f"history: {added} row{'s' if added != 1 else ''} added to {where}"
    except BadInput as exc:
        why = str(exc)
    except Exception as exc:  # noqa: BLE001 - a locked, full or unreachable store: the run is saved
        why = f"{type(exc).__name__}: {exc}"
    return (
        f"warning: the run was not added to the history store {where} ({why}); it is saved in {run_dir}: "
        f"`gpubench history add {run_dir}` adds it later"
    )
