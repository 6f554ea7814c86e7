"""What an engine is configured with: its scheduler, its KV layout and their limits."""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULERS = ("static", "continuous")
KV_LAYOUTS = ("contiguous", "paged")


@dataclass(frozen=True)
class EngineConfig:
    scheduler: str = "continuous"
    kv: str = "paged"
    kv_budget_bytes: int = 2 << 20
    block_size: int = 16
    max_len: int = 256  # longest request (prompt + output); contiguous slabs reserve this
    max_batch: int = 16  # most requests decoding at once
    batch_timeout_s: float = 0.05  # static: start a partial batch after its oldest waited this long
    max_prefill_tokens: int = 2048  # prompt tokens one step may take in
    temperature: float = 0.0
    wait: bool = True  # honour arrival times (False: every request is there at time 0)
    # decode-only steps at bucketed batch sizes over static buffers, replayed as CUDA graphs;
    # None: on for CUDA, off elsewhere (True on a CPU runs the buckets eagerly, for tests)
    cuda_graphs: bool | None = None

    def graphs_on(self, device) -> bool:
        return self.cuda_graphs if self.cuda_graphs is not None else device.type == "cuda"

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler {self.scheduler!r} is not one of {SCHEDULERS}")
        if self.kv not in KV_LAYOUTS:
            raise ValueError(f"kv {self.kv!r} is not one of {KV_LAYOUTS}")
