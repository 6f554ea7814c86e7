"""Packed-sequence metadata rebuilt in every attention layer, the way stacks that derive document
boundaries per attention call do it.

A packed batch concatenates several documents of different lengths into each row, with no
padding, and carries their lengths. Attention must not cross documents and positions restart at
each one, so before attending something has to turn the lengths into: ``cu_seqlens`` (the int32
running sum of the lengths with a leading 0, what a varlen kernel takes), ``max_seqlen`` (the
longest document, a Python int: ``.item()``, a host sync on a GPU), the position ids, and the
attention structure (an additive block-diagonal causal mask for SDPA, or the varlen arguments).

Here every layer's attention call rebuilds all of it from the lengths (:func:`build_metadata`),
as code does when the boundaries are recovered inside the attention function (the model-level
RoPE positions are derived once more on top). The builder itself is already vectorized and makes
exactly one host sync (``max_seqlen``); :mod:`gpubench.optimizations.packed_metadata` calls the
very same builder once per batch, so the measured difference is the caching alone.

Where the win comes from: ``layers - 1`` fewer builds per step. On a GPU each avoided build is a
``.item()`` that stops the host from running ahead of the GPU (each layer's kernel launches are
then exposed), plus the mask kernels over rows x seq^2 elements; and since SDPA saves its mask
for the backward pass, the baseline holds one mask per layer until backward runs. On a CPU there
is no stall: the mask construction itself is what shows.

Published figure: Unsloth reports +14.3% per training step and +43.3% in the forward pass on
Qwen3-14B QLoRA from building packed-sequence metadata once per batch.

The pieces shared by both variants (metadata record, builder, attention, loss, instrumentation)
live here; the two modules differ only in how often the builder runs.
"""
from __future__ import annotations

import contextlib
import functools
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.torch_version import TorchVersion

from gpubench.models.llama import LlamaWeights, forward

BACKENDS = ("sdpa", "flash_attn_varlen")
IGNORE_INDEX = -100
SDPA_HAS_GQA = TorchVersion(torch.__version__) >= (2, 5)  # enable_gqa arrived in torch 2.5


# -- the metadata -----------------------------------------------------------------------------

@dataclass(frozen=True)
class PackedMetadata:
    """Everything attention needs to know about a packed batch of ``rows`` x ``seq`` tokens."""

    cu_seqlens: torch.Tensor  # (documents + 1,) int32: 0, then the running sum of the lengths
    max_seqlen: int  # the longest document (a host value: varlen kernels size their grid by it)
    position_ids: torch.Tensor  # (rows, seq) int64: 0, 1, ... restarting at every document
    mask: torch.Tensor | None  # SDPA: (rows, 1, seq, seq) additive, 0 visible / -inf hidden
    backend: str

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.cu_seqlens, self.position_ids, self.mask) if t is not None]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


class StepStats:
    """Instrumentation of one training step, the same for both variants: named time spans
    (perf_counter on a CPU; CUDA events on a GPU, so nothing synchronizes to read a clock), the
    metadata builds and the host syncs they make (counted by construction), the mask bytes built,
    and the mask bytes still alive when the forward pass ends (held for the backward pass)."""

    def __init__(self, device: torch.device | str | None = None):
        self.cuda = torch.device(device or "cpu").type == "cuda"
        self.spans: list[tuple[str, Any, Any]] = []
        self.builds = 0  # full metadata builds
        self.host_syncs = 0  # .item() calls made by the builds
        self.mask_bytes_built = 0
        self.mask_bytes_held: int | None = None  # set by note_forward_done
        self.metadata_bytes_held: int | None = None
        self.cache_hits = 0
        self.cache_misses = 0
        self.observed_syncs: int | None = None  # CUDA sync debug mode count, when measured
        self._built: list[weakref.ref] = []  # every metadata tensor built, (ref, is_mask)
        self._totals: dict[str, float] | None = None

    def _now(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @contextlib.contextmanager
    def span(self, name: str) -> Iterator[None]:
        start = self._now()
        try:
            yield
        finally:
            self.spans.append((name, start, self._now()))

    def note_build(self, meta: PackedMetadata) -> None:
        self.builds += 1
        self.host_syncs += 1  # max_seqlen's .item()
        if meta.mask is not None:
            self.mask_bytes_built += meta.mask.numel() * meta.mask.element_size()
        self._built += [(weakref.ref(t), t is meta.mask) for t in meta.tensors()]

    def _alive_bytes(self, masks_only: bool) -> int:
        seen: set[int] = set()
        total = 0
        for ref, is_mask in self._built:
            t = ref()
            if t is None or (masks_only and not is_mask) or id(t) in seen:
                continue
            seen.add(id(t))
            total += t.numel() * t.element_size()
        return total

    def note_forward_done(self) -> None:
        """Record what metadata is still alive after the forward pass: what autograd saved for
        the backward pass (and what a cache holds)."""
        self.mask_bytes_held = self._alive_bytes(masks_only=True)
        self.metadata_bytes_held = self._alive_bytes(masks_only=False)

    def alive_bytes(self) -> int:
        """Bytes of metadata built during the step that are still alive now."""
        return self._alive_bytes(masks_only=False)

    def totals(self) -> dict[str, float]:
        """Seconds per span name, summed over the step (spans nest: ``build`` lies inside
        ``forward``). On CUDA this waits for the step's last event."""
        if self._totals is None:
            totals: dict[str, float] = {}
            if self.cuda and self.spans:
                self.spans[-1][2].synchronize()
            for name, start, end in self.spans:
                seconds = start.elapsed_time(end) / 1e3 if self.cuda else end - start
                totals[name] = totals.get(name, 0.0) + seconds
            self._totals = totals
            self.spans = [(name, None, None) for name, _, _ in self.spans]  # drop the events
        return dict(self._totals)


def phase(stats: StepStats | None, name: str):
    """``stats.span(name)``, or nothing when the step is not instrumented."""
    return contextlib.nullcontext() if stats is None else stats.span(name)


# -- building it ------------------------------------------------------------------------------

def cu_seqlens_of(doc_lens: torch.Tensor) -> torch.Tensor:
    """The int32 running sum of ``doc_lens`` with a leading 0: document d is tokens
    ``cu[d]:cu[d + 1]`` of the flattened batch."""
    return F.pad(torch.cumsum(doc_lens, 0, dtype=torch.int32), (1, 0))


def position_ids_of(cu_seqlens: torch.Tensor, rows: int, seq: int) -> torch.Tensor:
    """(rows, seq) int64 positions restarting at 0 at every document, without a host sync: each
    document's first token is marked with its own index, a running maximum spreads the start of
    a token's document to every token after it, and the position is the distance from it."""
    total = rows * seq
    starts = cu_seqlens[:-1].long()
    index = torch.arange(total, device=cu_seqlens.device)
    start_of = torch.zeros(total, dtype=torch.long, device=cu_seqlens.device).scatter_(0, starts, starts)
    return (index - start_of.cummax(0).values).view(rows, seq)


def block_causal_mask(position_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(rows, 1, seq, seq) additive mask: query i sees key j iff both lie in one document and
    j <= i, that is 0 <= i - j <= position_ids[i] (i's document starts position_ids[i] tokens
    back). 0 where visible, -inf elsewhere; every query sees at least itself."""
    rows, seq = position_ids.shape
    index = torch.arange(seq, device=position_ids.device)
    back = index[:, None] - index[None, :]  # i - j
    visible = (back >= 0) & (back <= position_ids[:, :, None])
    mask = torch.full((rows, seq, seq), float("-inf"), dtype=dtype, device=position_ids.device)
    return mask.masked_fill_(visible, 0.0).unsqueeze(1)


def build_metadata(doc_lens: torch.Tensor, rows: int, seq: int, backend: str, dtype: torch.dtype,
                   stats: StepStats | None = None) -> PackedMetadata:
    """All of a packed batch's attention metadata from its document lengths.

    ``doc_lens``: (documents,) int32 on the model's device, row-major: row 0's documents, then
    row 1's, ...; each row's lengths sum to ``seq`` (a document never straddles two rows).
    ``backend`` "sdpa" adds the additive block-causal mask in ``dtype``; "flash_attn_varlen"
    needs only ``cu_seqlens`` and ``max_seqlen``. One host sync: ``max_seqlen``'s ``.item()``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {list(BACKENDS)}")
    with phase(stats, "build"):
        cu_seqlens = cu_seqlens_of(doc_lens)
        max_seqlen = int(doc_lens.max().item())  # a host sync on a GPU
        position_ids = position_ids_of(cu_seqlens, rows, seq)
        mask = block_causal_mask(position_ids, dtype) if backend == "sdpa" else None
        meta = PackedMetadata(cu_seqlens, max_seqlen, position_ids, mask, backend)
    if stats is not None:
        stats.note_build(meta)
    return meta


# -- attending with it ------------------------------------------------------------------------

@functools.cache
def flash_attn_varlen() -> Callable[..., torch.Tensor] | str:
    """flash-attn's ``flash_attn_varlen_func``, or why it cannot be imported."""
    try:
        from flash_attn import flash_attn_varlen_func
    except ModuleNotFoundError:
        return "flash_attn is not installed"
    except Exception as exc:  # noqa: BLE001 - a build that does not match this torch
        return f"flash_attn does not import ({type(exc).__name__}: {exc})"
    return flash_attn_varlen_func


def packed_attention(meta: PackedMetadata, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of a packed batch: q (rows, seq, heads, head_dim), k and v (rows, seq, kv_heads,
    head_dim), heads a multiple of kv_heads; returns (rows, seq, heads, head_dim). Each token sees
    the tokens of its own document up to itself.

    "sdpa": torch SDPA with the additive block-causal mask. "flash_attn_varlen": the tokens as one
    flat stream of documents cut by ``cu_seqlens`` (GQA handled by the kernel)."""
    rows, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    if meta.backend == "flash_attn_varlen":
        fn = flash_attn_varlen()
        if isinstance(fn, str):
            raise RuntimeError(f"the flash_attn_varlen backend cannot run: {fn}")
        out = fn(q.reshape(rows * seq, heads, head_dim), k.reshape(rows * seq, kv_heads, head_dim),
                 v.reshape(rows * seq, kv_heads, head_dim), meta.cu_seqlens, meta.cu_seqlens,
                 meta.max_seqlen, meta.max_seqlen, causal=True)
        return out.view(rows, seq, heads, head_dim)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if heads == kv_heads:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=meta.mask)
    elif SDPA_HAS_GQA and not q.is_cuda:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=meta.mask, enable_gqa=True)
    else:  # CUDA's mask-capable SDPA kernels take as many k/v heads as q heads
        group = heads // kv_heads
        out = F.scaled_dot_product_attention(qt, kt.repeat_interleave(group, dim=1),
                                             vt.repeat_interleave(group, dim=1), attn_mask=meta.mask)
    return out.transpose(1, 2)


def next_token_labels(tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Token t's target is token t + 1 when that one continues t's document; the last token of a
    document (and of a row) has none (IGNORE_INDEX), so the loss never crosses a boundary."""
    labels = torch.full_like(tokens, IGNORE_INDEX)
    continues = position_ids[:, 1:] != 0
    labels[:, :-1] = torch.where(continues, tokens[:, 1:], IGNORE_INDEX)
    return labels


def packed_loss(logits: torch.Tensor, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (in float32) over the tokens that have a target."""
    labels = next_token_labels(tokens, position_ids)
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)


@dataclass
class StepOutput:
    loss: torch.Tensor  # detached scalar
    grads: list[torch.Tensor]  # one per parameter, in LlamaWeights.parameters() order
    params: list[torch.Tensor]  # the parameters after the optimizer step (the live tensors)


# -- the baseline -----------------------------------------------------------------------------

def packed_forward(weights: LlamaWeights, tokens: torch.Tensor, doc_lens: torch.Tensor, *, backend: str = "sdpa",
                   stats: StepStats | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits (rows, seq, vocab) of a packed batch and its position ids. The model-level RoPE
    positions are derived from the lengths once; then every layer's attention call rebuilds the
    whole metadata (cu_seqlens, max_seqlen with its sync, position ids, mask) for itself."""
    rows, seq = tokens.shape
    with phase(stats, "build"):
        positions = position_ids_of(cu_seqlens_of(doc_lens), rows, seq)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        meta = build_metadata(doc_lens, rows, seq, backend, q.dtype, stats)
        return packed_attention(meta, q, k, v)

    return forward(weights, tokens, positions, attend), positions


def train_step(weights: LlamaWeights, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
               doc_lens: torch.Tensor, *, backend: str = "sdpa", stats: StepStats | None = None) -> StepOutput:
    """One training step on a packed batch: forward, next-token loss within documents, backward,
    optimizer step. ``weights``' tensors are the optimizer's leaf parameters."""
    with phase(stats, "forward"):
        logits, positions = packed_forward(weights, tokens, doc_lens, backend=backend, stats=stats)
        loss = packed_loss(logits, tokens, positions)
    if stats is not None:
        stats.note_forward_done()
    del logits
    with phase(stats, "backward"):
        loss.backward()
    with phase(stats, "optimizer"):
        optimizer.step()
    params = weights.parameters()
    return StepOutput(loss.detach(), [p.grad for p in params], params)
