"""The history page (`gpubench history html`) and the run report's sparklines (issue 27.4): a trend
chart per case with the change point marked at the run where it starts, commits linked to their
pages when the remote is a GitHub or GitLab one (plain text otherwise), a case with one run shown
and said to be one; per case of a run, a sparkline of its history up to and including the run,
in run order with the run marked, and a report that never fails because of the store. Synthetic
histories and results files only (tests/test_changepoints.py, tests/test_history_store.py)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_changepoints import _row, history_values
from test_history_store import _add, write_run

from gpubench.cli import main
from gpubench.gate.history import changepoints, links, open_store, trends
from gpubench.reports import html
from gpubench.reports.drawing import REFERENCE
from gpubench.reports.sparkline import sparkline_svg
from gpubench.reports.trend_chart import trend_figure

MODEL = "NVIDIA H100"  # test_changepoints' rows


def sha(i: int) -> str:
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def write_step_history(store: Path, runs: int = 12, step_at: int | None = 6) -> list[float]:
    """A case with a 10% step at run ``step_at`` (fused) beside its unchanged baseline (loop),
    commits as real hashes; and a case of another technique with one run."""
    fused, loop = history_values(5, runs, step_at=step_at), history_values(6, runs)
    rows = [
        dataclasses.replace(
            _row(i, variant, float(v)), git_commit=sha(i), ci_low_s=float(v) * 0.98, ci_high_s=float(v) * 1.02
        )
        for i in range(runs)
        for variant, v in (("fused", fused[i]), ("loop", loop[i]))
    ]
    rows.append(dataclasses.replace(_row(0, "fused", 2e-3), case_id="u[n=2]", technique="u", git_commit=sha(99)))
    with open_store(store) as opened:
        opened.add(rows)
    return list(fused)


def page(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    out = tmp_path / "page.html"
    result = CliRunner().invoke(main, ["history", "html", "--store", str(tmp_path / "h.sqlite"), "-o", str(out), *args])
    return result.exit_code, result.output, out.read_text() if out.exists() else ""


# -- commit links ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "remote, base",
    [
        ("https://github.com/acme/bench.git", "https://github.com/acme/bench/commit/"),
        ("https://github.com/acme/bench/", "https://github.com/acme/bench/commit/"),
        ("git@github.com:acme/bench.git", "https://github.com/acme/bench/commit/"),
        ("ssh://git@github.com:22/acme/bench.git", "https://github.com/acme/bench/commit/"),
        ("https://ci:s3cret@github.com/acme/bench.git", "https://github.com/acme/bench/commit/"),
        ("git@gitlab.com:group/sub/bench.git", "https://gitlab.com/group/sub/bench/-/commit/"),
        ("https://gitlab.example.org:8443/ml/bench", "https://gitlab.example.org:8443/ml/bench/-/commit/"),
        ("https://example.org/acme/bench.git", None),
        ("/srv/git/bench.git", None),
        ("file:///srv/git/bench.git", None),
        ("https://github.com/acme", None),
        ("", None),
    ],
)
def test_a_remote_in_any_of_gits_forms_gives_its_commit_pages_and_never_its_credentials(remote, base):
    assert links.commit_url_base(remote) == base
    if base:
        assert links.commit_url(base, sha(1).upper()) == base + sha(1)
        assert links.commit_url(base, "main") is None  # not a hash: no link


def test_origin_remote_is_read_from_the_checkout(tmp_path):
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    assert links.origin_remote(tmp_path) is None
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", "git@github.com:acme/bench.git"], check=True)
    assert links.origin_remote(tmp_path) == "git@github.com:acme/bench.git"


# -- the page -------------------------------------------------------------------------------------
def test_the_page_marks_a_planted_10_percent_step_at_its_run_with_commits_linked_to_github(tmp_path):
    write_step_history(tmp_path / "h.sqlite")
    code, output, text = page(tmp_path, "--remote", "git@github.com:acme/bench.git")
    assert code == 0, output
    changed = re.search(r'<table id="latest-table" class="latest">.*?</table>', text, re.S)[0]
    (fused,) = re.findall(r"<tr><td.*?</tr>", changed, re.S)  # the one change: fused's step
    assert "t[model=x,n=1]" in fused and "<td>fused</td>" in fused
    assert f'href="https://github.com/acme/bench/commit/{sha(6)}"' in fused and "(run06)" in fused
    assert "regression" in fused
    assert re.search(r"\+(9|10|11)\.\d%", fused)  # the magnitude of the step made
    unchanged = re.search(r'<table id="unchanged-table" class="latest">.*?</table>', text, re.S)[0]
    loop = next(r for r in re.findall(r"<tr><td.*?</tr>", unchanged, re.S) if "<td>loop</td>" in r)
    assert "t[model=x,n=1]" in loop and "<td>none</td>" in loop  # the unchanged variant: no change point
    # the chart's SVG: the magnitude label, and each commit label linking its page
    assert re.search(r"\+(9|10|11)\.\d% fused", text)
    assert f'xlink:href="https://github.com/acme/bench/commit/{sha(11)}"' in text


def test_the_change_point_line_sits_where_the_new_level_starts(tmp_path):
    write_step_history(tmp_path / "h.sqlite")
    with open_store(tmp_path / "h.sqlite") as opened:
        (group, _) = trends.technique_histories(opened, MODEL, changepoints.case_histories(opened, MODEL))
    ((case_id, histories),) = [c for c in group.cases if c[0] == "t[model=x,n=1]"]
    fig = trend_figure(
        histories, trends.points_by_run(histories), {"fused": "optimized", "loop": "baseline"}, lambda commit: None
    )
    marks = [line.get_xdata()[0] for ax in fig.axes for line in ax.lines if line.get_gid() == REFERENCE]
    assert marks == [5.5]  # between run 5 and run 6: the step starts at run 6


def test_without_a_known_remote_commits_are_plain_text(tmp_path, monkeypatch):
    monkeypatch.setattr(links, "origin_remote", lambda where=".": None)
    write_step_history(tmp_path / "h.sqlite")
    code, output, text = page(tmp_path)
    assert code == 0, output
    assert "https://github.com" not in text and "xlink:href=\"http" not in text
    assert f'<code title="{sha(6)}">{sha(6)[:7]}</code>' in text
    assert "not linked: no remote known" in text


def test_cases_group_by_technique_and_a_case_with_one_run_shows_its_point_and_says_so(tmp_path):
    write_step_history(tmp_path / "h.sqlite")
    code, output, text = page(tmp_path, "--remote", "https://example.org/acme/bench")
    assert code == 0, output
    assert [m for m in re.findall(r'<section id="tech-(\w+)"', text)] == ["t", "u"]
    single = re.search(r'<section id="tech-u".*?</section>', text, re.S)[0]
    assert "one run so far" in single and 'id="data-' in single  # its one point is drawn
    assert "is not a GitHub or GitLab remote" in text


@pytest.mark.parametrize(
    "args, says", [((), "there is none"), (("--device", "NVIDIA B200"), "no runs of device model 'NVIDIA B200'")]
)
def test_an_absent_store_or_an_unknown_device_model_exits_2_naming_what_it_holds(tmp_path, args, says):
    """An absent store is named and not created (the page only reads); a model the store does not
    hold: the models it holds are named."""
    if args:
        write_step_history(tmp_path / "h.sqlite")
    code, output, text = page(tmp_path, *args)
    assert code == 2 and says in output and "Traceback" not in output and text == ""
    assert (tmp_path / "h.sqlite").exists() == bool(args)
    if args:
        assert "'NVIDIA H100' (12 runs)" in output


def test_an_unwritable_page_path_exits_2_naming_it(tmp_path):
    write_step_history(tmp_path / "h.sqlite", runs=4, step_at=None)
    (tmp_path / "a-file").write_text("")
    result = CliRunner().invoke(
        main, ["history", "--store", str(tmp_path / "h.sqlite"), "html", "-o", str(tmp_path / "a-file" / "page.html")]
    )
    assert result.exit_code == 2 and "cannot write the history page there" in result.output


# -- the report's sparklines ----------------------------------------------------------------------
def runs_of(tmp_path: Path, count: int = 5) -> list[Path]:
    """``count`` runs, each case's optimized time 10% above the run before."""
    return [
        write_run(
            tmp_path / "runs",
            f"r{i}",
            f"2026-12-0{i + 1}T00:00:00+00:00",
            f"{i:040x}",
            optimized_s=1e-3 * (1 + 0.1 * i),
        )
        for i in range(count)
    ]


def sparklines(report: str) -> list[tuple[list[tuple[float, float]], tuple[float, float]]]:
    """Each sparkline's polyline points and its marked point."""
    out = []
    for svg in re.findall(r'<svg class="sparkline".*?</svg>', report, re.S):
        points = [tuple(map(float, p.split(","))) for p in re.search(r'points="([^"]+)"', svg)[1].split()]
        marked = re.search(r'<circle class="current" cx="([\d.]+)" cy="([\d.]+)"', svg)
        out.append((points, (float(marked[1]), float(marked[2]))))
    return out


def test_a_sparkline_holds_the_runs_up_to_this_one_in_order_with_this_run_marked(tmp_path):
    dirs = runs_of(tmp_path)
    _add(dirs[:4], tmp_path / "h.sqlite")  # r4 is not in the store: its report still ends with its point
    for report_of, expected in ((dirs[2], 3), (dirs[4], 5)):
        text = html.write_report(report_of, history_store=str(tmp_path / "h.sqlite")).html.read_text()
        lines = sparklines(text)
        assert len(lines) == 3 and "<th" in text and ">history</th>" in text  # every case of the run
        timed = lines[0]  # case "t n=0": slower run by run, so each point higher (smaller y) than the last
        xs, ys = zip(*timed[0])
        assert len(xs) == expected and list(xs) == sorted(xs) and list(ys) == sorted(ys, reverse=True)
        assert timed[1] == timed[0][-1]  # this run: the last point, marked
        assert 'id="history-note"' not in text


def test_a_report_without_a_store_says_why_once_and_creates_none(tmp_path):
    (run,) = runs_of(tmp_path, 1)
    missing = tmp_path / "none.sqlite"
    text = html.write_report(run, history_store=str(missing)).html.read_text()
    assert text.count("no history sparklines: there is no history store at") == 1
    assert not sparklines(text) and ">history</th>" not in text and not missing.exists()


def test_a_store_that_cannot_be_read_costs_the_sparklines_never_the_report(tmp_path):
    (run,) = runs_of(tmp_path, 1)
    corrupt = tmp_path / "h.sqlite"
    corrupt.write_bytes(b"not a database at all" * 10)
    text = html.write_report(run, history_store=str(corrupt)).html.read_text()
    assert text.count("no history sparklines:") == 1 and "not an SQLite database" in text
    assert corrupt.read_bytes() == b"not a database at all" * 10


def test_a_case_with_fewer_than_two_runs_gets_no_sparkline_and_the_report_says_why(tmp_path):
    (run,) = runs_of(tmp_path, 1)
    _add([run], tmp_path / "h.sqlite")  # the store holds only this run
    text = html.write_report(run, history_store=str(tmp_path / "h.sqlite")).html.read_text()
    assert not sparklines(text) and text.count("holds no earlier run of this run") == 1


def test_gpubench_report_reads_the_store_it_is_given_or_none_with_no_history(tmp_path):
    dirs = runs_of(tmp_path, 3)
    _add(dirs, tmp_path / "h.sqlite")
    args = ["report", str(dirs[2]), "--store", str(tmp_path / "h.sqlite")]
    assert CliRunner().invoke(main, args).exit_code == 0
    assert len(sparklines((dirs[2] / "report.html").read_text())) == 3
    assert CliRunner().invoke(main, [*args, "--no-history"]).exit_code == 0
    text = (dirs[2] / "report.html").read_text()
    assert not sparklines(text) and "the history store was not read (--no-history)" in text


def test_a_sparkline_escapes_what_the_results_named_and_draws_only_numbers():
    svg = sparkline_svg([1.0, 3.0, 2.0], 2, '<script>alert(1)</script>')
    assert "<script>" not in svg and "&lt;script&gt;" in svg
    assert re.fullmatch(r"[\d., ]+", re.search(r'points="([^"]+)"', svg)[1])


@pytest.mark.e2e  # two (toy) scenario runs
def test_gpubench_run_reports_each_case_with_its_sparkline_from_the_store_it_adds_to(toys, write_scenario, tmp_path):
    path = write_scenario("name: ok\nentries:\n  - technique: toy_kernel\n")
    args = [
        "run",
        "--scenario",
        str(path),
        "--out",
        str(tmp_path / "runs"),
        "--no-calibrate",
        "--isolation",
        "none",
        "--store",
        str(tmp_path / "h.sqlite"),
    ]
    for _ in range(2):
        result = CliRunner().invoke(main, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
    report = re.search(r"report: (\S+)", result.output)[1]
    (line,) = sparklines(Path(report).read_text())
    assert len(line[0]) == 2 and line[1] == line[0][-1]


@pytest.mark.e2e
@pytest.mark.timeout(300)
@pytest.mark.parametrize("phone", [False, True])
def test_a_page_of_many_long_named_cases_fits_the_browser_page_with_every_text_in_its_figure(tmp_path, phone):
    """Headless Chromium (tests/test_report_browser.py's probe), 1300 px wide and a phone's 390 px,
    every <details> closed then opened: no script error, nothing wider than the page (a trend grid
    of one column on a phone; the latest-change table and a case's table of six variants by run
    scroll in their own box), every SVG text inside its figure."""
    from test_report_browser import PHONE, WIDTH, needs_chromium, probe

    needs_chromium()
    rows = []
    others = ("two_buffers_prefetch", "one_buffer_prefetch", "no_checkpoint", "checkpoint_every_layer")
    for c in range(12):
        technique = ("flash_attention", "paged_attention", "moe_grouping")[c % 3]
        params = {"batch": c, "dtype": "bf16", "head_dim": 128, "heads": 32, "kv_heads": 8, "seq_len": 4096}
        case_id = technique + "[" + ",".join(f"{k}={v}" for k, v in params.items()) + "]"
        fused = history_values(c, 12, step_at=6 if c % 4 == 0 else None)
        variants = (
            [("fused", fused), ("loop", history_values(50 + c, 12))]
            if c
            else [("fused", fused), ("loop", history_values(50, 12))]
            + [(v, history_values(60 + k, 12)) for k, v in enumerate(others)]
        )
        rows += [
            dataclasses.replace(
                _row(i, variant, float(v[i]) * (1 + c)),
                case_id=case_id,
                technique=technique,
                params_json=json.dumps(params),
                git_commit=sha(i),
            )
            for i in range(12)
            for variant, v in variants
        ]
    with open_store(tmp_path / "h.sqlite") as opened:
        opened.add(rows)
    code, output, _ = page(tmp_path, "--remote", "https://github.com/acme/bench")
    assert code == 0, output
    width = PHONE if phone else WIDTH
    result, console_errors = probe(tmp_path / "page.html", tmp_path, width)
    assert not result["errors"] and not console_errors, (result["errors"], console_errors)
    for state in ("closed", "opened"):
        seen = result[state]
        assert seen["svgs"] >= 12 and seen["bad_svgs"] == 0, (state, seen)
        assert seen["outside"] == [], (state, seen["outside"][:10])
        assert seen["scroll_width"] <= seen["inner_width"] == width and seen["wide"] == [], (state, seen["wide"][:10])


@pytest.mark.e2e
@pytest.mark.timeout(900)  # the session's small real run (~10 s, ~35 s where the speculative pair is not cached)
def test_the_widest_report_keeps_every_column_in_view_with_its_history_column(small_run_dir, tmp_path):
    """Issue 24's H200-shaped run (peak memory and energy columns: the widest summary table), with
    three earlier runs of it in the store: in Chromium at 1300 px every column, the history one
    included, is in view and nothing runs off the page."""
    import report_runs
    from test_report_browser import WIDTH, needs_chromium, probe

    needs_chromium()
    doc = report_runs.h200_shaped_doc(small_run_dir)
    earlier = [
        report_runs.write_run(
            tmp_path / f"earlier{i}", {**doc, "run_id": f"earlier{i}", "started_at": f"2025-12-0{i + 1}T00:00:00+00:00"}
        )
        for i in range(3)
    ]
    _add(earlier, tmp_path / "h.sqlite")
    run = report_runs.write_run(tmp_path / "now", doc)
    report = html.write_report(run, history_store=str(tmp_path / "h.sqlite")).html
    assert len(sparklines(report.read_text())) == len(doc["cases"])
    result, console_errors = probe(report, tmp_path)
    assert not result["errors"] and not console_errors, (result["errors"], console_errors)
    seen = result["closed"]
    heads = [name for name, _, _ in seen["summary_heads"]]
    assert "history" in heads and all(0 <= left < right <= WIDTH for _, left, right in seen["summary_heads"]), heads
    assert seen["scroll_width"] <= WIDTH and seen["wide"] == [], seen["wide"][:10]


def test_a_case_new_to_the_history_has_no_sparkline_and_one_note_counts_such_cases(tmp_path):
    earlier = write_run(tmp_path / "runs", "r0", "2026-12-01T00:00:00+00:00", "0" * 40, n_cases=1)
    now = write_run(tmp_path / "runs", "r1", "2026-12-02T00:00:00+00:00", "1" * 40, n_cases=2)  # adds "t n=1"
    _add([earlier], tmp_path / "h.sqlite")
    text = html.write_report(now, history_store=str(tmp_path / "h.sqlite")).html.read_text()
    assert len(sparklines(text)) == 2  # "t n=0" and "kv bytes"
    row = re.search(r'<tr id="case-2".*?</tr>', text, re.S)[0]  # "t n=1": its cell is empty
    assert 'class="spark"></td>' in row
    assert text.count("history: 1 case without a sparkline") == 1


def test_a_token_in_the_remote_never_reaches_the_page(tmp_path):
    """CI's origin often carries a token (GitLab's gitlab-ci-token, a GitHub app's): the page is
    meant to be published, so it shows and links the remote without its user and password."""
    write_step_history(tmp_path / "h.sqlite")
    code, output, text = page(tmp_path, "--remote", "https://x-access-token:ghp_SECRET123@github.com/acme/bench.git")
    assert code == 0, output
    assert "SECRET123" not in text and "x-access-token" not in text
    assert "<code>https://github.com/acme/bench.git</code>" in text
    assert f'href="https://github.com/acme/bench/commit/{sha(6)}"' in text
