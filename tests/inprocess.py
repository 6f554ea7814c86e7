"""A scenario run in the test's own process, through the supervisor as ``gpubench run --isolation
none`` runs it: for tests that read a run's results and need no worker processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from gpubench.run import supervisor
from gpubench.run.outcome import RunOutcome
from gpubench.run.scenario import Scenario


def run_in_process(scenario: Scenario, device: torch.device | str, out_root: Path | str, **kw: Any) -> RunOutcome:
    """``supervisor.run_scenario`` on ``device`` with isolation none; ``kw`` as run_scenario takes
    them (only, repeat_scale, progress, telemetry_interval_s, calibrate)."""
    options = supervisor.RunOptions(devices=[str(device)], isolation="none")
    return supervisor.run_scenario(scenario, options, out_root, **kw)
