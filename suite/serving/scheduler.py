"""Schedulers: which sequences the next step prefills and decodes. Each owns its waiting queue
and running list and counts its preemptions; the KV backend says what fits.

- :class:`StaticScheduler`: a batch of up to ``max_batch`` requests, in arrival order, starts
  when it is full or its oldest request has waited ``batch_timeout_s``; it runs until its longest
  request finishes, and only then does the next batch start. A request that finishes early stops
  computing (its slot idles), which is kinder to the baseline than padding it along.
- :class:`ContinuousScheduler`: iteration-level scheduling: before every step, arrived requests
  join while memory allows, and a request leaves the moment it finishes.

When a running sequence has no room for its next token, the newest-admitted one is preempted:
its KV is freed and it goes back to the front of the queue, to be recomputed from its prompt and
the tokens it already produced.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field

from gpubench.serving.config import EngineConfig
from gpubench.serving.kv import KVBackend
from gpubench.serving.sequence import Sequence


@dataclass
class Step:
    prefills: list[Sequence]
    decodes: list[Sequence]
    tokens: int = field(init=False)  # through the forward pass: what each prefill has not cached, one per decode

    def __post_init__(self) -> None:
        self.tokens = sum(len(s.tokens) - s.cached for s in self.prefills) + len(self.decodes)

    def __bool__(self) -> bool:
        return bool(self.prefills or self.decodes)


class Scheduler(ABC):
    def __init__(self, kv: KVBackend, config: EngineConfig):
        self.kv, self.config = kv, config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # admitted and holding KV (static: finished ones too, until the batch ends)
        self.preempted_tokens_left: list[int] = []  # per preemption, the tokens its request had still to generate
        self._admitted = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    @property
    def preemptions(self) -> int:
        return len(self.preempted_tokens_left)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    @abstractmethod
    def schedule(self, now: float) -> Step:
        """This step's prefills (now running) and decodes (each with room for its next token)."""

    @abstractmethod
    def finish_step(self) -> None:
        """After a step: release the KV of what is over."""

    def wake_s(self, now: float) -> float | None:
        """When an idle scheduler could act without a new arrival (None: it cannot)."""
        return None

    def stuck(self) -> str:
        if self.waiting and not self.running:
            return f"request {self.waiting[0].id} does not fit the KV budget even alone"
        return "the scheduler is stuck: nothing runs, nothing can be admitted"

    def _admit(self) -> list[Sequence]:
        """From the front of the queue, while the batch, the KV and the step's prefill budget allow."""
        admitted: list[Sequence] = []
        budget = self.config.max_prefill_tokens
        while self.waiting and len(self.running) + len(admitted) < self.config.max_batch:
            seq = self.waiting[0]
            if not self.kv.can_admit(seq) or (admitted and len(seq.tokens) > budget):
                break
            self.waiting.popleft()
            self.kv.admit(seq)
            budget -= len(seq.tokens)
            self._admitted += 1
            seq.admitted_order = self._admitted
            admitted.append(seq)
        self.running = self.running + admitted  # a new list: the step keeps its own decodes
        return admitted

    def _make_room(self, seqs: list[Sequence]) -> list[Sequence]:
        """Room for every sequence's next token, oldest first; the newest give way (as in vLLM)."""
        kept = sorted(seqs, key=lambda s: s.admitted_order)
        ready: list[Sequence] = []
        while kept:
            seq = kept.pop(0)
            while not self.kv.reserve_next(seq):
                victim = kept.pop() if kept else seq
                self._preempt(victim)
                if victim is seq:
                    break
            else:
                ready.append(seq)
        return ready

    def _preempt(self, seq: Sequence) -> None:
        self.kv.release(seq)
        seq.preempt()
        self.preempted_tokens_left.append(seq.req.output_len - len(seq.output))
        self.waiting.appendleft(seq)


class ContinuousScheduler(Scheduler):
    def schedule(self, now: float) -> Step:
        decodes = self._make_room(self.running)
        preempted = len(decodes) < len(self.running)
        self.running = decodes  # the preempted went back to the front of the queue
        prefills = [] if preempted else self._admit()
        return Step(prefills, decodes)

    def finish_step(self) -> None:
        for seq in [s for s in self.running if s.done]:
            self.kv.release(seq)
            self.running.remove(seq)


class StaticScheduler(Scheduler):
    def schedule(self, now: float) -> Step:
        if self.running:  # the batch in flight: decode whoever has not finished
            active = [s for s in self.running if not s.done]
            decodes = self._make_room(active)
            self.running = [s for s in self.running if s.done or s in decodes]
            if decodes:
                return Step([], decodes)
            self._end_batch()  # every unfinished member was preempted: they start the next batch
        if not self._batch_due(now):
            return Step([], [])
        return Step(self._admit(), [])

    def finish_step(self) -> None:
        if self.running and all(s.done for s in self.running):  # the batch ends with its longest
            self._end_batch()

    def wake_s(self, now: float) -> float | None:
        if self.waiting and not self.running:
            deadline = self.waiting[0].req.arrival_s + self.config.batch_timeout_s
            return deadline if deadline > now else None  # past it, admission was tried and failed
        return None

    def _batch_due(self, now: float) -> bool:
        """A full batch waits, or its oldest request has waited long enough: a server cannot know
        that no more requests are coming."""
        if not self.waiting:
            return False
        return (
            len(self.waiting) >= self.config.max_batch
            or now - self.waiting[0].req.arrival_s >= self.config.batch_timeout_s
        )

    def _end_batch(self) -> None:
        for seq in self.running:
            self.kv.release(seq)
        self.running = []


def make_scheduler(kv: KVBackend, config: EngineConfig) -> Scheduler:
    return {"static": StaticScheduler, "continuous": ContinuousScheduler}[config.scheduler](kv, config)
