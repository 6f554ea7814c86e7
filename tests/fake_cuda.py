"""A stand-in for the parts of ``torch.cuda`` that stream, event and graph code calls, on a machine
without a GPU: it logs the order of operations and models the one hazard that order must avoid,
an asynchronous copy. ``non_blocking`` copies into a "device" tensor are queued, not done; they
run when an event recorded after them is synchronized, when a stream waits on the stream they
were issued on, or at ``torch.cuda.synchronize``. A host buffer overwritten before that is what
the queued copy then reads, as on a GPU.

"Device" tensors are CPU tensors of the :class:`DeviceTensor` subclass; ``torch.empty`` and
``torch.zeros`` with a CUDA device (always with an index: the code under test must name one)
make them, and ``pin_memory=True`` is accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch


class DeviceTensor(torch.Tensor):
    """A CPU tensor playing a CUDA one: its ``non_blocking`` copies are queued on the fake."""

    fake: FakeCuda | None = None

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.copy_ and kwargs.get("non_blocking") and cls.fake is not None:
            dst, src = args
            cls.fake.queue(lambda: torch.Tensor.copy_(dst.as_subclass(torch.Tensor), src.as_subclass(torch.Tensor)))
            return dst
        if func == torch.Tensor.is_cuda.__get__:  # a getter: a new wrapper object at each access
            return True
        return super().__torch_function__(func, types, args, kwargs)

    def record_stream(self, stream: FakeStream) -> None:  # torch's own rejects a fake stream before dispatch
        stream.fake.log.append(f"tensor kept for {stream.name}")


class FakeStream:
    def __init__(self, fake: FakeCuda, name: str):
        self.fake, self.name = fake, name

    def wait_stream(self, other: FakeStream) -> None:
        self.fake.log.append(f"{self.name} waits for {other.name}")
        self.fake.flush()  # the waiting stream's later work sees everything queued before

    def wait_event(self, event: FakeEvent) -> None:
        self.fake.log.append(f"{self.name} waits for an event")
        self.fake.flush(event.upto)

    def __repr__(self) -> str:
        return f"<stream {self.name}>"


class FakeEvent:
    def __init__(self, fake: FakeCuda):
        self.fake = fake
        self.upto = 0  # the copies queued when it was last recorded

    def record(self, stream: Any = None) -> None:
        self.upto = self.fake.issued
        self.fake.log.append("event recorded")

    def synchronize(self) -> None:
        self.fake.log.append("event synchronized")
        self.fake.flush(self.upto)

    def elapsed_time(self, end: FakeEvent) -> float:
        """Milliseconds: one per copy queued between the two records."""
        return float(end.upto - self.upto)


class FakeGraph:
    def __init__(self, fake: FakeCuda):
        self.fake = fake
        self.pool_id = object()

    def pool(self) -> Any:
        return self.pool_id

    def replay(self) -> None:
        self.fake.log.append("replay")


class FakeCuda:
    """Install with :meth:`install`; ``log`` then holds what was done, in order."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.pending: list[tuple[int, Callable[[], Any]]] = []
        self.issued = 0
        self.streams = [FakeStream(self, "current")]
        self.capturing = False

    # -- the queue of copies --------------------------------------------------------------------
    def queue(self, copy: Callable[[], Any]) -> None:
        self.issued += 1
        self.pending.append((self.issued, copy))
        self.log.append(f"copy queued on {self.streams[-1].name}")

    def flush(self, upto: int | None = None) -> None:
        while self.pending and (upto is None or self.pending[0][0] <= upto):
            self.pending.pop(0)[1]()

    # -- torch.cuda -----------------------------------------------------------------------------
    def current_stream(self, device: Any = None) -> FakeStream:
        return self.streams[-1]

    @contextmanager
    def stream(self, s: FakeStream):
        self.streams.append(s)
        try:
            yield
        finally:
            self.streams.pop()

    @contextmanager
    def graph(self, g: FakeGraph, pool: Any = None):
        self.log.append("capture begins" + (" (shared pool)" if pool is not None else ""))
        self.streams.append(FakeStream(self, "capture"))
        self.capturing = True
        try:
            yield
        finally:
            self.capturing = False
            self.streams.pop()
            self.log.append("capture ends")

    def synchronize(self, device: Any = None) -> None:
        self.log.append("synchronize")
        self.flush()

    def _allocator(self, real: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def make(*shape: Any, device: Any = None, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
            dev = torch.device(device) if device is not None else None
            if dev is None or dev.type != "cuda":
                return real(*shape, device=device, **kwargs)
            if dev.index is None:
                raise AssertionError(f"a CUDA tensor made without a device index ({device})")
            return real(*shape, **kwargs).as_subclass(DeviceTensor)

        return make

    def install(self, monkeypatch: Any) -> FakeCuda:
        monkeypatch.setattr(DeviceTensor, "fake", self)
        monkeypatch.setattr(torch.cuda, "Event", lambda *a, **k: FakeEvent(self))
        monkeypatch.setattr(torch.cuda, "Stream", lambda device=None, **k: FakeStream(self, "side"))
        monkeypatch.setattr(torch.cuda, "current_stream", self.current_stream)
        monkeypatch.setattr(torch.cuda, "stream", self.stream)
        monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda *a, **k: FakeGraph(self))
        monkeypatch.setattr(torch.cuda, "graph", self.graph)
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: self.log.append("sleep"))
        monkeypatch.setattr(torch, "empty", self._allocator(torch.empty))
        monkeypatch.setattr(torch, "zeros", self._allocator(torch.zeros))
        return self
