"""gpubench's import graph drawn at folder level (issue 36 point 6): one box per folder of the package
as installed (suite/'s layer folders, the modules at suite/'s top, baselines/, optimizations/,
reports/), placed in bands by layer (tests/test_layering.py's LAYERS, the lowest at the bottom), an
arrow from each folder to each folder it imports with the number of module-to-module imports on it.
An arrow that carries an import the layering rules forbid (up a layer, between the sibling layers
run/ and gate/, between a baseline and an optimization, a report reaching the registry) is drawn red
and listed.

    python benchmarks/import_graph.py [--root TREE] [--out docs/architecture.svg] [--modules]

Every import counts, function-local ones too: the imports are read by tests/test_layering.py's walker
(imported, not copied) and judged by its rules. Prints the counts and each red arrow's imports; exits
1 when there is a red arrow. The drawing is deterministic (same tree, same matplotlib: same bytes), and
its SVG metadata holds the graph as text, which tests/test_import_graph.py compares with the tree's.
``--modules`` draws one box per module instead (the same bands; arrows unlabelled)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import test_layering as walker  # noqa: E402  (the walker and the rules: tests/test_layering.py)

UNLAYERED = "not in LAYERS"


@dataclass
class Arrow:
    source: str
    target: str
    pairs: set[tuple[str, str]] = field(default_factory=set)  # (importer, imported) modules
    broken: list[str] = field(default_factory=list)  # "file:line: rule: a imports b"

    @property
    def red(self) -> bool:
        return bool(self.broken)


@dataclass
class Graph:
    boxes: dict[str, tuple[int | None, str]]  # box -> (level, layer); level None: outside LAYERS
    modules: dict[str, str]  # module -> its box
    arrows: dict[tuple[str, str], Arrow]
    inside: list[str]  # broken imports between modules of one box (no arrow to draw them on)

    @property
    def module_pairs(self) -> set[tuple[str, str]]:
        return {pair for arrow in self.arrows.values() for pair in arrow.pairs}

    @property
    def red(self) -> list[Arrow]:
        return [a for a in self.arrows.values() if a.red]


def box_of(path: Path, root: Path) -> str:
    """A module's box: its folder under suite/ (``suite/records/``), a module at suite/'s top by its
    file (``suite/errors.py``), a module of baselines/, optimizations/ or reports/ by that folder."""
    parts = path.relative_to(root).parts
    if parts[0] != "suite":
        return f"{parts[0]}/"
    return f"suite/{parts[1]}/" if len(parts) > 2 else f"suite/{parts[1]}"


def package_of(box: str) -> str:
    """The package a box is drawn for (its layer is the box's): suite/records/ -> gpubench.records."""
    if not box.startswith("suite/"):
        return walker.PACKAGES[box.rstrip("/")]
    name = box.removeprefix("suite/").removesuffix("/").removesuffix(".py")
    return "gpubench" if name == "__init__" else f"gpubench.{name}"


def _level(layer: tuple[int, str] | None) -> tuple[int | None, str]:
    return (None, UNLAYERED) if layer is None else layer


def graph_of(root: Path = REPO, by_module: bool = False) -> Graph:
    """The tree at ``root``'s imports, grouped by box (or by module, ``by_module``)."""
    files = walker.module_files(root)
    modules = {name: name if by_module else box_of(path, root) for name, path in files.items()}
    boxes: dict[str, tuple[int | None, str]] = {}
    for name, box in sorted(modules.items()):
        boxes.setdefault(box, _level(walker.layer_of(name if by_module else package_of(box))))
    arrows: dict[tuple[str, str], Arrow] = {}
    inside = []
    for imp in walker.all_imports(root):
        target = walker.as_module(imp.imported, files)
        if target is None or target == imp.importer:
            continue
        ends = modules[imp.importer], modules[target]
        rule = walker.broken_rule(imp)
        line = f"{imp.where}: {rule}: {imp.importer} imports {imp.imported}"
        if ends[0] == ends[1]:
            if rule is not None:
                inside.append(line)
            continue
        arrow = arrows.setdefault(ends, Arrow(*ends))
        arrow.pairs.add((imp.importer, target))
        if rule is not None:
            arrow.broken.append(line)
    return Graph(boxes, modules, dict(sorted(arrows.items())), inside)


def describe(graph: Graph) -> str:
    """The graph as text: boxes by layer, arrows with their counts (red ones marked): what the
    drawing shows, kept in its metadata."""
    lines = []
    for box, (level, layer) in sorted(graph.boxes.items(), key=_band_order):
        count = sum(1 for b in graph.modules.values() if b == box)
        lines.append(f"box {box} [{'-' if level is None else level} {layer}] {count} modules")
    for (source, target), arrow in graph.arrows.items():
        lines.append(f"arrow {source} -> {target} {len(arrow.pairs)}{' RED' if arrow.red else ''}")
    return "\n".join(lines)


def _band_order(item: tuple[str, tuple[int | None, str]]) -> tuple[int, int, str]:
    box, (level, layer) = item
    order = [name for _, name, _ in walker.LAYERS]
    return (99 if level is None else level, order.index(layer) if layer in order else 99, box)


def _positions(
    graph: Graph, width: float, band: float, per_row: int
) -> tuple[dict[str, tuple[float, float]], list[tuple[float, float, list[str]]]]:
    """Box centres, and each band's (bottom, top, names of its layers): one band per level (the lowest
    at the bottom; boxes outside LAYERS above the rest), a band's boxes spread across it in rows of
    ``per_row``; a band's single box alternates left and right of the middle so long arrows do not run
    through it."""
    levels: dict[int, list[str]] = defaultdict(list)
    names: dict[int, list[str]] = defaultdict(list)
    top = max((lv for lv, _ in graph.boxes.values() if lv is not None), default=0)
    for box, (level, layer) in sorted(graph.boxes.items(), key=_band_order):
        key = top + 1 if level is None else level
        levels[key].append(box)
        name = layer if level is None else f"{level}: {layer}"
        if name not in names[key]:
            names[key].append(name)
    out, bands, y = {}, [], 0.0
    for level, boxes in sorted(levels.items()):
        rows = [boxes[i : i + per_row] for i in range(0, len(boxes), per_row)]
        for r, row in enumerate(rows):
            if len(row) == 1 and len(rows) == 1:
                xs = [width / 2 + (width / 5 if level % 2 else -width / 5)]
            else:
                xs = [width * (i + 0.5) / len(row) for i in range(len(row))]
            for x, box in zip(xs, row):
                out[box] = (x, y + r * band)
        bands.append((y - band / 2, y + (len(rows) - 0.5) * band, names[level]))
        y += len(rows) * band
    return out, bands


def draw(graph: Graph, out: Path, by_module: bool = False) -> None:
    """The graph into ``out`` (.svg or .png). Its settings (svg.hashsalt fixed, text kept as text) are
    this figure's only: the process's rcParams are left as they were."""
    import matplotlib

    style = {"svg.hashsalt": "gpubench-import-graph", "svg.fonttype": "none", "font.size": 9}
    with matplotlib.rc_context(style):
        _draw(graph, out, by_module)


def _draw(graph: Graph, out: Path, by_module: bool) -> None:
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    width, band, per_row = (30.0, 1.6, 9) if by_module else (12.0, 2.0, 3)
    pos, bands = _positions(graph, width, band, per_row)
    margin = 2.4  # the bands' names, left of the boxes
    top = bands[-1][1]
    fig = Figure(figsize=((width + margin) * 0.8, (top + band / 2) * 0.8 + 0.8))
    ax = fig.subplots()
    ax.set_xlim(-margin, width)
    ax.set_ylim(-band / 2, top)
    ax.set_aspect("equal")  # the arcs' middles below are computed in data units
    ax.axis("off")
    # the bands, each named by its layers
    for i, (low, high, names) in enumerate(bands):
        ax.axhspan(low, high, color="#f3f3f3" if i % 2 else "white", zorder=0)
        label = textwrap.fill(f"{names[0]}, {', '.join(n.split(': ', 1)[-1] for n in names[1:])}".rstrip(", "), 18)
        ax.text(-margin + 0.1, (low + high) / 2, label, va="center", ha="left", fontsize=8, color="#555555")
    patches = {}
    size = (3.0, 0.45) if by_module else (2.4, 0.7)
    ends = _ends(graph, pos, size)
    for box, (x, y) in pos.items():
        count = sum(1 for b in graph.modules.values() if b == box)
        if by_module:
            text = box.removeprefix("gpubench.")
        else:
            text = box if box.endswith(".py") else f"{box}\n{count} modules"
        w, h = size
        patch = FancyBboxPatch(
            (x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05", fc="#dde8f5", ec="#3a5a80", zorder=3
        )
        ax.add_patch(patch)
        patches[box] = patch
        ax.text(x, y, text, ha="center", va="center", zorder=4, fontsize=7 if by_module else 9)
    # red arrows last, so none hides under a grey one
    for arrow in sorted(graph.arrows.values(), key=lambda a: (a.red, a.source, a.target)):
        (x1, y1), (x2, y2) = ends[arrow.source, arrow.target]
        rad = 0.15 if y1 == y2 else 0.05  # A -> B and B -> A bow to opposite sides
        colour = "#d62728" if arrow.red else "#777777"
        ax.add_patch(
            FancyArrowPatch(
                (x1, y1),
                (x2, y2),
                connectionstyle=f"arc3,rad={rad}",
                arrowstyle="-|>",
                mutation_scale=10,
                lw=1.6 if arrow.red else 0.8,
                color=colour,
                alpha=1.0 if arrow.red else 0.7,
                zorder=5 if arrow.red else 2,
            )
        )
        if not by_module:
            mx, my = _label_point((x1, y1), (x2, y2), rad, pos, size)
            ax.text(
                mx,
                my,
                str(len(arrow.pairs)),
                ha="center",
                va="center",
                fontsize=7,
                color=colour,
                zorder=6,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
            )
    red = len(graph.red)
    ax.set_title(
        f"gpubench's imports by {'module' if by_module else 'folder'}: {len(graph.module_pairs)} module imports on {len(graph.arrows)} arrows, "
        f"{red} against the layers (red)\n(count: distinct importer -> imported module pairs; "
        "function-local imports included; benchmarks/import_graph.py draws it)",
        fontsize=10,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format=out.suffix.lstrip(".") or "svg", bbox_inches="tight", metadata=_metadata(graph, out.suffix))


def _ends(graph: Graph, pos: dict[str, tuple[float, float]], size: tuple[float, float]) -> dict:
    """Each arrow's start and end on its boxes' edges: an arrow down leaves the bottom edge and enters
    the top one (up: the other way round), one within a band leaves and enters a side; the arrows on
    one edge are spread along it in the order of the boxes at their other ends, so they do not cross
    at the edge."""
    w, h = size
    ports: dict[tuple[str, str], list[tuple[tuple[float, float], tuple[str, str], int]]] = defaultdict(list)
    for source, target in graph.arrows:
        (xs, ys), (xt, yt) = pos[source], pos[target]
        if ys == yt:
            side = "right" if xt > xs else "left"
            ports[source, side].append(((yt, xt), (source, target), 0))
            ports[target, "left" if side == "right" else "right"].append(((ys, xs), (source, target), 1))
        else:
            down = ys > yt
            ports[source, "bottom" if down else "top"].append(((xt, -yt if down else yt), (source, target), 0))
            ports[target, "top" if down else "bottom"].append(((xs, ys if down else -ys), (source, target), 1))
    points: dict[tuple[str, str], list] = defaultdict(lambda: [None, None])
    for (box, side), here in ports.items():
        x, y = pos[box]
        for i, (_, arrow, end) in enumerate(sorted(here)):
            share = (i + 1) / (len(here) + 1) - 0.5
            if side in ("top", "bottom"):
                points[arrow][end] = (x + 0.9 * w * share, y + (h / 2 + 0.05) * (1 if side == "top" else -1))
            else:
                points[arrow][end] = (x + (w / 2 + 0.05) * (1 if side == "right" else -1), y - 0.8 * h * share)
    return {arrow: tuple(ends) for arrow, ends in points.items()}


def _label_point(p1, p2, rad, pos, size) -> tuple[float, float]:
    """Where an arrow's count goes: the point of its arc (arc3's quadratic Bezier) nearest its middle
    that lies in no box."""
    (x1, y1), (x2, y2) = p1, p2
    cx, cy = (x1 + x2) / 2 + rad * (y2 - y1), (y1 + y2) / 2 - rad * (x2 - x1)
    point = (0.0, 0.0)
    for t in (0.5, *(0.5 + sign * k / 25 for k in range(1, 10) for sign in (-1, 1)), 0.5):
        point = (
            (1 - t) ** 2 * x1 + 2 * (1 - t) * t * cx + t**2 * x2,
            (1 - t) ** 2 * y1 + 2 * (1 - t) * t * cy + t**2 * y2,
        )
        if not any(
            abs(point[0] - x) < size[0] / 2 + 0.2 and abs(point[1] - y) < size[1] / 2 + 0.2 for x, y in pos.values()
        ):
            break
    return point


def _metadata(graph: Graph, suffix: str) -> dict[str, str | None]:
    import matplotlib

    if suffix == ".png":
        return {"Software": f"benchmarks/import_graph.py (matplotlib {matplotlib.__version__})"}
    return {
        "Date": None,
        "Creator": f"benchmarks/import_graph.py (matplotlib {matplotlib.__version__})",
        "Description": describe(graph),
    }


def report(graph: Graph) -> str:
    lines = [
        f"{len(graph.boxes)} boxes, {len(graph.arrows)} arrows between them carrying "
        f"{len(graph.module_pairs)} module imports (distinct importer -> imported pairs); "
        f"{len(graph.red)} red (against the layers)"
    ]
    for arrow in graph.red:
        lines.append(f"RED {arrow.source} -> {arrow.target}:")
        lines += [f"  {line}" for line in arrow.broken]
    if graph.inside:
        lines.append("imports against the rules inside one box:")
        lines += [f"  {line}" for line in graph.inside]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=REPO, help="the tree to read (default: this repository)")
    parser.add_argument("--out", type=Path, help="the drawing (.svg or .png; default docs/architecture.svg)")
    parser.add_argument("--modules", action="store_true", help="one box per module, not per folder")
    parser.add_argument("--no-draw", action="store_true", help="print the counts only")
    args = parser.parse_args(argv)
    if not (args.root / "suite").is_dir():
        print(f"--root {args.root}: no suite/ folder there; give the root of a gpubench tree.", file=sys.stderr)
        return 2
    graph = graph_of(args.root.resolve(), by_module=args.modules)
    print(report(graph))
    if not args.no_draw:
        out = args.out or REPO / "docs" / ("architecture-modules.svg" if args.modules else "architecture.svg")
        draw(graph, out, by_module=args.modules)
        print(f"drawn: {out}")
    return 1 if graph.red else 0


if __name__ == "__main__":
    sys.exit(main())
