"""KV-cache arithmetic: exact bytes per token, per sequence and per GPU (pure functions).

Per layer and token a standard attention layer stores K and V:
``2 x kv_heads (per GPU) x head_dim x bytes``; an MLA layer (DeepSeek-V2/V3) stores one latent
of ``kv_lora_rank + qk_rope_head_dim`` values, with no factor 2. Quantized formats add their
scales (stated per format below). How many tokens each layer holds depends on the allocator:

- ``paged``: blocks of ``block_size`` tokens on demand, window-aware: a sliding-window layer keeps
  only the blocks that still hold tokens inside its window (what vLLM's hybrid allocator does);
- ``paged_full``: blocks on demand, but every layer keeps the whole sequence (an engine that
  ignores windows);
- ``contiguous``: every layer reserves ``max_len`` slots per sequence up front (static caches);
- ``contiguous_ring``: as contiguous, but sliding-window layers reserve a ring of ``window`` slots.

Tensor parallelism splits KV heads across GPUs; with fewer KV heads than GPUs each GPU keeps one
(replicated). An MLA latent is shared by all heads, so each GPU keeps all of it.

A capacity plan (:func:`plan`) follows vLLM where vLLM's figures can be compared:

- per-tensor scales (fp8's K and V scales, nvfp4's global scale) are layer parameters, counted with
  the model's memory, not taken from the KV block pool (vLLM keeps them as ``k_scale`` /
  ``v_scale`` parameters of each attention layer);
- the default block size is vLLM's on CUDA: 16 tokens, or 64 for MLA models (vLLM's FlashMLA
  backend, its MLA default on Hopper, forces 64; the CUTLASS MLA backend, Blackwell's, 128);
- besides the steady-state decode capacity, the plan gives the maximum concurrency vLLM's start-up
  log reports: a worst case per request of ``max_len`` tokens in which a sliding layer holds
  ``window - 1`` tokens plus a whole prefill chunk (``max_num_batched_tokens``) plus one block.

Per-layer sums cost one term per distinct window (not per layer), and model configs are bounded
(:data:`gpubench.models.config.CONFIG_LIMITS`), so a plan answers at once whatever the sizes.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from gpubench.errors import BadInput
from gpubench.models.config import ModelConfig


@dataclass(frozen=True)
class KVFormat:
    name: str
    value_bits: int  # bits per stored value
    group: int  # values per scale group; 0 = one scale per stored vector (per token and head)
    group_scale_bytes: int  # bytes of scale (and zero-point) per group
    tensor_scale_bytes: int  # per K (or V, or latent) cache tensor per layer
    torch_dtype: str | None  # storage dtype of the values where torch has one, else packed bytes
    overhead: str  # what the scales cost, in words

    def vector_bytes(self, values: int) -> int:
        """Bytes of one stored vector of ``values`` values, scales included."""
        groups = 0 if self.group_scale_bytes == 0 else (1 if self.group == 0 else math.ceil(values / self.group))
        return self.value_bytes(values) + groups * self.group_scale_bytes

    def value_bytes(self, values: int) -> int:
        return math.ceil(values * self.value_bits / 8)

    def scale_bytes(self, values: int) -> int:
        return self.vector_bytes(values) - self.value_bytes(values)


KV_FORMATS: dict[str, KVFormat] = {
    "fp32": KVFormat("fp32", 32, 0, 0, 0, "float32", "none"),
    "bf16": KVFormat("bf16", 16, 0, 0, 0, "bfloat16", "none"),
    "fp16": KVFormat("fp16", 16, 0, 0, 0, "float16", "none"),
    "fp8": KVFormat("fp8", 8, 0, 0, 4, "float8_e4m3fn",
                    "one fp32 scale per layer for K and one for V (per-tensor, as vLLM's fp8 KV cache: layer "
                    "parameters, counted with the weights)"),
    "int8": KVFormat("int8", 8, 0, 2, 0, None,
                     "one fp16 scale per stored vector (per token and head): +2 bytes per head_dim values"),
    "int4": KVFormat("int4", 4, 32, 4, 0, None,
                     "asymmetric groups of 32 values, fp16 scale + fp16 zero-point each: 5 bits per value"),
    "mxfp4": KVFormat("mxfp4", 4, 32, 1, 0, None,
                      "OCP MX: one 8-bit (e8m0) scale per 32 values: 4.25 bits per value"),
    "nvfp4": KVFormat("nvfp4", 4, 16, 1, 4, None,
                      "one fp8 (e4m3) scale per 16 values: 4.5 bits per value, + one fp32 scale per tensor"),
}
KV_DTYPE_ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                    "fp8_e4m3": "fp8", "fp8_e5m2": "fp8", "float8": "fp8"}
POLICIES = ("paged", "paged_full", "contiguous", "contiguous_ring")


def kv_format(name: str, source: str = "--kv-dtype") -> KVFormat:
    key = KV_DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in KV_FORMATS:
        raise BadInput(f"{source}: {name!r} is not a supported KV dtype; allowed: {', '.join(KV_FORMATS)} "
                       f"(aliases: {', '.join(KV_DTYPE_ALIASES)}).")
    return KV_FORMATS[key]


@dataclass(frozen=True)
class KVLayout:
    """What one GPU stores per token per layer."""

    model: str
    attention: str  # MHA, GQA, MQA, MLA
    fmt: KVFormat
    tp: int
    kv_heads_per_gpu: int  # MLA: 1 latent
    vectors_per_token: int  # per layer: 2 x kv heads (K and V), or 1 latent for MLA
    vector_len: int  # head_dim, or kv_lora_rank + qk_rope_head_dim
    windows: tuple[int | None, ...]  # per layer
    tp_note: str

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    @cached_property
    def window_counts(self) -> tuple[tuple[int | None, int], ...]:
        """(window, number of layers) pairs, in first-seen order: per-layer sums take one term per
        distinct window."""
        return tuple(Counter(self.windows).items())

    @property
    def bytes_per_token_per_layer(self) -> int:
        return self.vectors_per_token * self.fmt.vector_bytes(self.vector_len)

    @property
    def tensors_per_layer(self) -> int:
        return 1 if self.attention == "MLA" else 2

    @property
    def fixed_bytes(self) -> int:
        """Per-tensor scales: a constant per GPU, whatever the number of tokens."""
        return self.num_layers * self.tensors_per_layer * self.fmt.tensor_scale_bytes

    @property
    def bytes_per_token(self) -> int:
        """All layers, every layer holding the token (no window)."""
        return self.num_layers * self.bytes_per_token_per_layer


def layout_for(cfg: ModelConfig, kv_dtype: str = "bf16", tp: int = 1) -> KVLayout:
    fmt = kv_format(kv_dtype) if isinstance(kv_dtype, str) else kv_dtype
    if tp < 1:
        raise BadInput(f"--tp: {tp} is not valid; allowed: an integer >= 1.")
    if cfg.mla is not None:
        return KVLayout(cfg.name, "MLA", fmt, tp, 1, 1, cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim,
                        cfg.layer_windows, "MLA latent is shared by all heads: every GPU keeps all of it"
                        if tp > 1 else "")
    kv = cfg.num_kv_heads
    if kv >= tp:
        if kv % tp:
            raise BadInput(f"--tp: {cfg.name} has {kv} KV heads, which {tp} GPUs cannot split evenly; "
                           f"allowed: a divisor of {kv}, or a multiple of it (heads replicated).")
        per_gpu, note = kv // tp, (f"{kv} KV heads split over {tp} GPUs" if tp > 1 else "")
    else:
        if tp % kv:
            raise BadInput(f"--tp: {tp} GPUs cannot share {kv} KV heads evenly; allowed: a multiple of {kv} or a divisor of it.")
        per_gpu, note = 1, f"{kv} KV heads < {tp} GPUs: each GPU keeps one head (replicated {tp // kv}x)"
    return KVLayout(cfg.name, cfg.attention, fmt, tp, per_gpu, 2 * per_gpu, cfg.head_dim, cfg.layer_windows, note)


# --------------------------------------------------------------------------------------------
# Tokens held

def blocks_for(length: int, block_size: int) -> int:
    return math.ceil(length / block_size)


def block_edge_lengths(block_size: int, longest: int, windows: tuple[int | None, ...] = ()) -> list[int]:
    """Sequence lengths at and around block edges, where block arithmetic goes wrong: 1, B-1, B,
    B+1, 2B-1, 2B, 2B+1, the last edge at or below ``longest`` and around it, ``longest``
    itself, and for each sliding ``window`` the lengths where the window starts on a block edge
    or just past one (W-1 .. W+1, W+B-1 .. W+B+1). Sorted, in [1, longest]."""
    b = block_size
    edges = {1, longest - 1, longest}
    for k in (1, 2, longest // b):
        edges |= {k * b - 1, k * b, k * b + 1}
    for w in {w for w in windows if w}:
        edges |= {w - 1, w, w + 1, w + b - 1, w + b, w + b + 1}
    return sorted(n for n in edges if 1 <= n <= longest)


def window_blocks(length: int, window: int, block_size: int) -> int:
    """Blocks a window-aware paged allocator still holds for a sliding layer once ``length``
    tokens were written: those containing positions length-window .. length-1 (a window that
    does not start on a block boundary touches one block more)."""
    if length <= 0:
        return 0
    first = max(0, length - window)
    return (length - 1) // block_size - first // block_size + 1


def layer_slots(window: int | None, length: int, policy: str, block_size: int, max_len: int) -> int:
    """Token slots one layer (full attention, or sliding with ``window``) reserves for one
    sequence of ``length`` tokens."""
    if policy == "paged":
        n = window_blocks(length, window, block_size) if window else blocks_for(length, block_size)
        return n * block_size
    if policy == "paged_full":
        return blocks_for(length, block_size) * block_size
    if policy == "contiguous":
        return max_len
    if policy == "contiguous_ring":
        return min(max_len, window) if window else max_len
    raise ValueError(f"unknown policy {policy!r}; allowed: {POLICIES}")


def slots_per_layer(layout: KVLayout, length: int, policy: str, block_size: int, max_len: int) -> list[int]:
    """Token slots each layer reserves for one sequence of ``length`` tokens."""
    return [layer_slots(w, length, policy, block_size, max_len) for w in layout.windows]


def live_tokens_per_layer(layout: KVLayout, length: int) -> list[int]:
    """Tokens each layer still needs: the whole sequence, or the window for sliding layers."""
    return [min(length, w) if w else length for w in layout.windows]


def sequence_bytes(layout: KVLayout, length: int, policy: str, block_size: int, max_len: int) -> int:
    """Bytes one sequence occupies on one GPU (per-tensor scales not included: see fixed_bytes)."""
    slots = sum(count * layer_slots(w, length, policy, block_size, max_len) for w, count in layout.window_counts)
    return slots * layout.bytes_per_token_per_layer


def cache_bytes(layout: KVLayout, lengths: list[int], policy: str, block_size: int, max_len: int) -> int:
    """Bytes of the whole cache on one GPU for these sequences, fixed per-tensor scales included:
    exactly what an allocator of that policy holds in tensor storage (the kv_cache technique's
    allocators keep the scales beside their cache tensors; a capacity plan counts them with the
    weights instead, as vLLM does)."""
    return layout.fixed_bytes + sum(sequence_bytes(layout, n, policy, block_size, max_len) for n in lengths)


def token_bytes(layout: KVLayout, lengths: list[int]) -> int:
    """Bytes that actually hold live tokens (what an ideal allocator would need)."""
    live = sum(count * sum(min(n, w) if w else n for n in lengths) for w, count in layout.window_counts)
    return live * layout.bytes_per_token_per_layer


def naive_bytes_per_token(cfg: ModelConfig, fmt: KVFormat) -> float:
    """The back-of-envelope formula: 2 x layers x hidden_size x bytes per value (assumes MHA,
    head_dim = hidden / heads, no windows, no scales)."""
    return 2 * cfg.num_layers * cfg.hidden_size * fmt.value_bits / 8


# --------------------------------------------------------------------------------------------
# A capacity plan

DEFAULT_BLOCK_SIZE = 16  # vLLM's on CUDA
MLA_BLOCK_SIZE = 64  # vLLM's FlashMLA backend forces it for MLA models (its CUTLASS MLA backend: 128)
MAX_SUGGESTED_TP = 1024


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    sign, n = ("-" if n < 0 else ""), abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.3g} {unit}" if unit != "B" else f"{sign}{n:.0f} B"
        n /= 1024
    return f"{sign}{n:.3g} TiB"


def block_size_for(cfg: ModelConfig, given: int | None) -> tuple[int, str]:
    """The paged block size and why: ``given`` (--block-size), else vLLM's default on CUDA (16
    tokens; 64 for MLA, which vLLM's FlashMLA backend forces)."""
    if given is not None:
        note = "given (--block-size)"
        if cfg.mla is not None and given % MLA_BLOCK_SIZE:
            note += (f"; vLLM would not run MLA with it: its FlashMLA backend forces {MLA_BLOCK_SIZE} "
                     "(CUTLASS MLA: 128)")
        return given, note
    if cfg.mla is not None:
        return MLA_BLOCK_SIZE, (f"MLA default: vLLM's FlashMLA backend (its MLA default on Hopper) forces "
                                f"{MLA_BLOCK_SIZE}-token blocks; the CUTLASS MLA backend (Blackwell) uses 128: "
                                "--block-size 128")
    return DEFAULT_BLOCK_SIZE, "vLLM's default on CUDA"


def default_batched_tokens(gpu_memory_bytes: int, device_name: str = "") -> tuple[int, str]:
    """``vllm serve``'s default max_num_batched_tokens (the most tokens a step schedules, so the
    largest prefill chunk): 8192 on a GPU of at least 70 GiB other than an A100, else 2048."""
    if gpu_memory_bytes >= 70 * 2**30 and "a100" not in device_name.lower():
        return 8192, "vllm serve's default on a GPU of >= 70 GiB other than an A100"
    return 2048, "vllm serve's default on a GPU under 70 GiB or an A100"


def vllm_blocks_per_request(layout: KVLayout, max_len: int, block_size: int, batched_tokens: int) -> int:
    """Blocks (of one layer each) that vLLM's start-up log charges one request of ``max_len``
    tokens when it reports maximum concurrency: a full-attention layer ceil(max_len / B); a
    sliding layer ceil(min(window - 1 + batched_tokens, max_len) / B) + 1, its worst case: during
    chunked prefill it holds the window's last window - 1 tokens and the whole new chunk, plus a
    block because the window need not start on a block edge (vLLM's SlidingWindowSpec)."""
    total = 0
    for window, count in layout.window_counts:
        if window:
            total += count * (blocks_for(min(window - 1 + batched_tokens, max_len), block_size) + 1)
        else:
            total += count * blocks_for(max_len, block_size)
    return total


@dataclass
class PolicyPlan:
    policy: str
    bytes_per_sequence: int
    batch_bytes: int | None  # for the requested batch
    max_sequences: int  # that fit in the free memory at this length
    utilization: float  # bytes holding live tokens / bytes reserved, at this length


@dataclass
class KVPlan:
    model: str
    attention: str
    kv_dtype: str
    kv_overhead: str
    seq_len: int
    max_len: int
    max_position_embeddings: int | None
    long_note: str  # when a length beyond the model's positions was allowed (--allow-long)
    batch: int | None
    block_size: int
    block_size_note: str
    tp: int
    tp_note: str
    num_layers: int
    sliding_layers: int
    windows: list[int | None]
    head_dim: int
    head_dim_source: str
    kv_heads_per_gpu: int
    bytes_per_token_per_layer: int
    bytes_per_token: int  # per GPU, all layers
    kv_scale_bytes: int  # per GPU: per-tensor scales, counted with the weights (vLLM: layer parameters)
    naive_bytes_per_token: float  # whole model, one GPU
    exact_bytes_per_token_tp1: int  # whole model, one GPU, every layer
    naive_vs_exact: float  # naive / exact
    gpu_memory_bytes: int
    utilization_target: float
    weight_bytes: int  # whole model
    weight_bytes_per_gpu: int
    weight_note: str
    overhead_bytes: int
    free_bytes: int  # per GPU, for KV (negative: the model does not fit)
    max_tokens: int  # paged blocks that fit, every layer holding every token
    policies: dict[str, PolicyPlan]
    # vLLM's start-up log: "Maximum concurrency for max_len tokens per request"
    max_num_batched_tokens: int  # the prefill chunk of vLLM's worst case
    batched_tokens_note: str
    vllm_blocks_per_request: int  # summed over layers
    vllm_bytes_per_request: int
    vllm_max_concurrency: float
    fits: bool  # the model, one sequence and the requested batch fit on each GPU
    fit_problem: str  # why not, and what to try
    suggested_tp: int | None  # the smallest tensor parallelism that would fit, when that helps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fitting_tp(cfg: ModelConfig, fmt: KVFormat, *, tp: int, need_sequences: int, seq_len: int, block_size: int,
                max_len: int, limit_bytes: int, weight_bytes: int, overhead_bytes: int) -> int | None:
    """The smallest tensor parallelism above ``tp`` (up to MAX_SUGGESTED_TP) whose GPUs each hold
    their share of the weights and ``need_sequences`` sequences, or None."""
    kv = cfg.num_kv_heads
    candidates = ({2**k for k in range(11)} | {d for d in range(1, min(kv, MAX_SUGGESTED_TP) + 1) if kv % d == 0}
                  | {kv * 2**k for k in range(11)})
    for t in sorted(c for c in candidates if tp < c <= MAX_SUGGESTED_TP):
        try:
            layout = layout_for(cfg, fmt, t)
        except BadInput:
            continue
        usable = limit_bytes - math.ceil(weight_bytes / t) - layout.fixed_bytes - overhead_bytes
        if usable >= 0 and usable >= need_sequences * sequence_bytes(layout, seq_len, "paged", block_size, max_len):
            return t
    return None


def _long_problems(cfg: ModelConfig, seq_len: int, max_len: int | None) -> list[str]:
    limit = cfg.max_position_embeddings
    if not limit:
        return []
    return [f"{option}: {value:,} tokens exceeds {cfg.name}'s max_position_embeddings ({limit:,})"
            for option, value in (("--seq-len", seq_len), ("--max-len", max_len)) if value is not None and value > limit]


def plan(cfg: ModelConfig, *, seq_len: int, batch: int | None, kv_dtype: str = "bf16", block_size: int | None = None,
         tp: int = 1, gpu_memory_bytes: int, utilization: float = 0.9, weight_bytes: int,
         weight_note: str = "", max_len: int | None = None, overhead_bytes: int = 0, allow_long: bool = False,
         max_num_batched_tokens: int | None = None, device_name: str = "") -> KVPlan:
    problems = []
    for name, value in (("--seq-len", seq_len), ("--block-size", block_size), ("--tp", tp),
                        ("--gpu-memory", gpu_memory_bytes), ("--max-len", max_len),
                        ("--max-num-batched-tokens", max_num_batched_tokens)):
        if value is not None and value <= 0:
            problems.append(f"{name}: {value} must be > 0")
    if batch is not None and batch <= 0:
        problems.append(f"--batch: {batch} must be > 0 (or 'fit')")
    if not 0 < utilization <= 1:
        problems.append(f"--utilization: {utilization} must be in (0, 1]")
    if weight_bytes < 0 or overhead_bytes < 0:
        problems.append("--weight-bytes / --overhead-bytes must be >= 0")
    if max_len is not None and max_len < seq_len:
        problems.append(f"--max-len: {max_len} is shorter than --seq-len {seq_len}")
    if problems:
        raise BadInput("invalid sizes: " + "; ".join(problems) + ".")
    too_long = _long_problems(cfg, seq_len, max_len)
    if too_long and not allow_long:
        raise BadInput("; ".join(too_long) + ": the model was not trained on longer sequences, and vLLM refuses "
                       "such a --max-model-len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set; allowed: at most "
                       f"{cfg.max_position_embeddings:,} tokens, or pass --allow-long to plan it anyway.")
    long_note = "; ".join(too_long) + " (allowed by --allow-long)" if too_long else ""
    max_len = max_len if max_len is not None else max(seq_len, cfg.max_position_embeddings or seq_len)
    block_size, block_note = block_size_for(cfg, block_size)
    if max_num_batched_tokens is None:
        max_num_batched_tokens, batched_note = default_batched_tokens(gpu_memory_bytes, device_name)
    else:
        batched_note = "given (--max-num-batched-tokens)"
    layout = layout_for(cfg, kv_dtype, tp)
    exact_tp1 = layout_for(cfg, kv_dtype, 1).bytes_per_token
    naive = naive_bytes_per_token(cfg, layout.fmt)
    per_gpu_weights = math.ceil(weight_bytes / tp)
    limit_bytes = int(gpu_memory_bytes * utilization)
    # Per-tensor scales are layer parameters: model memory, as vLLM counts them, not KV pool.
    free = limit_bytes - per_gpu_weights - layout.fixed_bytes - overhead_bytes
    usable = max(0, free)
    live = token_bytes(layout, [seq_len])
    policies = {}
    for policy in POLICIES:
        per_seq = sequence_bytes(layout, seq_len, policy, block_size, max_len)
        policies[policy] = PolicyPlan(policy, per_seq, per_seq * batch if batch else None,
                                      usable // per_seq if per_seq else 0, live / per_seq if per_seq else 0.0)
    page_bytes = block_size * layout.bytes_per_token_per_layer  # one block of one layer
    vllm_blocks = vllm_blocks_per_request(layout, max_len, block_size, max_num_batched_tokens)

    paged = policies["paged"]
    fit_problem, need = "", 0
    if free < 0:
        other = f" + {human_bytes(layout.fixed_bytes)} of K/V scales" if layout.fixed_bytes else ""
        other += f" + {human_bytes(overhead_bytes)} of --overhead" if overhead_bytes else ""
        fit_problem = (f"{cfg.name} does not fit: weights {human_bytes(per_gpu_weights)} per GPU{other} exceed the "
                       f"usable {human_bytes(limit_bytes)} ({human_bytes(gpu_memory_bytes)} x utilization "
                       f"{utilization:g})")
        need = batch or 1
    elif paged.max_sequences == 0:
        fit_problem = (f"0 sequences of {seq_len:,} tokens fit: one needs {human_bytes(paged.bytes_per_sequence)} "
                       f"(paged, window-aware) and {human_bytes(usable)} is free for KV per GPU")
        need = batch or 1
    elif batch and batch > paged.max_sequences:
        fit_problem = (f"the batch of {batch:,} does not fit: at most {paged.max_sequences:,} sequences of "
                       f"{seq_len:,} tokens with paged allocation ({human_bytes(paged.batch_bytes)} needed, "
                       f"{human_bytes(usable)} free for KV per GPU)")
        need = batch
    suggested = None
    if fit_problem:
        suggested = _fitting_tp(cfg, layout.fmt, tp=tp, need_sequences=need, seq_len=seq_len, block_size=block_size,
                                max_len=max_len, limit_bytes=limit_bytes, weight_bytes=weight_bytes,
                                overhead_bytes=overhead_bytes)
        tries = [f"--tp {suggested}"] if suggested else []
        if free >= 0:
            tries += ["a shorter --seq-len", "a smaller --kv-dtype"] + (["a smaller --batch"] if batch else [])
        elif overhead_bytes:
            tries.append("a smaller --overhead")
        tries.append("a larger --gpu-memory")
        fit_problem += "; try " + ", ".join(tries[:-1]) + (" or " if len(tries) > 1 else "") + tries[-1] + "."
    return KVPlan(
        model=cfg.name, attention=layout.attention, kv_dtype=layout.fmt.name, kv_overhead=layout.fmt.overhead,
        seq_len=seq_len, max_len=max_len, max_position_embeddings=cfg.max_position_embeddings, long_note=long_note,
        batch=batch, block_size=block_size, block_size_note=block_note, tp=tp, tp_note=layout.tp_note,
        num_layers=cfg.num_layers, sliding_layers=cfg.sliding_layers, windows=list(cfg.layer_windows),
        head_dim=layout.vector_len,
        head_dim_source=("kv_lora_rank + qk_rope_head_dim" if cfg.mla else
                         "config head_dim" if cfg.head_dim_from_config else "hidden_size / num_attention_heads"),
        kv_heads_per_gpu=layout.kv_heads_per_gpu, bytes_per_token_per_layer=layout.bytes_per_token_per_layer,
        bytes_per_token=layout.bytes_per_token, kv_scale_bytes=layout.fixed_bytes,
        naive_bytes_per_token=naive, exact_bytes_per_token_tp1=exact_tp1, naive_vs_exact=naive / exact_tp1,
        gpu_memory_bytes=gpu_memory_bytes, utilization_target=utilization, weight_bytes=weight_bytes,
        weight_bytes_per_gpu=per_gpu_weights, weight_note=weight_note, overhead_bytes=overhead_bytes,
        free_bytes=free, max_tokens=(usable // (page_bytes * layout.num_layers)) * block_size if page_bytes else 0,
        policies=policies, max_num_batched_tokens=max_num_batched_tokens, batched_tokens_note=batched_note,
        vllm_blocks_per_request=vllm_blocks, vllm_bytes_per_request=vllm_blocks * page_bytes,
        vllm_max_concurrency=(usable // page_bytes) / vllm_blocks if vllm_blocks else 0.0,
        fits=not fit_problem, fit_problem=fit_problem, suggested_tp=suggested,
    )
