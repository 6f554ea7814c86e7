"""Seconds by phase, the one timer every phase figure of gpubench comes from: a training step's
forward and backward, offload copies and the waits for them, speculative decoding's draft and
verify, a case's stages in the runner.

A phase is timed as spans (``with timer.span("forward"): ...``, or ``add`` between two ``mark``
s) or as laps (``enter(name)`` closes the running phase and opens the next). On a CPU a mark
reads the wall clock. On a GPU a mark is a CUDA event recorded on the stream (the current one,
or the one given): nothing synchronizes inside the timed region, so the phases of a timed call
cost it nothing; the events are read once, after the call, by :attr:`PhaseTimer.seconds`. Spans
may be added from another thread (a CPU copy worker).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch


class PhaseTimer:
    """Seconds by phase: wall clock, or CUDA events on ``device`` when it is a GPU."""

    def __init__(self, device: torch.device | str | None = None, clock: Callable[[], float] = time.perf_counter):
        self.cuda = device is not None and torch.device(device).type == "cuda"
        self._clock = clock
        self._done: dict[str, float] = {}
        self._pending: list[tuple[str, Any, Any]] = []  # CUDA spans whose events are read later
        self._lock = threading.Lock()
        self._current: str | None = None
        self._since: Any = None

    def mark(self, stream: torch.cuda.Stream | None = None) -> Any:
        """Now: a CUDA event recorded on ``stream`` (the current stream when None), else the clock."""
        if not self.cuda:
            return self._clock()
        event = torch.cuda.Event(enable_timing=True)
        event.record(stream)
        return event

    def add(self, name: str, start: Any, end: Any) -> None:
        """The span between two marks counts to ``name``."""
        with self._lock:
            if self.cuda:
                self._pending.append((name, start, end))
            else:
                self._done[name] = self._done.get(name, 0.0) + (end - start)

    @contextlib.contextmanager
    def span(self, name: str, stream: torch.cuda.Stream | None = None) -> Iterator[None]:
        start = self.mark(stream)
        try:
            yield
        finally:
            self.add(name, start, self.mark(stream))

    def enter(self, name: str | None) -> None:
        """Laps: close the running phase (if any) and open ``name`` (None: none)."""
        now = self.mark()
        if self._current is not None:
            self.add(self._current, self._since, now)
        self._current, self._since = name, now

    def stop(self) -> dict[str, float]:
        """Close the running lap; the seconds by phase."""
        self.enter(None)
        return self.seconds

    @property
    def seconds(self) -> dict[str, float]:
        """Seconds by phase, in the order phases first ended. On a GPU this waits for the events
        recorded so far (call it after the timed region)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for name, start, end in pending:
            end.synchronize()
            self._done[name] = self._done.get(name, 0.0) + start.elapsed_time(end) * 1e-3
        return self._done
