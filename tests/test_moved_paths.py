"""Scripts and CI jobs written against the flat suite/ (before the layer folders of issue 36) keep
working: every old module path gives the module at its new path, the same object, with a
DeprecationWarning that names where it went. gpubench itself never uses an old path."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import gpubench

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(gpubench.MOVED))
def test_an_old_module_path_is_the_module_at_its_new_path_with_a_warning(old):
    new = importlib.import_module(f"gpubench.{gpubench.MOVED[old]}")
    sys.modules.pop(f"gpubench.{old}", None)
    with pytest.warns(DeprecationWarning, match=f"gpubench.{old} moved to gpubench.{gpubench.MOVED[old]}"):
        moved = importlib.import_module(f"gpubench.{old}")
    assert moved is new


def test_a_submodule_of_an_old_package_path_is_the_one_module_not_a_second_copy():
    """gpubench.history was a package: its submodules by the old path are the same modules, so a
    class imported by either path is one class (isinstance holds across them)."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from gpubench.history.store import HistoryStore as Old\n"
        "from gpubench.gate.history.store import HistoryStore as New\n"
        "import sys, gpubench.gate.history as pkg\n"
        "print(Old is New, pkg.store is sys.modules['gpubench.gate.history.store'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


def test_the_old_ci_line_still_finds_the_baseline_store():
    """The line earlier gpu-regression workflows (which users copied) ran: `from gpubench import compare`."""
    code = "import sys; from gpubench import compare; print(compare.__name__, callable(compare.store_path))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["gpubench.gate.compare", "True"]
    assert "moved to gpubench.gate.compare" in done.stderr or done.stderr == ""  # warnings may be filtered


def test_an_unknown_name_is_still_an_error():
    with pytest.raises(AttributeError):
        gpubench.no_such_module  # noqa: B018
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("gpubench.no_such_module")


def test_gpubench_itself_imports_no_old_path():
    """Every import in the package names a module where it lives now (the aliases are for others)."""
    olds = {f"gpubench.{old}" for old in gpubench.MOVED}
    found = []
    for folder in ("suite", "reports", "baselines", "optimizations", "benchmarks", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                found += [
                    f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                    for n in names
                    if any(n == o or n.startswith(o + ".") for o in olds)
                ]
    assert found == []
