"""The HTML report in a real browser (headless Chromium, 1300 px wide), on a small real run, on a
synthesized 200-case sweep and on a run shaped like issue 24's H200 run (four techniques, peak
memory and energy columns, most claims not judged): it loads with no console errors; every figure
decodes and has a size; no figure's text leaves its SVG box; nothing is wider than the page, with
every collapsed section closed and opened; the summary comes before the claims and every column of
the summary table is in view; no empty figure frame; no mathtext reaches the page; a screenshot is
saved under the test's temporary directory (GPUBENCH_KEEP_SCREENSHOT=path keeps a copy)."""

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import report_runs
from test_report import EMPTY_FRAME

from gpubench.reports import html as report_html

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
WIDTH = 1300
PHONE, PHONE_HEIGHT = 390, 844  # a phone's viewport, in CSS px

# Appended to a copy of the report only: the report itself carries no script. It measures the page
# as loaded, then again with every <details> opened, and writes what it found as JSON.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e)));
function describe(el) {
  const cls = typeof el.className === 'string' ? el.className : '';
  return el.tagName + (el.id ? '#' + el.id : '') + (cls ? '.' + cls.split(' ')[0] : '')
    + ' "' + (el.textContent || '').trim().slice(0, 50) + '"';
}
// Inside a box of its own that scrolls sideways (overflow-x) and fits the page: not the page's width.
function scrollsInOwnBox(el, vw) {
  for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
    if (getComputedStyle(a).overflowX !== 'visible') return a.getBoundingClientRect().right <= vw + 0.5;
  }
  return false;
}
function measure() {
  const vw = window.innerWidth;
  const wide = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.id === 'probe' || (el.closest('svg') && el.tagName.toLowerCase() !== 'svg')) continue;
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > vw + 0.5 && !scrollsInOwnBox(el, vw)) wide.push(describe(el) + ' right=' + Math.round(r.right));
  }
  const outside = [];
  const svgs = [...document.querySelectorAll('svg')];
  for (const svg of svgs) {
    const box = svg.getBoundingClientRect();
    if (box.width === 0) continue;  // in a closed <details>
    const caption = ((svg.closest('figure') || svg).querySelector('figcaption') || {}).textContent || '?';
    for (const t of svg.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1)
        outside.push(caption.slice(0, 60) + ': "' + t.textContent.slice(0, 40) + '"');
    }
  }
  const bad = svgs.filter(s => !s.closest('details:not([open])'))
                  .filter(s => { const r = s.getBoundingClientRect(); return !(r.width > 0 && r.height > 0); });
  const top = sel => { const e = document.querySelector(sel); return e ? e.getBoundingClientRect().top : null; };
  const heads = [...document.querySelectorAll('#summary-table thead th')].map(th => {
    const r = th.getBoundingClientRect(); return [th.textContent.trim(), Math.round(r.left), Math.round(r.right)]; });
  return {scroll_width: document.documentElement.scrollWidth, inner_width: vw,
          summary_top: top('#summary'), claims_top: top('#claims'), summary_heads: heads,
          height: document.documentElement.scrollHeight, svgs: svgs.length, bad_svgs: bad.length,
          wide: wide, outside: outside};
}
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const result = {imgs: imgs.length, bad_imgs: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length,
                  closed: measure()};
  document.querySelectorAll('details').forEach(d => { d.open = true; });
  result.opened = measure();
  result.errors = window.__errors;
  // In a phone-sized frame (probe(width=PHONE)) the page that holds the frame is the one dumped.
  const host = window.parent !== window ? window.parent.document : document;
  const out = host.createElement('pre');
  out.id = 'probe';
  out.textContent = 'PROBE' + JSON.stringify(result) + 'END';
  host.body.appendChild(out);
});
</script>
"""
FOUND = re.compile(r'<pre id="probe">PROBE(.*?)END</pre>', re.S)
# matplotlib's mathtext markup, or a $...$ span, in the text of an inline SVG
SVG_TEXT = re.compile(r"<text\b[^>]*>(.*?)</text>", re.S)
MATH = re.compile(r"\$[^$<]+\$")

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--enable-logging=stderr",
    "--v=0",
    f"--window-size={WIDTH},2000",
]


@pytest.fixture(scope="module")
def reports(small_run_dir, tmp_path_factory) -> dict[str, Path]:
    """The session's small real run's report (conftest.small_run_dir, written beside a copy of its
    results: the shared run stays unwritten), a synthesized 200-case sweep's, and the H200-shaped
    run's (report_runs.h200_shaped_doc)."""
    out = tmp_path_factory.mktemp("runs")
    sweep = report_runs.write_run(out / "sweep", report_runs.sweep_doc())
    small = out / "small"
    shutil.copytree(small_run_dir, small)
    h200 = report_runs.write_run(out / "h200", report_runs.h200_shaped_doc(small_run_dir))
    return {
        "small run": report_html.write_report(small).html,
        "200-case sweep": report_html.write_report(sweep).html,
        "H200-shaped run": report_html.write_report(h200).html,
    }


def probe(report: Path, tmp_path: Path, width: int = WIDTH) -> tuple[dict, list[str]]:
    """What PROBE found in ``report`` in a window ``width`` px wide. Chromium's windows are at
    least 500 px wide, so a narrower width (a phone's) is a frame of that size in a page of its
    own, the report as the frame's srcdoc (same origin: its probe writes into the page)."""
    page = tmp_path / "probe.html"
    probed = report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>")
    if width < 500:
        probed = (
            f'<!DOCTYPE html><html><body style="margin: 0"><iframe style="border: 0; width: {width}px; '
            f'height: {PHONE_HEIGHT}px" srcdoc="{html.escape(probed, quote=True)}"></iframe></body></html>'
        )
    page.write_text(probed, encoding="utf-8")
    flags = [f for f in FLAGS if not f.startswith("--window-size")] + [f"--window-size={max(width, 500)},2000"]
    proc = subprocess.run(
        [
            CHROMIUM,
            *flags,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = FOUND.search(proc.stdout)
    assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
    console_errors = [line for line in proc.stderr.splitlines() if "CONSOLE" in line and "ERROR" in line.upper()]
    return json.loads(html.unescape(found.group(1))), console_errors


def mathtext(page: str) -> list[str]:
    """SVG texts that carry mathtext markup instead of plain text."""
    return [t for t in SVG_TEXT.findall(page) if "mathdefault" in t or MATH.search(t)]


def needs_chromium() -> None:
    if CHROMIUM is None:
        if os.environ.get("GPUBENCH_REQUIRE_BROWSER"):
            pytest.fail("chromium is required here (GPUBENCH_REQUIRE_BROWSER is set) but not installed")
        pytest.skip("chromium is not installed (.ci/run installs it)")


@pytest.mark.e2e
@pytest.mark.timeout(300)  # one small page, about 2 s
def test_the_probe_sees_text_outside_its_figure_a_wide_element_and_mathtext(tmp_path):
    """The checks below would catch what they look for: a tick label past its SVG's edge, a row
    of links wider than the page (also inside a collapsed section), a mathtext tick label."""
    needs_chromium()
    label = r"$\mathdefault{2^{7}}$"
    page = tmp_path / "bad.html"
    page.write_text(f"""<!DOCTYPE html><html><body>
<figure><figcaption>bad figure</figcaption><svg width="200" height="100" xmlns="http://www.w3.org/2000/svg">
<text x="150" y="50" style="font-size: 20px">{label} far past the right edge</text></svg></figure>
<nav style="white-space: nowrap">{'<a href="#x">a section link</a> ' * 40}</nav>
<details><summary>more</summary><p style="width: 2000px">wide when opened</p></details>
<div style="overflow-x: auto"><p style="width: 2000px">scrolls in its own box</p></div>
</body></html>""")
    result, _ = probe(page, tmp_path)
    assert not any("scrolls in its own box" in w for w in result["closed"]["wide"] + result["opened"]["wide"])
    outside = result["closed"]["outside"]
    assert len(outside) == 1 and outside[0].startswith(f'bad figure: "{label} far past')
    assert any(w.startswith('A "a section link"') for w in result["closed"]["wide"])
    assert result["closed"]["scroll_width"] > WIDTH
    assert any(w.startswith('P "wide when opened"') for w in result["opened"]["wide"])
    assert mathtext(page.read_text()) == [label + " far past the right edge"]


@pytest.mark.e2e
@pytest.mark.timeout(
    900
)  # the session's small run (~10 s, ~35 s where the speculative pair is not cached), three pages
@pytest.mark.parametrize("which", ["small run", "200-case sweep", "H200-shaped run"])
def test_report_in_chromium_loads_fits_the_page_and_keeps_figure_text_in_its_box(reports, which, tmp_path):
    needs_chromium()
    report = reports[which]
    text = report.read_text(encoding="utf-8")
    assert "mathdefault" not in text and mathtext(text) == []  # tick labels are plain text
    assert [frame for frame in EMPTY_FRAME if frame in text] == []  # a figure with no data is left out

    result, console_errors = probe(report, tmp_path)
    assert not result["errors"] and not console_errors, (result["errors"], console_errors)
    assert result["bad_imgs"] == 0
    for state in ("closed", "opened"):  # as loaded, then with every collapsed section open
        seen = result[state]
        assert seen["svgs"] > 0 and seen["bad_svgs"] == 0, (state, seen)
        assert seen["outside"] == [], (state, seen["outside"][:10])  # every <text> inside its <svg>
        assert seen["scroll_width"] <= seen["inner_width"] == WIDTH, (state, seen["wide"][:10])
        assert seen["wide"] == [], (state, seen["wide"][:10])  # nothing runs off the page
        assert seen["summary_top"] < seen["claims_top"]  # the summary first
        assert seen["summary_heads"] and all(0 <= left < right <= WIDTH for _, left, right in seen["summary_heads"])
    if which == "H200-shaped run":  # every column in view, the energy and memory columns included
        heads = [name for name, _, _ in result["closed"]["summary_heads"]]
        assert "peak memory base / opt" in heads and "energy per call base / opt" in heads, heads
    if which == "200-case sweep":  # read as a surface: a few screens, not a 200-row table and box plot
        assert result["closed"]["height"] < 6000 < result["opened"]["height"]

    shot = tmp_path / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS[:-1],
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={WIDTH},2400",
            f"--screenshot={shot}",
            report.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert shot.exists() and shot.stat().st_size > 10_000  # a page with content, not a blank
    if os.environ.get("GPUBENCH_KEEP_SCREENSHOT") and which == "small run":
        shutil.copy(shot, os.environ["GPUBENCH_KEEP_SCREENSHOT"])


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_phone_probe_sees_a_page_that_scrolls_sideways(tmp_path):
    """At a phone's width (a frame, Chromium's windows being wider) the probe measures the frame's
    page: a table wider than it, not in a box of its own, makes the document wider."""
    needs_chromium()
    page = tmp_path / "wide.html"
    page.write_text(
        '<!DOCTYPE html><html><head><meta name="viewport" content="width=device-width, initial-scale=1">'
        '</head><body><table style="width: 800px"><tr><td>a wide table</td></tr></table>'
        '<div style="overflow-x: auto"><table style="width: 800px"><tr><td>boxed</td></tr></table></div>'
        '</body></html>'
    )
    result, _ = probe(page, tmp_path, PHONE)
    seen = result["closed"]
    assert seen["inner_width"] == PHONE and seen["scroll_width"] > PHONE
    assert [w.split('"')[1] for w in seen["wide"]] == ["a wide table"] * 4  # table, tbody, tr, td; not the boxed one


@pytest.mark.e2e
@pytest.mark.timeout(900)
@pytest.mark.parametrize("which", ["small run", "200-case sweep", "H200-shaped run"])
def test_on_a_phone_the_page_never_scrolls_sideways(reports, which, tmp_path):
    """At 390 px (a phone) the document is no wider than the viewport, as loaded and with every
    collapsed section open: wide tables scroll inside their own box, figures shrink to the page."""
    needs_chromium()
    result, console_errors = probe(reports[which], tmp_path, PHONE)
    assert not result["errors"] and not console_errors, (result["errors"], console_errors)
    for state in ("closed", "opened"):
        seen = result[state]
        assert seen["inner_width"] == PHONE, (state, seen["inner_width"])
        assert seen["scroll_width"] <= PHONE and seen["wide"] == [], (state, seen["scroll_width"], seen["wide"][:10])
