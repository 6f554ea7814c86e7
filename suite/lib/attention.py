"""Attention's conventions, shared by every attention path of gpubench (eager, the tiled loop, the
Triton kernels); the float64 references every attention path is checked against, padded (SDPA's
layout) and variable-length (flash-attn's packed one), forward and backward; and what a call costs
(FLOPs as the flash-attention repository counts them, the least HBM traffic).

q (batch, heads, seq_q, head_dim), k (batch, kv_heads, seq_k, head_dim), v (batch, kv_heads, seq_k,
head_dim_v), heads a multiple of kv_heads (GQA / MQA), head_dim and head_dim_v each 1..256; the output
is (batch, heads, seq_q, head_dim_v). ``causal_align`` places the causal diagonal when seq_q != seq_k:
"bottom_right" (the default, as flash-attn >= 2.1 and serving engines: query i sees keys
j <= i + seq_k - seq_q, what a chunk of queries at the end of a KV cache needs) or "top_left" (SDPA's
``is_causal``: j <= i). Equal lengths: both the same. A query row that sees no key (bottom-right with
seq_q > seq_k) gets output 0 and log-sum-exp -inf.

Local attention narrows the causal mask (and needs it; :func:`check_local`), with p = i + offset a query's
position aligned as above: a sliding ``window`` (Mistral, Gemma 2/3, gpt-oss, as transformers and vLLM
define it) lets query i see key j iff 0 <= p - j < window; a ``chunk`` (Llama 4's chunked local
attention) iff j <= p and p // chunk == j // chunk. 0 is neither.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CAUSAL_ALIGNS = ("bottom_right", "top_left")
# Scores the float64 reference holds at once, in elements (256 MiB).
REFERENCE_CHUNK_ELEMENTS = 2**25


def causal_offset(seq_q: int, seq_k: int, causal_align: str) -> int:
    """The shift of the causal diagonal: query i sees keys j <= i + offset."""
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS} (got {causal_align!r})")
    return seq_k - seq_q if causal_align == "bottom_right" else 0


def check_local(causal: bool, window: int = 0, chunk: int = 0) -> None:
    """ValueError unless ``window`` and ``chunk`` are a local mask the attention paths take: ints >= 0
    (0: none), not both, and only with ``causal`` (each narrows the causal mask)."""
    for name, size in (("window", window), ("chunk", chunk)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"{name} must be an int >= 0, 0 for none (got {size!r})")
    if window and chunk:
        raise ValueError(f"give a sliding window or a chunk, not both (got window={window}, chunk={chunk})")
    if (window or chunk) and not causal:
        raise ValueError(
            f"{'window' if window else 'chunk'} needs causal attention: local attention narrows the causal mask"
        )


def first_visible_key(pos, window: int = 0, chunk: int = 0):
    """The first key a query at aligned position ``pos`` (an int or an integer tensor) may see under a
    local mask (one of ``window``, ``chunk`` given): pos - window + 1 under a sliding window, the start
    of pos's chunk (pos < 0: 0) under a chunk; the causal bound (keys j <= pos) comes on top."""
    if window:
        return pos - window + 1
    clamped = max(pos, 0) if isinstance(pos, int) else pos.clamp(min=0)
    return clamped // chunk * chunk


def visible_keys(
    query_pos: torch.Tensor, key_pos: torch.Tensor, offset: int, window: int = 0, chunk: int = 0
) -> torch.Tensor:
    """Causal visibility (with a window or a chunk, local): whether query i (``query_pos``, its rows'
    indices) sees key j (``key_pos``), broadcast against each other, e.g. ``pos_q[:, None]`` and
    ``pos_k[None, :]``; ``offset`` from :func:`causal_offset`."""
    pos = query_pos + offset
    seen = key_pos <= pos
    if window or chunk:
        seen = seen & (key_pos >= first_visible_key(pos, window, chunk))
    return seen


def keys_seen(seq_q: int, seq_k: int, causal: bool, causal_align: str, window: int = 0, chunk: int = 0) -> int:
    """How many of the keys some query sees (they are contiguous: each query's are, and the next
    query's start no earlier and at most one past the last seen); all of them unless local."""
    if not causal or not (window or chunk):
        return seq_k
    offset = causal_offset(seq_q, seq_k, causal_align)
    last = min(seq_q - 1 + offset, seq_k - 1)
    first = max(first_visible_key(max(offset, 0), window, chunk), 0)
    return max(0, last - first + 1)


def sees_no_key(
    seq_q: int, seq_k: int, causal: bool, causal_align: str = "bottom_right", window: int = 0, chunk: int = 0
) -> bool:
    """Whether some query row sees no key at all: no keys; causal, a query before the first key
    (bottom-right, seq_q > seq_k); local, the last query's window or chunk past the last key
    (top-left, seq_q > seq_k; its first visible key only grows with the position)."""
    if seq_k == 0:
        return seq_q > 0
    if not causal or seq_q == 0:
        return False
    offset = causal_offset(seq_q, seq_k, causal_align)
    local = bool(window or chunk)
    return offset < 0 or local and first_visible_key(seq_q - 1 + offset, window, chunk) > seq_k - 1


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_dim: int = 2) -> None:
    """ValueError unless q, k, v are a valid attention problem (``seq_dim`` 2 for the padded layout
    (batch, heads, seq, dim), 0 for the packed one (tokens, heads, dim))."""
    dims = 4 if seq_dim == 2 else 3
    if not q.dim() == k.dim() == v.dim() == dims:
        raise ValueError(f"q, k, v must each have {dims} dims (got {q.dim()}, {k.dim()}, {v.dim()})")
    head_dim_axis = dims - 1
    heads, kv_heads = q.shape[1], k.shape[1]  # heads are dim 1 in both layouts
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"heads ({heads}) must be divisible by kv_heads ({kv_heads})")
    same = [a for a in range(k.dim()) if a != head_dim_axis]
    if (
        [k.shape[a] for a in same] != [v.shape[a] for a in same]
        or k.shape[head_dim_axis] != q.shape[head_dim_axis]
        or (seq_dim == 2 and k.shape[0] != q.shape[0])
    ):
        raise ValueError(
            f"k {tuple(k.shape)} and v {tuple(v.shape)} do not fit q {tuple(q.shape)}: k must have q's "
            "batch and head_dim, v k's shape but for its own head_dim_v"
        )
    for name, dim in (("head_dim", q.shape[head_dim_axis]), ("head_dim_v", v.shape[head_dim_axis])):
        if not 1 <= dim <= 256:
            raise ValueError(f"{name} {dim} is not supported (1..256)")


def softmax_with_empty_rows(scores: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(scores) v with rows of only -inf giving 0 (and a zero gradient, not NaN): those rows
    are softmaxed as zeros and their weights then multiplied by 0."""
    empty = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(
        scores.masked_fill(empty, 0.0), dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)
    )
    probs = probs.masked_fill(empty, 0.0).to(v.dtype)
    return torch.matmul(probs, v)


@dataclass(frozen=True)
class Documents:
    """A packed (varlen) batch: document d is q rows ``cu_seqlens_q[d]:cu_seqlens_q[d + 1]`` against
    k/v rows ``cu_seqlens_k[d]:cu_seqlens_k[d + 1]``."""

    cu_seqlens_q: torch.Tensor  # (documents + 1,) int32 on the workload's device
    cu_seqlens_k: torch.Tensor
    lens_q: list[int]  # host copies, drawn at build: no variant reads them back from the device
    lens_k: list[int]

    @classmethod
    def of(cls, lens_q: list[int], lens_k: list[int], device: torch.device) -> Documents:
        """The packing of documents of these lengths, in order."""

        def cu_seqlens(lens: list[int]) -> torch.Tensor:
            return torch.tensor([0, *lens], dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)

        return cls(cu_seqlens(lens_q), cu_seqlens(lens_k), lens_q, lens_k)

    @property
    def max_seqlen_q(self) -> int:
        return max(self.lens_q)

    @property
    def max_seqlen_k(self) -> int:
        return max(self.lens_k)

    @property
    def total_q(self) -> int:
        """Packed query rows that belong to a document (cu_seqlens_q[-1]); the rest is tail."""
        return sum(self.lens_q)

    @property
    def total_k(self) -> int:
        return sum(self.lens_k)

    def spans(self) -> list[tuple[slice, slice]]:
        """Each document's (query rows, key rows) in the packed stream."""
        out, q0, k0 = [], 0, 0
        for n_q, n_k in zip(self.lens_q, self.lens_k):
            out.append((slice(q0, q0 + n_q), slice(k0, k0 + n_k)))
            q0, k0 = q0 + n_q, k0 + n_k
        return out


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    causal_align: str = "bottom_right",
    *,
    return_lse: bool = False,
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention in float64 (SDPA's layout), a chunk of query rows at a time so memory stays
    bounded; differentiable, so its gradients are the backward pass's reference too. With
    ``return_lse`` also the natural-log log-sum-exp of the scaled scores over the visible keys,
    (batch, heads, seq_q) float64, -inf for a row that sees no key. ``window`` / ``chunk``: local
    attention (module docstring), with ``causal`` only."""
    check_shapes(q, k, v)
    check_local(causal, window, chunk)
    q, k, v = (t.to(torch.float64) for t in (q, k, v))
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    offset = causal_offset(seq_q, seq_k, causal_align)
    scale = head_dim**-0.5 if scale is None else scale
    q = q.unflatten(1, (kv_heads, heads // kv_heads))  # (b, kv_heads, group, s, d): no copy of k, v
    outs, lses = [], []
    rows = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, batch * heads * seq_k))
    key_pos = torch.arange(seq_k, device=q.device)
    for start in range(0, seq_q, rows):
        stop = min(start + rows, seq_q)
        scores = torch.einsum("bkgqd,bknd->bkgqn", q[:, :, :, start:stop], k) * scale
        if causal:
            query_pos = torch.arange(start, stop, device=q.device)
            seen = visible_keys(query_pos[:, None], key_pos[None, :], offset, window, chunk)
            scores = scores.masked_fill(~seen, float("-inf"))
        outs.append(softmax_with_empty_rows(scores, v[:, :, None]))
        lses.append(torch.logsumexp(scores, dim=-1))
    out = torch.cat(outs, dim=3).flatten(1, 2) if outs else q.new_zeros(batch, heads, 0, v.shape[-1])
    if not return_lse:
        return out
    lse = torch.cat(lses, dim=3).flatten(1, 2) if lses else q.new_zeros(batch, heads, 0)
    return out, lse


def attention_reference_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    causal_align: str = "bottom_right",
    *,
    return_lse: bool = False,
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Packed (flash-attn varlen) attention in float64, each document run alone by
    :func:`attention_reference`: q (total_q, heads, head_dim), k (total_k, kv_heads, head_dim), v
    (total_k, kv_heads, head_dim_v); document b is q rows cu_seqlens_q[b]:cu_seqlens_q[b+1] against
    k/v rows cu_seqlens_k[b]:cu_seqlens_k[b+1]. Returns out (total_q, heads, head_dim_v) float64
    [and lse (heads, total_q)]."""
    check_shapes(q, k, v, seq_dim=0)
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    if len(cu_q) != len(cu_k) or len(cu_q) < 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must both be (batch + 1,) (got {len(cu_q)}, {len(cu_k)})")
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        qd, kd, vd = (
            t[lo:hi].transpose(0, 1)[None]
            for t, lo, hi in ((q, cu_q[b], cu_q[b + 1]), (k, cu_k[b], cu_k[b + 1]), (v, cu_k[b], cu_k[b + 1]))
        )
        out, lse = attention_reference(
            qd,
            kd,
            vd,
            causal=causal,
            scale=scale,
            causal_align=causal_align,
            return_lse=True,
            window=window,
            chunk=chunk,
        )
        outs.append(out[0].transpose(0, 1))
        lses.append(lse[0])
    out = torch.cat(outs) if outs else q.new_zeros(0, q.shape[1], v.shape[2], dtype=torch.float64)
    if not return_lse:
        return out
    return out, torch.cat(lses, dim=1) if lses else q.new_zeros(q.shape[1], 0, dtype=torch.float64)


def reference_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    grad_out: torch.Tensor,
    causal: bool,
    causal_align: str,
    window: int = 0,
    chunk: int = 0,
) -> tuple[torch.Tensor, ...]:
    """dq, dk, dv of attention in float64 (SDPA's layout), from the forward's output and
    log-sum-exp, a chunk of query rows at a time so memory stays bounded at any length:
    P = exp(S - lse), dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(dO * O)), dQ = dS K * scale,
    dK = dS^T Q * scale; a kv head's gradients summed over the query heads that share it.
    ``window`` / ``chunk``: local attention, as :func:`attention_reference`."""
    check_local(causal, window, chunk)
    q, k, v, out, lse, grad_out = (t.detach().to(torch.float64) for t in (q, k, v, out, lse, grad_out))
    batch, heads, seq_q, head_dim = q.shape
    kv, seq_k = k.shape[1], k.shape[2]
    offset, scale = causal_offset(seq_q, seq_k, causal_align), head_dim**-0.5
    qg, og, dog = (t.unflatten(1, (kv, heads // kv)) for t in (q, out, grad_out))  # (b, kv, group, s, d)
    lse = lse.unflatten(1, (kv, heads // kv))
    delta = (dog * og).sum(dim=-1)
    dq, dk, dv = torch.empty_like(qg), torch.zeros_like(k), torch.zeros_like(v)
    rows = max(1, REFERENCE_CHUNK_ELEMENTS // max(1, batch * heads * seq_k))
    key_pos = torch.arange(seq_k, device=q.device)
    for start in range(0, seq_q, rows):
        at = slice(start, min(start + rows, seq_q))
        probs = torch.einsum("bkgqd,bknd->bkgqn", qg[:, :, :, at], k).mul_(scale).sub_(lse[..., at, None]).exp_()
        if causal:  # also zeroes rows that see no key (lse -inf made them +inf)
            query_pos = torch.arange(at.start, at.stop, device=q.device)
            probs.masked_fill_(~visible_keys(query_pos[:, None], key_pos[None, :], offset, window, chunk), 0.0)
        dscores = torch.einsum("bkgqe,bkne->bkgqn", dog[:, :, :, at], v).sub_(delta[..., at, None]).mul_(probs)
        dq[:, :, :, at] = torch.einsum("bkgqn,bknd->bkgqd", dscores, k) * scale
        dk += torch.einsum("bkgqn,bkgqd->bknd", dscores, qg[:, :, :, at]) * scale
        dv += torch.einsum("bkgqn,bkgqe->bkne", probs, dog[:, :, :, at])
    return dq.flatten(1, 2), dk, dv


# -- what a call costs ----------------------------------------------------------------------


def _ramp_area_x2(t: int, seq_k: int) -> int:
    """Twice the integral of clamp(u, 0, seq_k) for u from 0 to t."""
    if t <= 0:
        return 0
    return t * t if t <= seq_k else seq_k * seq_k + 2 * seq_k * (t - seq_k)


def _chunk_starts_x2(first: int, stop: int, seq_k: int, chunk: int) -> int:
    """Twice the sum over positions p in [first, stop) (>= 0) of min(start of p's chunk, seq_k)."""

    def below(n: int) -> int:  # the sum of chunk * (p // chunk) over p in [0, n)
        full, rest = divmod(n, chunk)
        return chunk * (chunk * full * (full - 1) // 2 + full * rest)

    capped = -(-seq_k // chunk) * chunk  # from here on a chunk starts at or past the last key
    total = below(min(stop, capped)) - below(min(first, capped)) + seq_k * max(0, stop - max(first, capped))
    return 2 * total


def score_area_x2(
    seq_q: int, seq_k: int, causal: bool, causal_align: str = "bottom_right", window: int = 0, chunk: int = 0
) -> int:
    """Twice the area of the score matrix that is computed: seq_q x seq_k, or under a causal mask
    the area below its diagonal as a continuous region (seq^2 / 2 for equal lengths, as the
    flash-attention repository counts causal; a chunk of seq_q queries at the end of seq_k keys:
    seq_q * seq_k - seq_q^2 / 2). A local mask takes away what lies before each query's first
    visible key (:func:`first_visible_key`): a sliding window leaves the band of ``window`` keys per
    query (exactly the pairs attended once past the first ``window`` queries), a chunk leaves each
    query its own chunk's keys up to the diagonal, which (as causal) counts the diagonal's pairs as
    half: within half a pair per query row of the pairs attended."""
    if not causal:
        return 2 * seq_q * seq_k
    offset = causal_offset(seq_q, seq_k, causal_align)
    area = _ramp_area_x2(seq_q + offset, seq_k) - _ramp_area_x2(offset, seq_k)
    if window:  # keys j <= u + offset - window, u over the queries as a continuous range
        area -= _ramp_area_x2(seq_q + offset - window, seq_k) - _ramp_area_x2(offset - window, seq_k)
    elif chunk:  # keys before each query's chunk; a query row u in [i, i + 1) sits in i + offset's chunk
        area -= _chunk_starts_x2(max(offset, 0), max(seq_q + offset, 0), seq_k, chunk)
    return area


def attention_flops(
    batch: int,
    heads: int,
    seq_q: int,
    seq_k: int,
    head_dim: int,
    head_dim_v: int,
    causal: bool,
    causal_align: str = "bottom_right",
    window: int = 0,
    chunk: int = 0,
) -> int:
    """Forward FLOPs as the flash-attention repository counts them: two matmuls per head, Q K^T
    (2 * seq_q * seq_k * head_dim) and P V (2 * seq_q * seq_k * head_dim_v), causal counting only the
    area below the diagonal (half, for equal lengths), a local mask only its band or chunks
    (:func:`score_area_x2`)."""
    return batch * heads * (head_dim + head_dim_v) * score_area_x2(seq_q, seq_k, causal, causal_align, window, chunk)


def attention_bytes(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, train: bool = False, *, keys_read: int | None = None
) -> int:
    """Least HBM traffic one call can do. Forward: read q, k, v once and write the output (q's rows,
    v's head_dim). Train adds the log-sum-exp written (fp32, one per query row) and the backward's
    reads of q, k, v, the output, its gradient and the log-sum-exp, and writes of dq, dk, dv.
    ``keys_read``: how many of k's and v's rows (per head, over the whole batch) some query sees
    (a local mask's; :func:`keys_seen`), the rest never read (their gradients are still written);
    None: all."""
    kv = sum(t.numel() * t.element_size() for t in (k, v))
    qkv = q.numel() * q.element_size() + kv
    rows_k = k.numel() // (k.shape[1] * k.shape[-1])  # heads: dim 1 in both layouts
    read = qkv if keys_read is None else qkv - kv + kv * keys_read // max(rows_k, 1)
    rows = q.numel() // q.shape[-1]
    out = rows * v.shape[-1] * q.element_size()
    if not train:
        return read + out
    lse = rows * 4
    return (read + out + lse) + (read + 2 * out + lse + qkv)
