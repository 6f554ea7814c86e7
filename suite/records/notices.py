"""Notices: what a case says to the user while it runs (a draft model trained once, a download),
so a long silent step is not mistaken for a hang.

A technique or model calls :func:`notice`; whoever runs the case decides where it goes: ``gpubench
run``'s progress output (a worker process sends it to the supervisor over its pipe; see
:mod:`gpubench.run.worker`), or, with no one listening (a script, a test, a Ray task), stderr.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

_listeners: list[Callable[[str], None]] = []


def notice(text: str) -> None:
    """Tell the user ``text`` now (one line, e.g. ``speculative_decoding: training ...``)."""
    if _listeners:
        _listeners[-1](text)
    else:
        print(f"gpubench: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def listening(callback: Callable[[str], None]) -> Iterator[None]:
    """Inside the block, notices go to ``callback`` instead of stderr."""
    _listeners.append(callback)
    try:
        yield
    finally:
        _listeners.remove(callback)
