"""Offloaded activation checkpointing, all but the backward schedule: the :class:`Copier` (a CUDA
copy stream and events, or a worker thread and futures on a CPU), :class:`OffloadStats`, and
:func:`offloaded_forward`, which sends each layer's input to host memory and leaves an
:class:`OffloadedStep` whose ``backward_layer`` a schedule calls as its reloads land.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy
import torch
import torch.nn.functional as F

from gpubench.measure.phase_timer import PhaseTimer
from gpubench.models.llama import LlamaWeights, causal_attend, decoder_layer, head_loss, rope_cos_sin

# One checkpointed layer: (weights, i, x, cos, sin) -> layer i's output. The default is the Llama
# decoder layer with plain causal attention; a model with other layers (packed attention, an MoE
# MLP: combined_training) passes its own.
Layer = Callable[[Any, int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def llama_layer(weights: LlamaWeights, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return decoder_layer(weights, i, x, cos, sin, causal_attend)


@dataclass
class OffloadStats:
    """What one step moved and waited for; on CUDA the times come from events on the streams."""

    buffers: int = 0  # device staging buffers the reloads went through
    fallback: str = ""  # why a second buffer was not used, when it was asked for
    bytes_d2h: int = 0
    bytes_h2d: int = 0
    d2h_ms: float = 0.0  # time the copies themselves took (copy stream busy)
    h2d_ms: float = 0.0
    wait_ms: float = 0.0  # time compute stood still waiting for a reload
    extra_buffer_bytes: int = 0  # device memory of the second staging buffer


_POOL: ThreadPoolExecutor | None = None


def _cpu_copy_pool() -> ThreadPoolExecutor:
    """One long-lived worker thread for every step's copies (a new thread per step would also
    start a new OpenMP team, whose spinning threads then compete with compute)."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpubench-copy")
    return _POOL


def _memcpy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """A plain single-threaded memcpy that releases the GIL (NumPy's), so the worker's copy
    neither holds up Python on the main thread nor opens an OpenMP team of its own."""
    numpy.copyto(_as_numpy(dst), _as_numpy(src))


def _as_numpy(t: torch.Tensor) -> numpy.ndarray:
    return (t.view(torch.int16) if t.element_size() == 2 else t).numpy()  # bf16 has no NumPy dtype


class Copier:
    """Asynchronous copies and the guards around them, used as a context manager (leaving it waits
    for every copy still queued). Copies run in the order issued (one copy stream, one worker
    thread), so an offload always lands before the reload that reads its host buffer. ``delay_s``
    holds every reload back first (a stress test: slow copies must still never be read early)."""

    def __init__(self, device: torch.device, delay_s: float = 0.0):
        self.cuda = device.type == "cuda"
        self.delay_s = delay_s
        self.stats = OffloadStats()
        if self.cuda:
            self.compute = torch.cuda.current_stream(device)
            self.stream = torch.cuda.Stream(device)
        else:
            self.pool = _cpu_copy_pool()
        self._futures: list[Future] = []
        self.timer = PhaseTimer(device)  # h2d, d2h (copy stream or worker thread) and wait (compute)

    def __enter__(self) -> Copier:
        return self

    def __exit__(self, *exc: Any) -> None:
        for future in self._futures:  # a step never leaves work behind for the next
            future.exception()
        self._futures.clear()

    def host_buffer(self, like: torch.Tensor) -> torch.Tensor:
        return torch.empty(like.shape, dtype=like.dtype, pin_memory=self.cuda)

    def marker(self) -> Any:
        """A point on the compute stream: what a later copy must wait for."""
        if self.cuda:
            event = torch.cuda.Event()
            event.record(self.compute)
            return event
        return None  # CPU compute is synchronous: once this line runs, the work before it is done

    def copy(self, dst: torch.Tensor, src: torch.Tensor, after: Any, reload: bool) -> Any:
        """dst.copy_(src) once ``after`` (a marker) is reached; returns a handle to wait on."""
        nbytes = src.numel() * src.element_size()
        if reload:
            self.stats.bytes_h2d += nbytes
        else:
            self.stats.bytes_d2h += nbytes
        phase = "h2d" if reload else "d2h"
        if self.cuda:
            # With no marker, the copy still waits for the compute queued so far: a device dst (a
            # staging buffer) comes from the allocator on the compute stream, whose queued kernels
            # may still use that memory (measured on an H200: the first reload overwrote the head's
            # loss temporaries and every gradient came out wrong; CUDA_LAUNCH_BLOCKING=1 hid it).
            self.stream.wait_event(after if after is not None else self.marker())
            with torch.cuda.stream(self.stream):
                if reload and self.delay_s:
                    torch.cuda._sleep(int(self.delay_s * 1.5e9))  # ~cycles at 1.5 GHz: a slow copy
                start = self.timer.mark(self.stream)
                dst.copy_(src, non_blocking=True)
                done = self.timer.mark(self.stream)
            if src.is_cuda:  # the allocator must not reuse src before the copy ran (a host src: the step holds it)
                src.record_stream(self.stream)
            self.timer.add(phase, start, done)
            return done

        def run() -> None:
            if reload and self.delay_s:
                time.sleep(self.delay_s)
            with self.timer.span(phase):
                _memcpy(dst, src)

        future = self.pool.submit(run)
        self._futures.append(future)
        return future

    def wait(self, handle: Any) -> None:
        """Compute does not go on until the copy behind ``handle`` has landed; the stall is timed."""
        with self.timer.span("wait", self.compute if self.cuda else None):
            if self.cuda:
                self.compute.wait_event(handle)
            else:
                handle.result()

    def finish(self) -> OffloadStats:
        """The step's stats, the phase times read (on CUDA this waits for the device)."""
        if self.cuda:
            torch.cuda.synchronize()
        for phase, seconds in self.timer.seconds.items():
            setattr(self.stats, f"{phase}_ms", seconds * 1e3)
        return self.stats


@dataclass
class OffloadedStep:
    """A step between its offloading forward pass and its backward schedule."""

    weights: LlamaWeights
    copier: Copier
    cos: torch.Tensor
    sin: torch.Tensor
    embedded: torch.Tensor  # the embedding output, with grad: its backward comes last
    hosts: list[torch.Tensor]  # each layer's input, in host memory
    loss: torch.Tensor
    grad: torch.Tensor  # gradient of the loss w.r.t. the output of the lowest layer done so far
    layer: Layer = llama_layer

    def staging_buffers(self, wanted: int, allocate: Callable[[torch.Tensor], torch.Tensor]) -> list[torch.Tensor]:
        """Up to ``wanted`` device buffers for reloads, each from ``allocate(like a layer input)``; one
        at least. When a further one cannot be allocated, fewer, and ``stats.fallback`` says why."""
        like = self.embedded.detach()
        buffers = [allocate(like)]
        try:
            while len(buffers) < wanted:
                buffers.append(allocate(like))
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
            self.copier.stats.fallback = (
                f"staging buffer {len(buffers) + 1} not allocated ({type(exc).__name__}): {len(buffers)} buffer(s)"
            )
        self.copier.stats.buffers = len(buffers)
        self.copier.stats.extra_buffer_bytes = (len(buffers) - 1) * like.numel() * like.element_size()
        return buffers

    def backward_layer(self, i: int, reloaded: torch.Tensor) -> None:
        """Recompute layer ``i`` from its reloaded input and backpropagate through it."""
        inp = reloaded.detach().requires_grad_()
        with torch.enable_grad():
            out = self.layer(self.weights, i, inp, self.cos, self.sin)
        out.backward(self.grad)
        assert inp.grad is not None  # (inp requires grad and out depends on it)
        self.grad = inp.grad

    def finish(self) -> tuple[torch.Tensor, OffloadStats]:
        """Backpropagate into the embedding; the loss and the step's stats."""
        self.embedded.backward(self.grad)
        return self.loss.detach(), self.copier.finish()


def offloaded_forward(
    weights: LlamaWeights,
    tokens: torch.Tensor,
    targets: torch.Tensor,
    positions: torch.Tensor,
    copier: Copier,
    layer: Layer = llama_layer,
) -> OffloadedStep:
    """The forward pass without a graph, each layer's input copied to host memory as it goes,
    then the head's loss and its backward (gradients accumulate into the weights). ``weights``
    is a LlamaWeights or anything with its embed, config, final_norm and lm_head that ``layer`` runs."""
    cos, sin = rope_cos_sin(weights, positions)
    embedded = F.embedding(tokens, weights.embed)
    hosts: list[torch.Tensor] = []
    h = embedded.detach()
    with torch.no_grad():
        for i in range(weights.config.num_layers):
            host = copier.host_buffer(h)
            copier.copy(host, h, copier.marker(), reload=False)
            hosts.append(host)
            h = layer(weights, i, h, cos, sin)
    top = h.detach().requires_grad_()
    loss = head_loss(weights, top, targets)
    loss.backward()
    assert top.grad is not None  # (top requires grad and the loss depends on it)
    return OffloadedStep(weights, copier, cos, sin, embedded, hosts, loss, top.grad, layer)
