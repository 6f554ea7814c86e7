"""Compiling a Triton kernel for sm_90 (H100 / H200) on a machine without a GPU: Triton's own
compiler and ptxas, run in a subprocess with the interpreter off (gpubench turns it on where
there is no CUDA) and a fresh cache, so a test sees what the compiler rejects, which Triton's
interpreter happily runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def compile_script_output(script: str, cache_dir: Path, timeout_s: int = 300) -> str:
    """The stdout of ``python -c script`` compiled, not interpreted; skips the test where Triton
    has no CUDA backend or no ptxas, fails it on any other error."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(cache_dir)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0 and (
        "No module named 'triton.backends.nvidia'" in result.stderr
        or "ptxas" in result.stderr
        and "not found" in result.stderr
    ):
        pytest.skip(f"Triton cannot compile for CUDA here: {result.stderr.strip().splitlines()[-1]}")
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout
