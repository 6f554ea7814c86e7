"""The documentation site (mkdocs.yml, docs/) builds with warnings as errors, and every link inside
it reaches a page and, where it names one, an anchor that page has.

`mkdocs build --strict` already refuses a link to a missing page or heading in the Markdown; the
check of the built HTML also covers what the theme, the snippets included from README.md and the
API reference generated from `gpubench.contract`'s docstrings link to. The mkdocs packages come
with the `test` extra (and the `docs` one); without them this fails rather than skips, so CI
cannot pass without building the site.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent


class _Page(HTMLParser):
    """The ids a page defines and the links (href, src) it holds."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for key, value in attrs:
            if value is None:
                continue
            if key in ("id", "name"):
                self.ids.add(value)
            elif key in ("href", "src"):
                self.links.append(value)


def broken_links(site: Path) -> list[str]:
    """Every link of every page of the built ``site`` that points inside it at a file that is not
    there, or at an anchor its target page does not define: ``page: link``."""
    site, pages = site.resolve(), {}  # path -> _Page
    for path in sorted(site.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        pages[path] = page
    out = []
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            if parts.scheme or parts.netloc or link.startswith(("mailto:", "javascript:", "data:")):
                continue  # outside the site
            base = site if parts.path.startswith("/") else path.parent  # 404.html links from the root
            target = path if not parts.path else (base / unquote(parts.path).lstrip("/")).resolve()
            if target.is_dir() or parts.path.endswith("/"):
                target = target / "index.html"
            if not target.is_file():
                out.append(f"{path.relative_to(site)}: {link}")
            elif parts.fragment and target.suffix == ".html":
                ids = pages[target].ids if target in pages else set()
                if unquote(parts.fragment) not in ids:
                    out.append(f"{path.relative_to(site)}: {link} (no such anchor)")
    return out


@pytest.fixture(scope="module")
def built_site(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        pytest.fail(
            "the docs packages are missing: install the test extra (pip install -e '.[test]') or the docs extra"
        )
    site = tmp_path_factory.mktemp("docs") / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # no end-of-life banner in the log
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return site, done


def test_the_site_builds_with_warnings_as_errors(built_site):
    site, done = built_site
    log = done.stdout + done.stderr
    warnings = [line for line in log.splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0 and warnings == [], log
    assert (site / "index.html").is_file() and (site / "api" / "index.html").is_file()


def test_the_api_reference_is_generated_from_the_contracts_docstrings(built_site):
    site, done = built_site
    assert done.returncode == 0, done.stdout + done.stderr
    api = (site / "api" / "index.html").read_text(encoding="utf-8")
    # A name of each public piece, and a sentence only its docstring holds.
    for anchor in (
        "gpubench.contract.Technique",
        "gpubench.contract.Technique.variant",
        "gpubench.contract.Param",
        "gpubench.contract.Workload",
        "gpubench.contract.Plot",
        "gpubench.contract.Headline",
        "gpubench.contract.Bench",
        "gpubench.contract.Measured",
        "gpubench.contract.Recorder",
        "gpubench.checks.CheckResult",
        "gpubench.records.claims.Claim",
    ):
        assert f'id="{anchor}"' in api, anchor
    assert "A registered technique. Build one at module level" in api
    assert ":class:" not in api and "&gt;&gt;&gt;" not in api  # Sphinx roles and doctest prompts render raw


def test_a_table_cells_escaped_pipes_show_without_their_backslash(built_site):
    # docs/cli.md escapes the pipes of its code spans for GitHub; docs/hooks.py unescapes them for the site.
    site, done = built_site
    assert done.returncode == 0, done.stdout + done.stderr
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "run [--scenario NAME|PATH]" in cli and "\\|" not in cli


def test_every_link_inside_the_site_resolves(built_site):
    site, done = built_site
    assert done.returncode == 0, done.stdout + done.stderr
    assert broken_links(site) == []


def unrendered_blocks(page: str) -> list[str]:
    """Paragraphs of a built page that hold a list item, a table row or a fence as text: Markdown
    GitHub renders but Python-Markdown does not (a list without a blank line before it, an item
    after a code block that ended its list)."""
    suspect = re.compile(r"\n\s*(?:[-*+]|\d+[.)]) |(?:^|\n)\s*\|.*\||```")
    return [p[:120] for p in re.findall(r"<p>(.*?)</p>", page, re.S) if suspect.search(p)]


def test_no_list_table_or_fence_renders_as_plain_text(built_site):
    site, done = built_site
    assert done.returncode == 0, done.stdout + done.stderr
    found = {
        str(path.relative_to(site)): unrendered_blocks(path.read_text(encoding="utf-8"))
        for path in site.rglob("*.html")
    }
    assert {k: v for k, v in found.items() if v} == {}
    assert unrendered_blocks("<p>The fakes:\n- one\n- two</p>") and unrendered_blocks("<p>end.\n3. Add</p>")


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text(
        '<h2 id="here">x</h2><a href="#here">ok</a><a href="../b/">ok</a><a href="https://example.org/x">out</a>'
    )
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "index.html").write_text(
        '<a href="../a/#here">ok</a><a href="../a/#gone">bad</a><a href="../c/">bad</a><img src="../p.png">'
    )
    assert broken_links(tmp_path) == [
        "b/index.html: ../a/#gone (no such anchor)",
        "b/index.html: ../c/",
        "b/index.html: ../p.png",
    ]
