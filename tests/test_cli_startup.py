"""The commands that only read or refuse start without torch (issue 35 point 5): `--help`, an
option or scenario name refused, a scenario refused for its keys or values, `list`, `history`,
`compare` and `report` of a run that recorded its declarations. Each runs in a fresh interpreter, which then says whether torch or triton was
imported; no timing here (benchmarks/cli_startup.py measures it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cli_probe import probe
from report_runs import recorded_runs


def _probe(tmp_path: Path, *args: str) -> dict:
    result = probe(tmp_path, *args)
    return {**result, "heavy": result["imported"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """Two runs of schema 3 (declarations recorded, as every run writes them now): a report of
    them needs no technique code."""
    return recorded_runs(tmp_path_factory.mktemp("runs"))


@pytest.mark.parametrize(
    "args, code",
    [
        (["--help"], 0),
        (["run", "--help"], 0),
        (["report", "--help"], 0),
        (["run", "--no-such-option"], 2),
        (["run", "--scenario", "smokee"], 2),  # a misspelt scenario name
        (["run", "--budget", "soon"], 2),
        (["compare", "--help"], 0),
        (["history"], 2),  # no store yet: refused
        (["history", "html", "--help"], 0),
    ],
)
def test_help_and_refusals_import_no_torch(tmp_path, args, code):
    """`gpubench --help`, a bad option and a misspelt scenario name are answered before torch is
    imported (it took 11-21 s on a busy machine)."""
    result = _probe(tmp_path, *args)
    assert result["code"] == code, result["stderr"]
    assert result["heavy"] == [], f"gpubench {' '.join(args)} imported {result['heavy']}"


BAD_SCENARIOS = {
    "unknown param": "  - technique: kv_cache\n    params: {no_such: 1}\n",
    "bad value": "  - technique: flash_attention\n    params: {dtype: float8, seq_len: -4}\n",
    "unknown technique": "  - technique: flash_atention\n  - technique: nosuchthing\n",
    # a model param's own value check (Param.value_check, torch-free): a misspelt preset, a missing file
    "misspelt model": (
        "  - technique: kv_cache\n    params: {model: lama-2-7b}\n"
        "  - technique: paged_kv_serving\n    params: {model: [tiny, /no/such/config.json]}\n"
    ),
    # beside a valid entry of a technique with cross-param rules (code): those wait for the fix
    "unknown param beside a valid moe entry": (
        "  - technique: moe_grouping\n    params: {experts: 8, top_k: 2}\n"
        "  - technique: kv_cache\n    params: {no_such: 1}\n"
    ),
}


@pytest.mark.parametrize("what", BAD_SCENARIOS)
def test_a_scenario_refused_for_its_keys_or_values_imports_no_torch(tmp_path, what):
    """An unknown technique or param, or a value of the wrong type, choice or range, is refused
    (exit 2, the file:line paragraph) from the catalogue of the built-ins' declarations: no torch."""
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nentries:\n" + BAD_SCENARIOS[what])
    result = _probe(tmp_path, "run", "--scenario", str(path))
    assert result["code"] == 2, result["stderr"]
    assert f"{path}:" in result["stderr"] and "nothing was run" in result["stderr"], result["stderr"]
    assert result["heavy"] == [], f"a scenario with an {what} imported {result['heavy']}"
    if "beside" in what:  # the rules not checked are said to wait, not silently passed
        assert "own rules across params are checked once these are fixed" in result["stderr"], result["stderr"]


def test_cross_param_rules_are_still_checked_once_nothing_else_is_wrong(tmp_path):
    """A scenario whose keys and values are all valid is checked against each technique's own
    rules across params (moe: top_k above experts), every problem named, exit 2."""
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nentries:\n  - technique: moe_grouping\n    params: {experts: 2, top_k: 4}\n")
    result = _probe(tmp_path, "run", "--scenario", str(path))
    assert result["code"] == 2, result["stderr"]
    assert "moe_grouping.params" in result["stderr"] and "top_k" in result["stderr"], result["stderr"]
    assert "checked once these are fixed" not in result["stderr"]


def test_list_imports_no_torch(tmp_path):
    """`gpubench list` reads the built-ins from the catalogue and prints every one of them."""
    result = _probe(tmp_path, "list")
    assert result["code"] == 0, result["stderr"]
    assert result["heavy"] == [], f"gpubench list imported {result['heavy']}"


def test_reading_commands_import_no_torch(tmp_path, runs):
    """history add, history, compare and report read files only: no torch, no triton."""
    a, b = runs
    for args in (
        ["history", "add", str(a), str(b)],
        ["history"],
        ["compare", str(a), str(b)],
        ["report", str(a), "--no-history"],
        ["report", str(a), "--compare", str(b)],
    ):
        result = _probe(tmp_path, *args)
        assert result["code"] in (0, 1), (args, result["stderr"])
        assert result["heavy"] == [], f"gpubench {' '.join(args)} imported {result['heavy']}"


def test_a_command_that_measures_still_imports_torch(tmp_path):
    """The probe can see torch: `gpubench env` imports it (else the tests above prove nothing)."""
    result = _probe(tmp_path, "env", "--device", "cpu", "--json")
    assert result["code"] == 0, result["stderr"]
    assert "torch" in result["heavy"]


def test_the_contract_imports_without_torch_and_still_names_the_checks():
    """gpubench.contract (which results, and so every reading command, imports) needs no torch; its
    names from gpubench.checks are still there for plug-ins, torch imported on their first use."""
    code = (
        "import sys\nimport gpubench.contract as c\nbefore = 'torch' in sys.modules\n"
        "from gpubench.contract import DTYPE_TOLERANCE, CheckResult, rel_l2, relative_l2_check, tensors_check\n"
        "from gpubench import checks\n"
        "print(before, 'DTYPE_TOLERANCE' in dir(c), DTYPE_TOLERANCE is checks.DTYPE_TOLERANCE, "
        "CheckResult is checks.CheckResult)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.stdout.split() == ["False", "True", "True", "True"], out.stderr


def test_each_command_is_found_where_the_command_table_says():
    """gpubench.cli imports a command's module only when the command runs (COMMANDS): every name
    there is that module's command of that name, and --help lists every one of them."""
    import click

    from gpubench.cli import COMMANDS, main

    ctx = click.Context(main)
    for name in COMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None and command.name == name, name
    assert main.list_commands(ctx) == sorted(COMMANDS)
    listed = subprocess.run(
        [sys.executable, "-m", "gpubench.cli", "--help"], capture_output=True, text=True, timeout=300
    ).stdout
    assert all(f"  {name} " in listed for name in COMMANDS), listed


def test_a_misspelt_command_is_still_told_the_closest_ones(tmp_path):
    """A command not found is answered with the closest names, though no command was loaded yet."""
    result = probe(tmp_path, "reprot")
    assert result["code"] == 2
    assert "No such command 'reprot'" in result["stderr"] and "'report'" in result["stderr"], result["stderr"]
