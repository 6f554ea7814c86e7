"""docs/architecture.svg, the import graph by folder (benchmarks/import_graph.py): the tree's graph has
no arrow against the layers, an upward import is found and drawn red, and the committed drawing is
the one today's tree gives.

The drawing is compared by the graph its SVG metadata records (boxes, arrows, counts, red marks), and
byte for byte only when the matplotlib that drew it is the one installed: another matplotlib writes
the same graph with other bytes, and that must not fail the suite."""

from __future__ import annotations

import html
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DRAWING = ROOT / "docs" / "architecture.svg"
REGENERATE = "python benchmarks/import_graph.py  (writes docs/architecture.svg; commit it)"


@pytest.fixture(scope="module")
def script():
    """benchmarks/import_graph.py as a module (registered: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location("benchmarks_import_graph", ROOT / "benchmarks" / "import_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tree_graph(script):
    return script.graph_of(ROOT)


def _toy(tmp_path: Path) -> Path:
    """A tree of three layers whose records import the runner: one arrow up."""
    files = {
        "suite/__init__.py": "",
        "suite/errors.py": "",
        "suite/records/__init__.py": "",
        "suite/records/results.py": "from gpubench.errors import BadInput\n\ndef f():\n    from gpubench.run import runner\n",
        "suite/run/__init__.py": "",
        "suite/run/runner.py": "from gpubench.records import results\nfrom ..errors import BadInput\n",
        "reports/__init__.py": "",
        "reports/page.py": "from gpubench.records.results import f\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    return tmp_path


def test_the_trees_import_graph_has_no_arrow_against_the_layers(script, tree_graph):
    assert script.report(tree_graph).splitlines()[1:] == []
    assert tree_graph.red == [] and tree_graph.inside == []
    # every suite/ layer folder is a box, and the arrows carry every import between modules
    assert {"suite/records/", "suite/measure/", "suite/run/", "suite/gate/", "suite/cli/", "reports/"} <= set(
        tree_graph.boxes
    )
    assert len(tree_graph.module_pairs) == sum(len(a.pairs) for a in tree_graph.arrows.values()) > 100


def test_an_upward_import_in_a_function_is_an_arrow_drawn_red_and_named(script, tmp_path, capsys):
    root = _toy(tmp_path / "tree")
    graph = script.graph_of(root)
    assert {(a.source, a.target): (len(a.pairs), a.red) for a in graph.arrows.values()} == {
        ("suite/records/", "suite/errors.py"): (1, False),
        ("suite/records/", "suite/run/"): (1, True),
        ("suite/run/", "suite/records/"): (1, False),
        ("suite/run/", "suite/errors.py"): (1, False),
        ("reports/", "suite/records/"): (1, False),
    }
    (red,) = graph.red
    assert red.broken == [
        "suite/records/results.py:4: a layer imports a layer above it (or its sibling): "
        "gpubench.records.results imports gpubench.run.runner"
    ]
    out = tmp_path / "toy.svg"
    assert script.main(["--root", str(root), "--out", str(out)]) == 1  # a red arrow fails the command
    printed = capsys.readouterr().out
    assert "1 red" in printed and "RED suite/records/ -> suite/run/" in printed
    svg = out.read_text()
    assert "arrow suite/records/ -> suite/run/ 1 RED" in html.unescape(svg)
    assert "#d62728" in svg  # drawn red ...
    assert svg.count("#d62728") < svg.count("#777777")  # ... and only that arrow (and its count)
    # by module: the same import, between the two modules
    assert script.main(["--root", str(root), "--modules", "--out", str(tmp_path / "modules.svg")]) == 1
    described = _recorded((tmp_path / "modules.svg").read_text(), "description")
    assert "arrow gpubench.records.results -> gpubench.run.runner 1 RED" in described.splitlines()


def test_a_tree_without_suite_is_refused_with_exit_2(script, tmp_path, capsys):
    assert script.main(["--root", str(tmp_path), "--no-draw"]) == 2
    assert "no suite/ folder" in capsys.readouterr().err


def test_the_drawing_is_the_same_bytes_each_time_and_leaves_rcparams_alone(script, tmp_path):
    import matplotlib

    before = dict(matplotlib.rcParams)
    graph = script.graph_of(_toy(tmp_path / "tree"))
    script.draw(graph, tmp_path / "a.svg")
    script.draw(graph, tmp_path / "b.svg")
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()
    assert "<dc:date>" not in (tmp_path / "a.svg").read_text()
    assert dict(matplotlib.rcParams) == before  # the report's figures, drawn in the same process, keep theirs


def _recorded(svg: str, element: str) -> str:
    found = re.search(rf"<dc:{element}>(.*?)</dc:{element}>", svg, re.S)
    return html.unescape(found.group(1)) if found else ""


def test_the_committed_drawing_is_the_one_the_tree_gives(script, tree_graph, tmp_path):
    committed = DRAWING.read_text()
    assert _recorded(committed, "description") == script.describe(tree_graph), (
        f"docs/architecture.svg is not the tree's import graph; regenerate it: {REGENERATE}"
    )
    fresh = tmp_path / "architecture.svg"
    script.draw(tree_graph, fresh)
    if "<dc:title>" + _recorded(fresh.read_text(), "title") not in committed:
        pytest.skip("the drawing was made by another matplotlib: its graph is checked above, not its bytes")
    assert fresh.read_bytes() == DRAWING.read_bytes(), f"docs/architecture.svg is stale; {REGENERATE}"


def test_layout_page_shows_the_drawing():
    assert "architecture.svg" in (ROOT / "docs" / "layout.md").read_text()
