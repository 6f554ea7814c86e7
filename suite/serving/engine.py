"""A small LLM inference engine: requests in, tokens out, with real prefill and decode forward
passes of a Llama-style model (:mod:`gpubench.models.llama`), real arrival times, and the two
choices the serving techniques compare:

- **scheduling**: ``static`` batching (a batch of up to ``max_batch`` requests, in arrival order,
  starts when it is full or its oldest request has waited ``batch_timeout_s``; it runs until its
  longest request finishes, and only then does the next batch start) against ``continuous``
  batching (Orca's iteration-level scheduling: before every step, arrived requests join while
  memory allows, and a request leaves the moment it finishes);
- **KV memory**: ``contiguous`` (every admitted request reserves one slab of ``max_len`` tokens,
  as systems that cannot know the output length do) against ``paged`` (vLLM's 16-token blocks
  taken from a fixed pool on demand; when the pool runs dry the newest running request is
  preempted: its blocks are freed and it is recomputed later from its prompt and the tokens it
  already produced).

Both KV layouts get the same memory budget in bytes. The split follows nano-vllm's: a
:class:`Sequence` per request, a block manager (:mod:`gpubench.serving.blocks`), a scheduler
(:meth:`Engine._schedule_static` / :meth:`Engine._schedule_continuous`), the model runner
(:meth:`Engine._step`) and the engine loop (:meth:`Engine.run`).

In static batching a request that finishes before its batch's longest stops computing (its slot
idles); that is kinder to the baseline than padding it along, as simple implementations do.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from gpubench.models.llama import LlamaWeights, causal_attention, forward
from gpubench.optimizations.paged_attention import paged_decode_attention
from gpubench.serving.blocks import BlockManager, SlabAllocator
from gpubench.serving.traces import Request

SCHEDULERS = ("static", "continuous")
KV_LAYOUTS = ("contiguous", "paged")


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
    generator: torch.Generator | None = None

    @property
    def done(self) -> bool:
        return len(self.output) >= self.req.output_len


# -- KV stores --------------------------------------------------------------------------------

class _KVStore:
    """K/V of every layer in ``units`` of ``unit_tokens`` tokens, handed out by ``self.allocator``
    (a :class:`BlockManager` or a :class:`SlabAllocator`: the same calls)."""

    def __init__(self, weights: LlamaWeights, budget_bytes: int, unit_tokens: int, what: str, fill):
        c = weights.config
        self.token_bytes = c.kv_bytes_per_token(weights.embed.element_size())
        self.unit_tokens = unit_tokens
        self.units = budget_bytes // (self.token_bytes * unit_tokens)
        if self.units < 1:
            raise ValueError(f"a KV budget of {budget_bytes} bytes holds no {unit_tokens}-token {what} "
                             f"({self.token_bytes * unit_tokens} bytes)")
        shape = (self.units, unit_tokens, c.num_kv_heads, c.head_dim)
        kw = dict(dtype=weights.dtype, device=weights.device)
        self.k = [fill(shape, **kw) for _ in range(c.num_layers)]
        self.v = [fill(shape, **kw) for _ in range(c.num_layers)]
        self.capacity_tokens = self.units * unit_tokens
        self.allocator = None

    def can_admit(self, seq: Sequence) -> bool:
        return self.allocator.can_allocate(len(seq.tokens))

    def admit(self, seq: Sequence) -> None:
        self.allocator.allocate(seq.req.id, len(seq.tokens))

    def reserve_next(self, seq: Sequence) -> bool:
        return self.allocator.ensure(seq.req.id, seq.cached + 1)

    def release(self, seq: Sequence) -> None:
        self.allocator.release(seq.req.id)

    def check(self) -> list[str]:
        return self.allocator.check()

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the K/V of tokens at flat slot indices (unit * unit_tokens + offset)."""
        self.k[layer].view(-1, *k.shape[1:])[slots] = k
        self.v[layer].view(-1, *v.shape[1:])[slots] = v


class PagedKV(_KVStore):
    """One pool of blocks, addressed through per-sequence block tables. The pool is torch.empty,
    as an engine's is: slots nobody wrote must never be read as data (the decode paths mask them)."""

    layout = "paged"

    def __init__(self, weights: LlamaWeights, budget_bytes: int, block_size: int):
        super().__init__(weights, budget_bytes, block_size, "block", torch.empty)
        self.block_size = block_size
        self.allocator = self.manager = BlockManager(self.units, block_size)

    def reserved_bytes(self) -> int:
        return self.manager.num_owned * self.block_size * self.token_bytes

    def slots(self, seq: Sequence, start: int, stop: int, device) -> torch.Tensor:
        table = torch.tensor(self.manager.tables[seq.req.id], dtype=torch.long)
        pos = torch.arange(start, stop)
        return (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(device)

    def prepare_decode(self, seqs: list[Sequence], device) -> dict[str, torch.Tensor]:
        tables = [self.manager.tables[s.req.id] for s in seqs]
        width = max(len(t) for t in tables)
        block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
        slots = torch.tensor([self.manager.slot(s.req.id, s.cached) for s in seqs], dtype=torch.long)
        lens = torch.tensor([s.cached + 1 for s in seqs], dtype=torch.int32)
        return {"block_tables": block_tables.to(device), "slots": slots.to(device), "lens": lens.to(device)}

    def decode_attention(self, layer: int, q, k, v, meta) -> torch.Tensor:
        self.write(layer, meta["slots"], k, v)
        return paged_decode_attention(q, self.k[layer], self.v[layer], meta["block_tables"], meta["lens"])


class ContiguousKV(_KVStore):
    """``max_len``-token slabs, one per admitted request. Zeroed, as static caches are: the padded
    attention below multiplies masked-out positions by probability 0, and 0 * (NaN left in
    never-written memory) would still be NaN."""

    layout = "contiguous"

    def __init__(self, weights: LlamaWeights, budget_bytes: int, max_len: int):
        super().__init__(weights, budget_bytes, max_len, "slab", torch.zeros)
        self.max_len = max_len
        self.allocator = SlabAllocator(self.units, max_len)

    def reserved_bytes(self) -> int:
        return len(self.allocator.owner) * self.max_len * self.token_bytes

    def slots(self, seq: Sequence, start: int, stop: int, device) -> torch.Tensor:
        return (self.allocator.owner[seq.req.id] * self.max_len + torch.arange(start, stop)).to(device)

    def prepare_decode(self, seqs: list[Sequence], device) -> dict[str, torch.Tensor]:
        slabs = torch.tensor([self.allocator.owner[s.req.id] for s in seqs], dtype=torch.long)
        pos = torch.tensor([s.cached for s in seqs], dtype=torch.long)
        width = int(pos.max()) + 1
        live = torch.arange(width)[None, :] <= pos[:, None]  # (batch, width)
        return {"slabs": slabs.to(device), "slots": (slabs * self.max_len + pos).to(device),
                "width": width, "mask": live[:, None, None, :].to(device)}

    def decode_attention(self, layer: int, q, k, v, meta) -> torch.Tensor:
        """Padded batch attention over each request's slab (the static-cache way): read the
        batch's slabs up to the longest context, mask each row past its own length."""
        self.write(layer, meta["slots"], k, v)
        keys = self.k[layer][meta["slabs"], :meta["width"]]  # (batch, width, kv_heads, d)
        values = self.v[layer][meta["slabs"], :meta["width"]]
        group = q.shape[1] // keys.shape[2]
        keys = keys.transpose(1, 2).repeat_interleave(group, dim=1)  # (batch, heads, width, d)
        values = values.transpose(1, 2).repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q[:, :, None, :], keys, values, attn_mask=meta["mask"])
        return out[:, :, 0, :]


def make_kv(layout: str, weights: LlamaWeights, budget_bytes: int, block_size: int, max_len: int):
    if layout == "paged":
        return PagedKV(weights, budget_bytes, block_size)
    if layout == "contiguous":
        return ContiguousKV(weights, budget_bytes, max_len)
    raise ValueError(f"kv layout {layout!r} is not one of {KV_LAYOUTS}")


# -- sampling ---------------------------------------------------------------------------------

def sample(logits: torch.Tensor, seqs: list[Sequence], temperature: float) -> list[int]:
    """Greedy (temperature 0: argmax) or sampled from softmax(logits / T), each request from its
    own seeded generator, so a request draws the same numbers however it is batched."""
    if temperature <= 0:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits.float() / temperature, dim=-1).cpu()
    return [int(torch.multinomial(probs[i], 1, generator=s.generator)) for i, s in enumerate(seqs)]


# -- the engine -------------------------------------------------------------------------------

@dataclass
class EngineConfig:
    scheduler: str = "continuous"
    kv: str = "paged"
    kv_budget_bytes: int = 2 << 20
    block_size: int = 16
    max_len: int = 256  # longest request (prompt + output); contiguous slabs reserve this
    max_batch: int = 16  # most requests decoding at once
    batch_timeout_s: float = 0.05  # static: start a partial batch after its oldest waited this long
    max_prefill_tokens: int = 2048  # continuous: prompt tokens one step may take in
    temperature: float = 0.0
    wait: bool = True  # honour arrival times (False: every request is there at time 0)

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler {self.scheduler!r} is not one of {SCHEDULERS}")
        if self.kv not in KV_LAYOUTS:
            raise ValueError(f"kv {self.kv!r} is not one of {KV_LAYOUTS}")


class Engine:
    def __init__(self, weights: LlamaWeights, config: EngineConfig):
        self.weights, self.config = weights, config
        self.device = weights.device

    # -- the model runner: one forward pass over this step's prefills and decodes --------------
    def _step(self, kv, prefills: list[Sequence], decodes: list[Sequence]) -> list[int]:
        device = self.device
        tokens, positions, last = [], [], []
        for s in prefills:
            n = len(s.tokens)
            tokens += s.tokens
            positions += range(n)
            last.append(len(tokens) - 1)
        first_decode = len(tokens)
        for s in decodes:
            tokens.append(s.tokens[s.cached])
            positions.append(s.cached)
            last.append(len(tokens) - 1)
        prefill_slots = [kv.slots(s, 0, len(s.tokens), device) for s in prefills]
        meta = kv.prepare_decode(decodes, device) if decodes else None

        def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            outs, start = [], 0
            for s, slots in zip(prefills, prefill_slots):
                stop = start + len(s.tokens)
                kv.write(layer, slots, k[start:stop], v[start:stop])
                outs.append(causal_attention(q[start:stop], k[start:stop], v[start:stop]))
                start = stop
            if decodes:
                outs.append(kv.decode_attention(layer, q[first_decode:], k[first_decode:], v[first_decode:], meta))
            return torch.cat(outs) if len(outs) > 1 else outs[0]

        tok = torch.tensor(tokens, dtype=torch.long, device=device)
        pos = torch.tensor(positions, dtype=torch.long, device=device)
        with torch.inference_mode():
            logits = forward(self.weights, tok, pos, attend, logits_at=torch.tensor(last, device=device))
        for s in prefills:
            s.cached = len(s.tokens)
        for s in decodes:
            s.cached += 1
        return sample(logits, prefills + decodes, self.config.temperature)

    # -- schedulers: which sequences this step prefills and decodes ---------------------------
    def _admit(self, kv, waiting: deque, running: list[Sequence], limit: int) -> list[Sequence]:
        admitted, budget = [], self.config.max_prefill_tokens
        while waiting and len(running) + len(admitted) < limit:
            seq = waiting[0]
            if not kv.can_admit(seq) or (admitted and len(seq.tokens) > budget):
                break
            waiting.popleft()
            kv.admit(seq)
            budget -= len(seq.tokens)
            seq.admitted_order = self._order = self._order + 1
            admitted.append(seq)
        return admitted

    def _make_room(self, kv, running: list[Sequence], waiting: deque) -> list[Sequence]:
        """Every running sequence gets a slot for its next token; when the pool has none, the
        newest-admitted sequence is preempted (freed, recomputed later), as vLLM does."""
        kept = sorted(running, key=lambda s: s.admitted_order)
        ready: list[Sequence] = []
        while kept:
            seq = kept.pop(0)
            while not kv.reserve_next(seq):
                victim = kept.pop() if kept else seq
                kv.release(victim)
                victim.cached = 0
                victim.preemptions += 1
                self._preemptions += 1
                waiting.appendleft(victim)
                if victim is seq:
                    break
            else:
                ready.append(seq)
        return ready

    def _schedule_continuous(self, kv, waiting: deque, running: list[Sequence], now: float):
        decodes = self._make_room(kv, running, waiting)
        preempted = len(decodes) < len(running)
        running[:] = decodes  # the preempted went back to the front of the queue
        prefills = [] if preempted else self._admit(kv, waiting, decodes, self.config.max_batch)
        return prefills, decodes

    def _schedule_static(self, kv, waiting: deque, running: list[Sequence], now: float):
        if running:  # the batch in flight: decode whoever has not finished
            active = [s for s in running if not s.done]
            decodes = self._make_room(kv, active, waiting)
            running[:] = [s for s in running if s.done or s in decodes]
            return [], decodes
        if not waiting:
            return [], []
        full = len(waiting) >= self.config.max_batch
        timed_out = now - waiting[0].req.arrival_s >= self.config.batch_timeout_s
        if not (full or timed_out):  # a server cannot know that no more requests are coming
            return [], []
        return self._admit(kv, waiting, [], self.config.max_batch), []

    # -- the loop -----------------------------------------------------------------------------
    def run(self, requests: list[Request]) -> dict[str, Any]:
        """Serve ``requests`` (sorted by arrival) in real time; return per-request tokens and
        timestamps, a per-step timeline and the KV accounting."""
        c = self.config
        kv = make_kv(c.kv, self.weights, c.kv_budget_bytes, c.block_size, c.max_len)
        for r in requests:
            if r.prompt_len + r.output_len > c.max_len:
                raise ValueError(f"request {r.id}: prompt {r.prompt_len} + output {r.output_len} tokens "
                                 f"exceeds max_len {c.max_len}")
        seqs = [Sequence(r, list(r.prompt)) for r in requests]
        if c.temperature > 0:
            for s in seqs:
                s.generator = torch.Generator().manual_seed(s.req.seed)
        pending = deque(sorted(seqs, key=lambda s: s.req.arrival_s))
        waiting: deque[Sequence] = deque()
        running: list[Sequence] = []
        self._order, self._preemptions = 0, 0
        timeline: dict[str, list] = {"t_s": [], "running": [], "waiting": [], "live_bytes": [],
                                     "reserved_bytes": [], "step_tokens": []}
        problems: list[str] = []
        schedule = self._schedule_continuous if c.scheduler == "continuous" else self._schedule_static
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        start = time.perf_counter()
        clock = lambda: time.perf_counter() - start  # noqa: E731
        while pending or waiting or running:
            now = clock()
            while pending and (not c.wait or pending[0].req.arrival_s <= now):
                waiting.append(pending.popleft())
            prefills, decodes = schedule(kv, waiting, running, now)
            if not prefills and not decodes:
                if not running and not waiting and not pending:
                    break
                if not running and waiting and not pending and c.scheduler == "continuous":
                    raise RuntimeError(f"request {waiting[0].req.id} does not fit the KV budget even alone")
                wake = [pending[0].req.arrival_s] if pending else []
                if c.scheduler == "static" and waiting and not running:
                    wake.append(waiting[0].req.arrival_s + c.batch_timeout_s)
                if not wake:
                    raise RuntimeError("the scheduler is stuck: nothing runs, nothing can be admitted")
                time.sleep(max(0.0, min(wake) - clock()))
                continue
            step_tokens = sum(len(s.tokens) for s in prefills) + len(decodes)
            new = self._step(kv, prefills, decodes)
            sync()
            t = clock()
            for s, token in zip(prefills + decodes, new):
                s.tokens.append(token)
                s.output.append(token)
                s.token_times.append(t)
            running.extend(prefills)
            live = sum(s.cached for s in running) * kv.token_bytes
            timeline["t_s"].append(t)
            timeline["running"].append(sum(1 for s in running if not s.done))
            timeline["waiting"].append(len(waiting))
            timeline["live_bytes"].append(live)
            timeline["reserved_bytes"].append(kv.reserved_bytes())
            timeline["step_tokens"].append(step_tokens)
            if kv.reserved_bytes() > c.kv_budget_bytes:
                problems.append(f"step {len(timeline['t_s'])}: {kv.reserved_bytes()} bytes reserved, over the budget")
            for s in running:
                if s.done and s.finish_s is None:
                    s.finish_s = t
            if c.scheduler == "continuous":
                for s in [s for s in running if s.done]:
                    kv.release(s)
                    running.remove(s)
            elif running and all(s.done for s in running):  # static: the batch ends with its longest
                for s in running:
                    kv.release(s)
                running.clear()
        problems += kv.check()
        if getattr(kv, "manager", None) is not None and kv.manager.num_free != kv.manager.num_blocks:
            problems.append(f"{kv.manager.num_blocks - kv.manager.num_free} blocks not free at the end")
        return {
            "scheduler": c.scheduler, "kv": c.kv, "wait": c.wait,
            "tokens": {s.req.id: s.output for s in seqs},
            "requests": [{"id": s.req.id, "arrival_s": s.req.arrival_s if c.wait else 0.0,
                          "prompt_len": s.req.prompt_len, "output_len": len(s.output),
                          "token_times_s": s.token_times, "finish_s": s.finish_s,
                          "preemptions": s.preemptions} for s in seqs],
            "timeline": timeline,
            "duration_s": clock(),
            "preemptions": self._preemptions,
            "kv_budget_bytes": c.kv_budget_bytes,
            "kv_capacity_tokens": kv.capacity_tokens,
            "kv_token_bytes": kv.token_bytes,
            "accounting_problems": problems,
        }


# -- the reference: one request at a time, a growing contiguous cache ------------------------------

def reference_generate(weights: LlamaWeights, request: Request, temperature: float = 0.0) -> tuple[list[int], list[float]]:
    """Tokens of one request decoded alone (K/V kept by concatenation, attention by SDPA), and at
    each step the gap between the two largest logits (how near a tie greedy's choice was)."""
    c = weights.config
    past_k: list[torch.Tensor | None] = [None] * c.num_layers
    past_v: list[torch.Tensor | None] = [None] * c.num_layers
    seq = Sequence(request, list(request.prompt))
    if temperature > 0:
        seq.generator = torch.Generator().manual_seed(request.seed)
    gaps: list[float] = []
    feed, start = list(request.prompt), 0
    with torch.inference_mode():
        while len(seq.output) < request.output_len:
            def attend(layer, q, k, v):
                out = causal_attention(q, k, v, past_k[layer], past_v[layer])
                past_k[layer] = k if past_k[layer] is None else torch.cat([past_k[layer], k])
                past_v[layer] = v if past_v[layer] is None else torch.cat([past_v[layer], v])
                return out
            tok = torch.tensor(feed, dtype=torch.long, device=weights.device)
            pos = torch.arange(start, start + len(feed), device=weights.device)
            logits = forward(weights, tok, pos, attend,
                             logits_at=torch.tensor([len(feed) - 1], device=weights.device))
            top = logits[0].float().topk(2).values
            gaps.append(float(top[0] - top[1]))
            token = sample(logits, [seq], temperature)[0]
            seq.output.append(token)
            start += len(feed)
            feed = [token]
    return seq.output, gaps


# -- serving metrics, as vLLM's benchmark reports them -------------------------------------------

def _summary(values: list[float], scale: float = 1e3) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "median": None, "p90": None, "p99": None}
    t = torch.tensor(values, dtype=torch.float64) * scale
    q = torch.quantile(t, torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)).tolist()
    return {"mean": float(t.mean()), "median": q[0], "p90": q[1], "p99": q[2]}


def serving_metrics(run: dict[str, Any], slo_ttft_ms: float, slo_tpot_ms: float) -> dict[str, Any]:
    """Request and token throughput, TTFT / TPOT / ITL / end-to-end latency (ms: mean, median, p90,
    p99), goodput under the SLOs, KV utilization (live / reserved bytes, averaged over steps, and
    live / budget), peak concurrency and preemptions."""
    reqs = run["requests"]
    first_arrival = min(r["arrival_s"] for r in reqs)
    duration = max(r["finish_s"] for r in reqs) - first_arrival
    ttft, tpot, itl, e2e, good = [], [], [], [], 0
    for r in reqs:
        times = r["token_times_s"]
        t_first = times[0] - r["arrival_s"]
        ttft.append(t_first)
        e2e.append(r["finish_s"] - r["arrival_s"])
        per_token = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
        if len(times) > 1:
            tpot.append(per_token)
        itl += [b - a for a, b in zip(times, times[1:])]
        good += t_first * 1e3 <= slo_ttft_ms and per_token * 1e3 <= slo_tpot_ms
    out_tokens = sum(r["output_len"] for r in reqs)
    in_tokens = sum(r["prompt_len"] for r in reqs)
    tl = run["timeline"]
    util = [live / res for live, res in zip(tl["live_bytes"], tl["reserved_bytes"]) if res > 0]
    metrics: dict[str, Any] = {
        "requests": len(reqs),
        "duration_s": duration,
        "request_throughput": len(reqs) / duration,
        "output_tokens_per_s": out_tokens / duration,
        "total_tokens_per_s": (out_tokens + in_tokens) / duration,
        "goodput_requests_per_s": good / duration,
        "slo_attained": good / len(reqs),
        "kv_utilization": sum(util) / len(util) if util else None,
        "kv_budget_used": max(tl["reserved_bytes"]) / run["kv_budget_bytes"] if tl["reserved_bytes"] else None,
        "max_concurrency": max(tl["running"]) if tl["running"] else 0,
        "preemptions": run["preemptions"],
        "steps": len(tl["t_s"]),
        "kv_capacity_tokens": run["kv_capacity_tokens"],
    }
    for name, values in (("ttft", ttft), ("tpot", tpot), ("itl", itl), ("e2e", e2e)):
        for stat, value in _summary(values).items():
            metrics[f"{stat}_{name}_ms"] = value
    # Raw series for the report's figures (kept in results.json; the CSV keeps the scalars).
    metrics["series"] = {"ttft_ms": [x * 1e3 for x in ttft], "tpot_ms": [x * 1e3 for x in tpot],
                         "itl_ms": [x * 1e3 for x in itl], "e2e_ms": [x * 1e3 for x in e2e],
                         "t_s": tl["t_s"], "running": tl["running"],
                         "kv_utilization": [live / res if res else None
                                            for live, res in zip(tl["live_bytes"], tl["reserved_bytes"])],
                         "kv_live_fraction": [live / run["kv_budget_bytes"] for live in tl["live_bytes"]]}
    return metrics

