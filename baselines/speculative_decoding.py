"""Plain autoregressive decoding: the target produces one token per forward pass, reading its past
from a KV cache (:class:`gpubench.models.decode_cache.KVCache`)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch

from gpubench.measure.phase_timer import PhaseTimer
from gpubench.models.decode_cache import KVCache, pick
from gpubench.models.llama import LlamaWeights


def generate(
    target: LlamaWeights,
    prompt: Sequence[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    timer: PhaseTimer | None = None,
) -> tuple[list[int], int]:
    """``max_new_tokens`` tokens after ``prompt`` and the target forward passes they took (one
    each; the first token comes from the prompt's prefill). ``timer`` gets the phases ``prefill``
    and ``decode`` (the one-token steps after it)."""
    if len(prompt) < 1 or max_new_tokens < 1:
        raise ValueError("need a prompt of at least one token and at least one new token")
    span = timer.span if timer is not None else lambda name: contextlib.nullcontext()
    cache = KVCache(target, len(prompt) + max_new_tokens)
    out: list[int] = []
    with torch.inference_mode():
        with span("prefill"):
            logits = cache.forward(list(prompt))[0]
            out.append(pick(logits, temperature, generator))
        with span("decode"):
            while len(out) < max_new_tokens:
                logits = cache.forward([out[-1]])[0]
                out.append(pick(logits, temperature, generator))
    return out, len(out)
