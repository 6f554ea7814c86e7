"""What one serving step costs, side by side with what it must not cost more than.

1. ``step``: at batch B (every request at time 0, prompts of P tokens, O output tokens each),
   the median wall time of one engine step while all B requests decode (from the engine's own
   timeline: scheduler, KV bookkeeping, staging, forward, sampling, token bookkeeping), against
   one plain batched decode step of the same model over a contiguous ``(batch, kv_heads,
   length, head_dim)`` cache (write the new K/V at the step's position, SDPA over the prefix
   view with GQA, argmax, tokens back to the host); and the engine's step with the forward
   pass stubbed out (its host-side cost alone). Variants interleave, each repeated; the figure
   is the median over repetitions of each run's median step. The plain step runs inside each
   engine step (its time then subtracted from the engine's), so both see the same machine load.
2. ``graphs`` (CUDA): a graph-replayed decode step's host time (bookkeeping, staging, launch)
   against its GPU time (CUDA events).
3. ``profile``: per decode step, the ops, kernel launches (CUDA) and host syncs torch.profiler
   sees (:func:`gpubench.measure.profiling.summarize`).
4. ``hf``: the whole trace served by the paged engine against one padded Hugging Face batch
   (left padding, ``generate``, greedy, every request generating O tokens), on a checkpoint
   written by transformers into a temporary directory (nothing is downloaded).

    python benchmarks/serving_step.py [--device cpu|cuda] [--model tiny] [--batch 64] [--threads N]
                                      [--what step,graphs,profile,hf]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from contextlib import contextmanager, nullcontext
from unittest import mock

import torch
import torch.nn.functional as F

from gpubench.measure import profiling
from gpubench.models.llama import SIZES, LlamaWeights, forward, load_hf, random_weights
from gpubench.serving import graphs, model_runner
from gpubench.serving.config import EngineConfig
from gpubench.serving.engine import Engine
from gpubench.serving.traces import Request


def requests(batch: int, prompt: int, output: int, vocab: int, seed: int = 1, varied: bool = False) -> list[Request]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(prompt // 2, prompt * 2 + 1, (batch,), generator=g).tolist() if varied else [prompt] * batch
    return [Request(i, 0.0, torch.randint(0, vocab, (n,), generator=g).tolist(), output) for i, n in enumerate(lens)]


def engine_config(reqs: list[Request], kv: str = "paged", graphs: bool | None = None) -> EngineConfig:
    longest = max(r.prompt_len + r.output_len for r in reqs)
    return EngineConfig(
        kv=kv, kv_budget_bytes=1 << 40, max_len=longest, max_batch=len(reqs), wait=False, cuda_graphs=graphs
    )


def kv_budget(weights: LlamaWeights, reqs: list[Request], config: EngineConfig) -> EngineConfig:
    """Room for every request at once (no preemption), with slack of one unit per request."""
    per_token = weights.config.kv_bytes_per_token(weights.embed.element_size())
    tokens = len(reqs) * (config.max_len + config.block_size)
    return EngineConfig(**{**config.__dict__, "kv_budget_bytes": per_token * tokens})


class PlainDecoder:
    """Plain batched generation: a contiguous cache, every row at one shared position."""

    def __init__(self, weights: LlamaWeights, reqs: list[Request]):
        c, self.weights = weights.config, weights
        self.batch, self.prompt = len(reqs), reqs[0].prompt_len
        self.length = self.prompt + reqs[0].output_len
        shape = (c.num_layers, self.batch, c.num_kv_heads, self.length, c.head_dim)
        self.k = torch.zeros(shape, dtype=weights.dtype, device=weights.device)
        self.v = torch.zeros_like(self.k)
        self.gqa = c.num_heads != c.num_kv_heads
        self.next = self.step(torch.tensor([r.prompt for r in reqs], device=weights.device), 0)
        self.position = self.prompt

    def step(self, tokens: torch.Tensor, start: int) -> list[int]:
        n = tokens.shape[1]

        def attend(i, q, k, v):  # q (batch, n, heads, d), k/v (batch, n, kv_heads, d)
            self.k[i, :, :, start : start + n] = k.transpose(1, 2)
            self.v[i, :, :, start : start + n] = v.transpose(1, 2)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2),
                self.k[i, :, :, : start + n],
                self.v[i, :, :, : start + n],
                is_causal=n > 1,
                enable_gqa=self.gqa,
            )
            return out.transpose(1, 2)

        positions = torch.arange(start, start + n, device=tokens.device).expand(self.batch, n)
        with torch.inference_mode():
            logits = forward(self.weights, tokens, positions, attend)
            return logits[:, -1].argmax(dim=-1).tolist()

    def decode(self) -> float:
        """One decode step (new tokens from the host, tokens back to the host); its wall time in ms,
        or 0 when the cache is full."""
        if self.position >= self.length:
            return 0.0
        if self.weights.device.type == "cuda":
            torch.cuda.synchronize(self.weights.device)
        t0 = time.perf_counter()
        self.next = self.step(torch.tensor(self.next, device=self.weights.device)[:, None], self.position)
        self.position += 1
        return (time.perf_counter() - t0) * 1e3


def interleaved_steps_ms(
    weights: LlamaWeights, reqs: list[Request], config: EngineConfig, stub: bool = False
) -> tuple[list[float], list[float]]:
    """Engine steps while every request decodes, each followed (inside it, its time then
    subtracted) by one plain step, so both see the same machine: (engine ms, plain ms) per step."""
    plain = PlainDecoder(weights, reqs)
    original = model_runner.ModelRunner.run
    inserted: list[float] = []

    def run(self, prefills, decodes):
        out = original(self, prefills, decodes)
        inserted.append(0.0 if prefills or stub else plain.decode())
        return out

    with mock.patch.object(model_runner.ModelRunner, "run", run), stubbed_forward(weights) if stub else nullcontext():
        served = Engine(weights, config).run(reqs)
    t, running = served.timeline.t_s, served.timeline.running
    steps = [i for i in range(2, len(t)) if running[i] == len(reqs) and (stub or inserted[i] > 0)]
    return [(t[i] - t[i - 1]) * 1e3 - inserted[i] for i in steps], [inserted[i] for i in steps]


@contextmanager
def stubbed_forward(weights: LlamaWeights):
    """The runner's forward pass replaced by logits of the right shape (its inputs are still built)."""
    vocab = weights.config.vocab_size

    def stub(self, inputs):
        n = inputs.logits_at.shape[0] if inputs.logits_at is not None else inputs.tokens.shape[0]
        return torch.zeros(n, vocab, device=weights.device)

    with mock.patch.object(model_runner.ModelRunner, "forward", stub):
        yield


def measure_steps(weights: LlamaWeights, reqs: list[Request], repeats: int, graphs: bool | None) -> dict[str, float]:
    """Median over ``repeats`` runs (after one warm-up run) of each run's median step (ms)."""
    config = kv_budget(weights, reqs, engine_config(reqs, graphs=graphs))
    contiguous = EngineConfig(**{**config.__dict__, "kv": "contiguous"})
    medians: dict[str, list[float]] = {k: [] for k in ("engine", "engine_contiguous", "plain", "engine_stubbed")}
    for i in range(repeats + 1):
        for key, cfg in (("engine", config), ("engine_contiguous", contiguous)):
            engine, plain = interleaved_steps_ms(weights, reqs, cfg)
            if i:
                medians[key].append(statistics.median(engine))
                medians["plain"].append(statistics.median(plain))
        stubbed = statistics.median(interleaved_steps_ms(weights, reqs, config, stub=True)[0])
        if i:
            medians["engine_stubbed"].append(stubbed)
    return {k: statistics.median(v) for k, v in medians.items()}


def profile_steps(weights: LlamaWeights, reqs: list[Request], graphs: bool | None) -> dict:
    """ops / launches / syncs per full-batch decode step, from torch.profiler."""
    from torch.profiler import ProfilerActivity, profile, record_function

    config = kv_budget(weights, reqs, engine_config(reqs, graphs=graphs))
    cuda = weights.device.type == "cuda"
    original = model_runner.ModelRunner.run
    calls = [0]

    def traced(self, prefills, decodes):
        if prefills or len(decodes) < len(reqs):
            return original(self, prefills, decodes)
        with record_function(f"{profiling.CALL_RANGE}{calls[0]}"):
            calls[0] += 1
            return original(self, prefills, decodes)

    Engine(weights, config).run(reqs)  # warm-up
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    host_reads = profiling._HostReads() if not cuda else nullcontext()
    with mock.patch.object(model_runner.ModelRunner, "run", traced), host_reads:
        with profile(activities=activities) as prof:
            Engine(weights, config).run(reqs)
    summary = profiling.summarize(prof.events(), calls[0], cuda)
    return {k: summary[k] for k in ("ops_per_call", "kernel_launches_per_call", "syncs_per_call", "sync_ops")} | {
        "top_ops": [(t["name"], t["self_us_per_call"], t["count_per_call"]) for t in summary["top_ops"][:8]]
    }


def graph_step_times(weights: LlamaWeights, reqs: list[Request]) -> dict[str, float]:
    """CUDA only: per full-batch decode step, the host time to stage and launch its graph replay
    (plus the step's host bookkeeping, from the stubbed-forward run) against the GPU time between
    CUDA events around it. A host time under the GPU time means the GPU, not Python, sets the pace."""
    config = kv_budget(weights, reqs, engine_config(reqs, graphs=True))
    original = graphs.DecodeGraphs.run
    launch_ms: list[float] = []
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def run(self, decodes):
        if len(decodes) < len(reqs):
            return original(self, decodes)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        logits = original(self, decodes)
        end.record()
        launch_ms.append((time.perf_counter() - t0) * 1e3)
        events.append((start, end))
        return logits

    with mock.patch.object(graphs.DecodeGraphs, "run", run):
        Engine(weights, config).run(reqs)
    torch.cuda.synchronize(weights.device)
    gpu = [a.elapsed_time(b) for a, b in events]
    with stubbed_forward(weights):
        bookkeeping = statistics.median(interleaved_steps_ms(weights, reqs, config, stub=True)[0])
    return {"launch_ms": statistics.median(launch_ms), "bookkeeping_ms": bookkeeping, "gpu_ms": statistics.median(gpu)}


def hf_comparison(size: str, reqs: list[Request], device: torch.device, repeats: int) -> dict[str, float]:
    """Seconds to serve ``reqs`` (all at time 0): the paged engine vs one padded HF generate batch."""
    import transformers

    c = SIZES[size]
    cfg = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position,
        rms_norm_eps=c.rms_eps,
        rope_theta=c.rope_theta,
        tie_word_embeddings=False,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval().to(device)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        weights = load_hf(tmp, device=device)
    output = reqs[0].output_len
    longest = max(r.prompt_len for r in reqs)
    ids = torch.zeros(len(reqs), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(reqs):  # left padding, as batched generation needs
        ids[i, longest - r.prompt_len :] = torch.tensor(r.prompt)
        mask[i, longest - r.prompt_len :] = 1
    ids, mask = ids.to(device), mask.to(device)
    config = kv_budget(weights, reqs, engine_config(reqs))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def hf():
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=output,
                min_new_tokens=output,
                do_sample=False,
                pad_token_id=0,
            )
        sync()
        return out[:, longest:].tolist()

    def engine():
        return Engine(weights, config).run(reqs).tokens

    times: dict[str, list[float]] = {"hf_padded_s": [], "engine_paged_s": []}
    for i in range(repeats + 1):
        for name, fn in (("hf_padded_s", hf), ("engine_paged_s", engine)):
            t0 = time.perf_counter()
            result = fn()
            if i:
                times[name].append(time.perf_counter() - t0)
            if name == "hf_padded_s":
                hf_tokens = result
            else:
                same = sum(result[r.id] == hf_tokens[j] for j, r in enumerate(reqs))
    out = {k: statistics.median(v) for k, v in times.items()}
    out["hf_over_engine"] = out["hf_padded_s"] / out["engine_paged_s"]
    out["requests_with_identical_tokens"] = same
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="tiny", choices=list(SIZES))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--graphs", choices=["auto", "on", "off"], default="auto")
    parser.add_argument("--what", default="step,graphs,profile,hf", help="graphs: CUDA only")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    graphs = {"auto": None, "on": True, "off": False}[args.graphs]
    what = set(args.what.split(","))
    weights = random_weights(SIZES[args.model], 0, getattr(torch, args.dtype), device)
    reqs = requests(args.batch, args.prompt, args.output, weights.config.vocab_size)
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} CPU threads"
    print(
        f"# {args.model} {args.dtype} on {device.type} ({hardware}), torch {torch.__version__}; batch "
        f"{args.batch}, prompts {args.prompt}, outputs {args.output}, graphs {args.graphs}"
    )
    if "step" in what:
        m = measure_steps(weights, reqs, args.repeats, graphs)
        print(
            f"step ms (median of {args.repeats} runs' medians): engine paged {m['engine']:.3f}, engine "
            f"contiguous {m['engine_contiguous']:.3f}, plain contiguous {m['plain']:.3f}, engine with the "
            f"forward stubbed {m['engine_stubbed']:.3f}; paged / plain {m['engine'] / m['plain']:.2f}"
        )
    if "graphs" in what and device.type == "cuda":
        m = graph_step_times(weights, reqs)
        print(
            f"graph decode step: host {m['bookkeeping_ms'] + m['launch_ms']:.3f} ms (bookkeeping "
            f"{m['bookkeeping_ms']:.3f} + staging and replay launch {m['launch_ms']:.3f}), GPU {m['gpu_ms']:.3f} ms"
        )
    if "profile" in what:
        print("per full-batch decode step:", profile_steps(weights, reqs, graphs))
    if "hf" in what:
        varied = requests(args.batch, args.prompt, args.output, SIZES[args.model].vocab_size, varied=True)
        m = hf_comparison(args.model, varied, device, max(1, args.repeats // 2))
        print(
            f"whole trace ({args.batch} requests, prompts {args.prompt // 2}-{args.prompt * 2}, {args.output} "
            f"output tokens each): HF padded batch {m['hf_padded_s']:.3f} s, paged engine "
            f"{m['engine_paged_s']:.3f} s, HF / engine {m['hf_over_engine']:.2f}x; "
            f"{m['requests_with_identical_tokens']}/{args.batch} requests with identical tokens"
        )


if __name__ == "__main__":
    main()
