"""paged_attention: decode attention over a paged KV cache, gather-then-attend vs a kernel that
reads K and V through the block table in place.

A case is one decode step of ``batch`` sequences with mixed context lengths (drawn in
[1, context_len], the longest set to context_len, so most last blocks are partly filled). The KV
pool holds the blocks the sequences need plus spare ones, shuffled (a randperm from the case's
seed) the way they are in a long-running engine; every slot of every block, unreferenced and past
the end of a context included, holds random data, so a read through a wrong block or past a
context's end changes the result. Table entries past a sequence's last block name spare blocks
for the same reason. The ground truth is float64 attention over each sequence's keys and values
gathered through the block table as it was built.
"""
from __future__ import annotations

from typing import Any

import torch

from gpubench.baselines.paged_attention import paged_decode_attention as gather_then_attend
from gpubench.contract import CheckResult, Measured, Param, Technique, Workload, relative_l2_check
from gpubench.optimizations.paged_attention import paged_decode_attention, paged_decode_attention_torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Relative L2 error allowed against the float64 reference, by the output's dtype.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# Blocks in the pool beyond those the sequences hold, as a fraction of those (at least one): the
# free blocks of a running engine, and the targets of any read through a wrong table entry.
SPARE_BLOCK_FRACTION = 0.25

TECHNIQUE = Technique(
    name="paged_attention",
    shape="kernel",
    summary="Decode attention reading K/V through the block table in place, instead of gathering "
            "each sequence's blocks into a contiguous copy first.",
    anchor="vLLM: KV memory waste under 4% (vs 60-80% for contiguous reservation); 2-4x throughput",
    gpu_specific=(
        "The win is HBM traffic: decode is memory-bound, and the gather writes every KV byte into a "
        "copy and reads it back, where the Triton kernel reads each byte once. On a CPU the "
        "optimized variant is the PyTorch block loop (not the kernel), both run largely from "
        "caches with Python overhead per step, so the CPU ratio says little about a GPU's."
    ),
    params=[
        Param("batch", int, 4, "sequences decoding one token each", min=1),
        Param("heads", int, 8, "query heads", min=1),
        Param("kv_heads", int, 0, "key/value heads (GQA); 0 means the same as heads", min=0),
        Param("head_dim", int, 64, "channels per head", choices=[64, 128]),
        Param("context_len", int, 512, "longest context (tokens); the others are drawn in [1, this]", min=1),
        Param("block_size", int, 16, "tokens per KV block", choices=[8, 16, 32]),
        Param("dtype", str, "float32", "dtype of q, the KV cache and the output",
              choices=["float32", "float16", "bfloat16"]),
    ],
)


def _kv_heads(params: dict[str, Any]) -> int:
    return params["kv_heads"] or params["heads"]


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    heads, kv_heads = params["heads"], _kv_heads(params)
    if heads % kv_heads != 0:
        return [f"heads ({heads}) must be divisible by kv_heads ({kv_heads})"]
    return []


def draw_context_lens(batch: int, context_len: int, gen: torch.Generator) -> list[int]:
    """Mixed lengths in [1, context_len]; the longest is context_len, so the case's longest context
    (and the block table's width) is the parameter."""
    lens = torch.randint(1, context_len + 1, (batch,), generator=gen)
    lens[int(lens.argmax())] = context_len
    return lens.tolist()


def build_block_tables(lens: list[int], block_size: int, gen: torch.Generator) -> tuple[torch.Tensor, int]:
    """(block_tables, num_blocks): every sequence gets ceil(len / block_size) blocks from a
    shuffled pool that also holds spare blocks; entries past a sequence's last block name spare
    blocks (never read by a correct kernel)."""
    counts = [-(-n // block_size) for n in lens]
    needed = sum(counts)
    spare = max(1, int(needed * SPARE_BLOCK_FRACTION))
    pool = torch.randperm(needed + spare, generator=gen).to(torch.int32)
    used, free = pool[:needed], pool[needed:]
    width = max(counts)
    tables = torch.empty(len(lens), width, dtype=torch.int32)
    start = 0
    for b, count in enumerate(counts):
        tables[b, :count] = used[start:start + count]
        pad = width - count
        tables[b, count:] = free[torch.randint(0, len(free), (pad,), generator=gen)]
        start += count
    return tables, needed + spare


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> Workload:
    workload = Workload(params=dict(params), device=torch.device(device), seed=seed)
    batch, heads, dim, block_size = params["batch"], params["heads"], params["head_dim"], params["block_size"]
    kv_heads = _kv_heads(params)
    dtype = DTYPES[params["dtype"]]
    gen = workload.generator()
    lens = draw_context_lens(batch, params["context_len"], gen)
    tables, num_blocks = build_block_tables(lens, block_size, gen)
    # Drawn on the CPU in float32, then moved: the same values on every device. Every slot of the
    # pool is random (spare blocks and the tail of each last block included), never zeros.
    q = torch.randn(batch, heads, dim, generator=gen)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=gen)
    move = dict(device=workload.device, dtype=dtype)
    workload.inputs.update(
        q=q.to(**move), k_cache=k_cache.to(**move), v_cache=v_cache.to(**move),
        block_tables=tables.to(workload.device),
        context_lens=torch.tensor(lens, dtype=torch.int32, device=workload.device),
        lens=lens,
        # The table as built, for the reference only: a variant given a corrupted block_tables
        # is then checked against what the sequences really hold.
        reference_tables=tables.clone(),
        # The optimized variant writes here; NaN until its first (checked) call, so an element the
        # kernel never writes fails the check instead of inheriting a correct value from memory.
        out=torch.full((batch, heads, dim), float("nan"), **move),
    )
    return workload


def _call(fn, w: Workload) -> torch.Tensor:
    return fn(w.q, w.k_cache, w.v_cache, w.block_tables, w.context_lens)


# -- variants ---------------------------------------------------------------------------------

@TECHNIQUE.variant("baseline", role="baseline")
def run_baseline(w: Workload) -> torch.Tensor:
    """Gather every sequence's blocks into a contiguous copy, then masked eager attention."""
    return _call(gather_then_attend, w)


@TECHNIQUE.variant("optimized", role="optimized")
def run_optimized(w: Workload) -> torch.Tensor:
    """Reads K/V through the block table in place: the Triton kernel on CUDA, the same block loop
    with an online softmax in PyTorch elsewhere."""
    return paged_decode_attention(w.q, w.k_cache, w.v_cache, w.block_tables, w.context_lens, out=w.out)


def _cpu_is_optimized(device: torch.device) -> str | None:
    if torch.device(device).type == "cuda":
        return None
    return "on this device the optimized variant is this PyTorch path already"


@TECHNIQUE.variant("torch_blocks", unavailable=_cpu_is_optimized)
def run_torch_blocks(w: Workload) -> torch.Tensor:
    """The optimized algorithm in PyTorch (block loop, online softmax), beside the CUDA kernel."""
    return _call(paged_decode_attention_torch, w)


# -- correctness ------------------------------------------------------------------------------

@TECHNIQUE.reference
def reference(w: Workload) -> torch.Tensor:
    """Attention in float64 over each sequence's contiguous keys and values, gathered through the
    block table as built."""
    q = w.q.to(torch.float64)
    batch, heads, head_dim = q.shape
    block_size, kv_heads = w.k_cache.shape[1], w.k_cache.shape[2]
    group = heads // kv_heads
    out = torch.empty_like(q)
    for b, n in enumerate(w.lens):
        blocks = w.reference_tables[b, :-(-n // block_size)].to(device=w.k_cache.device, dtype=torch.long)
        k, v = (cache[blocks].flatten(0, 1)[:n].to(torch.float64) for cache in (w.k_cache, w.v_cache))
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))  # (n, heads, dim)
        scores = torch.einsum("hd,nhd->hn", q[b], k) * head_dim ** -0.5
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)
    return out


@TECHNIQUE.check
def check(reference_output: torch.Tensor, output: torch.Tensor) -> CheckResult:
    """Relative L2 (Frobenius) error in float64, with a tolerance set by the output's dtype."""
    return relative_l2_check(reference_output, output, TOLERANCE)


# -- metrics ----------------------------------------------------------------------------------

def decode_bytes(lens: list[int], kv_heads: int, head_dim: int, element_size: int, q_numel: int) -> int:
    """Least memory traffic of one decode step: each context's K and V read once, q read, the
    output (shaped like q) written. Block tables and lengths are left out (a few bytes per block)."""
    return sum(lens) * kv_heads * head_dim * 2 * element_size + 2 * q_numel * element_size


@TECHNIQUE.metrics
def metrics(w: Workload, measured: Measured) -> dict[str, Any]:
    _, _, kv_heads, head_dim = w.k_cache.shape
    return {
        "bytes_moved": decode_bytes(w.lens, kv_heads, head_dim, w.k_cache.element_size(), w.q.numel()),
        "tokens_per_s": len(w.lens) / measured.median_s,  # one new token per sequence per step
        "context_tokens": sum(w.lens),
    }


# -- report -----------------------------------------------------------------------------------

def _points(cases: list[dict[str, Any]], x_param: str, value) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(role, label of the other params) -> [(x, y)] over cases, y = value(variant record) where
    it is not None. Cases differing in anything but ``x_param`` go on separate lines."""
    varying = {k for k in {k for c in cases for k in c.get("params", {})}
               if len({repr(c.get("params", {}).get(k)) for c in cases}) > 1} - {x_param}
    series: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for case in cases:
        params = case.get("params", {})
        if x_param not in params:
            continue
        label = ", ".join(f"{k}={params.get(k)}" for k in sorted(varying))
        for record in (case.get("variants") or {}).values():
            role = record.get("role")
            if role not in ("baseline", "optimized"):
                continue
            y = value(record)
            if isinstance(y, (int, float)):
                series.setdefault((role, label), []).append((params[x_param], y))
    return series


def _line_figure(series, xlabel: str, ylabel: str):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot()
    colors = {"baseline": "#8c8c8c", "optimized": "#1f6fb4"}
    for (role, label), points in sorted(series.items()):
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", color=colors[role], label=f"{role} {label}".strip(),
                linestyle="-" if role == "optimized" else "--")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@TECHNIQUE.figures
def figures(cases: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Decode bandwidth against context length; latency per decode step against batch (when the
    run varies batch). Only figures with data are returned."""
    out = []
    gbps = _points(cases, "context_len", lambda r: (r.get("metrics") or {}).get("gbps"))
    if gbps:
        out.append(("Decode bandwidth (KV bytes read once, per second) vs context length",
                    _line_figure(gbps, "longest context (tokens)", "GB/s")))
    if len({c.get("params", {}).get("batch") for c in cases}) > 1:
        latency = _points(cases, "batch", lambda r: None if not r.get("stats") or r["stats"].get("median") is None
                          else 1e3 * r["stats"]["median"])
        if latency:
            out.append(("Latency per decode step vs batch", _line_figure(latency, "batch (sequences)", "ms per step")))
    return out
