"""The engine loop: requests arrive in real time, the scheduler picks each step's prefills and
decodes, the model runner runs them, and every step is put on a timeline. The result is a
:class:`ServingRun`: each request's tokens and timestamps, the timeline and the KV accounting.

The parts, after nano-vllm's split: :mod:`.sequence`, :mod:`.blocks` (block manager, slabs),
:mod:`.kv` (contiguous and paged KV behind one interface), :mod:`.scheduler` (static and
continuous), :mod:`.model_runner`; :mod:`.metrics` reads a run as vLLM's benchmark does.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from gpubench.models.llama import LlamaWeights
from gpubench.serving.config import EngineConfig
from gpubench.serving.kv import KVBackend, make_kv
from gpubench.serving.model_runner import ModelRunner
from gpubench.serving.scheduler import Scheduler, Step, make_scheduler
from gpubench.serving.sequence import Sequence
from gpubench.serving.traces import Request


@dataclass
class RequestTimes:
    id: int
    arrival_s: float  # 0 when the run ignored arrival times
    prompt_len: int
    output_len: int
    token_times_s: list[float]  # when each output token came out, from the run's start
    finish_s: float | None
    preemptions: int = 0


@dataclass
class Timeline:
    """One entry per step, taken after it."""

    t_s: list[float] = field(default_factory=list)
    running: list[int] = field(default_factory=list)  # unfinished requests holding KV
    waiting: list[int] = field(default_factory=list)
    live_bytes: list[int] = field(default_factory=list)  # KV of the tokens cached
    reserved_bytes: list[int] = field(default_factory=list)  # KV set aside for them
    step_tokens: list[int] = field(default_factory=list)  # tokens through the forward pass

    def add(self, t: float, step: Step, scheduler: Scheduler, kv: KVBackend) -> None:
        self.t_s.append(t)
        self.running.append(sum(1 for s in scheduler.running if not s.done))
        self.waiting.append(len(scheduler.waiting))
        self.live_bytes.append(sum(s.cached for s in scheduler.running) * kv.token_bytes)
        self.reserved_bytes.append(kv.reserved_bytes())
        self.step_tokens.append(step.tokens)


@dataclass
class ServingRun:
    scheduler: str
    kv: str
    wait: bool
    tokens: dict[int, list[int]]  # request id -> output tokens
    requests: list[RequestTimes]
    timeline: Timeline
    duration_s: float  # the whole loop, wall clock
    preemptions: int
    preempted_tokens_left: list[int]  # per preemption, the tokens its request had still to generate
    kv_budget_bytes: int
    kv_capacity_tokens: int
    kv_token_bytes: int
    accounting_problems: list[str]


class Engine:
    def __init__(self, weights: LlamaWeights, config: EngineConfig):
        self.weights, self.config = weights, config

    def run(self, requests: list[Request]) -> ServingRun:
        """Serve ``requests`` in real time (each at its arrival, unless ``config.wait`` is off)."""
        c = self.config
        for r in requests:
            if r.prompt_len + r.output_len > c.max_len:
                raise ValueError(
                    f"request {r.id}: prompt {r.prompt_len} + output {r.output_len} tokens exceeds max_len {c.max_len}"
                )
        graphs = c.graphs_on(self.weights.device)
        kv = make_kv(self.weights, c, spare_unit=graphs)
        scheduler = make_scheduler(kv, c)
        runner = ModelRunner(self.weights, kv, c.temperature, decode_graphs=graphs, max_batch=c.max_batch)
        seqs = [Sequence.of(r, c.temperature) for r in requests]
        pending = deque(sorted(seqs, key=lambda s: s.req.arrival_s))
        timeline, problems = Timeline(), []
        start = time.perf_counter()
        clock = lambda: time.perf_counter() - start
        while pending or scheduler.busy:
            now = clock()
            while pending and (not c.wait or pending[0].req.arrival_s <= now):
                scheduler.add(pending.popleft())
            step = scheduler.schedule(now)
            if not step:
                wake = [pending[0].req.arrival_s] if pending else []
                if (deadline := scheduler.wake_s(now)) is not None:
                    wake.append(deadline)
                if not wake:
                    raise RuntimeError(scheduler.stuck())
                time.sleep(max(0.0, min(wake) - clock()))
                continue
            new = runner.run(step.prefills, step.decodes)  # host ints: the step's one sync is behind us
            t = clock()
            for s, token in zip(step.prefills + step.decodes, new):
                s.append(token, t)
            timeline.add(t, step, scheduler, kv)
            if kv.reserved_bytes() > c.kv_budget_bytes:
                problems.append(f"step {len(timeline.t_s)}: {kv.reserved_bytes()} bytes reserved, over the budget")
            scheduler.finish_step()
        problems += kv.problems(finished=True)
        return ServingRun(
            scheduler=c.scheduler,
            kv=c.kv,
            wait=c.wait,
            tokens={s.id: s.output for s in seqs},
            requests=[
                RequestTimes(
                    s.id,
                    s.req.arrival_s if c.wait else 0.0,
                    s.req.prompt_len,
                    len(s.output),
                    s.token_times,
                    s.finish_s,
                    s.preemptions,
                )
                for s in seqs
            ],
            timeline=timeline,
            duration_s=clock(),
            preemptions=scheduler.preemptions,
            preempted_tokens_left=scheduler.preempted_tokens_left,
            kv_budget_bytes=c.kv_budget_bytes,
            kv_capacity_tokens=kv.capacity_tokens,
            kv_token_bytes=kv.token_bytes,
            accounting_problems=problems,
        )
