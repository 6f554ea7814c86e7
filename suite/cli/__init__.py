"""Layer 7, the top: may import every layer below; nothing imports it.

Command line: ``gpubench run | profile | report | compare | baseline save | list | env | kv-cache | serve |
prepare | history add``.

This module is the console script (``gpubench.cli:main``) and the map of the commands; each family
lives in its own module: cli.run (run, profile, report), cli.gate (compare, baseline save),
cli.info (list, env), cli.tools (kv-cache, serve, prepare), cli.history (history add); cli.console holds
what they share.

Exit codes: 0 every case passed, 1 some case failed, 2 bad input (one paragraph, no traceback),
74 the disk is full (what finished is kept), 130 interrupted by Ctrl-C and 143 by SIGTERM (what
finished is saved).
"""

from __future__ import annotations

import click

from gpubench.cli import gate as cli_gate
from gpubench.cli import history as cli_history
from gpubench.cli import info as cli_info
from gpubench.cli import run as cli_run
from gpubench.cli import tools as cli_tools
from gpubench.cli.console import CommandGroup, disk_full_text
from gpubench.cli.run import DRY_RUN_IDS, LARGE_RUN_CASES, _CaseProgress
from gpubench.cli.tools import parse_size

__all__ = ["main", "disk_full_text", "parse_size", "DRY_RUN_IDS", "LARGE_RUN_CASES", "_CaseProgress"]


@click.group(cls=CommandGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpubench")
def main() -> None:
    """gpubench: what LLM training and inference optimizations are worth on this machine."""


for _command in (
    cli_run.run,
    cli_run.profile_cmd,
    cli_run.report,
    cli_gate.compare_cmd,
    cli_gate.baseline_group,
    cli_info.list_,
    cli_info.env_,
    cli_tools.kv_cache,
    cli_tools.serve,
    cli_tools.prepare,
    cli_history.history_group,
):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover - after every command is registered
    main()
