"""flash_attention's correctness and figures: attention in float64 (:func:`float64_reference`;
train mode: and its gradients; varlen: each document alone), the check of a variant's output
(:func:`output_check`) and the FLOPs, bytes and tokens of a call (:func:`attention_metrics`).
"""

from __future__ import annotations

from typing import Any

import torch

from gpubench.contract import CheckResult, Measured, relative_l2_check, tensors_check
from gpubench.lib.attention import (
    Documents,
    attention_bytes,
    attention_flops,
    attention_reference,
    attention_reference_varlen,
    keys_seen,
    reference_backward,
)
from gpubench.techniques.flash_attention.workload import OUTPUT_KEYS, TRAIN_TOLERANCE, AttentionWorkload


def _reference_varlen_backward(
    w: AttentionWorkload, docs: Documents, grad_out: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """:func:`reference_backward` of each packed document (``docs``: the workload's) alone, into
    packed gradients."""
    grads = [torch.zeros(t.shape, dtype=torch.float64, device=t.device) for t in (w.q, w.k, w.v)]
    as_batch = lambda t: t.transpose(0, 1)[None]
    for rows_q, rows_k in docs.spans():
        doc = reference_backward(
            as_batch(w.q[rows_q]),
            as_batch(w.k[rows_k]),
            as_batch(w.v[rows_k]),
            as_batch(out[rows_q]),
            lse[None, :, rows_q],
            as_batch(grad_out[rows_q]),
            w.causal,
            w.causal_align,
            **w.local,
        )
        for grad, rows, part in zip(grads, (rows_q, rows_k, rows_k), doc):
            grad[rows] = part[0].transpose(0, 1)
    return tuple(grads)


def float64_reference(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """Attention in float64 (``attention_reference``; varlen: each document alone, the documents'
    rows); train mode adds dq, dk, dv by :func:`reference_backward`, a chunk of query rows at a
    time (varlen: exactly 0 on the tail after the last document)."""
    with torch.no_grad():
        if w.docs is None:
            result = attention_reference(
                w.q, w.k, w.v, causal=w.causal, causal_align=w.causal_align, return_lse=w.train, **w.local
            )
        else:
            result = attention_reference_varlen(
                w.q,
                w.k,
                w.v,
                w.docs.cu_seqlens_q,
                w.docs.cu_seqlens_k,
                causal=w.causal,
                causal_align=w.causal_align,
                return_lse=w.train,
                **w.local,
            )
        if not w.train:
            assert isinstance(result, torch.Tensor)  # (no lse asked)
            return result
        out, lse = result
        assert w.grad_out is not None  # (train mode draws it)
        if w.docs is None:
            grads = reference_backward(w.q, w.k, w.v, out, lse, w.grad_out, w.causal, w.causal_align, **w.local)
        else:
            grads = _reference_varlen_backward(w, w.docs, w.grad_out, out, lse)
    return dict(zip(OUTPUT_KEYS, (out, *grads)))


def output_check(reference_output: torch.Tensor | dict[str, torch.Tensor], output: Any) -> CheckResult:
    """Forward: the output's relative L2 error within its dtype's tolerance. Train: the output and
    dq, dk, dv by name, the worst relative L2 error within TRAIN_TOLERANCE of the output's dtype."""
    if not isinstance(reference_output, dict):
        return relative_l2_check(reference_output, output)
    out = output.get("out") if isinstance(output, dict) else None
    return tensors_check(
        reference_output, output, TRAIN_TOLERANCE, dtype=out.dtype if isinstance(out, torch.Tensor) else None
    )


# -- metrics ----------------------------------------------------------------------------------


def attention_metrics(w: AttentionWorkload, measured: Measured) -> dict[str, Any]:
    """FLOPs (train: forward + backward at 2.5x the forward), bytes moved, tokens per second. A
    sliding window or a chunk counts only the pairs it attends (``attention_flops``) and reads only
    the keys some query sees (``keys_seen``), so its TFLOP/s and GB/s are of the work it does."""
    heads, head_dim, head_dim_v = w.q.shape[1], w.q.shape[-1], w.v.shape[-1]  # heads: dim 1 in both layouts
    if w.docs is None:
        problems = [(w.q.shape[0], w.q.shape[2], w.k.shape[2])]
    else:
        problems = [(1, n_q, n_k) for n_q, n_k in zip(w.docs.lens_q, w.docs.lens_k)]
    forward = sum(
        attention_flops(b, heads, s_q, s_k, head_dim, head_dim_v, w.causal, w.causal_align, **w.local)
        for b, s_q, s_k in problems
    )
    tokens = sum(b * s_q for b, s_q, _ in problems)
    q, k, v = (
        (w.q, w.k, w.v) if w.docs is None else (w.q[: w.docs.total_q], w.k[: w.docs.total_k], w.v[: w.docs.total_k])
    )
    keys_read = None
    if w.local["window"] or w.local["chunk"]:
        keys_read = sum(b * keys_seen(s_q, s_k, w.causal, w.causal_align, **w.local) for b, s_q, s_k in problems)
    out: dict[str, Any] = {
        "bytes_moved": attention_bytes(q, k, v, w.train, keys_read=keys_read),
        "tokens_per_s": tokens / measured.median_s,
    }
    if w.train:
        # The flash-attention repository's benchmark: backward 2.5x the forward, a step 3.5x.
        out.update(flops=forward * 7 // 2, forward_flops=forward, backward_flops=forward * 5 // 2)
    else:
        out["flops"] = forward
    return out
