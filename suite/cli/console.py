"""What every command shares: the console it prints on, a stdout a closed pipe cannot break, and
the command group that turns bad input into exit 2 and a full disk into exit 74 (one paragraph,
no traceback)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from gpubench.errors import BadInput
from gpubench.records.atomic import DiskFull
from gpubench.run.outcome import EXIT_BAD_INPUT, EXIT_DISK_FULL


def make_console(stderr: bool = False) -> Console:
    # Logs (not a terminal, no COLUMNS) get a wide fixed width rather than rich's 80 columns.
    wide = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
    return Console(stderr=stderr, highlight=False, soft_wrap=False, width=wide)


class _ClosedPipeSafe:
    """stdout that a reader going away (``gpubench compare ... | head -1``) cannot break: once the
    pipe is closed, output is dropped (fd 1 goes to /dev/null, so the final flush at exit succeeds
    too) and the command goes on to its own exit code, instead of click's exit 1 on EPIPE or a run
    cut short mid-case."""

    def __init__(self, stream: Any):
        self._stream = stream
        self.closed_pipe = False

    def write(self, text: str) -> int:
        if not self.closed_pipe:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.closed_pipe:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.closed_pipe = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # not a real file (a test's buffer)
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def disk_full_text(path: str | None, strerror: str | None, what: str) -> str:
    """One paragraph for a full disk: the file it refused, how much room is left there, what was kept."""
    import shutil

    where = Path(path or ".")
    try:
        free = f"; {shutil.disk_usage(where if where.is_dir() else where.parent).free / 2**20:.1f} MiB free there"
    except OSError:
        free = ""
    return f"the disk is full: writing {where} failed ({strerror or 'no space left'}{free}). {what}"


class OldSpellings(click.Option):
    """An option whose older spellings (``old=("--output",)``) still work, so scripts do not break,
    but are left out of ``--help``: one spelling shown per meaning (every file or folder a command
    writes is ``-o/--out``)."""

    def __init__(self, *args: Any, old: tuple[str, ...] = (), **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.old = tuple(old)
        unknown = [o for o in self.old if o not in self.opts]
        assert not unknown, f"old spellings {unknown} are not among {self.opts}"

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        shown, self.opts = self.opts, [o for o in self.opts if o not in self.old]
        try:
            return super().get_help_record(ctx)
        finally:
            self.opts = shown


class CommandGroup(click.Group):
    """Turns BadInput anywhere in a command into a one-paragraph message and exit code 2, and a
    full disk into one with exit code 74; a closed stdout pipe changes neither what a command does
    nor its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        real = sys.stdout
        sys.stdout = guarded = _ClosedPipeSafe(real)
        try:
            return super().invoke(ctx)
        except BadInput as exc:
            click.echo(f"error: {exc}", err=True)
            ctx.exit(EXIT_BAD_INPUT)
        except DiskFull as exc:
            click.echo(
                "error: "
                + disk_full_text(
                    exc.filename, exc.strerror, "Nothing else was changed; free some space and run it again."
                ),
                err=True,
            )
            ctx.exit(EXIT_DISK_FULL)
        finally:
            guarded.flush()
            sys.stdout = real
