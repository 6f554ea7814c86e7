"""Flash attention: exact attention by tiles with an online softmax, never storing the N x N
scores. :func:`flash_attention` runs the Triton kernel (:mod:`gpubench.lib.kernels.flash_attention_triton`) on CUDA
and :func:`flash_attention_torch`, the same algorithm as a loop of PyTorch tile operations,
elsewhere (checkable anywhere; each tile goes through memory, so it does not realise the saving).
"""

from __future__ import annotations

import torch

from gpubench.lib.attention import causal_offset, check_local, check_shapes, first_visible_key, visible_keys
from gpubench.lib.triton_support import dispatch

KERNEL = ("gpubench.lib.kernels.flash_attention_triton", "flash_attention_triton")
# Tiles of the PyTorch loop: few enough Python iterations at long sequences to hide launch
# overhead on a GPU, while one fp32 score tile stays at 2 MiB per head.
BLOCK_M = 1024
BLOCK_N = 512


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    causal_align: str = "bottom_right",
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor:
    """softmax(q k^T * scale) v in SDPA's layout: q (batch, heads, seq_q, head_dim), k (batch,
    kv_heads, seq_k, head_dim), v (batch, kv_heads, seq_k, head_dim_v), heads a multiple of
    kv_heads; causal aligned bottom-right by default (flash-attn's; "top_left" is SDPA's
    ``is_causal``), with a sliding ``window`` or a ``chunk`` (local attention, causal only),
    conventions as :mod:`gpubench.lib.attention`. The Triton kernel on
    CUDA, the tiled PyTorch loop elsewhere; ``out`` receives the result."""
    local = {"window": window, "chunk": chunk} if window or chunk else {}  # kept off calls that need none
    return dispatch(
        KERNEL, flash_attention_torch, q, k, v, causal=causal, scale=scale, out=out, causal_align=causal_align, **local
    )


def flash_attention_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    block_m: int = BLOCK_M,
    block_n: int = BLOCK_N,
    out: torch.Tensor | None = None,
    causal_align: str = "bottom_right",
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor:
    """:func:`flash_attention` as a loop of PyTorch tile operations, on any device; each tile's
    rows are written into ``out`` (allocated when not given). Differentiable: with gradients
    wanted, autograd runs backward through the tiles (each tile's weights are kept for it, so
    this saves nothing over eager attention in training; it is the stand-in off CUDA). A local
    mask (``window`` / ``chunk``) loads only the key tiles its query tile's rows can see."""
    check_shapes(q, k, v)
    check_local(causal, window, chunk)
    local = bool(window or chunk)
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k, head_dim_v = k.shape[1], k.shape[2], v.shape[3]
    offset = causal_offset(seq_q, seq_k, causal_align)  # causal: query i sees keys j <= i + offset
    if block_m < 1 or block_n < 1:
        raise ValueError(f"block sizes must be >= 1 (got block_m={block_m}, block_n={block_n})")
    if scale is None:
        scale = head_dim**-0.5
    group = heads // kv_heads
    # GQA without copying K/V: the `group` query heads that share a kv head are stacked into one
    # taller query tile against the same K/V tile.
    q_grouped = q.unflatten(1, (kv_heads, group))
    out = q.new_empty(batch, heads, seq_q, head_dim_v) if out is None else out
    out_grouped = out.unflatten(1, (kv_heads, group))
    query_pos = torch.arange(seq_q, device=q.device)
    key_pos = torch.arange(seq_k, device=q.device)

    for m_start in range(0, seq_q, block_m):
        m_end = min(m_start + block_m, seq_q)
        rows = m_end - m_start
        q_tile = q_grouped[:, :, :, m_start:m_end].reshape(batch, kv_heads, group * rows, head_dim)
        row_max = torch.full((batch, kv_heads, group * rows, 1), float("-inf"), dtype=torch.float32, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros(batch, kv_heads, group * rows, head_dim_v, dtype=torch.float32, device=q.device)
        # Rows that see no key at all (bottom-right with seq_q > seq_k, or no keys): their maximum stays
        # -inf, so they are shifted by 0 instead (weights exp(-inf) = 0, not NaN) and end as 0.
        # A local mask: a row may see nothing of a tile its neighbours see (or nothing at all).
        empty_rows = causal and m_start + offset < 0 or seq_k == 0 or local
        # Causal: K/V tiles wholly above the diagonal are never loaded; local: nor those wholly
        # before the first row's first visible key.
        n_stop = max(0, min(seq_k, m_end + offset)) if causal else seq_k
        n_first = max(0, first_visible_key(m_start + offset, window, chunk)) // block_n * block_n if local else 0
        # Keys from here on are seen by every row of the tile as far as the local mask goes.
        n_full = first_visible_key(m_end - 1 + offset, window, chunk) if local else 0
        for n_start in range(n_first, n_stop, block_n):
            n_end = min(n_start + block_n, n_stop)
            scores = torch.matmul(q_tile, k[:, :, n_start:n_end].transpose(-2, -1)).float().mul_(scale)
            # only tiles crossing the diagonal (or a local mask's lower edge) need a mask
            if causal and (n_end - 1 > m_start + offset or n_start < n_full):
                hidden = ~visible_keys(
                    query_pos[m_start:m_end][:, None], key_pos[n_start:n_end][None, :], offset, window, chunk
                )
                scores.view(batch, kv_heads, group, rows, n_end - n_start).masked_fill_(hidden, float("-inf"))
            # The running maximum is only a shift that cancels between numerator and
            # denominator, so it is kept out of autograd's graph (its gradient is exactly 0);
            # every in-place update below then overwrites nothing a backward pass needs.
            new_max = torch.maximum(row_max, scores.detach().amax(dim=-1, keepdim=True))
            shift = new_max.nan_to_num(neginf=0.0) if empty_rows else new_max
            rescale = torch.exp(row_max - shift)
            probs = scores.sub_(shift).exp_()
            row_sum.mul_(rescale).add_(probs.sum(dim=-1, keepdim=True))
            acc.mul_(rescale).add_(torch.matmul(probs.to(v.dtype), v[:, :, n_start:n_end]))
            row_max = new_max
        if empty_rows:
            row_sum = row_sum.masked_fill(row_sum == 0, 1.0)  # their acc is 0: they store 0
        out_grouped[:, :, :, m_start:m_end] = (acc / row_sum).view(batch, kv_heads, group, rows, head_dim_v)
    return out


# The differentiable entry points (forward kernel + backward kernels, gpubench.lib.kernels.
# flash_attention_triton_bwd), imported on first use: that module imports Triton, this one must not.
TRAINING_API = (
    "FlashAttentionFunction",
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attention_backward_triton",
)


def __getattr__(name: str):
    from gpubench.lib.triton_support import kernel_module

    if name in TRAINING_API:
        module = kernel_module("gpubench.lib.kernels.flash_attention_triton_bwd")
        if isinstance(module, str):
            raise ImportError(f"gpubench.optimizations.flash_attention.{name}: {module}")
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
