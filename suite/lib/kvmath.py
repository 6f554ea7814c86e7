"""KV-cache arithmetic: exact bytes per token, per sequence and per GPU (pure functions).

Per layer and token a standard attention layer stores K and V:
``2 x kv_heads (per GPU) x head_dim x bytes``; an MLA layer (DeepSeek-V2/V3) stores one latent
of ``kv_lora_rank + qk_rope_head_dim`` values, with no factor 2. Quantized formats add their
scales (stated per format below). How many tokens each layer holds depends on the allocator:

- ``paged``: blocks of ``block_size`` tokens on demand, window-aware: a sliding-window layer keeps
  only the blocks that still hold tokens inside its window, a chunked local attention layer only
  those of the current chunk (what vLLM's hybrid allocator does);
- ``paged_full``: blocks on demand, but every layer keeps the whole sequence (an engine that
  ignores windows);
- ``contiguous``: every layer reserves ``max_len`` slots per sequence up front (static caches);
- ``contiguous_ring``: as contiguous, but sliding-window layers reserve a ring of ``window`` slots.

Tensor parallelism splits KV heads across GPUs; with fewer KV heads than GPUs each GPU keeps one
(replicated). An MLA latent is shared by all heads, so each GPU keeps all of it.

A capacity plan (:func:`plan`) follows vLLM's own arithmetic (its main branch of early 2026; see
docs/kv-cache.md for what each figure is and where vLLM versions differ):

- per-tensor scales (fp8's K and V scales, nvfp4's global scale) are buffers of every attention
  layer, part of the model's memory, never taken from the KV block pool;
- the default block size is vLLM's on CUDA: 16 tokens, or 64 for MLA models (vLLM's FlashMLA
  backend replaces a block size that is not a multiple of 64 by 64; CUTLASS MLA, Blackwell: 128);
- layers are grouped as vLLM's hybrid KV-cache manager groups them (:class:`KVCacheGroups`: one
  kind per group, groups of equal size, the last of a kind padded); the pool holds
  budget // page // group size blocks, one of them the null block no request gets;
- besides the steady-state decode capacity, the plan gives the maximum concurrency vLLM's start-up
  log reports: whole pool blocks divided by what one request of ``max_len`` tokens needs in the
  worst case (a sliding layer ``window - 1`` tokens plus a whole prefill chunk plus one block; a
  chunked layer its chunk plus a prefill chunk).

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
from gpubench.units import human_bytes as human_bytes  # (kvmath.human_bytes: where it was first)


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
    "fp8": KVFormat(
        "fp8",
        8,
        0,
        0,
        4,
        "float8_e4m3fn",
        "one fp32 scale per layer for K and one for V (per-tensor, as vLLM's fp8 KV cache: layer "
        "parameters, counted with the weights)",
    ),
    "int8": KVFormat(
        "int8", 8, 0, 2, 0, None, "one fp16 scale per stored vector (per token and head): +2 bytes per head_dim values"
    ),
    "int4": KVFormat(
        "int4", 4, 32, 4, 0, None, "asymmetric groups of 32 values, fp16 scale + fp16 zero-point each: 5 bits per value"
    ),
    "mxfp4": KVFormat("mxfp4", 4, 32, 1, 0, None, "OCP MX: one 8-bit (e8m0) scale per 32 values: 4.25 bits per value"),
    "nvfp4": KVFormat(
        "nvfp4",
        4,
        16,
        1,
        4,
        None,
        "one fp8 (e4m3) scale per 16 values: 4.5 bits per value, + one fp32 scale per tensor",
    ),
}
KV_DTYPE_ALIASES = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "float8": "fp8",
}
POLICIES = ("paged", "paged_full", "contiguous", "contiguous_ring")


def kv_format(name: str, source: str = "--kv-dtype") -> KVFormat:
    key = KV_DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in KV_FORMATS:
        raise BadInput(
            f"{source}: {name!r} is not a supported KV dtype; allowed: {', '.join(KV_FORMATS)} "
            f"(aliases: {', '.join(KV_DTYPE_ALIASES)})."
        )
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
    windows: tuple[int | None, ...]  # per layer: sliding window, else None
    tp_note: str
    chunks: tuple[int | None, ...] = ()  # per layer: chunked local attention's chunk, else None (or empty)

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    @property
    def spans(self) -> tuple[tuple[int | None, int | None], ...]:
        """Per layer, what it attends to: (window, chunk); (None, None) is full attention."""
        return tuple(zip(self.windows, self.chunks or (None,) * len(self.windows)))

    @cached_property
    def span_counts(self) -> tuple[tuple[tuple[int | None, int | None], int], ...]:
        """((window, chunk), number of layers) pairs, in first-seen order (vLLM groups layers in
        this order too): per-layer sums take one term per distinct kind of layer."""
        return tuple(Counter(self.spans).items())

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


def layout_for(cfg: ModelConfig, kv_dtype: str | KVFormat = "bf16", tp: int = 1) -> KVLayout:
    fmt = kv_format(kv_dtype) if isinstance(kv_dtype, str) else kv_dtype
    if tp < 1:
        raise BadInput(f"--tp: {tp} is not valid; allowed: an integer >= 1.")
    if cfg.mla is not None:
        return KVLayout(
            cfg.name,
            "MLA",
            fmt,
            tp,
            1,
            1,
            cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim,
            cfg.layer_windows,
            "MLA latent is shared by all heads: every GPU keeps all of it" if tp > 1 else "",
            cfg.layer_chunks,
        )
    kv = cfg.num_kv_heads
    if kv >= tp:
        if kv % tp:
            raise BadInput(
                f"--tp: {cfg.name} has {kv} KV heads, which {tp} GPUs cannot split evenly; "
                f"allowed: a divisor of {kv}, or a multiple of it (heads replicated)."
            )
        per_gpu, note = kv // tp, (f"{kv} KV heads split over {tp} GPUs" if tp > 1 else "")
    else:
        if tp % kv:
            raise BadInput(
                f"--tp: {tp} GPUs cannot share {kv} KV heads evenly; allowed: a multiple of {kv} or a divisor of it."
            )
        per_gpu, note = 1, f"{kv} KV heads < {tp} GPUs: each GPU keeps one head (replicated {tp // kv}x)"
    return KVLayout(
        cfg.name, cfg.attention, fmt, tp, per_gpu, 2 * per_gpu, cfg.head_dim, cfg.layer_windows, note, cfg.layer_chunks
    )


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


def chunk_blocks(length: int, chunk: int, block_size: int) -> int:
    """Blocks a chunk-aware paged allocator still holds for a chunked local attention layer once
    ``length`` tokens were written: those of the chunk the last token belongs to (positions
    (length - 1) // chunk * chunk .. length - 1; earlier chunks are never read again)."""
    if length <= 0:
        return 0
    first = (length - 1) // chunk * chunk
    return (length - 1) // block_size - first // block_size + 1


def held_blocks(span: tuple[int | None, int | None], length: int, block_size: int) -> int:
    """Blocks one layer of this span (window, chunk) holds at ``length`` tokens, window- and
    chunk-aware: what vLLM's hybrid allocator keeps for that layer's KV-cache group."""
    window, chunk = span
    if window:
        return window_blocks(length, window, block_size)
    if chunk:
        return chunk_blocks(length, chunk, block_size)
    return blocks_for(length, block_size)


def live_tokens(span: tuple[int | None, int | None], length: int) -> int:
    """Tokens one layer still needs: the whole sequence, the window of a sliding layer, or the
    last token's chunk for a chunked layer."""
    window, chunk = span
    if window:
        return min(length, window)
    if chunk:
        return length - (length - 1) // chunk * chunk if length > 0 else 0
    return length


def layer_slots(
    window: int | None, length: int, policy: str, block_size: int, max_len: int, chunk: int | None = None
) -> int:
    """Token slots one layer (full attention, sliding with ``window``, or chunked local attention
    with ``chunk``) reserves for one sequence of ``length`` tokens."""
    if policy == "paged":
        return held_blocks((window, chunk), length, block_size) * block_size
    if policy == "paged_full":
        return blocks_for(length, block_size) * block_size
    if policy == "contiguous":
        return max_len
    if policy == "contiguous_ring":
        span = window or chunk
        return min(max_len, span) if span else max_len
    raise ValueError(f"unknown policy {policy!r}; allowed: {POLICIES}")


def slots_per_layer(layout: KVLayout, length: int, policy: str, block_size: int, max_len: int) -> list[int]:
    """Token slots each layer reserves for one sequence of ``length`` tokens."""
    return [layer_slots(w, length, policy, block_size, max_len, c) for w, c in layout.spans]


def live_tokens_per_layer(layout: KVLayout, length: int) -> list[int]:
    """Tokens each layer still needs (see :func:`live_tokens`)."""
    return [live_tokens(span, length) for span in layout.spans]


def sequence_bytes(layout: KVLayout, length: int, policy: str, block_size: int, max_len: int) -> int:
    """Bytes one sequence occupies on one GPU (per-tensor scales not included: see fixed_bytes)."""
    slots = sum(count * layer_slots(w, length, policy, block_size, max_len, c) for (w, c), count in layout.span_counts)
    return slots * layout.bytes_per_token_per_layer


def cache_bytes(layout: KVLayout, lengths: list[int], policy: str, block_size: int, max_len: int) -> int:
    """Bytes of the whole cache on one GPU for these sequences, fixed per-tensor scales included:
    exactly what an allocator of that policy holds in tensor storage (the kv_cache technique's
    allocators keep the scales beside their cache tensors; a capacity plan counts them with the
    weights instead, as vLLM does)."""
    return layout.fixed_bytes + sum(sequence_bytes(layout, n, policy, block_size, max_len) for n in lengths)


def token_bytes(layout: KVLayout, lengths: list[int]) -> int:
    """Bytes that actually hold live tokens (what an ideal allocator would need)."""
    live = 0
    for (w, chunk), count in layout.span_counts:
        if chunk:  # chunked local attention: the last token's chunk
            live += count * sum(live_tokens((w, chunk), n) for n in lengths)
        else:  # the whole sequence, or a sliding layer's window
            live += count * sum(min(n, w) if w else n for n in lengths)
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


def block_size_for(cfg: ModelConfig, given: int | None) -> tuple[int, str]:
    """The paged block size and why: ``given`` (--block-size), else vLLM's default on CUDA (16
    tokens; 64 for MLA). For MLA, vLLM's FlashMLA backend replaces a block size that is not a
    multiple of 64 by 64 (its start-up log: "Forcing kv cache block size to 64"), so a given 16 or
    32 is planned as 64, as vLLM would run it."""
    if given is not None:
        if cfg.mla is not None and given % MLA_BLOCK_SIZE:
            return MLA_BLOCK_SIZE, (
                f"--block-size {given} given, but vLLM's FlashMLA backend (its MLA default on "
                f"Hopper) forces a multiple of {MLA_BLOCK_SIZE} for MLA, so vLLM runs "
                f"{MLA_BLOCK_SIZE}-token blocks: planned with {MLA_BLOCK_SIZE} "
                "(CUTLASS MLA, Blackwell: --block-size 128)"
            )
        return given, "given (--block-size)"
    if cfg.mla is not None:
        return MLA_BLOCK_SIZE, (
            f"MLA default: vLLM's FlashMLA backend (its MLA default on Hopper) forces "
            f"{MLA_BLOCK_SIZE}-token blocks; the CUTLASS MLA backend (Blackwell) uses 128: "
            "--block-size 128"
        )
    return DEFAULT_BLOCK_SIZE, "vLLM's default on CUDA"


def default_batched_tokens(gpu_memory_bytes: int, device_name: str = "") -> tuple[int, str]:
    """``vllm serve``'s default max_num_batched_tokens (the most tokens a step schedules, so the
    largest prefill chunk): 8192 on a GPU of at least 70 GiB other than an A100, else 2048."""
    if gpu_memory_bytes >= 70 * 2**30 and "a100" not in device_name.lower():
        return 8192, "vllm serve's default on a GPU of >= 70 GiB other than an A100"
    return 2048, "vllm serve's default on a GPU under 70 GiB or an A100"


# --------------------------------------------------------------------------------------------
# vLLM's KV-cache groups (vllm/v1/core/kv_cache_utils.py, kv_cache_interface.py; the formulas of
# vLLM's main branch of early 2026, read at commit 001cabc: see docs/kv-cache.md)

Span = tuple[int | None, int | None]  # (window, chunk): (None, None) = full attention


@dataclass(frozen=True)
class KVCacheGroups:
    """How vLLM's KV-cache manager groups one GPU's attention layers. Layers of one kind (full,
    sliding with one window, chunked with one chunk) share a block table; every group holds the
    same number of layers, ``group_size``, so that a pool block (one block of every layer in a
    group) has one size. The smallest kind count is the group size (or the largest, when it is
    under 1.5x the smallest); a kind whose count is not a multiple gets a last group padded with
    empty layers: Gemma-3-27B's 10 full and 52 sliding layers become 7 groups of 10, the memory of
    70 layers. With the hybrid manager disabled every layer keeps every token: one group."""

    group_size: int
    spans: tuple[Span, ...]  # one per group

    @property
    def layers_with_padding(self) -> int:
        return self.group_size * len(self.spans)


def vllm_kv_cache_groups(layout: KVLayout, hybrid: bool = True) -> KVCacheGroups:
    counts = Counter(layout.spans if hybrid else [(None, None)] * layout.num_layers)
    if len(counts) == 1:
        ((span, n),) = counts.items()
        return KVCacheGroups(n, (span,))
    smallest, largest = min(counts.values()), max(counts.values())
    size = largest if largest < 1.5 * smallest else smallest
    spans: list[Span] = []
    for span, n in counts.items():
        spans += [span] * math.ceil(n / size)
    return KVCacheGroups(size, tuple(spans))


def vllm_request_blocks(span: Span, max_len: int, block_size: int, batched_tokens: int) -> int:
    """Pool blocks vLLM charges one request of ``max_len`` tokens in a group of this span (its
    spec's max_memory_usage_bytes / page size): full ceil(max_len / B); sliding
    ceil(min(window - 1 + chunk_tokens, max_len) / B) + 1 (during chunked prefill it holds the
    window's last window - 1 tokens and the whole new chunk of ``batched_tokens``, plus a block
    because the window need not start on a block edge); chunked local attention
    ceil(min(chunk + batched_tokens, max_len) / B)."""
    window, chunk = span
    if window:
        return blocks_for(min(window - 1 + batched_tokens, max_len), block_size) + 1
    if chunk:
        return blocks_for(min(chunk + batched_tokens, max_len), block_size)
    return blocks_for(max_len, block_size)


@dataclass(frozen=True)
class VLLMPool:
    """vLLM's block pool on one GPU for a KV budget: ``num_blocks`` pool blocks (floored: the
    budget // page // group_size), one of them vLLM's null block, which no request gets."""

    groups: KVCacheGroups
    page_bytes: int  # one block of one layer
    num_blocks: int
    block_size: int

    @property
    def block_bytes(self) -> int:
        """One pool block: one block of each layer of a group."""
        return self.page_bytes * self.groups.group_size

    @property
    def log_tokens(self) -> int:
        """vLLM's start-up log "GPU KV cache size: N tokens": num_blocks // groups x B."""
        return self.num_blocks // len(self.groups.spans) * self.block_size

    def sequence_blocks(self, length: int) -> int:
        """Pool blocks one sequence of ``length`` tokens holds in steady state (window- and
        chunk-aware per group)."""
        return sum(held_blocks(span, length, self.block_size) for span in self.groups.spans)

    def max_sequences(self, length: int) -> int:
        """Sequences of ``length`` tokens that fit at once: every pool block but the null block."""
        per_seq = self.sequence_blocks(length)
        return max(0, self.num_blocks - 1) // per_seq if per_seq else 0

    def request_blocks(self, max_len: int, batched_tokens: int) -> int:
        """Pool blocks vLLM charges one request of ``max_len`` tokens for its maximum concurrency."""
        return sum(vllm_request_blocks(span, max_len, self.block_size, batched_tokens) for span in self.groups.spans)

    def max_concurrency(self, max_len: int, batched_tokens: int) -> float:
        """vLLM's start-up log "Maximum concurrency for max_len tokens per request": num_blocks
        (null block included, as vLLM divides) / the request's pool blocks."""
        need = self.request_blocks(max_len, batched_tokens)
        return self.num_blocks / need if need else 0.0


def vllm_pool(layout: KVLayout, kv_bytes: int, block_size: int, hybrid: bool = True) -> VLLMPool:
    groups = vllm_kv_cache_groups(layout, hybrid)
    page = block_size * layout.bytes_per_token_per_layer
    num_blocks = max(0, kv_bytes) // page // groups.group_size if page else 0
    return VLLMPool(groups, page, num_blocks, block_size)


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
    chunked_layers: int  # chunked local attention (Llama-4's attention_chunk_size)
    chunks: list[int | None]
    hybrid: bool  # vLLM's hybrid KV-cache manager on (window- and chunk-aware blocks)
    kv_cache_groups: int  # vLLM's KV-cache groups (block tables)
    kv_group_size: int  # layers per group
    padding_layers: int  # empty layers vLLM adds so every group has kv_group_size layers
    vllm_num_blocks: int  # vLLM's "# GPU blocks": KV budget // page // group size, null block included
    head_dim: int
    head_dim_source: str
    kv_heads_per_gpu: int
    bytes_per_token_per_layer: int
    bytes_per_token: int  # per GPU, all layers
    kv_scale_bytes: int  # per GPU: per-tensor scales, model buffers counted with the weights (as vLLM does)
    kv_scales_in_weights: bool  # the weight figure already held them (a measured --weight-bytes)
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
    max_tokens: int  # vLLM's "GPU KV cache size: N tokens": num_blocks // groups x block size
    policies: dict[str, PolicyPlan]
    # vLLM's start-up log: "Maximum concurrency for max_len tokens per request"
    max_num_batched_tokens: int  # the prefill chunk of vLLM's worst case
    batched_tokens_note: str
    vllm_blocks_per_request: int  # blocks of one layer, summed over the layers of every group (padding included)
    vllm_bytes_per_request: int
    vllm_max_concurrency: float
    fits: bool  # the model, one sequence and the requested batch fit on each GPU
    fit_problem: str  # why not, and what to try
    suggested_tp: int | None  # the smallest tensor parallelism that would fit, when that helps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fitting_tp(
    cfg: ModelConfig,
    fmt: KVFormat,
    *,
    tp: int,
    need_sequences: int,
    seq_len: int,
    block_size: int,
    limit_bytes: int,
    weight_bytes: int,
    overhead_bytes: int,
    kv_scales_in_weights: bool,
    hybrid: bool,
) -> int | None:
    """The smallest tensor parallelism above ``tp`` (up to MAX_SUGGESTED_TP) whose GPUs each hold
    their share of the weights and ``need_sequences`` sequences, or None."""
    kv = cfg.num_kv_heads
    candidates = (
        {2**k for k in range(11)}
        | {d for d in range(1, min(kv, MAX_SUGGESTED_TP) + 1) if kv % d == 0}
        | {kv * 2**k for k in range(11)}
    )
    for t in sorted(c for c in candidates if tp < c <= MAX_SUGGESTED_TP):
        try:
            layout = layout_for(cfg, fmt, t)
        except BadInput:
            continue
        scales = 0 if kv_scales_in_weights else layout.fixed_bytes
        usable = limit_bytes - math.ceil(weight_bytes / t) - scales - overhead_bytes
        if usable >= 0 and vllm_pool(layout, usable, block_size, hybrid).max_sequences(seq_len) >= need_sequences:
            return t
    return None


def _long_problems(cfg: ModelConfig, seq_len: int, max_len: int | None) -> list[str]:
    limit = cfg.max_position_embeddings
    if not limit:
        return []
    return [
        f"{option}: {value:,} tokens exceeds {cfg.name}'s max_position_embeddings ({limit:,})"
        for option, value in (("--seq-len", seq_len), ("--max-len", max_len))
        if value is not None and value > limit
    ]


def _check_sizes(
    *,
    seq_len: int,
    batch: int | None,
    block_size: int | None,
    tp: int,
    gpu_memory_bytes: int,
    utilization: float,
    weight_bytes: int,
    max_len: int | None,
    overhead_bytes: int,
    max_num_batched_tokens: int | None,
) -> None:
    """Every size of a plan that is out of range, in one :class:`BadInput` naming the options."""
    problems = []
    for name, value in (
        ("--seq-len", seq_len),
        ("--block-size", block_size),
        ("--tp", tp),
        ("--gpu-memory", gpu_memory_bytes),
        ("--max-len", max_len),
        ("--max-num-batched-tokens", max_num_batched_tokens),
    ):
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


def _long_note(cfg: ModelConfig, seq_len: int, max_len: int | None, allow_long: bool) -> str:
    """Lengths beyond the model's positions: refused (BadInput) unless ``allow_long``, then the
    plan's note saying so ("" when every length is within them)."""
    too_long = _long_problems(cfg, seq_len, max_len)
    if too_long and not allow_long:
        raise BadInput(
            "; ".join(too_long) + ": the model was not trained on longer sequences, and vLLM refuses "
            "such a --max-model-len unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is set; allowed: at most "
            f"{cfg.max_position_embeddings:,} tokens, or pass --allow-long to plan it anyway."
        )
    return "; ".join(too_long) + " (allowed by --allow-long)" if too_long else ""


def _policy_plans(
    layout: KVLayout,
    pool: VLLMPool,
    full_pool: VLLMPool,
    *,
    usable: int,
    seq_len: int,
    batch: int | None,
    block_size: int,
    max_len: int,
) -> dict[str, PolicyPlan]:
    """Each allocation policy's bytes per sequence and sequences that fit in ``usable`` bytes: vLLM's
    block pool for ``paged`` (hybrid manager on) and ``paged_full`` (off), arithmetic for the others."""
    live = token_bytes(layout, [seq_len])
    policies = {}
    for policy in POLICIES:
        if policy in ("paged", "paged_full"):  # vLLM's block pool, hybrid manager on / off
            p = pool if policy == "paged" else full_pool
            per_seq, fit = p.sequence_blocks(seq_len) * p.block_bytes, p.max_sequences(seq_len)
        else:
            per_seq = sequence_bytes(layout, seq_len, policy, block_size, max_len)
            fit = usable // per_seq if per_seq else 0
        policies[policy] = PolicyPlan(
            policy, per_seq, per_seq * batch if batch else None, fit, live / per_seq if per_seq else 0.0
        )
    return policies


def _fit_problem(
    model: str,
    paged: PolicyPlan,
    *,
    seq_len: int,
    batch: int | None,
    free: int,
    usable: int,
    per_gpu_weights: int,
    limit_bytes: int,
    gpu_memory_bytes: int,
    utilization: float,
    overhead_bytes: int,
) -> tuple[str, int]:
    """Why the model, one sequence or the batch does not fit on a GPU ("" when they do), and the
    sequences a larger tensor parallelism would have to hold."""
    if free < 0:
        other = f" + {human_bytes(overhead_bytes)} of --overhead" if overhead_bytes else ""
        return (
            f"{model} does not fit: weights {human_bytes(per_gpu_weights)} per GPU{other} exceed the "
            f"usable {human_bytes(limit_bytes)} ({human_bytes(gpu_memory_bytes)} x utilization "
            f"{utilization:g})"
        ), batch or 1
    if paged.max_sequences == 0:
        return (
            f"0 sequences of {seq_len:,} tokens fit: one needs {human_bytes(paged.bytes_per_sequence)} "
            f"(paged, window-aware) and {human_bytes(usable)} is free for KV per GPU"
        ), batch or 1
    if batch and batch > paged.max_sequences:
        return (
            f"the batch of {batch:,} does not fit: at most {paged.max_sequences:,} sequences of "
            f"{seq_len:,} tokens with paged allocation ({human_bytes(paged.batch_bytes)} needed, "
            f"{human_bytes(usable)} free for KV per GPU)"
        ), batch
    return "", 0


def _what_to_try(suggested_tp: int | None, *, fits_weights: bool, batch: int | None, overhead_bytes: int) -> str:
    """The options that would make a plan fit, as a sentence's list ("--tp 4, ... or a larger --gpu-memory")."""
    tries = [f"--tp {suggested_tp}"] if suggested_tp else []
    if fits_weights:
        tries += ["a shorter --seq-len", "a smaller --kv-dtype"] + (["a smaller --batch"] if batch else [])
    elif overhead_bytes:
        tries.append("a smaller --overhead")
    tries.append("a larger --gpu-memory")
    return ", ".join(tries[:-1]) + (" or " if len(tries) > 1 else "") + tries[-1]


def plan(
    cfg: ModelConfig,
    *,
    seq_len: int,
    batch: int | None,
    kv_dtype: str = "bf16",
    block_size: int | None = None,
    tp: int = 1,
    gpu_memory_bytes: int,
    utilization: float = 0.9,
    weight_bytes: int,
    weight_note: str = "",
    max_len: int | None = None,
    overhead_bytes: int = 0,
    allow_long: bool = False,
    max_num_batched_tokens: int | None = None,
    device_name: str = "",
    kv_scales_in_weights: bool = True,
    hybrid: bool = True,
) -> KVPlan:
    """A capacity plan for one GPU of ``tp``. ``weight_bytes`` is the whole model's weight memory;
    ``kv_scales_in_weights``: whether it already holds the per-tensor K/V scale buffers (True for
    a measured figure such as --weight-bytes; False for a count of parameters, to which they are
    added). ``hybrid``: vLLM's hybrid KV-cache manager on (its default), else every layer keeps
    every token (--disable-hybrid-kv-cache-manager)."""
    _check_sizes(
        seq_len=seq_len,
        batch=batch,
        block_size=block_size,
        tp=tp,
        gpu_memory_bytes=gpu_memory_bytes,
        utilization=utilization,
        weight_bytes=weight_bytes,
        max_len=max_len,
        overhead_bytes=overhead_bytes,
        max_num_batched_tokens=max_num_batched_tokens,
    )
    long_note = _long_note(cfg, seq_len, max_len, allow_long)
    max_len = max_len if max_len is not None else max(seq_len, cfg.max_position_embeddings or seq_len)
    block_size, block_note = block_size_for(cfg, block_size)
    if max_num_batched_tokens is None:
        max_num_batched_tokens, batched_note = default_batched_tokens(gpu_memory_bytes, device_name)
    else:
        batched_note = "given (--max-num-batched-tokens)"
    layout = layout_for(cfg, kv_dtype, tp)
    exact_tp1 = layout_for(cfg, kv_dtype, 1).bytes_per_token
    naive = naive_bytes_per_token(cfg, layout.fmt)
    # Per-tensor K/V scales are buffers of every attention layer: model memory, which vLLM measures
    # with the weights, never taken from the KV budget. A given --weight-bytes is that measured
    # memory; a weight figure counted from the config's parameters gets them added here.
    per_gpu_weights = math.ceil(weight_bytes / tp) + (0 if kv_scales_in_weights else layout.fixed_bytes)
    limit_bytes = int(gpu_memory_bytes * utilization)
    free = limit_bytes - per_gpu_weights - overhead_bytes
    usable = max(0, free)
    pool = vllm_pool(layout, usable, block_size, hybrid)
    policies = _policy_plans(
        layout,
        pool,
        vllm_pool(layout, usable, block_size, hybrid=False),
        usable=usable,
        seq_len=seq_len,
        batch=batch,
        block_size=block_size,
        max_len=max_len,
    )
    page_bytes = pool.page_bytes  # one block of one layer
    vllm_blocks = pool.request_blocks(max_len, max_num_batched_tokens) * pool.groups.group_size

    fit_problem, need = _fit_problem(
        cfg.name,
        policies["paged"],
        seq_len=seq_len,
        batch=batch,
        free=free,
        usable=usable,
        per_gpu_weights=per_gpu_weights,
        limit_bytes=limit_bytes,
        gpu_memory_bytes=gpu_memory_bytes,
        utilization=utilization,
        overhead_bytes=overhead_bytes,
    )
    suggested = None
    if fit_problem:
        suggested = _fitting_tp(
            cfg,
            layout.fmt,
            tp=tp,
            need_sequences=need,
            seq_len=seq_len,
            block_size=block_size,
            limit_bytes=limit_bytes,
            weight_bytes=weight_bytes,
            overhead_bytes=overhead_bytes,
            kv_scales_in_weights=kv_scales_in_weights,
            hybrid=hybrid,
        )
        fit_problem += (
            "; try " + _what_to_try(suggested, fits_weights=free >= 0, batch=batch, overhead_bytes=overhead_bytes) + "."
        )
    return KVPlan(
        model=cfg.name,
        attention=layout.attention,
        kv_dtype=layout.fmt.name,
        kv_overhead=layout.fmt.overhead,
        seq_len=seq_len,
        max_len=max_len,
        max_position_embeddings=cfg.max_position_embeddings,
        long_note=long_note,
        batch=batch,
        block_size=block_size,
        block_size_note=block_note,
        tp=tp,
        tp_note=layout.tp_note,
        num_layers=cfg.num_layers,
        sliding_layers=cfg.sliding_layers,
        windows=list(cfg.layer_windows),
        chunked_layers=cfg.chunked_layers,
        chunks=list(cfg.layer_chunks),
        hybrid=hybrid,
        kv_cache_groups=len(pool.groups.spans),
        kv_group_size=pool.groups.group_size,
        padding_layers=pool.groups.layers_with_padding - layout.num_layers,
        vllm_num_blocks=pool.num_blocks,
        head_dim=layout.vector_len,
        head_dim_source=(
            "kv_lora_rank + qk_rope_head_dim"
            if cfg.mla
            else "config head_dim"
            if cfg.head_dim_from_config
            else "hidden_size / num_attention_heads"
        ),
        kv_heads_per_gpu=layout.kv_heads_per_gpu,
        bytes_per_token_per_layer=layout.bytes_per_token_per_layer,
        bytes_per_token=layout.bytes_per_token,
        kv_scale_bytes=layout.fixed_bytes,
        kv_scales_in_weights=kv_scales_in_weights,
        naive_bytes_per_token=naive,
        exact_bytes_per_token_tp1=exact_tp1,
        naive_vs_exact=naive / exact_tp1,
        gpu_memory_bytes=gpu_memory_bytes,
        utilization_target=utilization,
        weight_bytes=weight_bytes,
        weight_bytes_per_gpu=per_gpu_weights,
        weight_note=weight_note,
        overhead_bytes=overhead_bytes,
        free_bytes=free,
        max_tokens=pool.log_tokens,
        policies=policies,
        max_num_batched_tokens=max_num_batched_tokens,
        batched_tokens_note=batched_note,
        vllm_blocks_per_request=vllm_blocks,
        vllm_bytes_per_request=vllm_blocks * page_bytes,
        vllm_max_concurrency=pool.max_concurrency(max_len, max_num_batched_tokens),
        fits=not fit_problem,
        fit_problem=fit_problem,
        suggested_tp=suggested,
    )
