"""The HTML report in a real browser (headless Chromium): it loads with no console errors, every
figure decodes and has a size, and a screenshot is saved under the test's temporary directory."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

# Appended to a copy of the report only: the report itself carries no script.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || e)));
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const badImgs = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length;
  const svgs = [...document.querySelectorAll('svg')];
  const badSvgs = svgs.filter(s => { const r = s.getBoundingClientRect(); return !(r.width > 0 && r.height > 0); }).length;
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = `PROBE imgs=${imgs.length} bad_imgs=${badImgs} svgs=${svgs.length} bad_svgs=${badSvgs} errors=${window.__errors.length}`;
  document.body.appendChild(out);
});
</script>
"""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    exe = Path(sys.executable).with_name("gpubench")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "gpubench.cli"]
    proc = subprocess.run(cmd + ["run", "--scenario", "smoke", "--device", "cpu", "--repeat-scale", "0.2",
                                 "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    path = next(out.iterdir()) / "report.html"
    assert path.exists(), proc.stdout
    return path


def test_report_loads_in_chromium_without_errors_and_every_figure_renders(report, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("GPUBENCH_REQUIRE_BROWSER"):
            pytest.fail("chromium is required here (GPUBENCH_REQUIRE_BROWSER is set) but not installed")
        pytest.skip("chromium is not installed (.ci/run installs it)")
    probe = tmp_path / "probe.html"
    probe.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
    profile = tmp_path / "profile"
    proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                           "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=120)
    m = re.search(r"PROBE imgs=(\d+) bad_imgs=(\d+) svgs=(\d+) bad_svgs=(\d+) errors=(\d+)", proc.stdout)
    assert m, proc.stdout[-2000:] + proc.stderr[-2000:]
    imgs, bad_imgs, svgs, bad_svgs, errors = map(int, m.groups())
    assert imgs + svgs > 0 and bad_imgs == 0 and bad_svgs == 0 and errors == 0
    console_errors = [line for line in proc.stderr.splitlines() if "CONSOLE" in line and "ERROR" in line.upper()]
    assert not console_errors, console_errors

    shot = tmp_path / "report.png"
    subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--window-size=1280,2400",
                    f"--screenshot={shot}", report.as_uri()], capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000  # a page with content, not a blank
    if os.environ.get("GPUBENCH_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["GPUBENCH_KEEP_SCREENSHOT"])
