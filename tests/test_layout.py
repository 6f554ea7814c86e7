"""docs/layout.md's block is the map of the code: every module and package of suite/, reports/,
baselines/ and optimizations/ is on it, and it names nothing that is not there.

The block is read as a tree: a folder at column 0 (``suite/``), its entries at column 2 (``cli.py``,
``models/``), an entry's description on its line and the deeper-indented lines after it. A folder
whose section has entries must give every module and package an entry of its own; a folder
without entries (baselines/) names them in its text. A package's entry names its modules.
``<technique>`` stands for every module or package of suite/techniques/ that defines ``TECHNIQUE`` and ``*``
for any run of name characters, so a new technique needs no line of the map.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAPPED = ("suite", "reports", "baselines", "optimizations")
FILE_TOKEN = re.compile(r"(?<![\w/.<>*-])[\w<>*]+(?:/[\w<>*]+)*\.py\b")
FOLDER_TOKEN = re.compile(r"(?<![\w/.<>*-])[\w<>*]+/")


def layout_block(page: str) -> list[str]:
    """The lines of the page's first code block (docs/layout.md, the Layout page)."""
    return page.split("```", 2)[1].split("\n")[1:]


def sections(block: list[str]) -> dict[str, tuple[str, dict[str, str]]]:
    """Folder -> (its own text, {entry name: entry text}) for every folder at column 0."""
    out: dict[str, tuple[str, dict[str, str]]] = {}
    folder = entry = None
    for line in block:
        indent = len(line) - len(line.lstrip())
        first = line.split()[0] if line.strip() else ""
        if indent == 0 and first.endswith("/"):
            folder, entry = first.rstrip("/"), None
            out[folder] = (line[len(first) :], {})
        elif folder is not None and indent == 2 and (first.endswith(".py") or first.endswith("/")):
            entry = first
            out[folder][1][entry] = line.strip()[len(first) :]
        elif folder is not None and entry is not None and indent > 2:
            out[folder][1][entry] += " " + line.strip()
        elif folder is not None and line.strip():
            own, entries = out[folder]
            out[folder] = (own + " " + line.strip(), entries)
    return out


def technique_modules(repo: Path) -> list[str]:
    """Names of suite/techniques' modules (x.py) and packages (x/__init__.py) that define TECHNIQUE
    at module level."""
    names = []
    folder = repo / "suite" / "techniques"
    for path in sorted([*folder.glob("*.py"), *folder.glob("*/__init__.py")]):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TECHNIQUE" for t in node.targets)
            for node in tree.body
        ):
            names.append(path.parent.name if path.name == "__init__.py" else path.stem)
    return names


def matcher(token: str, techniques: list[str]) -> re.Pattern:
    pattern = re.escape(token).replace(re.escape("<technique>"), f"(?:{'|'.join(map(re.escape, techniques))})")
    return re.compile(pattern.replace(re.escape("*"), r"\w*") + r"\Z")


def children(folder: Path) -> list[str]:
    """A folder's modules (``x.py``) and packages (``x/``), dunder files left out."""
    out = [p.name for p in folder.glob("*.py") if not p.name.startswith("__")]
    out += [p.name + "/" for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()]
    return sorted(out)


def named(text: str, name: str, techniques: list[str]) -> bool:
    tokens = FILE_TOKEN.findall(text) + FOLDER_TOKEN.findall(text)
    return any(matcher(token, techniques).match(name) for token in tokens)


def missing(block: list[str], repo: Path) -> list[str]:
    """Modules and packages the map leaves out, each with where it should be."""
    found, techniques, out = sections(block), technique_modules(repo), []
    for root in MAPPED:
        if root not in found:
            out.append(f"{root}/ (no line for the folder)")
            continue
        own, entries = found[root]
        for child in children(repo / root):
            listed = child in entries if entries else named(own, child, techniques)
            if not listed:
                out.append(f"{root}/{child} (an entry of its own under {root}/)" if entries else f"{root}/{child}")
            elif child.endswith("/"):
                out += [
                    f"{root}/{child}{sub} (named in the {child} entry)"
                    for sub in children(repo / root / child)
                    if not named(entries[child], sub, techniques)
                ]
    return out


def ghosts(block: list[str], repo: Path) -> list[str]:
    """Names on the map (entries, and files or folders its text names) that do not exist where it says."""
    techniques, out = technique_modules(repo), []
    for folder, (own, entries) in sections(block).items():
        base = repo / folder
        if not base.is_dir():
            out.append(f"{folder}/")
            continue
        texts = [(base, own)] + [
            (base / name if name.endswith("/") else base, name + " " + text) for name, text in entries.items()
        ]
        for where, text in texts:
            for token in FILE_TOKEN.findall(text) + FOLDER_TOKEN.findall(text):
                # a package's entry may name its subpackages' modules (gate/'s history/ store.py)
                inner = [d for d in where.iterdir() if d.is_dir()] if where.is_dir() else []
                if not any(_exists(start, token, techniques) for start in (where, *inner, base, repo)):
                    out.append(f"{token} (in the {folder}/ section)")
    return out


def _exists(start: Path, token: str, techniques: list[str]) -> bool:
    folder, _, name = token.rstrip("/").rpartition("/")
    parent = start / folder if folder else start
    if not parent.is_dir():
        return False
    if "<" not in name and "*" not in name:
        return (parent / token.rstrip("/").rpartition("/")[2]).exists()
    pattern = matcher(name, techniques)
    return any(pattern.match(p.name) for p in parent.iterdir())


LAYOUT_BLOCK = layout_block((ROOT / "docs" / "layout.md").read_text())


def test_every_module_and_package_is_on_the_layout_map():
    assert missing(LAYOUT_BLOCK, ROOT) == [], "docs/layout.md's map leaves these out; add a line for each"


def test_the_layout_map_names_only_modules_that_exist():
    assert ghosts(LAYOUT_BLOCK, ROOT) == [], "docs/layout.md's map names these, which do not exist there"


def _toy_repo(tmp_path: Path) -> Path:
    for folder, names in {
        "suite": ["__init__.py", "runner.py", "worker.py"],
        "suite/techniques": ["__init__.py"],
        "reports": ["__init__.py", "html.py"],
        "baselines": ["__init__.py", "flash.py"],
        "optimizations": ["__init__.py", "flash.py", "flash_triton.py"],
    }.items():
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        for name in names:
            (tmp_path / folder / name).write_text("")
    (tmp_path / "suite/techniques/flash.py").write_text("TECHNIQUE = object()\n")
    return tmp_path


TOY_BLOCK = """suite/       the harness
  runner.py    one case, measured
  worker.py    a worker process
  techniques/  __init__.py: the registry; <technique>.py: one per technique
reports/     presentation
  html.py      the report
baselines/   <technique>.py
optimizations/  <technique>.py (and <technique>_triton*.py)
""".split("\n")


def test_the_map_checks_fail_on_a_module_left_out_or_one_that_is_gone(tmp_path):
    repo = _toy_repo(tmp_path)
    assert missing(TOY_BLOCK, repo) == [] and ghosts(TOY_BLOCK, repo) == []
    (repo / "suite" / "cluster.py").write_text("")  # a new core module without its line
    (repo / "baselines" / "shared.py").write_text("")  # not a technique's module
    (repo / "suite" / "techniques" / "helpers.py").write_text("")  # in a package, not a technique
    assert missing(TOY_BLOCK, repo) == [
        "suite/cluster.py (an entry of its own under suite/)",
        "suite/techniques/helpers.py (named in the techniques/ entry)",
        "baselines/shared.py",
    ]
    (repo / "suite" / "worker.py").unlink()  # a module the map still credits
    (repo / "optimizations" / "flash_triton.py").unlink()  # a pattern that matches nothing now
    assert ghosts(TOY_BLOCK, repo) == [
        "worker.py (in the suite/ section)",
        "<technique>_triton*.py (in the optimizations/ section)",
    ]


def test_no_tracked_text_file_holds_a_merge_conflict_marker():
    """A merge resolved by hand can leave `<<<<<<<` blocks in a file no test parses (README.md held
    two, landed unnoticed): every tracked text file is free of them."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    marked = []
    for name in listed.splitlines():
        path = root / name
        if path.suffix in {".png", ".svg", ".sqlite", ".gz"} or not path.is_file():
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        marked += [
            f"{name}:{i + 1}"
            for i, line in enumerate(lines)
            if line.startswith(("<<<<<<< ", ">>>>>>> ")) or line == "======="
        ]
    assert marked == []


def test_every_package_is_in_pyprojects_package_list():
    """A wheel holds only the packages pyproject lists (an editable install finds the others, so
    only a real install would miss one): every folder of suite/ with an __init__.py is listed."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        "gpubench." + ".".join(p.parent.relative_to(ROOT / "suite").parts) if p.parent != ROOT / "suite" else "gpubench"
        for p in (ROOT / "suite").rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
