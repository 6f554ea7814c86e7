"""Run the CLI as the console script does, in a fresh interpreter, and learn its exit code and
which heavy modules it imported (what start-up tests check; never how long it took)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

PROBE = """
import json, sys
from gpubench.cli import main
watched, out = json.loads(sys.argv[2]), sys.argv[3]
sys.argv = ["gpubench", *json.loads(sys.argv[1])]
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
with open(out, "w") as f:
    json.dump({"code": code, "imported": sorted(m for m in watched if m in sys.modules)}, f)
"""


def probe(
    tmp_path: Path, *args: str, watch: Sequence[str] = ("torch", "triton"), env: Mapping[str, str] | None = None
) -> dict:
    """``gpubench ARGS`` run in ``tmp_path`` (its history store there, 100 columns): ``code``, the
    exit code; ``imported``, which of ``watch`` it imported; ``stderr``."""
    said = tmp_path / "probe.json"
    said.unlink(missing_ok=True)
    env = {**os.environ, "GPUBENCH_HISTORY": str(tmp_path / "history.sqlite"), "COLUMNS": "100", **(env or {})}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(args)), json.dumps(list(watch)), str(said)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert said.exists(), proc.stderr
    return {**json.loads(said.read_text()), "stderr": proc.stderr}
