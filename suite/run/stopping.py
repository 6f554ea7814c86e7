"""How a run stops before its cases are done: SIGTERM turned into a Ctrl-C-like interrupt
(:class:`Terminated`, :func:`sigterm_as_interrupt`), a run that cannot go on (:class:`RunAborted`),
and the reason written into the records of the cases still running (:func:`stop_reason`).

SIGTERM (``timeout``, a CI cancel, a scheduler) stops the run as Ctrl-C does: the workers are
stopped, the running case is recorded ``interrupted`` and the record is closed.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from gpubench.records.atomic import DiskFull


class RunAborted(Exception):
    """The run cannot go on (in-process: the CUDA context is unusable)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM: the run stops as on Ctrl-C (a KeyboardInterrupt, so every path that closes the
    record on Ctrl-C closes it on SIGTERM too)."""

    def __init__(self) -> None:
        super().__init__("stopped by SIGTERM")


class SigtermAsInterrupt:
    """While armed, SIGTERM raises :class:`Terminated` in the main thread, once; later ones, and
    any that come while the record is being closed (disarmed), are ignored: the run is ending."""

    def __init__(self) -> None:
        self.armed = True
        self.received = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.received = True
        if self.armed:
            self.armed = False
            raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[SigtermAsInterrupt]:
    """Install :class:`SigtermAsInterrupt` for the block (in the main thread; elsewhere a signal
    handler cannot be set, and SIGTERM keeps its default)."""
    handler = SigtermAsInterrupt()
    if threading.current_thread() is not threading.main_thread():
        yield handler
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def sigint_restored() -> bool:
    """Make Ctrl-C (SIGINT) stop this process with a KeyboardInterrupt even where it was started
    with SIGINT ignored: a shell script's ``gpubench run &`` (a background job of a non-interactive
    shell), nohup-like wrappers. Python installs its handler only where SIGINT was not ignored, so
    such a run would not stop on ``kill -INT`` at all (issue 35). True when it was ignored; in
    another thread than the main one nothing is changed (no handler can be set there)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True


def stop_reason(exc: BaseException | None) -> str:
    """Why the cases still running were stopped, for their records."""
    if isinstance(exc, Terminated):
        return "stopped by SIGTERM"
    if isinstance(exc, KeyboardInterrupt):
        return "stopped by Ctrl-C"
    if isinstance(exc, DiskFull):
        return f"stopped: the disk is full ({exc.strerror}: {exc.filename})"
    return f"stopped: the run failed ({type(exc).__name__}: {exc})" if exc is not None else "stopped"
