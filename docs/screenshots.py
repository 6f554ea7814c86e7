"""Make the README's report screenshots from a run's report.html with headless Chromium.

    .venv/bin/python docs/screenshots.py runs/<timestamp>-smoke/report.html

Writes docs/report-smoke.png (the headline and the first rows of the summary) and
docs/report-smoke-figures.png (the kv_cache section: speedup, raw samples, measured bytes beside
the calculator's, and the one-GPU memory breakdown). Positions come from the page itself (a probe
script in a copy of the report reads each section's box), so the crops follow the layout."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

WIDTH = 1300
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--hide-scrollbars",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PROBE = """<script>window.addEventListener('load', () => {
  const box = id => { const e = document.getElementById(id); if (!e) return null;
    const r = e.getBoundingClientRect(); return [r.top + scrollY, r.bottom + scrollY]; };
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = 'BOXES ' + JSON.stringify({summary: box('summary'), row: box('case-9'),
    kv: box('tech-kv_cache'), page: [0, document.documentElement.scrollHeight]});
  document.body.appendChild(out); });</script>"""


def main(report: Path, out_dir: Path) -> None:
    if CHROMIUM is None:
        sys.exit("chromium is not installed (apt install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.html"
        probe.write_text(report.read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"), encoding="utf-8")
        common = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp}/profile", f"--window-size={WIDTH},1000"]
        dom = subprocess.run(
            common + ["--virtual-time-budget=10000", "--dump-dom", probe.as_uri()],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        boxes = json.loads(re.search(r"BOXES (\{.*?\})</pre>", dom).group(1))
        height = int(boxes["page"][1]) + 10
        shot = Path(tmp) / "page.png"
        subprocess.run(
            [
                CHROMIUM,
                *FLAGS,
                f"--user-data-dir={tmp}/profile",
                f"--window-size={WIDTH},{height}",
                f"--screenshot={shot}",
                report.as_uri(),
            ],
            capture_output=True,
            timeout=180,
            check=True,
        )
        page = Image.open(shot)
        crops = {
            "report-smoke.png": (0, int(boxes["row"][1]) + 8),
            "report-smoke-figures.png": (int(boxes["kv"][0]) - 8, int(boxes["kv"][1])),
        }
        for name, (top, bottom) in crops.items():
            image = page.crop((0, top, WIDTH, bottom)).convert("RGB")
            image.quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(out_dir / name, optimize=True)
            print(f"{out_dir / name}: {WIDTH} x {bottom - top} px")


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), Path(__file__).resolve().parent)
