"""One request as the engine sees it: its tokens so far, how many of them have K/V in the cache,
and when each output token came out."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from gpubench.serving.traces import Request


@dataclass(eq=False)  # identity: two requests with equal tokens are still two sequences
class Sequence:
    req: Request
    tokens: list[int]  # prompt, then generated
    output: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose K/V are in the cache
    token_times: list[float] = field(default_factory=list)
    admitted_order: int = -1
    preemptions: int = 0
    finish_s: float | None = None
    generator: torch.Generator | None = None  # sampled decoding: the request's own seeded draws

    @classmethod
    def of(cls, req: Request, temperature: float) -> Sequence:
        seq = cls(req, list(req.prompt))
        if temperature > 0:
            seq.generator = torch.Generator().manual_seed(req.seed)
        return seq

    @property
    def id(self) -> int:
        return self.req.id

    @property
    def done(self) -> bool:
        return len(self.output) >= self.req.output_len

    def append(self, token: int, t: float) -> None:
        self.tokens.append(token)
        self.output.append(token)
        self.token_times.append(t)
        if self.done and self.finish_s is None:
            self.finish_s = t

    def preempt(self) -> None:
        """Its K/V are dropped: nothing is cached, so prompt and output so far are prefilled again
        when it is readmitted."""
        self.cached = 0
        self.preemptions += 1
