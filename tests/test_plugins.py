"""Techniques from outside the package: a file or module a scenario names, or an installed package's
entry point, runs through run, report and the gate like a built-in; a broken one is bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpubench.errors import BadInput
from gpubench.run import scenario

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "rmsnorm_pair.py"


def gpubench(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The installed command in a fresh process: nothing registered in this test session leaks in."""
    command = [sys.executable, "-m", "gpubench.cli", *args]
    return subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})}
    )


def gpubench_here(*args: str):
    """The command in this process (click's runner): for what needs no fresh process, as the gate,
    which reads only results files, and a scenario refused before anything is registered."""
    from click.testing import CliRunner

    from gpubench.cli import main

    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def scenario_text(technique: str) -> str:
    return textwrap.dedent(f"""\
        name: mine
        policy: {{warmup_s: 0, min_reps: 3, max_reps: 5, min_time_s: 0, max_time_s: 0.5, energy_s: 0}}
        entries:
          - technique: {technique}
            params: {{rows: [64, 128], hidden: 64}}
        """)


@pytest.mark.e2e
def test_a_pair_in_a_file_outside_the_repository_runs_reports_and_passes_the_gate(tmp_path):
    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(EXAMPLE, work / "my_pair.py")
    (work / "my.yaml").write_text(scenario_text("my_pair.py"))
    ran = gpubench("run", "--scenario", "my.yaml", "--out", "runs", "--no-calibrate", cwd=work)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    run_dir = next((work / "runs").iterdir())
    doc = json.loads((run_dir / "results.json").read_text())
    assert [c["status"] for c in doc["cases"]] == ["passed", "passed"]
    case = doc["cases"][0]
    assert case["technique"] == "rmsnorm" and case["source"] == str((work / "my_pair.py").resolve())
    assert {n: v["role"] for n, v in case["variants"].items()} == {"eager": "baseline", "fused": "optimized"}
    assert case["variants"]["fused"]["check"]["passed"]
    # A fresh process, from another directory, renders the technique's own description (found
    # through the recorded source), and the gate reads the run (only its results: in this process).
    reported = gpubench("report", str(run_dir), cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    assert "RMSNorm: four eager ops" in (run_dir / "report.html").read_text()
    gate = gpubench_here("compare", str(run_dir), str(run_dir))
    assert gate.exit_code == 0, gate.output


@pytest.mark.e2e
def test_a_module_on_the_path_and_an_installed_entry_point_are_found_and_listed(tmp_path):
    site = tmp_path / "site"
    (site / "my_pkg").mkdir(parents=True)
    (site / "my_pkg" / "__init__.py").write_text("")
    (site / "my_pkg" / "norm_pair.py").write_text(EXAMPLE.read_text())
    (site / "broken_pkg.py").write_text("raise ImportError('a dependency is missing')\n")
    dist = site / "my_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[gpubench.techniques]\nrmsnorm = my_pkg.norm_pair\nbroken = broken_pkg\n")
    env = {"PYTHONPATH": str(site)}
    listed = gpubench("list", cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert "rmsnorm (kernel): RMSNorm" in listed.stdout and "from: my_pkg.norm_pair" in listed.stdout
    assert "broken (entry point, not loaded)" in listed.stdout and "a dependency is missing" in listed.stdout

    # Its cases in the command's own process (--isolation none): a worker loads a plug-in through
    # the same techniques.load, by the recorded source, as the file pair above shows.
    (tmp_path / "by_module.yaml").write_text(scenario_text("my_pkg.norm_pair"))
    ran = gpubench(
        "run",
        "--scenario",
        "by_module.yaml",
        "--out",
        "runs",
        "--no-calibrate",
        "--isolation",
        "none",
        cwd=tmp_path,
        env=env,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    (tmp_path / "by_name.yaml").write_text(scenario_text("broken"))
    refused = gpubench("run", "--scenario", "by_name.yaml", cwd=tmp_path, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "broken" in refused.stderr and "a dependency is missing" in refused.stderr


BROKEN = {
    "no_check.py": (
        "from gpubench.contract import Technique, Workload\n"
        "TECHNIQUE = Technique('half', summary='s', shape='kernel', params=[])\n"
        "TECHNIQUE.build(lambda p, d, s: Workload(p, d, s))\n"
        "TECHNIQUE.variant('a', role='baseline')(lambda w: 1)\n",
        "missing check; missing optimized variant",
    ),
    "no_technique.py": ("X = 1\n", "has no TECHNIQUE"),
    "not_a_technique.py": ("TECHNIQUE = 'flash'\n", "TECHNIQUE is a str, not a gpubench.contract.Technique"),
    "raises.py": ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
    "taken_name.py": (EXAMPLE.read_text().replace('"rmsnorm"', '"flash_attention"'), "registered twice"),
}


@pytest.mark.parametrize("file_name", list(BROKEN))
def test_a_broken_pair_is_bad_input_naming_what_is_missing(tmp_path, file_name):
    source, expected = BROKEN[file_name]
    (tmp_path / file_name).write_text(source)
    path = tmp_path / "s.yaml"
    path.write_text(scenario_text(file_name))
    with pytest.raises(BadInput) as info:
        scenario.load(path)
    assert expected in str(info.value) and "entries[0].technique" in str(info.value)


def test_an_unknown_module_or_missing_file_is_bad_input(tmp_path):
    for spec, expected in (("no_such_pkg.pair", "ModuleNotFoundError"), ("missing.py", "no such file")):
        path = tmp_path / "s.yaml"
        path.write_text(scenario_text(spec))
        with pytest.raises(BadInput, match=expected):
            scenario.load(path)


def test_a_broken_pair_exits_2_with_one_paragraph(tmp_path):
    (tmp_path / "half.py").write_text(BROKEN["no_check.py"][0])
    (tmp_path / "s.yaml").write_text(scenario_text("half.py"))
    # In this process: the pair is refused while the scenario loads, before anything runs or is
    # registered (an exception escaping the command would fail this test, not pass it).
    result = gpubench_here("run", "--scenario", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "runs"))
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert "missing check" in result.stderr and "Bring your own pair" in result.stderr
    assert not (tmp_path / "runs").exists()


def twin_pairs(root: Path) -> dict[str, Path]:
    """a/pair.py and b/pair.py: one file name in two folders, each naming its technique from a
    module beside it that has one name too (naming.py), imported relatively."""
    files = {}
    for folder in ("a", "b"):
        (root / folder).mkdir(parents=True)
        (root / folder / "naming.py").write_text(f"NAME = 'rmsnorm_{folder}'\n")
        source = EXAMPLE.read_text().replace(
            'TECHNIQUE = Technique(\n    "rmsnorm",', 'from . import naming\n\nTECHNIQUE = Technique(\n    naming.NAME,'
        )
        assert "naming.NAME" in source  # the example still reads as this test rewrites it
        (root / folder / "pair.py").write_text(source)
        files[f"rmsnorm_{folder}"] = (root / folder / "pair.py").resolve()
    return files


@pytest.fixture
def forget_twins():
    from gpubench import techniques

    yield
    for name in ("rmsnorm_a", "rmsnorm_b"):
        techniques.unregister(name)


def test_two_plugin_files_of_one_name_are_two_modules_and_leave_sys_path_alone(tmp_path, forget_twins):
    files = twin_pairs(tmp_path)
    path = tmp_path / "twins.yaml"
    path.write_text(scenario_text("a/pair.py") + "  - technique: b/pair.py\n    params: {rows: [64], hidden: 64}\n")
    path_before = list(sys.path)
    loaded = scenario.load(path)
    assert sys.path == path_before
    from gpubench import techniques

    for name, file in files.items():
        tech = techniques.get(name)
        assert tech is not None and tech.source == str(file)
        # Each technique's code lives in its own module, found under its own name (what pickling,
        # typing.get_type_hints and dataclasses look up): the second file did not replace the first.
        assert Path(sys.modules[tech.build_fn.__module__].__file__).resolve() == file
    assert sorted({c.technique for c in loaded.cases()}) == ["rmsnorm_a", "rmsnorm_b"]


def test_a_plugin_file_is_found_again_by_its_recorded_source_in_a_fresh_process(tmp_path):
    files = twin_pairs(tmp_path)
    probe = (
        "import sys; from gpubench import techniques\n"
        "for name, source in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    t = techniques.find(name, source)\n"
        "    print(t.name, t.source, t.build_fn.__module__)\n"
    )
    args = [part for name, file in files.items() for part in (name, str(file))]
    proc = subprocess.run(
        [sys.executable, "-c", probe, *args], cwd=tmp_path.parent, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    assert [(n, s) for n, s, _ in lines] == [(n, str(f)) for n, f in files.items()]
    assert lines[0][2] != lines[1][2]  # two modules in that process too


def test_an_absolute_import_of_a_module_beside_a_plugin_file_is_bad_input_saying_how(tmp_path):
    (tmp_path / "naming.py").write_text("NAME = 'rmsnorm_abs'\n")
    (tmp_path / "pair.py").write_text("import naming\n" + EXAMPLE.read_text())
    path = tmp_path / "s.yaml"
    path.write_text(scenario_text("pair.py"))
    path_before = list(sys.path)
    with pytest.raises(BadInput) as info:
        scenario.load(path)
    assert "No module named 'naming'" in str(info.value) and "from . import naming" in str(info.value)
    assert sys.path == path_before  # and the failed file left no module behind
    assert not [m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(tmp_path / "pair.py")]
