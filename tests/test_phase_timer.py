"""gpubench.measure.phase_timer: the one timer of every phase figure (a case's stages, a training step's
forward and backward, offload copies and waits, speculative decoding's draft and verify)."""

from __future__ import annotations

import threading

import pytest
import torch

from gpubench.measure.phase_timer import PhaseTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_laps_and_spans_sum_by_phase_on_the_clock():
    """A lap runs from enter(name) to the next enter; a span from its start to its end; a phase
    entered twice sums both; stop() closes the running lap."""
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    timer.enter("build")
    clock.now = 1.0
    timer.enter("check")
    clock.now = 3.5
    timer.enter("build")
    with timer.span("inner"):
        clock.now = 4.0
    assert timer.stop() == {"build": 1.5, "check": 2.5, "inner": 0.5}
    assert timer.seconds == {"build": 1.5, "check": 2.5, "inner": 0.5}  # stopped: nothing more runs


def test_a_span_that_raises_still_counts():
    clock = FakeClock()
    timer = PhaseTimer(clock=clock)
    with pytest.raises(RuntimeError), timer.span("forward"):
        clock.now = 2.0
        raise RuntimeError("boom")
    assert timer.seconds == {"forward": 2.0}


def test_spans_added_from_another_thread_are_all_kept():
    """A CPU copy worker adds its spans beside the main thread's: none is lost."""
    timer = PhaseTimer()
    start = timer.mark()

    def worker() -> None:
        for _ in range(1000):
            timer.add("h2d", start, start + 0.001)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(1000):
        timer.add("wait", start, start + 0.002)
    for t in threads:
        t.join()
    assert timer.seconds == pytest.approx({"h2d": 4.0, "wait": 2.0})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_spans_are_events_read_after_the_region():
    """On a GPU a mark is an event on the stream; nothing is read until seconds is asked for."""
    timer = PhaseTimer("cuda")
    a = torch.randn(2048, 2048, device="cuda")
    with timer.span("matmul"):
        for _ in range(10):
            a = a @ a.T / 2048
    assert isinstance(timer.mark(), torch.cuda.Event)
    assert timer.seconds["matmul"] > 0
