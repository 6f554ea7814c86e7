"""Layer 7, the top: may import every layer below; nothing imports it.

Command line: ``gpubench run | profile | report | compare | baseline save | list | env | kv-cache | serve |
prepare | history add``.

This module is the console script (``gpubench.cli:main``) and the map of the commands
(:data:`COMMANDS`); each family lives in its own module, imported when one of its commands runs:
cli.run (run, profile), cli.report (report), cli.gate (compare, baseline save), cli.info (list,
env), cli.tools (kv-cache, serve, prepare), cli.history (history add, html); cli.console holds what
they share.

Exit codes: 0 every case passed, 1 some case failed, 2 bad input (one paragraph, no traceback),
74 the disk is full (what finished is kept), 130 interrupted by Ctrl-C and 143 by SIGTERM (what
finished is saved).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from gpubench.cli.console import CommandGroup, disk_full_text

__all__ = ["main", "disk_full_text", "parse_size", "DRY_RUN_IDS", "LARGE_RUN_CASES", "_CaseProgress"]

# Each command: the module that defines it and the command's name there. A command's module is
# imported when the command is looked up (click's lazy subcommands), so `gpubench report` imports
# what a report needs and not the scenario parser, the KV calculator or the other commands'
# modules; `--help` and a misspelt command (for its "did you mean") look up every one.
COMMANDS = {
    "run": ("gpubench.cli.run", "run"),
    "profile": ("gpubench.cli.run", "profile_cmd"),
    "report": ("gpubench.cli.report", "report"),
    "compare": ("gpubench.cli.gate", "compare_cmd"),
    "baseline": ("gpubench.cli.gate", "baseline_group"),
    "list": ("gpubench.cli.info", "list_"),
    "env": ("gpubench.cli.info", "env_"),
    "kv-cache": ("gpubench.cli.tools", "kv_cache"),
    "serve": ("gpubench.cli.tools", "serve"),
    "prepare": ("gpubench.cli.tools", "prepare"),
    "history": ("gpubench.cli.history", "history_group"),
}
_REEXPORTED = {  # names this module has always offered, from the modules that define them
    "parse_size": "gpubench.cli.tools",
    "DRY_RUN_IDS": "gpubench.cli.run",
    "LARGE_RUN_CASES": "gpubench.cli.run",
    "_CaseProgress": "gpubench.cli.run",
}


class LazyCommands(CommandGroup):
    """The command group, each command imported from :data:`COMMANDS` when it is looked up."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] not in COMMANDS and not args[0].startswith("-"):
            for name in COMMANDS:  # click suggests the loaded commands closest to a misspelt one
                self.get_command(ctx, name)
        return super().resolve_command(ctx, args)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            module, name = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), name)
            if not isinstance(command, click.Command) or command.name != cmd_name:
                raise RuntimeError(f"{module}.{name} is not the command {cmd_name!r}")  # a table out of step
            self.add_command(command)
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyCommands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gpubench")
def main() -> None:
    """gpubench: what LLM training and inference optimizations are worth on this machine."""


def __getattr__(name: str) -> Any:
    if name in _REEXPORTED:
        return getattr(importlib.import_module(_REEXPORTED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    main()
