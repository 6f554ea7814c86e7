"""Tensors that hold KV-cache tokens in a given format, shared by the contiguous (baseline) and
paged (optimized) allocators so both store exactly the same bytes per token.

A token slot of one layer holds ``vectors_per_token`` vectors (K and V per KV head, or one MLA
latent). Formats torch has a dtype for (fp32, bf16, fp16, fp8) store values in that dtype; packed
formats (int8 with scales, int4, mxfp4, nvfp4) store value bytes and scale bytes as uint8.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpubench.lib.kvmath import KVLayout


@dataclass
class TokenRows:
    """Values (and per-vector scales, if the format has them) for a run of token slots."""

    values: torch.Tensor  # (..., slots, vectors, vector_len) in the dtype, or (..., value_bytes) uint8
    scales: torch.Tensor | None  # (..., slots, vectors, scale_bytes) uint8

    def storage_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in (self.values, self.scales) if t is not None)


def empty_rows(layout: KVLayout, leading: tuple[int, ...], device: torch.device) -> TokenRows:
    """Uninitialised storage for ``leading`` (e.g. (batch, max_len) or (blocks, block_size)) slots."""
    fmt, v = layout.fmt, layout.vectors_per_token
    if fmt.torch_dtype is not None:
        values = torch.empty(*leading, v, layout.vector_len, dtype=getattr(torch, fmt.torch_dtype), device=device)
    else:
        values = torch.empty(*leading, v, fmt.value_bytes(layout.vector_len), dtype=torch.uint8, device=device)
    scale = fmt.scale_bytes(layout.vector_len)
    scales = torch.empty(*leading, v, scale, dtype=torch.uint8, device=device) if scale else None
    return TokenRows(values, scales)


def random_rows(layout: KVLayout, slots: int, generator: torch.Generator) -> TokenRows:
    """Random token data in the storage layout (normal values, or random bytes for packed formats):
    what a model would write, never zeros. Drawn on the generator's device."""
    fmt, v, device = layout.fmt, layout.vectors_per_token, generator.device
    if fmt.torch_dtype is not None:
        values = torch.randn(slots, v, layout.vector_len, generator=generator, device=device)
        values = values.to(getattr(torch, fmt.torch_dtype))
    else:
        values = torch.randint(
            0,
            256,
            (slots, v, fmt.value_bytes(layout.vector_len)),
            generator=generator,
            dtype=torch.uint8,
            device=device,
        )
    scale = fmt.scale_bytes(layout.vector_len)
    scales = (
        torch.randint(0, 256, (slots, v, scale), generator=generator, dtype=torch.uint8, device=device)
        if scale
        else None
    )
    return TokenRows(values, scales)


def tensor_scales(layout: KVLayout, device: torch.device) -> torch.Tensor | None:
    """Per-tensor fp32 scales of one layer (K and V, or the latent), for formats that have them."""
    if not layout.fmt.tensor_scale_bytes:
        return None
    return torch.ones(layout.tensors_per_layer, dtype=torch.float32, device=device)


def held_bytes(layers: list[TokenRows], scales: list[torch.Tensor | None]) -> int:
    """Bytes an allocator holds: the storage of its token tensors and of its per-tensor scales."""
    return sum(rows.storage_bytes() for rows in layers) + sum(
        s.untyped_storage().nbytes() for s in scales if s is not None
    )


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality whatever the dtype (fp8 and bf16 included)."""
    if a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@dataclass
class SequenceKV:
    """One sequence's tokens for every layer, as a model's forward pass would produce them."""

    length: int
    layers: list[TokenRows]  # one per layer, ``length`` slots each
