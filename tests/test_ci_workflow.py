"""The GPU regression workflow: a self-hosted GPU runner must never run a fork's pull request, and a
first run on a GPU with no stored baseline says how to store one instead of failing on a missing file."""

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

WORKFLOW = Path(__file__).resolve().parent.parent / ".github" / "workflows" / "gpu-regression.yml"


def load() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    return {**doc, "on": doc.get("on", doc.get(True))}  # YAML 1.1 reads a bare `on` as True


def test_fork_pull_requests_never_reach_the_self_hosted_runner():
    doc = load()
    assert "pull_request_target" not in doc["on"]  # would run with the repository's secrets
    for name, job in doc["jobs"].items():
        if "self-hosted" in job["runs-on"]:
            condition = job.get("if", "")
            assert "github.event.pull_request.head.repo.full_name == github.repository" in condition, name
            assert "github.event_name != 'pull_request'" in condition, name


def test_a_missing_baseline_is_a_warning_with_instructions_and_the_gate_is_skipped(tmp_path, monkeypatch, capsys):
    steps = {s.get("id"): s for s in load()["jobs"]["gpu-quick"]["steps"] if s.get("id")}
    look, gate = steps["stored"], steps["gate"]
    assert "steps.stored.outputs.found == 'yes'" in gate["if"]
    assert "save_baseline" in look["run"] and "baseline save" in look["run"] and "::warning" in look["run"]
    # The step's Python (the store path the gate will read) works against a real results file: run
    # as `python -c` runs it (its own namespace, its own imports, argv after the code), in this
    # process rather than a fresh interpreter importing torch again.
    code = re.search(r"python -c '([^']+)'", look["run"]).group(1)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "results.json").write_text(
        json.dumps(
            {
                "kind": "gpubench.results",
                "schema_version": 2,
                "status": "complete",
                "device_label": "NVIDIA H200",
                "scenario": {"name": "gpu-quick"},
                "cases": [],
                "summary": {"passed": 0, "failed": 0},
            }
        )
    )
    monkeypatch.setattr(sys, "argv", ["-c", str(tmp_path / "store"), str(run_dir)])
    exec(compile(code, "<workflow step 'stored'>", "exec"), {"__name__": "__main__"})
    assert capsys.readouterr().out.strip() == str(tmp_path / "store" / "NVIDIA-H200" / "gpu-quick.json")


# -- the commands the job runs parse with gpubench's CLI ------------------------------------------

SHIM = (
    "#!{python}\nimport json, os, sys\n"
    "with open(os.environ['ARGV_LOG'], 'a') as log:\n    log.write(json.dumps(sys.argv[1:]) + '\\n')\n"
)


def parse_only(argv: list[str]):
    """The click context ``gpubench ARGV`` would run with, parsed and never invoked (click's own
    errors: an unknown option, a missing argument)."""
    import click

    from gpubench.cli import main

    cmd, ctx, name, rest = main, None, "gpubench", list(argv)
    while True:
        ctx = cmd.make_context(name, rest, parent=ctx)
        if not isinstance(cmd, click.Group):
            return ctx
        name, cmd, rest = cmd.resolve_command(ctx, [*ctx._protected_args, *ctx.args])


def run_step(step: dict, workspace: Path, expressions: dict[str, str], env: dict[str, str]) -> list[list[str]]:
    """The step's script under bash -e (as the runner runs it), its ${{ }} expressions replaced;
    .venv/bin/gpubench and pip are shims that record their argv, .venv/bin/python is this Python."""
    import subprocess

    def expression(match: re.Match) -> str:
        assert match.group(1) in expressions, f"an expression this test does not know: {match.group(0)}"
        return expressions[match.group(1)]

    script = re.sub(r"\$\{\{\s*(.*?)\s*\}\}", expression, step["run"])
    log = workspace / "argv.log"
    log.unlink(missing_ok=True)
    proc = subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=workspace,
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": "/usr/bin:/bin",
            "HOME": str(workspace),
            "ARGV_LOG": str(log),
            "GITHUB_OUTPUT": str(workspace / "out"),
            "GITHUB_STEP_SUMMARY": str(workspace / "sum"),
            **env,
        },
    )
    assert proc.returncode == 0, (step["name"], proc.stderr)
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def workspace(tmp_path):
    """A checkout as actions/checkout leaves it (fetch-depth 0: origin/main and the tags), a run
    directory, and the shims."""
    import subprocess

    def git(*args):
        subprocess.run(
            ["git", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(tmp_path),
                "GIT_AUTHOR_NAME": "t",
                "GIT_AUTHOR_EMAIL": "t@t",
                "GIT_COMMITTER_NAME": "t",
                "GIT_COMMITTER_EMAIL": "t@t",
            },
        )

    git("init", "-q", "-b", "main")
    for i in range(3):
        git("commit", "-q", "--allow-empty", "-m", f"c{i}")
        if i == 0:
            git("tag", "v1.2")
        if i == 1:
            git("tag", "nightly-1")  # not a release tag: --since skips it
    git("update-ref", "refs/remotes/origin/main", "HEAD")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("gpubench", "pip"):
        (bin_dir / name).write_text(SHIM.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)
    run_dir = tmp_path / "runs" / "20261205-000000-gpu-quick"
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(
        json.dumps(
            {  # read by the step that looks for a stored baseline
                "kind": "gpubench.results",
                "schema_version": 2,
                "status": "complete",
                "device_label": "NVIDIA H200",
                "scenario": {"name": "gpu-quick"},
                "cases": [],
                "summary": {"passed": 0, "failed": 0},
            }
        )
    )
    return tmp_path


EXPRESSIONS = {
    "steps.run.outputs.dir": "runs/20261205-000000-gpu-quick",
    "steps.run.outputs.exit": "0",
    "github.event.repository.default_branch": "main",
}


@pytest.mark.parametrize("event,base", [("pull_request", "main"), ("push", "")])
def test_every_gpubench_command_of_the_job_parses_and_the_history_gate_reads_main_since_the_release(
    workspace, event, base
):
    """Each step that runs gpubench, run by bash as the runner would (a pull request, whose base is
    GITHUB_BASE_REF, and a push to main): every command it runs parses with gpubench's CLI, and
    compare --history judges the run against main since the last v* tag reachable from main."""
    steps = load()["jobs"]["gpu-quick"]["steps"]
    ran = {}
    for step in steps:
        # the steps that run gpubench, but the install (it makes the venv; `gpubench env` has no options)
        if ".venv/bin/gpubench" in step.get("run", "") and "-m venv" not in step["run"]:
            ran[step["name"]] = run_step(step, workspace, EXPRESSIONS, {"GITHUB_BASE_REF": base})
    calls = [argv for argvs in ran.values() for argv in argvs]
    gpubench = [argv for argv in calls if argv[:1] != ["install"]]
    assert {argv[0] for argv in gpubench} == {"run", "compare", "baseline"}
    contexts = [parse_only(argv) for argv in gpubench]  # raises on an option gpubench does not have
    (history,) = [c for c in contexts if c.info_name == "compare" and c.params["use_history"]]
    (pairwise,) = [c for c in contexts if c.info_name == "compare" and not c.params["use_history"]]
    assert pairwise.params["baseline_store"] == Path("baselines-store")
    assert history.params["paths"] == (Path(EXPRESSIONS["steps.run.outputs.dir"]),)
    assert (history.params["base_branch"], history.params["since"]) == ("main", "v1.2")
    assert history.params["markdown_path"] == Path("history.md")
    summary = next(s for s in steps if s.get("name") == "Job summary")["run"]
    assert "history.md" in summary


def test_without_a_release_tag_the_history_gate_runs_without_since(workspace):
    import subprocess

    subprocess.run(["git", "tag", "-d", "v1.2"], cwd=workspace, check=True, capture_output=True)
    step = next(s for s in load()["jobs"]["gpu-quick"]["steps"] if s.get("id") == "history")
    (argv,) = run_step(step, workspace, EXPRESSIONS, {"GITHUB_BASE_REF": "main"})
    ctx = parse_only(argv)
    assert ctx.params["use_history"] and ctx.params["since"] is None and ctx.params["base_branch"] == "main"


def test_the_history_store_persists_outside_the_checkout_and_the_checkout_has_the_tags():
    job = load()["jobs"]["gpu-quick"]
    assert job["env"]["GPUBENCH_HISTORY"] == "${{ vars.GPUBENCH_HISTORY }}"  # empty: ~/.local/share/gpubench
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout"))
    assert checkout["with"]["fetch-depth"] == 0
    install = next(s for s in job["steps"] if s.get("name", "").startswith("Install"))["run"]
    assert "apache-otava==0.8.0" in install and "--no-deps" in install
    # the pairwise gate still runs after a failed history gate, so the summary shows both verdicts
    gate = next(s for s in job["steps"] if s.get("id") == "gate")
    assert "!cancelled()" in gate["if"]
