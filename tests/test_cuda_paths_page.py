"""docs/cuda-paths.md points at CUDA-only code by file:line, and every move or reformat shifts the
lines under it (it went stale twice: the move into layer folders and the ruff format sweep). Each
reference must still land on the code its row names: every range exists, starts and ends on a line
of code (not a blank), and holds one of the row's anchors, the code names the row puts in backticks
(a range of the "not reachable" table may hold its ``GPU-only`` comment instead, and each such row
holds that comment in one of its ranges at least)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cuda-paths.md"
GPU_ONLY = "GPU-only"
FAKED, UNREACHABLE = "## Reached by a fake", "## Not reachable"


@dataclass(frozen=True)
class Row:
    section: str
    where: str
    anchors: tuple[str, ...]  # code names in backticks, in the row's where and what cells
    ranges: tuple[tuple[str, int, int], ...]  # (path, first line, last line), 1-based, inclusive


def ranges_of(where: str) -> tuple[tuple[str, int, int], ...]:
    """``a.py:1-3, 7, b.py:9 (peers ...)`` -> ((a.py, 1, 3), (a.py, 7, 7), (b.py, 9, 9))."""
    out, path = [], None
    for part in re.sub(r"\s*\(.*\)\s*$", "", where).split(","):
        match = re.fullmatch(r"\s*(?:(\S+\.py):)?(\d+)(?:-(\d+))?\s*", part)
        assert match and (match.group(1) or path), f"docs/cuda-paths.md: cannot read {part!r} in {where!r}"
        path = match.group(1) or path
        out.append((path, int(match.group(2)), int(match.group(3) or match.group(2))))
    return tuple(out)


def rows(text: str) -> list[Row]:
    out, section = [], None
    for line in text.splitlines():
        if line.startswith("## "):
            section = next((s for s in (FAKED, UNREACHABLE) if line.startswith(s)), None)
        elif section and line.startswith("| ") and not line.startswith(("| where", "|---")):
            where, what = (cell.strip() for cell in line.split("|")[1:3])
            anchors = tuple(re.findall(r"`([^`]+)`", where + " " + what))
            out.append(Row(section, where, anchors, ranges_of(where)))
    return out


ROWS = rows(PAGE.read_text())


def lines_of(path: str) -> list[str]:
    file = ROOT / path
    assert file.is_file(), f"docs/cuda-paths.md names {path}, which does not exist"
    return file.read_text().splitlines()


def problems(row: Row) -> list[str]:
    out, gpu_only_seen = [], False
    for path, first, last in row.ranges:
        lines = lines_of(path)
        where = f"{path}:{first}-{last}"
        if not 1 <= first <= last <= len(lines):
            out.append(f"{where} is outside the file ({len(lines)} lines)")
            continue
        held = "\n".join(lines[first - 1 : last])
        gpu_only_seen |= GPU_ONLY in held
        if not lines[first - 1].strip() or not lines[last - 1].strip():
            out.append(f"{where} starts or ends on a blank line")
        allowed = row.anchors + ((GPU_ONLY,) if row.section == UNREACHABLE else ())
        if not any(anchor in held for anchor in allowed):
            out.append(f"{where} holds none of {list(allowed)}")
    if row.section == UNREACHABLE and not gpu_only_seen:
        out.append(f"{row.where}: no {GPU_ONLY} comment in its lines")
    return out


def test_the_page_lists_both_tables():
    assert {row.section for row in ROWS} == {FAKED, UNREACHABLE} and len(ROWS) > 40


@pytest.mark.parametrize("row", ROWS, ids=[row.where[:60] for row in ROWS])
def test_each_reference_lands_on_the_code_its_row_names(row):
    assert row.anchors or row.section == UNREACHABLE, f"{row.where}: its row names no code in backticks"
    assert problems(row) == []


def test_a_shifted_reference_fails(tmp_path, monkeypatch):
    """The check catches what it exists for: the same row pointed a few lines off."""
    (tmp_path / "m.py").write_text("def f():\n    pass\n\n\ndef cuda_only():\n    torch.cuda.synchronize()\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    good = Row(FAKED, "m.py:5-6", ("cuda_only",), (("m.py", 5, 6),))
    assert problems(good) == []
    assert problems(Row(FAKED, "m.py:1-2", ("cuda_only",), (("m.py", 1, 2),))) == [
        "m.py:1-2 holds none of ['cuda_only']"
    ]
    assert problems(Row(FAKED, "m.py:4-5", ("cuda_only",), (("m.py", 4, 5),))) == [
        "m.py:4-5 starts or ends on a blank line"
    ]
    assert problems(Row(FAKED, "m.py:6-9", ("cuda_only",), (("m.py", 6, 9),)))[0].startswith("m.py:6-9 is outside")
    assert problems(Row(UNREACHABLE, "m.py:5-6", (), (("m.py", 5, 6),))) == [
        "m.py:5-6 holds none of ['GPU-only']",
        f"m.py:5-6: no {GPU_ONLY} comment in its lines",
    ]


def test_ranges_read_as_the_page_writes_them():
    assert ranges_of("a.py:1-3, 7, b/c.py:9 (peers `x`)") == (("a.py", 1, 3), ("a.py", 7, 7), ("b/c.py", 9, 9))
