"""The history gate's branches and releases (issue 27.3): a pull request's runs never move its base
branch's level, `compare --history` judges a run against its base branch (main by default), runs
that recorded no branch count as the default branch's, and `--since` takes a release tag of the
repository (resolved by git, in a temporary repository here). Synthetic histories of real CPU
noise (tests/data/cpu_noise.json, as in test_changepoints)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from test_changepoints import _current_run, _row, history_values

from gpubench.cli import main
from gpubench.errors import BadInput
from gpubench.gate.history import open_store
from gpubench.gate.history import since as since_mod

MODEL = "NVIDIA H100"


def add_runs(store_path, values, *, branch="main", first=0, commits=None):
    """Runs ``first``, ``first + 1``, ... of the optimized variant "fused" with these figures."""
    rows = [
        dataclasses.replace(
            _row(first + i, "fused", float(v)),
            branch=branch,
            git_commit=(commits[i] if commits else f"c{first + i:02d}"),
        )
        for i, v in enumerate(values)
    ]
    with open_store(store_path) as store:
        store.add(rows)


def compare_history(tmp_path, store, figure, *extra):
    out = CliRunner().invoke(
        main,
        [
            "compare",
            "--history",
            "--store",
            str(store),
            "--json",
            *extra,
            str(_current_run(Path(tempfile.mkdtemp(dir=tmp_path)), figure)),
        ],
    )
    return out.exit_code, (json.loads(out.output) if out.exit_code in (0, 1) else out.output)


def test_a_pull_request_s_runs_never_move_main_s_level(tmp_path):
    """main at level L for 12 runs, then a PR branch's 6 runs 30% slower (stored too): a run at L
    judged against main passes on main's 12 runs; judged against the PR branch it reads faster."""
    store = tmp_path / "h.sqlite"
    main_values = history_values(5, 12)
    add_runs(store, main_values)
    add_runs(store, history_values(6, 6) * 1.3, branch="feature", first=12)
    level = float(np.median(main_values))
    code, doc = compare_history(tmp_path, store, level)
    assert code == 0 and doc["branches"] == {MODEL: "main"}
    ((case),) = doc["cases"]
    assert (case["verdict"], case["level_runs"], case["since_commit"]) == ("passed", 12, None)
    code, doc = compare_history(tmp_path, store, level, "--branch", "feature")
    assert code == 0 and doc["cases"][0]["verdict"] == "improved" and doc["cases"][0]["level_runs"] == 6
    with open_store(store) as opened:  # every run, read without a branch: the PR's step is a change point
        assert len(opened.series(MODEL, "t[model=x,n=1]", "fused")) == 18
        assert [p.branch for p in opened.series(MODEL, "t[model=x,n=1]", "fused", branch="main")] == ["main"] * 12


def test_a_regression_on_main_fails_a_run_even_when_a_pr_branch_is_slower_still(tmp_path):
    """The level is main's: a run 15% above it regresses however the other branches' runs lie."""
    store = tmp_path / "h.sqlite"
    main_values = history_values(7, 10)
    add_runs(store, main_values)
    add_runs(store, history_values(8, 8) * 1.2, branch="feature", first=10)
    code, doc = compare_history(tmp_path, store, float(np.median(main_values)) * 1.15)
    assert code == 1 and doc["cases"][0]["verdict"] == "regressed" and doc["cases"][0]["level_runs"] == 10


@pytest.mark.parametrize(
    "held,default",
    [
        ({"feature": 3, "main": 1, "master": 5}, "main"),
        ({"feature": 3, "master": 1}, "master"),
        ({"feature": 2, "dev": 3, "zeta": 3}, "dev"),
        ({None: 4}, None),
    ],
)
def test_the_default_branch_is_main_else_master_else_the_one_with_most_runs(tmp_path, held, default):
    store = tmp_path / "h.sqlite"
    first = 0
    for branch, runs in held.items():
        add_runs(store, [1.0] * runs, branch=branch, first=first)
        first += runs
    with open_store(store) as opened:
        assert opened.default_branch(MODEL) == default
        assert opened.branches(MODEL) == held if None in held else dict(sorted(held.items()))


def test_runs_without_a_branch_count_as_the_trunk_s_and_never_a_pull_request_s(tmp_path):
    """Runs older than branch recording (branch NULL) are the trunk's: read with main's (named or
    not yet held: the day after an upgrade, CI's `--branch main` must still see them), never with
    a PR branch's, even when that branch is the only named one; a PR branch takes them only as the
    default branch with more runs than they are."""
    store = tmp_path / "h.sqlite"
    add_runs(store, [1.0] * 3, branch=None)
    add_runs(store, [1.1] * 2, branch="feature", first=3)
    with open_store(store) as opened:
        assert opened.default_branch(MODEL) == "main"
        assert [p.branch for p in opened.series(MODEL, "t[model=x,n=1]", "fused", branch="main")] == [None] * 3
        assert len(opened.series(MODEL, "t[model=x,n=1]", "fused", branch="feature")) == 2
    add_runs(store, [1.2] * 1, branch="main", first=5)
    with open_store(store) as opened:
        main_points = opened.series(MODEL, "t[model=x,n=1]", "fused", branch="main")
        assert [p.branch for p in main_points] == [None] * 3 + ["main"]
        assert [p.branch for p in opened.series(MODEL, "t[model=x,n=1]", "fused", branch="feature")] == ["feature"] * 2


def test_gpubench_history_shows_the_default_branch_and_refuses_a_branch_it_does_not_hold(tmp_path):
    store = tmp_path / "h.sqlite"
    add_runs(store, history_values(5, 12, step_at=6))
    add_runs(store, history_values(6, 4), branch="feature", first=12)
    out = CliRunner().invoke(main, ["history", "--store", str(store)], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "NVIDIA H100, branch main" in out.output, out.output
    assert "c06 (run06)" in out.output and " 12 " in out.output  # main's 12 runs, the PR's 4 left out
    out = CliRunner().invoke(main, ["history", "--store", str(store), "--branch", "feature"], env={"COLUMNS": "200"})
    assert out.exit_code == 0 and "branch feature" in out.output and " 4 " in out.output, out.output
    out = CliRunner().invoke(main, ["history", "--store", str(store), "--branch", "nope"])
    assert out.exit_code == 2 and "'nope'" in out.output and "main (12 runs)" in out.output
    assert "feature (4 runs)" in out.output and "Traceback" not in out.output


def test_store_since_and_branch_options_belong_to_compare_history(tmp_path):
    run = _current_run(tmp_path, 1.0)
    out = CliRunner().invoke(main, ["compare", "--branch", "main", str(run), str(run)])
    assert out.exit_code == 2 and "--branch go with --history" in out.output


# -- --since: run ids, commits and release tags --------------------------------------------------


def git(repo, *args) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
            "HOME": str(repo),
            "PATH": "/usr/bin:/bin",
        },
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository of 16 commits on main; v1.0 tags commit 7 (annotated), v0.9 commit 2."""
    path = tmp_path / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    shas = []
    for i in range(16):
        git(path, "commit", "-q", "--allow-empty", "-m", f"commit {i}")
        shas.append(git(path, "rev-parse", "HEAD"))
        if i == 2:
            git(path, "tag", "v0.9")
        if i == 7:
            git(path, "tag", "-a", "v1.0", "-m", "release 1.0")
    return path, shas


def test_since_a_release_tag_lists_main_s_regressions_after_it_and_not_before(tmp_path, repo, monkeypatch):
    """Steps up at run 4 and at run 11; v1.0 tags a commit no run measured (commit 7; runs
    measured the commits but 7): from v1.0 on, only the step at run 11 is listed; from v0.9, both."""
    path, shas = repo
    commits = [s for i, s in enumerate(shas) if i != 7]  # 15 runs
    values = history_values(21, 15)
    values[4:] *= 1.12
    values[11:] *= 1.12
    store = tmp_path / "h.sqlite"
    add_runs(store, values, commits=commits)
    monkeypatch.chdir(path)
    code, doc = compare_history(tmp_path, store, float(values[-1]), "--since", "v1.0")
    assert code == 0, doc
    assert doc["since"] == {"text": "v1.0", "how": "git revision", "commit": shas[7]}
    assert [r["commit"] for r in doc["regressions_since"]] == [commits[11]]
    code, doc = compare_history(tmp_path, store, float(values[-1]), "--since", "v0.9")
    assert [r["commit"] for r in doc["regressions_since"]] == [commits[4], commits[11]]
    code, doc = compare_history(tmp_path, store, float(values[-1]), "--since", commits[9][:10])  # a stored commit
    assert doc["since"]["how"] == "commit" and [r["commit"] for r in doc["regressions_since"]] == [commits[11]]


def test_since_that_matches_nothing_is_exit_2_saying_what_was_tried(tmp_path, repo, monkeypatch):
    path, _ = repo
    store = tmp_path / "h.sqlite"
    add_runs(store, history_values(3, 8))
    monkeypatch.chdir(path)
    code, output = compare_history(tmp_path, store, 1.0, "--since", "v7.7")
    assert code == 2 and "Traceback" not in output
    for tried in (
        "--since v7.7",
        "run id",
        "commit prefix",
        "8 runs",
        "git rev-parse --verify 'v7.7^{commit}'",
        str(path),
        "fetch-depth: 0",
    ):
        assert tried in output.replace("\n", " "), tried
    monkeypatch.chdir(tmp_path)  # not a repository at all: git's own reason is given
    code, output = compare_history(tmp_path, store, 1.0, "--since", "v1.0")
    assert code == 2 and "not a git repository" in output.replace("\n", " ")


def test_a_tag_never_reads_as_an_option_to_git(tmp_path):
    with pytest.raises(BadInput, match="starts with '-'"):
        since_mod.resolve("--output=/tmp/x", [], repo=tmp_path)


def test_compare_history_writes_its_verdicts_and_the_regressions_since_as_markdown(tmp_path):
    """The job summary of the GPU workflow: FAIL with the regressed case's row and the change since
    the release, from the same verdicts as the exit code."""
    store = tmp_path / "h.sqlite"
    values = history_values(5, 14, step_at=6)
    add_runs(store, values)
    md = tmp_path / "history.md"
    code, _ = compare_history(
        tmp_path, store, float(np.median(values[6:])) * 1.15, "--since", "c03", "--markdown", str(md)
    )
    text = md.read_text()
    assert code == 1 and text.startswith("### History gate: FAIL (1 regressed of 1 cases)")
    assert "| regressed | `t[model=x,n=1]` | fused | time |" in text and "branch main" in text
    assert "Regressions since c03 (a stored commit): 1" in text and "from c06 (run06)" in text


def test_the_day_after_an_upgrade_main_s_gate_reads_the_runs_that_recorded_no_branch(tmp_path):
    """Every old run has no branch and the first new one is a pull request's: CI's `compare
    --history --branch main` still judges against the old runs (it read none, and passed a 30%
    regression as inconclusive, before this was fixed)."""
    store = tmp_path / "h.sqlite"
    values = history_values(5, 12)
    add_runs(store, values, branch=None)
    add_runs(store, [float(np.median(values)) * 0.7], branch="feature-x", first=12)
    code, doc = compare_history(tmp_path, store, float(np.median(values)) * 1.3, "--branch", "main")
    assert code == 1 and doc["cases"][0]["verdict"] == "regressed" and doc["cases"][0]["level_runs"] == 12
    code, doc = compare_history(tmp_path, store, float(np.median(values)) * 1.3)  # no --branch: main too
    assert code == 1 and doc["branches"] == {MODEL: "main"}


def test_a_base_branch_the_store_holds_no_run_of_is_exit_2_not_a_silent_pass(tmp_path):
    """A typo (`--branch mian`) read no run and passed every case as inconclusive; now it is bad
    input naming the branches held."""
    store = tmp_path / "h.sqlite"
    add_runs(store, history_values(5, 12))
    code, output = compare_history(tmp_path, store, 1.0, "--branch", "mian")
    assert code == 2 and "'mian'" in output and "main (12 runs)" in output and "Traceback" not in output


def test_a_short_or_numeric_release_name_is_not_read_as_a_stored_commit_prefix(tmp_path):
    """`--since 2024` (a tag) named the first stored commit starting with those digits; a prefix
    now needs 7+ hex digits (git's abbreviation), while a stored commit given whole still matches."""
    from test_changepoints import points_of

    points = points_of([1.0, 1.0, 1.0], commits={0: "2024aa0" + "0" * 33, 1: "c01", 2: "feedbeef" * 5})
    with pytest.raises(BadInput, match="matches nothing"):
        since_mod.resolve("2024", points, repo=tmp_path)
    assert since_mod.resolve("2024aa0", points, repo=tmp_path).how == "commit"
    assert since_mod.resolve("c01", points, repo=tmp_path).how == "commit"
    assert not since_mod._is_ancestor(tmp_path, "feedbeef" * 5, "--help")  # free text never reaches git
