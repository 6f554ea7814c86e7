"""CUDA-graph replay of the decode forward pass, as vLLM and nano-vllm do it: a step of only
decodes launches one graph instead of a few hundred kernels. Graphs are captured once per
bucket of batch sizes (1, 2, 4, 8, ... up to max_batch) over static input buffers; a step of
``n`` decodes fills the buffers of the smallest bucket that holds it, the rows past ``n`` with
a padding row (token 0 at position 0, writing its K/V into the backend's spare unit, attending
over that one token), replays, and keeps the first ``n`` rows of the logits.

Without CUDA (tests) the same buckets, buffers and padding run the forward eagerly instead of a
replay: what the graphs compute, uncaptured.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpubench.serving.kv import KVBackend
from gpubench.serving.sequence import Sequence
from gpubench.serving.step_inputs import Staging, StepInputs


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two below ``max_batch``, then ``max_batch`` itself."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1 (got {max_batch})")
    buckets = [1]
    while buckets[-1] * 2 < max_batch:
        buckets.append(buckets[-1] * 2)
    return buckets if buckets[-1] == max_batch else buckets + [max_batch]


def bucket_for(n: int, buckets: list[int]) -> int:
    """The smallest bucket holding ``n`` rows."""
    i = bisect.bisect_left(buckets, n)
    if n < 1 or i == len(buckets):
        raise ValueError(f"{n} decodes do not fit the buckets {buckets}")
    return buckets[i]


@dataclass(frozen=True)
class DecodeBuffers:
    """One bucket's views of the static buffer: ``(4 + columns) * bucket`` int64 elements."""

    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    lens: torch.Tensor
    rows: torch.Tensor  # (bucket, columns)


class DecodeGraphs:
    """Decode forward passes at bucketed batch sizes over static buffers; captured as CUDA graphs
    when ``capture`` (CUDA only), else run eagerly on the same padded buffers."""

    def __init__(
        self,
        kv: KVBackend,
        staging: Staging,
        max_batch: int,
        decode_forward: Callable[[StepInputs], torch.Tensor],
        capture: bool,
    ):
        if kv.spare_unit is None:
            raise ValueError("bucketed decode needs the KV backend's spare unit for its padding rows")
        if capture and kv.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device (the model is on {kv.device})")
        self.kv, self.staging, self.forward = kv, staging, decode_forward
        self.buckets = batch_buckets(max_batch)
        self.columns = kv.decode_width()
        if self.columns < 1:
            raise ValueError(f"bucketed decode needs the longest request (max_len {kv.max_len}) to size its buffers")
        self.width = kv.max_len  # contiguous KV reads whole slabs: the graph's shapes cannot follow the batch
        self.buffer = torch.zeros((4 + self.columns) * self.buckets[-1], dtype=torch.long, device=kv.device)
        self.pad_slot, self.pad_row = kv.padding_row(self.columns)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays: dict[int, int] = {b: 0 for b in self.buckets}  # bucket -> steps run there
        if capture:
            self._capture()

    def views(self, bucket: int) -> DecodeBuffers:
        parts = torch.split(self.buffer[: (4 + self.columns) * bucket], [bucket] * 4 + [bucket * self.columns])
        return DecodeBuffers(parts[0], parts[1], parts[2], parts[3], parts[4].view(bucket, self.columns))

    def inputs(self, bucket: int) -> StepInputs:
        b = self.views(bucket)
        return StepInputs(b.tokens, b.positions, b.slots, None, None, self.kv.decode_batch(b.lens, b.rows, self.width))

    def pack(self, decodes: list[Sequence], bucket: int) -> list[int]:
        """The host values of a bucket's buffers: the decodes' rows, then padding rows."""
        rows = self.kv.decode_rows(decodes)
        pad = bucket - len(decodes)
        table = [row + [0] * (self.columns - len(row)) for row in rows.rows] + [self.pad_row] * pad
        return (
            [s.tokens[s.cached] for s in decodes]
            + [0] * pad
            + [s.cached for s in decodes]
            + [0] * pad
            + rows.slots
            + [self.pad_slot] * pad
            + rows.lens
            + [1] * pad
            + [x for row in table for x in row]
        )

    def run(self, decodes: list[Sequence]) -> torch.Tensor:
        """Logits ``(len(decodes), vocab)`` of one decode step."""
        bucket = bucket_for(len(decodes), self.buckets)
        self.staging.put(self.pack(decodes, bucket), into=self.buffer)
        self.replays[bucket] += 1
        if bucket in self.graphs:
            graph, logits = self.graphs[bucket]
            graph.replay()
        else:
            logits = self.forward(self.inputs(bucket))
        return logits[: len(decodes)]

    def _capture(self) -> None:
        """Largest bucket first, all sharing one memory pool (as nano-vllm does). Every row is a
        padding row during capture, so nothing a sequence owns is written."""
        pool = None
        for bucket in reversed(self.buckets):
            values = [0] * bucket * 2 + [self.pad_slot] * bucket + [1] * bucket + self.pad_row * bucket
            self.staging.put(values, into=self.buffer)
            self._warm_up(bucket)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self.forward(self.inputs(bucket))
            pool = graph.pool()
            self.graphs[bucket] = (graph, logits)
        torch.cuda.synchronize(self.kv.device)

    def _warm_up(self, bucket: int, calls: int = 3) -> None:
        """Lazy initialization and Triton compilation kept out of the graph, on a side stream as
        torch requires before a capture: it waits for the staged copy on the current stream, and
        the current stream waits for it before the capture starts."""
        device = self.kv.device
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(calls):
                self.forward(self.inputs(bucket))
        torch.cuda.current_stream(device).wait_stream(side)
