"""The layering docs/layout.md states, checked against every import in the tree.

Every import (top level and function-local, read with ast, so an import hidden inside a function
counts too) of suite/, baselines/, optimizations/ and reports/ is resolved to a gpubench module and
judged by the rules below; a failure names each broken rule with file:line. The records and the
reports are also followed through every chain of imports (a report imports a record module whose
function imports the registry: a back door a direct-import rule misses).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# folder -> the package it is installed as (pyproject's package-dir)
PACKAGES = {
    "suite": "gpubench",
    "baselines": "gpubench.baselines",
    "optimizations": "gpubench.optimizations",
    "reports": "gpubench.reports",
}
# what a report may not read: the registry (technique code of today, not the run's) and the runner's
# internals (a report reads a run directory, it never measures)
RUNNER_INTERNALS = (
    "gpubench.run.runner",
    "gpubench.run.supervisor",
    "gpubench.run.worker",
    "gpubench.run.cluster",
    "gpubench.measure.timing",
    "gpubench.measure.profiling",
)


@dataclass(frozen=True)
class Import:
    where: str  # file:line
    importer: str  # dotted module name of the file
    imported: str  # dotted module name, resolved (gpubench.x.y, or a third-party name)


def module_name(path: Path, root: Path | None = None) -> str:
    rel = path.relative_to(root or ROOT)
    parts = list(rel.with_suffix("").parts)
    package = PACKAGES[parts[0]]
    rest = parts[1:]
    if rest and rest[-1] == "__init__":
        rest = rest[:-1]
    return ".".join([package, *rest])


def _resolve_relative(importer: str, is_package: bool, level: int, module: str | None) -> str:
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(path: Path, root: Path | None = None) -> list[Import]:
    """Every import in the file at ``path`` (a file of the tree at ``root``, by default this repository's)."""
    root = root or ROOT
    importer = module_name(path, root)
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [Import(where, importer, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = (
                _resolve_relative(importer, is_package, node.level, node.module) if node.level else node.module or ""
            )
            # `from gpubench import techniques` imports a module: judge the name, not the package
            found += [Import(where, importer, f"{module}.{alias.name}") for alias in node.names]
    return found


def all_imports(root: Path | None = None) -> list[Import]:
    root = root or ROOT
    files = [p for folder in PACKAGES for p in sorted((root / folder).rglob("*.py"))]
    return [imp for path in files for imp in imports_of(path, root)]


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


# the registry's own modules: its __init__ and the catalogue of the built-ins' declarations
REGISTRY = ("gpubench.techniques", "gpubench.techniques.catalog")


def is_technique_module(name: str) -> bool:
    """gpubench.techniques.<name>: one technique's package (the registry and its catalogue are core)."""
    return (
        _under(name, "gpubench.techniques")
        and name.count(".") >= 2
        and not any(name == r or name.startswith(r + ".") for r in REGISTRY[1:])
    )


# ---- layers: suite/'s folders, each importing only the layers below it (issue 36) ----------------
# (the base: the package itself and errors; the public contract and its checks share layer 1 with the
# records: a record holds a technique's declared Plot/Headline/Param, the contract re-exports Claim)
LAYERS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (
        0,
        "the base",
        ("gpubench.__init__", "gpubench.__version__", "gpubench.errors", "gpubench.lazy", "gpubench.units"),
    ),
    (1, "the contract and the records", ("gpubench.contract", "gpubench.checks", "gpubench.records")),
    (2, "measure", ("gpubench.measure",)),
    (3, "the library", ("gpubench.lib", "gpubench.models", "gpubench.serving")),
    (4, "techniques and pairs", ("gpubench.techniques", "gpubench.baselines", "gpubench.optimizations")),
    (5, "run", ("gpubench.run",)),
    (5, "gate", ("gpubench.gate",)),
    (6, "reports", ("gpubench.reports",)),
    (7, "cli", ("gpubench.cli",)),
)


def layer_of(name: str) -> tuple[int, str] | None:
    """(level, layer) of a gpubench module, or None for a name outside gpubench."""
    if name == "gpubench":
        return 0, "the base"
    for level, layer, roots in LAYERS:
        if any(_under(name, root) for root in roots):
            return level, layer
    return None


def technique_of(name: str) -> str:
    return name.split(".")[2]


def is_core(name: str) -> bool:
    return (
        _under(name, "gpubench")
        and not is_technique_module(name)
        and not any(_under(name, f"gpubench.{side}") for side in ("baselines", "optimizations", "reports"))
    )


def broken_rule(imp: Import) -> str | None:
    """The rule this import breaks, or None."""
    src, dst = imp.importer, imp.imported
    if _under(src, "gpubench.baselines") and _under(dst, "gpubench.optimizations"):
        return "a baseline imports an optimization"
    if _under(src, "gpubench.optimizations") and _under(dst, "gpubench.baselines"):
        return "an optimization imports a baseline"
    if is_core(src) and (_under(dst, "gpubench.baselines") or _under(dst, "gpubench.optimizations")):
        return "a core module imports one side of a pair"
    if is_core(src) and is_technique_module(dst):
        return "a core module imports a technique module"
    if is_technique_module(src) and is_technique_module(dst) and technique_of(src) != technique_of(dst):
        return "a technique module imports another technique module"
    if _under(src, "gpubench.reports") and (
        _under(dst, "gpubench.techniques") or any(_under(dst, m) for m in RUNNER_INTERNALS)
    ):
        return "a report imports the registry or the runner's internals"
    here, there = layer_of(src), layer_of(dst)
    if here is not None and there is not None and (there[0] > here[0] or (there[0] == here[0] and there != here)):
        return "a layer imports a layer above it (or its sibling)"
    return None


def broken(selector) -> list[str]:
    lines = []
    for imp in all_imports():
        rule = broken_rule(imp)
        if rule is not None and selector(rule):
            lines.append(f"{imp.where}: {rule}: {imp.importer} imports {imp.imported}")
    return lines


# ---- the rules, one test each -------------------------------------------------------------------


def test_baselines_and_optimizations_never_import_each_other():
    assert broken(lambda rule: "a baseline" in rule or "an optimization" in rule) == []


def test_core_modules_never_import_baselines_optimizations_or_technique_modules():
    assert broken(lambda rule: rule.startswith("a core module")) == []


def test_a_technique_module_never_imports_another_technique_module():
    assert broken(lambda rule: rule.startswith("a technique module")) == []


def test_every_layer_imports_only_the_layers_under_it():
    """suite/'s folders are layers (LAYERS, and each folder's __init__.py says the same): records
    (with the contract) < measure < the library < techniques and pairs < run, gate < reports < cli.
    run and gate do not import each other; records and the contract may import each other."""
    assert broken(lambda rule: rule.startswith("a layer")) == []


def test_suite_has_no_top_level_module_but_the_base():
    """Every module of suite/ lives in its layer's folder; at the top only the base (the public
    contract, its checks, errors, and two helpers of no layer's own: modules imported when first
    used, sizes as a person reads them), which every layer may import."""
    top = sorted(p.stem for p in (ROOT / "suite").glob("*.py") if p.stem != "__init__")
    assert top == ["checks", "contract", "errors", "lazy", "units"]
    folders = sorted(p.name for p in (ROOT / "suite").iterdir() if (p / "__init__.py").is_file())
    assert all(layer_of(f"gpubench.{name}") is not None for name in folders), folders


def test_each_layer_folder_says_what_it_may_import():
    """A folder's __init__ docstring names its layer, so a reader needs no map to know the rule."""
    for name in ("records", "measure", "lib", "run", "gate", "cli"):
        doc = ast.get_docstring(ast.parse((ROOT / "suite" / name / "__init__.py").read_text())) or ""
        assert "layer" in doc.lower() and "import" in doc.lower(), name


def test_reports_never_import_the_registry_or_runner_internals():
    assert broken(lambda rule: rule.startswith("a report")) == []


# ---- what a module reaches, lazy imports followed ---------------------------------------------
# A direct-import rule misses the back door: a report imports gpubench.records.results, whose function
# imported the registry when called. The records and every report must not reach the registry or
# the runner's internals through any chain of imports, function-local ones included.
RECORDS = ("gpubench.records.results", "gpubench.records.declarations")


def module_files(root: Path | None = None) -> dict[str, Path]:
    root = root or ROOT
    return {module_name(p, root): p for folder in PACKAGES for p in sorted((root / folder).rglob("*.py"))}


def as_module(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported name loads: itself, or the module it is a name in (``gpubench.records.results.load_run``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def reached_from(start: str, modules: dict[str, Path], graph: dict[str, list[Import]]) -> dict[str, list[str]]:
    """Every gpubench module ``start`` loads through any chain of imports (function-local ones
    included), each with the chain of file:line that gets there; a package's __init__ counts."""
    paths: dict[str, list[str]] = {start: []}
    todo = [start]
    while todo:
        here = todo.pop()
        for imp in graph.get(here, []):
            target = as_module(imp.imported, modules)
            if target is None:
                continue
            parts = target.split(".")
            for n in range(2, len(parts) + 1):  # gpubench.gate.history.trends loads gpubench.gate.history first
                name = ".".join(parts[:n])
                if name in modules and name not in paths:
                    paths[name] = [*paths[here], imp.where]
                    todo.append(name)
    return paths


def reaching_registry(starts: list[str]) -> list[str]:
    modules = module_files()
    graph = {name: imports_of(path) for name, path in modules.items()}
    lines = []
    for start in starts:
        for name, chain in reached_from(start, modules, graph).items():
            if _under(name, "gpubench.techniques") or any(_under(name, m) for m in RUNNER_INTERNALS):
                lines.append(f"{start} reaches {name} through {' -> '.join(chain)}")
    return lines


def test_records_and_reports_never_reach_the_registry_even_lazily():
    reports = [m for m in module_files() if _under(m, "gpubench.reports")]
    assert reaching_registry([*RECORDS, *reports]) == []


def test_the_reach_follows_a_function_local_import_of_an_imported_module(tmp_path, monkeypatch):
    """The back door it closes: a report imports a record module whose function imports the registry."""
    for folder, files in {
        "suite": {"rec.py": "def f():\n    from gpubench import techniques\n", "techniques/__init__.py": ""},
        "reports": {"page.py": "from gpubench.rec import f\n"},
    }.items():
        for name, text in files.items():
            (tmp_path / folder / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / folder / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert reaching_registry(["gpubench.reports.page"]) == [
        "gpubench.reports.page reaches gpubench.techniques through reports/page.py:1 -> suite/rec.py:2"
    ]


# Strings in core that name a pair's module, each with why. Kernels the library runs live in the
# library (gpubench.lib.kernels), so core never reaches into a pair by name: a new string naming a
# pair's module in core fails below until it is listed here.
NAMED_KERNELS = {
    # not a reach: the catalogue hashes the source of both sides (finds their folders, imports neither)
    ("suite/techniques/catalog.py", "gpubench.optimizations"): "the catalogue's source hash",
    ("suite/techniques/catalog.py", "gpubench.baselines"): "the catalogue's source hash",
}


def named_modules() -> set[tuple[str, str]]:
    """(file, module) for every string constant of a core module that names a pair's or a technique's module."""
    found = set()
    for path in sorted((ROOT / "suite").rglob("*.py")):
        if is_core(module_name(path)):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and all(part.isidentifier() for part in node.value.split("."))
                    and (
                        _under(node.value, "gpubench.baselines")
                        or _under(node.value, "gpubench.optimizations")
                        or is_technique_module(node.value)
                    )
                ):
                    found.add((str(path.relative_to(ROOT)), node.value))
    return found


def test_core_reaches_a_pair_only_through_named_triton_kernels():
    assert named_modules() == set(NAMED_KERNELS)


# ---- the walker itself: each rule fires on the import it names ----------------------------------


@pytest.mark.parametrize(
    "importer, imported, rule",
    [
        ("gpubench.baselines.x", "gpubench.optimizations.x", "a baseline imports an optimization"),
        ("gpubench.optimizations.x", "gpubench.baselines.x.f", "an optimization imports a baseline"),
        ("gpubench.serving.kv", "gpubench.optimizations.paged_attention", "a core module imports one side of a pair"),
        ("gpubench.lib.packing", "gpubench.techniques.moe_grouping", "a core module imports a technique module"),
        ("gpubench.techniques.a", "gpubench.techniques.b.f", "a technique module imports another technique module"),
        ("gpubench.reports.html", "gpubench.techniques", "a report imports the registry or the runner's internals"),
        ("gpubench.reports.html", "gpubench.run.runner.f", "a report imports the registry or the runner's internals"),
        ("gpubench.measure.timing", "gpubench.lib.packing", "a layer imports a layer above it (or its sibling)"),
        ("gpubench.records.results", "gpubench.measure.energy", "a layer imports a layer above it (or its sibling)"),
        ("gpubench.gate.compare", "gpubench.run.runner", "a layer imports a layer above it (or its sibling)"),
        ("gpubench.run.supervisor", "gpubench.gate.history", "a layer imports a layer above it (or its sibling)"),
        ("gpubench.lib.packing", "gpubench.techniques", "a layer imports a layer above it (or its sibling)"),
        ("gpubench.reports.html", "gpubench.cli.run", "a layer imports a layer above it (or its sibling)"),
    ],
)
def test_each_rule_fires_on_the_import_it_forbids(importer, imported, rule):
    assert broken_rule(Import("x.py:1", importer, imported)) == rule


@pytest.mark.parametrize(
    "importer, imported",
    [
        ("gpubench.techniques.a", "gpubench.baselines.a"),  # the glue knows both sides
        ("gpubench.techniques.a", "gpubench.optimizations.a"),
        ("gpubench.techniques.a", "gpubench.techniques.a.f"),  # itself
        ("gpubench.techniques", "gpubench.contract"),  # the registry is core
        ("gpubench.optimizations.a_triton", "gpubench.optimizations.a"),
        ("gpubench.baselines.a", "gpubench.lib.packing"),  # both sides import core
        ("gpubench.reports.html", "gpubench.records.results"),
        ("gpubench.records.declarations", "gpubench.contract"),  # records and the contract: one layer
        ("gpubench.contract", "gpubench.records.claims"),
        ("gpubench.run.scenario", "gpubench.techniques.catalog"),  # the registry's catalogue is not a technique
        ("gpubench.cli.run", "gpubench.gate.history"),
    ],
)
def test_allowed_imports_pass(importer, imported):
    assert broken_rule(Import("x.py:1", importer, imported)) is None


def test_function_local_and_relative_imports_are_seen(tmp_path, monkeypatch):
    """An import hidden inside a function, or written relative, is judged like a top-level one."""
    folder = tmp_path / "suite"
    folder.mkdir()
    (folder / "core.py").write_text(
        "def f():\n    from .techniques import moe_grouping\n    import gpubench.optimizations.flash_attention\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    seen = [(imp.where, broken_rule(imp)) for imp in imports_of(folder / "core.py")]
    assert seen == [
        ("suite/core.py:2", "a core module imports a technique module"),
        ("suite/core.py:3", "a core module imports one side of a pair"),
    ]
