"""paged_attention's correctness and figures: attention in float64 through the tables as built
(:func:`float64_reference`), each sequence checked on its own (:func:`per_sequence_check`), and a
step's least memory traffic, FLOPs and tokens (:func:`decode_metrics`).
"""

from __future__ import annotations

from typing import Any

import torch

from gpubench.contract import CheckResult, Measured, relative_l2_check, tensors_check
from gpubench.lib.attention import attention_flops
from gpubench.techniques.paged_attention.workload import PagedDecodeWorkload


def float64_reference(w: PagedDecodeWorkload) -> torch.Tensor:
    """Attention in float64 over each sequence's keys and values, gathered through the block
    table as built."""
    q = w.q.to(torch.float64)
    batch, heads, head_dim = q.shape
    block_size, kv_heads = w.k_cache.shape[1], w.k_cache.shape[2]
    out = torch.empty_like(q)
    for b, n in enumerate(w.lens):
        blocks = w.reference_tables[b, : -(-n // block_size)].to(device=w.k_cache.device, dtype=torch.long)
        k, v = (cache[blocks].flatten(0, 1)[:n].to(torch.float64) for cache in (w.k_cache, w.v_cache))
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (k, v))  # (n, heads, dim)
        scores = torch.einsum("hd,nhd->hn", q[b], k) * head_dim**-0.5
        out[b] = torch.einsum("hn,nhd->hd", scores.softmax(dim=-1), v)
    return out


def per_sequence_check(reference_out: torch.Tensor, output: torch.Tensor) -> CheckResult:
    """Each sequence's output against the reference's: the worst relative L2 error. (Over the
    whole batch, short contexts, whose outputs average few values and are large, would hide an
    error in a long one.)"""
    if not isinstance(output, torch.Tensor) or output.shape != reference_out.shape:
        return relative_l2_check(reference_out, output)  # names what is wrong with it
    return tensors_check(
        {f"sequence {b}": r for b, r in enumerate(reference_out)},
        {f"sequence {b}": o for b, o in enumerate(output)},
        dtype=output.dtype,
    )


# -- metrics ----------------------------------------------------------------------------------


def decode_bytes(lens: list[int], kv_heads: int, head_dim: int, element_size: int, q_numel: int) -> int:
    """Least memory traffic of one decode step: each context's K and V read once, q read, the
    output (shaped like q) written. Block tables and lengths are left out (a few bytes per block)."""
    return sum(lens) * kv_heads * head_dim * 2 * element_size + 2 * q_numel * element_size


def decode_metrics(w: PagedDecodeWorkload, measured: Measured) -> dict[str, Any]:
    """Bytes moved (:func:`decode_bytes`), FLOPs, tokens per second, the contexts' tokens and sequences."""
    _, _, kv_heads, head_dim = w.k_cache.shape
    return {
        "bytes_moved": decode_bytes(w.lens, kv_heads, head_dim, w.k_cache.element_size(), w.q.numel()),
        # Two matmuls per query head over its context (q.k and p.v), as flash attention counts them:
        # about heads / kv_heads FLOPs per byte of 16-bit KV, far below any GPU's ridge point.
        "flops": sum(attention_flops(1, w.q.shape[1], 1, n, head_dim, head_dim, False) for n in w.lens),
        "tokens_per_s": len(w.lens) / measured.median_s,  # one new token per sequence per step
        "context_tokens": sum(w.lens),
        "sequences": len(w.lens),
    }
