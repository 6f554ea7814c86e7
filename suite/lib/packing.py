"""Packed batches for training (:class:`PackedBatch`): rows of random document lengths
(:func:`draw_doc_lens`), the attention metadata of rows that hold several documents
(:class:`PackedMetadata`, :func:`build_metadata`), attention and next-token loss over them, one
training step over one or more micro-batches (:func:`training_step`) and its
instrumentation (:class:`StepStats`). Shared by the per-layer and cached variants of
``packed_metadata``, which differ only in how often they call the builder."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.torch_version import TorchVersion

from gpubench.errors import BadInput
from gpubench.lib.optional import optional_import
from gpubench.lib.triton_support import kernel_module, kernel_problem
from gpubench.measure.phase_timer import PhaseTimer
from gpubench.models.llama import LlamaWeights

BACKENDS = ("sdpa", "triton_varlen", "flash_attn_varlen")
HALF = ("float16", "bfloat16")  # the dtypes flash-attn has kernels for
# gpubench's own varlen attention (Triton forward and backward, autograd): flash_attn_varlen_func.
TRITON_VARLEN = ("gpubench.lib.kernels.flash_attention_triton_bwd", "flash_attn_varlen_func")
IGNORE_INDEX = -100
# enable_gqa arrived in torch 2.5 (the ignore: TorchVersion compares with a tuple; its stub says str only)
SDPA_HAS_GQA = TorchVersion(torch.__version__) >= (2, 5)  # type: ignore[operator]


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


@dataclass(frozen=True)
class PackedBatch:
    """One micro-batch: ``rows`` rows of ``seq`` tokens, each row documents packed back to back."""

    tokens: torch.Tensor  # (rows, seq) int64
    doc_lens: torch.Tensor  # (documents,) int32 on the model's device, row-major, each row's summing to seq


@dataclass
class StepOutput:
    loss: torch.Tensor  # detached scalar: the mean over micro-batches of each one's mean next-token loss
    token_losses: torch.Tensor  # (micro-batches, rows, seq) float32, detached: 0 where a token has no target
    grads: list[torch.Tensor]  # one per parameter, in LlamaWeights.parameters() order
    params: list[torch.Tensor]  # the parameters after the optimizer step (the live tensors)


# -- instrumentation --------------------------------------------------------------------------


class StepStats:
    """One training step's phase times (:class:`gpubench.measure.phase_timer.PhaseTimer`: nothing
    synchronizes to read a clock mid-step on a GPU), its metadata builds and the host syncs they make
    (counted by construction), cache hits and misses, the mask bytes built, and the metadata
    bytes still alive when the forward pass ends (what autograd holds for the backward pass)."""

    PHASES = ("build", "forward", "backward", "optimizer")

    def __init__(self, device: torch.device | str | None = None):
        self.timer = PhaseTimer(device)
        self.builds = 0
        self.host_syncs = 0  # .item() calls made by the builds
        self.cache_hits = 0
        self.cache_misses = 0
        self.mask_bytes_built = 0
        self.mask_bytes_held = 0  # set by note_forward_done
        self.metadata_bytes_held = 0
        self._built: list[tuple[weakref.ref, bool]] = []  # every metadata tensor built, is it a mask

    def span(self, name: str):
        return self.timer.span(name)

    def note_build(self, meta: PackedMetadata) -> None:
        self.builds += 1
        self.host_syncs += 1  # max_seqlen's .item()
        if meta.mask is not None:
            self.mask_bytes_built += meta.mask.numel() * meta.mask.element_size()
        self._built += [(weakref.ref(t), t is meta.mask) for t in meta.tensors()]

    def _alive_bytes(self, masks_only: bool) -> int:
        alive = {id(t): t for ref, is_mask in self._built if (t := ref()) is not None and (is_mask or not masks_only)}
        return sum(t.numel() * t.element_size() for t in alive.values())

    def note_forward_done(self) -> None:
        """Called after each micro-batch's forward pass; keeps the largest."""
        self.mask_bytes_held = max(self.mask_bytes_held, self._alive_bytes(masks_only=True))
        self.metadata_bytes_held = max(self.metadata_bytes_held, self._alive_bytes(masks_only=False))

    def alive_bytes(self) -> int:
        """Bytes of metadata built during the step that are still alive now."""
        return self._alive_bytes(masks_only=False)

    def summary(self) -> dict[str, float | int]:
        """What a Recorder keeps of the step: ``<phase>_ms`` summed over its spans (``build``
        lies inside ``forward``) and the counts. On CUDA this waits for the step's last event
        (the harness's clock waits for the step right after anyway)."""
        ms = {**dict.fromkeys(self.PHASES, 0.0), **{name: 1e3 * s for name, s in self.timer.seconds.items()}}
        return {
            **{f"{name}_ms": value for name, value in ms.items()},
            "builds": self.builds,
            "host_syncs": self.host_syncs,
            "cache_hits": self.cache_hits,
            "cache_misses": self.cache_misses,
            "mask_bytes_built": self.mask_bytes_built,
            "mask_bytes_held": self.mask_bytes_held,
            "metadata_bytes_held": self.metadata_bytes_held,
        }


def phase(stats: StepStats | None, name: str):
    """``stats.span(name)``, or nothing when the step is not instrumented."""
    return contextlib.nullcontext() if stats is None else stats.span(name)


# -- choosing the attention backend ----------------------------------------------------------


def flash_varlen_unavailable(device: torch.device, dtype: str) -> str | None:
    """Why flash-attn's varlen kernel cannot run here, or None."""
    imported = optional_import("flash_attn", "flash_attn_varlen_func")
    if isinstance(imported, str):
        return imported
    if torch.device(device).type != "cuda":  # below: GPU-only, flash-attn builds (and imports) with CUDA only
        return "flash-attn runs on CUDA only"
    if dtype not in HALF:
        return f"flash-attn has no {dtype} kernel"
    return None


def triton_varlen_unavailable(device: torch.device) -> str | None:
    """Why gpubench's Triton varlen attention cannot run here (on a CPU Triton's interpreter
    could, far too slowly for a training step), or None."""
    return kernel_problem(TRITON_VARLEN[0], device)


def resolve_backend(choice: str, device: torch.device, dtype: str) -> str:
    """The backend a case runs: "auto" is triton_varlen (our kernels) where they can run, else sdpa."""
    if choice == "auto":
        return "sdpa" if triton_varlen_unavailable(device) else "triton_varlen"
    reason = {
        "triton_varlen": triton_varlen_unavailable,
        "flash_attn_varlen": lambda device: flash_varlen_unavailable(device, dtype),
    }.get(choice, lambda _: None)(device)
    if reason:
        raise BadInput(f"packed attention backend {choice} cannot run here: {reason}; use backend sdpa or auto")
    return choice


# -- building the metadata --------------------------------------------------------------------


def draw_doc_lens(rows: int, seq: int, mean: int, gen: torch.Generator) -> list[list[int]]:
    """Document lengths of each row, drawn until the row is full (the last one cut to fit), so
    rows hold different documents; every row has at least two (no document is seq long)."""
    longest = max(1, min(2 * mean - 1, seq - 1))
    out = []
    for _ in range(rows):
        lens, left = [], seq
        while left:
            n = min(left, int(torch.randint(1, longest + 1, (1,), generator=gen)))
            lens.append(n)
            left -= n
        out.append(lens)
    return out


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


def document_positions(doc_lens: torch.Tensor, rows: int, seq: int) -> torch.Tensor:
    """:func:`position_ids_of` straight from the lengths (RoPE's positions, with no other metadata)."""
    return position_ids_of(cu_seqlens_of(doc_lens), rows, seq)


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


def build_metadata(
    doc_lens: torch.Tensor, rows: int, seq: int, backend: str, dtype: torch.dtype, stats: StepStats | None = None
) -> PackedMetadata:
    """All of a packed batch's attention metadata from its document lengths: ``doc_lens``
    (documents,) int32 on the model's device, row-major, each row's lengths summing to ``seq``.
    "sdpa" adds the block-causal mask in ``dtype``; the varlen backends ("triton_varlen",
    "flash_attn_varlen") need only cu_seqlens and max_seqlen. One host sync: ``max_seqlen``'s ``.item()``."""
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


# -- attending and the loss -------------------------------------------------------------------


def packed_attention(meta: PackedMetadata, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention of a packed batch, each token over its own document up to itself: q (rows, seq,
    heads, head_dim), k and v (rows, seq, kv_heads, head_dim); returns q's shape. "sdpa": SDPA
    with the block-causal mask; "triton_varlen" (gpubench's Triton kernels) and "flash_attn_varlen"
    (flash-attn's): one flat stream of documents cut by ``cu_seqlens`` (GQA handled by the kernel)."""
    rows, seq, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    if meta.backend != "sdpa":
        if meta.backend == "triton_varlen":
            module = kernel_module(TRITON_VARLEN[0])
            fn = module if isinstance(module, str) else getattr(module, TRITON_VARLEN[1])
        else:
            fn = optional_import("flash_attn", "flash_attn_varlen_func")
        if isinstance(fn, str):
            raise RuntimeError(f"the {meta.backend} backend cannot run: {fn}")
        out = fn(
            q.reshape(rows * seq, heads, head_dim),
            k.reshape(rows * seq, kv_heads, head_dim),
            v.reshape(rows * seq, kv_heads, head_dim),
            meta.cu_seqlens,
            meta.cu_seqlens,
            meta.max_seqlen,
            meta.max_seqlen,
            causal=True,
        )
        return out.view(rows, seq, heads, head_dim)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if heads == kv_heads:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=meta.mask)
    elif SDPA_HAS_GQA and not q.is_cuda:
        out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=meta.mask, enable_gqa=True)
    else:  # CUDA's mask-capable SDPA kernels take as many k/v heads as q heads
        group = heads // kv_heads
        out = F.scaled_dot_product_attention(
            qt, kt.repeat_interleave(group, dim=1), vt.repeat_interleave(group, dim=1), attn_mask=meta.mask
        )
    return out.transpose(1, 2)


def next_token_labels(tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """Token t's target is token t + 1 when that one continues t's document; the last token of a
    document (and of a row) has none (IGNORE_INDEX), so the loss never crosses a boundary."""
    labels = torch.full_like(tokens, IGNORE_INDEX)
    continues = position_ids[:, 1:] != 0
    labels[:, :-1] = torch.where(continues, tokens[:, 1:], IGNORE_INDEX)
    return labels


def packed_loss(
    logits: torch.Tensor, tokens: torch.Tensor, position_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy in float32: each token's, shaped like ``tokens`` (0 where there is
    no target), and their mean over the tokens that have one (no host sync)."""
    labels = next_token_labels(tokens, position_ids)
    per_token = F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view(labels.shape)
    return per_token, per_token.sum() / (labels != IGNORE_INDEX).sum()


def training_step(
    weights: LlamaWeights,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[PackedBatch],
    forward: Callable[[PackedBatch], tuple[torch.Tensor, torch.Tensor]],
    stats: StepStats | None = None,
    metadata_scope: contextlib.AbstractContextManager[Any] | None = None,
) -> StepOutput:
    """One training step: for each micro-batch, ``forward(batch)`` (logits and position ids), its
    next-token loss within documents and backward (gradients accumulated, each loss weighted
    1 / micro-batches); then one optimizer step. ``metadata_scope`` spans every forward and
    backward pass (a cache's lifetime). ``weights``' tensors are the optimizer's leaf parameters."""
    losses, token_losses = [], []
    with metadata_scope or contextlib.nullcontext():
        for batch in batches:
            with phase(stats, "forward"):
                logits, positions = forward(batch)
                per_token, loss = packed_loss(logits, batch.tokens, positions)
            if stats is not None:
                stats.note_forward_done()
            del logits, positions
            with phase(stats, "backward"):
                (loss / len(batches)).backward()
            losses.append(loss.detach())
            token_losses.append(per_token.detach())
    with phase(stats, "optimizer"):
        optimizer.step()
    params = weights.parameters()
    grads = [p.grad for p in params]  # after backward: each parameter holds its gradient
    return StepOutput(torch.stack(losses).mean(), torch.stack(token_losses), grads, params)  # type: ignore[arg-type]
