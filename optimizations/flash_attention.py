"""Flash attention: exact attention without ever storing the N x N score matrix.

The eager baseline writes all N x N scores to memory, softmaxes them there and reads them back;
for long sequences that traffic dominates. Here the keys and values are streamed in tiles past
a tile of queries while a running row maximum ``m``, a running softmax denominator ``l`` and an
fp32 output accumulator are kept per query row (the *online softmax*): each new tile rescales
what was accumulated so far, so the result is exact, and the largest intermediate is one
(block_m x block_n) tile per head, O(N * block) instead of O(N^2). With causal masking, tiles
wholly above the diagonal are skipped, so causal attention does about half the work.

:func:`flash_attention` runs the fused Triton kernel (:mod:`.flash_attention_triton`) on CUDA
tensors: each tile lives in registers and shared memory, so the only HBM traffic is q, k, v in
and the output out, which is where the win comes from. Elsewhere (CPU, or no Triton) it runs
:func:`flash_attention_torch`, the same algorithm as a loop of PyTorch tile operations:
checkable on any device, but each tile goes through memory, so it does not realise the saving.
Published figures: FlashAttention-2 reaches 50-73% of the A100's peak; FlashAttention-3 reaches
740 TFLOP/s in fp16 on an H100 (75% of peak).
"""
from __future__ import annotations

import torch

try:
    from gpubench.optimizations.flash_attention_triton import flash_attention_triton
except ImportError as exc:  # Triton is a dependency on Linux x86-64 only
    _TRITON_MISSING = f"Triton is not importable ({exc})"

    def flash_attention_triton(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                               scale: float | None = None, **blocks: int) -> torch.Tensor:
        raise RuntimeError(f"the Triton flash-attention kernel cannot run: {_TRITON_MISSING}")
else:
    _TRITON_MISSING = ""

# A query tile of 1024 rows and key tiles of 512 keep the Python loop to (N/1024) x (N/512)
# iterations, so at long sequence lengths on a GPU each iteration is big enough to hide the
# kernel-launch overhead, while one fp32 score tile is still only 2 MiB per head.
BLOCK_M = 1024
BLOCK_N = 512


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v with SDPA's layout: q (batch, heads, seq, head_dim), k and v
    (batch, kv_heads, seq, head_dim) where heads is a multiple of kv_heads (GQA/MQA).

    ``causal``: query i sees keys 0..i (top-left aligned, as SDPA's ``is_causal``).
    CUDA tensors run the Triton kernel; anything else runs the tiled PyTorch loop.
    ``out``: write the result here (shaped and typed like q) instead of a new tensor; the suite
    passes a NaN-filled one to its checked call, so an element the kernel never writes fails.
    """
    if q.is_cuda and not _TRITON_MISSING:
        return flash_attention_triton(q, k, v, causal=causal, scale=scale, out=out)
    result = flash_attention_torch(q, k, v, causal=causal, scale=scale)
    return result if out is None else out.copy_(result)


def flash_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                          scale: float | None = None, *, block_m: int = BLOCK_M,
                          block_n: int = BLOCK_N) -> torch.Tensor:
    """:func:`flash_attention` as a loop of PyTorch tile operations, on any device.

    ``block_m`` / ``block_n``: rows per query tile / keys per key-value tile.
    """
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    if heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    if block_m < 1 or block_n < 1:
        raise ValueError(f"block sizes must be >= 1 (got block_m={block_m}, block_n={block_n})")
    if scale is None:
        scale = head_dim ** -0.5
    group = heads // kv_heads

    # GQA without copying K/V: query head j uses kv head j // group, so splitting the head
    # dimension into (kv_heads, group) puts every query head that shares a kv head side by
    # side. Stacking those `group` heads along the row dimension of a tile turns them into one
    # taller query tile against the same K/V tile: K and V are read once per group.
    q_grouped = q.unflatten(1, (kv_heads, group))
    out = torch.empty(batch, kv_heads, group, seq_q, head_dim, dtype=q.dtype, device=q.device)
    query_pos = torch.arange(seq_q, device=q.device)
    key_pos = torch.arange(seq_k, device=q.device)

    for m_start in range(0, seq_q, block_m):
        m_end = min(m_start + block_m, seq_q)
        rows = m_end - m_start

        # Load the query tile: (batch, kv_heads, group * rows, head_dim). It stays put while
        # every K/V tile it needs streams past it.
        q_tile = q_grouped[:, :, :, m_start:m_end].reshape(batch, kv_heads, group * rows, head_dim)

        # Per-row running state, in fp32 whatever the input dtype: the largest score seen so
        # far (m), the softmax denominator relative to that maximum (l) and the unnormalised
        # output (acc). m starts at -inf so the first tile's rescale factor is exp(-inf) = 0.
        row_max = torch.full((batch, kv_heads, group * rows, 1), float("-inf"),
                             dtype=torch.float32, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros(batch, kv_heads, group * rows, head_dim, dtype=torch.float32, device=q.device)

        # Causal: a key after this tile's last query is invisible to every row of the tile, so
        # the K/V tiles wholly above the diagonal are never loaded. Key 0 is always visible,
        # so every row has a finite maximum after the first tile.
        n_stop = min(seq_k, m_end) if causal else seq_k
        for n_start in range(0, n_stop, block_n):
            n_end = min(n_start + block_n, n_stop)
            cols = n_end - n_start

            # Load one K/V tile and score it against the query tile. The matmul runs in the
            # input dtype (as tensor cores would); scaling and everything after is fp32.
            k_tile = k[:, :, n_start:n_end]
            v_tile = v[:, :, n_start:n_end]
            scores = torch.matmul(q_tile, k_tile.transpose(-2, -1)).float()
            scores.mul_(scale)

            # Only tiles that cross the diagonal need a mask; tiles wholly below it are
            # fully visible and skip the masking work.
            if causal and n_end - 1 > m_start:
                future = key_pos[n_start:n_end][None, :] > query_pos[m_start:m_end][:, None]
                scores.view(batch, kv_heads, group, rows, cols).masked_fill_(future, float("-inf"))

            # Online softmax update. With a new maximum m_new, everything accumulated so far
            # was exponentiated against the old maximum and is off by exp(m_old - m_new):
            # rescale the denominator and the accumulator by that factor, then add this tile's
            # contribution, exponentiated against m_new (so no exp ever overflows).
            new_max = torch.maximum(row_max, scores.amax(dim=-1, keepdim=True))
            rescale = torch.exp(row_max - new_max)
            probs = scores.sub_(new_max).exp_()  # in place: the tile's scores become weights
            row_sum.mul_(rescale).add_(probs.sum(dim=-1, keepdim=True))
            # The weights go back to the input dtype for the second matmul, as a fused kernel
            # feeds them to the tensor cores; the sum over tiles stays in fp32.
            acc.mul_(rescale).add_(torch.matmul(probs.to(v.dtype), v_tile))
            row_max = new_max

        # Final normalisation: divide by the complete softmax denominator once, at the end,
        # instead of renormalising on every tile; then store the tile in the input dtype.
        acc.div_(row_sum)
        out[:, :, :, m_start:m_end] = acc.view(batch, kv_heads, group, rows, head_dim)

    return out.view(batch, heads, seq_q, head_dim)
