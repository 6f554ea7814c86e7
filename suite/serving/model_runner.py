"""The model runner: one forward pass over a step's prefills and decodes, then each sequence's
next token. Every sequence feeds the tokens whose K/V are not cached yet (``tokens[cached:]``): a
prefill all of them, attending over any cached prefix and causally among themselves; a decode its
last one, attending over its cache.

The step's index tensors are built once (:mod:`.step_inputs`); each layer then writes all new
K/V in one index_copy_ per tensor, runs every prefill in one padded SDPA call and every decode
in one paged (or padded-slab) attention call. A step of only decodes may replay a CUDA graph
(:mod:`.graphs`). The one host sync of a step is reading its sampled tokens back.
"""

from __future__ import annotations

import torch

from gpubench.models.llama import LlamaWeights, fused_forward
from gpubench.serving.graphs import DecodeGraphs
from gpubench.serving.kv import KVBackend
from gpubench.serving.sequence import Sequence
from gpubench.serving.step_inputs import Staging, StepInputs, build_step, prefill_attention


def sample(
    logits: torch.Tensor, seqs: list[Sequence], temperature: float, margins: list[float] | None = None
) -> list[int]:
    """Greedy (temperature 0: argmax) or sampled from softmax(logits / T), each request from its
    own seeded generator, so a request draws the same numbers however it is batched, and however
    often it is preempted. A draw is the exponential race torch.multinomial runs for one sample
    (the argmax of p / E, E ~ Exp(1) from the generator: the same tokens), written out so that
    ``margins``, when given, gets each choice's distance from a tie in logit units: the top two
    logits' gap (greedy), or T times the log-ratio of the race's top two scores (sampled). A
    change of the logits smaller than that (batching's rounding) may pick the other token."""
    if temperature <= 0:
        if margins is not None:
            top = logits.float().topk(2, dim=-1).values
            margins += (top[:, 0] - top[:, 1]).tolist()
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.float() / temperature, dim=-1).cpu()
    tokens = []
    for p, s in zip(probs, seqs):
        race = p / torch.empty_like(p).exponential_(generator=s.generator)
        if margins is None:
            tokens.append(int(race.argmax()))
            continue
        top = race.topk(2)
        tokens.append(int(top.indices[0]))
        margins.append(temperature * float(top.values[0].log() - top.values[1].log()))
    return tokens


class ModelRunner:
    """``decode_graphs``: run decode-only steps at bucketed batch sizes up to ``max_batch`` over
    static buffers, captured as CUDA graphs on CUDA (the KV backend needs its spare unit)."""

    def __init__(
        self,
        weights: LlamaWeights,
        kv: KVBackend,
        temperature: float,
        *,
        decode_graphs: bool = False,
        max_batch: int = 0,
    ):
        self.weights, self.kv, self.temperature = weights, kv, temperature
        self.device = weights.device
        self.staging = Staging(self.device)
        self.graphs = None
        if decode_graphs:
            with torch.inference_mode():
                self.graphs = DecodeGraphs(
                    kv, self.staging, max_batch, self.forward, capture=self.device.type == "cuda"
                )

    def forward(self, inputs: StepInputs) -> torch.Tensor:
        """Logits of each sequence's last new token."""
        kv, prefill, decode = self.kv, inputs.prefill, inputs.decode

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            kv.write(layer, inputs.slots, k, v)
            if prefill is None:
                assert decode is not None  # a step that prefills nothing decodes
                return kv.decode_attention(layer, q, decode)
            out = prefill_attention(kv.k[layer], kv.v[layer], q[: prefill.tokens], prefill)
            if decode is None:
                return out
            return torch.cat([out, kv.decode_attention(layer, q[prefill.tokens :], decode)])

        return fused_forward(self.weights, inputs.tokens, inputs.positions, attend, logits_at=inputs.logits_at)

    def run(self, prefills: list[Sequence], decodes: list[Sequence]) -> list[int]:
        """The next token of every sequence, prefills first; their K/V are cached on the way."""
        with torch.inference_mode():
            if self.graphs is not None and not prefills and len(decodes) <= self.graphs.buckets[-1]:
                logits = self.graphs.run(decodes)
            else:
                logits = self.forward(build_step(self.kv, self.staging, prefills, decodes))
        for s in prefills:
            s.cached = len(s.tokens)
        for s in decodes:
            s.cached += 1
        return sample(logits, prefills + decodes, self.temperature)
