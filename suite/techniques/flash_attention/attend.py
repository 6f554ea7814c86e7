"""flash_attention's variants, each one attention call on an :class:`AttentionWorkload` (train
mode: and its backward): the eager pair side (materialized scores; varlen: padded with a mask), the
Triton kernels (:mod:`gpubench.lib.kernels`, loaded lazily) and the PyTorch tile loop standing in
for them, and the peers (torch SDPA, default or pinned to a backend, and the flash-attn package).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.torch_version import TorchVersion

from gpubench.baselines.flash_attention import attention
from gpubench.lib.attention import Documents, causal_offset, first_visible_key, sees_no_key, visible_keys
from gpubench.lib.optional import optional_import
from gpubench.lib.triton_support import kernel_module, kernel_problem
from gpubench.optimizations.flash_attention import KERNEL, flash_attention_torch
from gpubench.techniques.flash_attention.workload import AttentionWorkload, run_mode

# The autograd functions of the Triton forward + backward (FlashAttention-2's recomputation from lse).
TRAIN_KERNELS = "gpubench.lib.kernels.flash_attention_triton_bwd"


# -- the pair -----------------------------------------------------------------------------------


def padded_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    docs: Documents,
    causal: bool,
    causal_align: str,
    window: int = 0,
    chunk: int = 0,
) -> torch.Tensor:
    """Packed documents the eager way (Hugging Face's eager path with an attention mask): scattered
    into a zero-padded (documents, heads, longest, dim) batch, scores materialized and masked past
    each document's own keys (and by its causal diagonal, and a sliding window or chunk of each
    document's own positions), fp32 softmax, @ V, gathered back to the
    packed rows (the documents' rows: a tail after the last document is never read).
    Differentiable. A query row that sees no key gives 0."""
    q, k, v = q[: docs.total_q], k[: docs.total_k], v[: docs.total_k]
    n, heads, kv, dim = len(docs.lens_q), q.shape[1], k.shape[1], q.shape[-1]
    longest_q, longest_k = docs.max_seqlen_q, docs.max_seqlen_k
    device = q.device
    pos_q, pos_k = torch.arange(longest_q, device=device), torch.arange(longest_k, device=device)
    len_q, len_k = (torch.tensor(lens, device=device) for lens in (docs.lens_q, docs.lens_k))
    starts_q, starts_k = docs.cu_seqlens_q[:-1].long(), docs.cu_seqlens_k[:-1].long()
    # Row of each packed token in the padded batch, flattened: document * longest + position.
    rows_q = (
        (torch.arange(n, device=device) * longest_q).repeat_interleave(len_q)
        + torch.arange(q.shape[0], device=device)
        - starts_q.repeat_interleave(len_q)
    )
    rows_k = (
        (torch.arange(n, device=device) * longest_k).repeat_interleave(len_k)
        + torch.arange(k.shape[0], device=device)
        - starts_k.repeat_interleave(len_k)
    )

    def padded(t: torch.Tensor, rows: torch.Tensor, longest: int) -> torch.Tensor:
        flat = t.new_zeros(n * longest, *t.shape[1:]).index_copy(0, rows, t)
        return flat.unflatten(0, (n, longest)).transpose(1, 2)  # (n, heads, longest, dim)

    qp, kp, vp = padded(q, rows_q, longest_q), padded(k, rows_k, longest_k), padded(v, rows_k, longest_k)
    if heads != kv:  # GQA: each k/v head copied once per query head that shares it
        kp, vp = (t.repeat_interleave(heads // kv, dim=1) for t in (kp, vp))
    visible = (pos_k[None, None, :] < len_k[:, None, None]) & (pos_q[None, :, None] < len_q[:, None, None])
    if causal:
        shift = (len_k - len_q) if causal_align == "bottom_right" else torch.zeros_like(len_q)
        visible &= pos_k[None, None, :] <= pos_q[None, :, None] + shift[:, None, None]
        if window or chunk:
            first = first_visible_key(pos_q[None, :, None] + shift[:, None, None], window, chunk)
            visible &= pos_k[None, None, :] >= first
    visible = visible[:, None]  # (n, 1, longest_q, longest_k)
    scores = torch.matmul(qp, kp.transpose(-2, -1)) * dim**-0.5
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1, dtype=torch.float32)
    # Padding rows and rows that see no key softmax to NaN: weights 0 there instead.
    probs = probs.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0).to(v.dtype)
    out = torch.matmul(probs, vp).transpose(1, 2).flatten(0, 1)  # (n * longest_q, heads, head_dim_v)
    return out.index_select(0, rows_q)


def eager(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """materialized scores, float32 softmax, @ V (Hugging Face's eager path); varlen: the documents
    padded to the longest with a mask; train: autograd's backward through it"""
    if w.docs is not None:
        d = w.docs
        return run_mode(w, lambda: padded_attention(w.q, w.k, w.v, d, w.causal, w.causal_align, **w.local))
    return run_mode(w, lambda: attention(w.q, w.k, w.v, causal=w.causal, causal_align=w.causal_align, **w.local))


def triton_problem(device: torch.device) -> str | None:
    """On CUDA, or in Triton's interpreter on a CPU (checked there, never timed)."""
    return kernel_problem(KERNEL[0], device, interpreter_ok=True) or kernel_problem(
        TRAIN_KERNELS, device, interpreter_ok=True
    )


def _kernels(name: str) -> ModuleType:
    """Kernel module ``name``: imported wherever the variant runs (:func:`triton_problem` found it)."""
    module = kernel_module(name)
    if isinstance(module, str):
        raise RuntimeError(module)
    return module


# Forward tiles where Triton's interpreter runs a case that fixes none (on a GPU the autotuner
# picks them): one of the GPU's candidate tiles, with BLOCK_M != BLOCK_N as the causal split
# wants. The interpreter runs a program per tile in NumPy: with these 1024 tokens take ~1-2 s on a
# 2-core AMD EPYC, with its own 32 x 16 ~25 s.
INTERPRETER_BLOCKS = {"block_m": 128, "block_n": 64}


def triton_kernel(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """the fused Triton kernels: online softmax over K/V tiles held on chip (varlen: one stream cut by
    cu_seqlens); train: flash_attn_func / flash_attn_varlen_func, FlashAttention-2's backward
    recomputing the scores from the saved log-sum-exp"""
    args = dict(causal=w.causal, causal_align=w.causal_align, **w.local)
    if w.train:
        functions = _kernels(TRAIN_KERNELS)
        if w.docs is None:
            return run_mode(w, lambda: functions.flash_attn_func(w.q, w.k, w.v, **args))
        d = w.docs
        return run_mode(
            w,
            lambda: functions.flash_attn_varlen_func(
                w.q, w.k, w.v, d.cu_seqlens_q, d.cu_seqlens_k, d.max_seqlen_q, d.max_seqlen_k, **args
            )[: d.total_q],
        )
    kernels = _kernels(KERNEL[0])
    blocks = w.blocks or (INTERPRETER_BLOCKS if getattr(kernels, "INTERPRETED", False) else {})
    if w.docs is None:
        return getattr(kernels, KERNEL[1])(w.q, w.k, w.v, out=w.triton_out, **args, **blocks)
    d = w.docs
    return kernels.flash_attention_varlen_triton(
        w.q,
        w.k,
        w.v,
        d.cu_seqlens_q,
        d.cu_seqlens_k,
        d.max_seqlen_q,
        d.max_seqlen_k,
        out=w.triton_out,
        **args,
        **blocks,
    )[: d.total_q]


def tiled_per_document(w: AttentionWorkload) -> torch.Tensor:
    """The tiled loop on each packed document alone (the loop has no varlen form), into
    ``tiled_out``'s rows of that document (train: concatenated, so autograd sees every one)."""
    docs = w.docs
    assert docs is not None  # (torch_tiled calls this for varlen cases only)
    outs = []
    for rows_q, rows_k in docs.spans():
        q, k, v = (t[rows].transpose(0, 1)[None] for t, rows in ((w.q, rows_q), (w.k, rows_k), (w.v, rows_k)))
        out = None if w.train else w.tiled_out[rows_q].transpose(0, 1)[None]
        outs.append(
            flash_attention_torch(
                q, k, v, causal=w.causal, causal_align=w.causal_align, out=out, **w.blocks, **w.local
            )[0].transpose(0, 1)
        )
    return torch.cat(outs) if w.train else w.tiled_out[: docs.total_q]


def torch_tiled(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """the same online softmax as a loop of PyTorch tile operations (stands in where the kernel cannot
    run; varlen: one document at a time; train: autograd's backward through the loop)"""
    if w.docs is not None:
        return run_mode(w, lambda: tiled_per_document(w))
    return run_mode(
        w,
        lambda: flash_attention_torch(
            w.q,
            w.k,
            w.v,
            causal=w.causal,
            causal_align=w.causal_align,
            out=None if w.train else w.tiled_out,
            **w.blocks,
            **w.local,
        ),
    )


# -- peers --------------------------------------------------------------------------------------


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def local_mask(w: AttentionWorkload) -> torch.Tensor:
    """A sliding window's or a chunk's (seq_q, seq_k) boolean mask for SDPA's ``attn_mask`` (True:
    attend): SDPA has no local mask of its own, so a caller passes one, as transformers' sdpa path
    does (built once per forward and shared by the layers). Built on the first (checked, untimed)
    call and kept on the workload, so the timed calls pay only for reading it."""
    if w.sdpa_mask is None:
        seq_q, seq_k = w.q.shape[2], w.k.shape[2]
        pos_q, pos_k = torch.arange(seq_q, device=w.q.device), torch.arange(seq_k, device=w.q.device)
        offset = causal_offset(seq_q, seq_k, w.causal_align)
        w.sdpa_mask = visible_keys(pos_q[:, None], pos_k[None, :], offset, **w.local)
    return w.sdpa_mask


def _sdpa(w: AttentionWorkload, gqa: bool) -> torch.Tensor:
    """SDPA on the workload's padded batch; bottom-right causal with unequal lengths through torch's
    ``causal_lower_right`` bias (``is_causal`` is top-left); a sliding window or a chunk through an
    explicit boolean mask (:func:`local_mask`)."""
    if w.docs is not None:
        raise RuntimeError("SDPA takes padded batches; this case is varlen (flash_attn is its peer)")
    q, k, v = w.q, w.k, w.v
    heads, seq_q, seq_k = q.shape[1], q.shape[2], k.shape[2]
    if w.local["window"] or w.local["chunk"]:
        mask = local_mask(w)
        if heads == k.shape[1]:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if gqa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return F.scaled_dot_product_attention(q, _repeat_kv(k, heads), _repeat_kv(v, heads), attn_mask=mask)
    if w.causal and seq_q > seq_k and w.causal_align == "bottom_right":
        raise RuntimeError(
            "SDPA's lower-right causal bias gives NaN for query rows that see no key "
            f"(seq_len_q {seq_q} > seq_len {seq_k})"
        )
    if w.causal and seq_q != seq_k and w.causal_align == "bottom_right":
        # Imported here: torch.nn.attention.bias loads torch._dynamo (~1.3 s of CPU), which every
        # process that lists the techniques (a worker, the CLI) would otherwise pay.
        from torch.nn.attention.bias import causal_lower_right

        return F.scaled_dot_product_attention(
            q, _repeat_kv(k, heads), _repeat_kv(v, heads), attn_mask=causal_lower_right(seq_q, seq_k)
        )
    if heads == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=w.causal)
    if gqa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=w.causal, enable_gqa=True)
    return F.scaled_dot_product_attention(q, _repeat_kv(k, heads), _repeat_kv(v, heads), is_causal=w.causal)


# enable_gqa arrived in torch 2.5 (the ignore: TorchVersion compares with a tuple; its stub says str only)
SDPA_HAS_GQA = TorchVersion(torch.__version__) >= (2, 5)  # type: ignore[operator]


def sdpa_unavailable(device: torch.device, params: dict[str, Any] | None = None) -> str | None:
    """Why SDPA cannot take a case of ``params`` (None: it can): a local mask leaving some query row
    no key at all, where a boolean mask's softmax gives NaN."""
    if params is None or not (params.get("window") or params.get("chunk")) or params.get("varlen"):
        return None
    seq_k, seq_q = params["seq_len"], params["seq_len_q"] or params["seq_len"]
    if sees_no_key(seq_q, seq_k, params["causal"], params["causal_align"], params["window"], params["chunk"]):
        return (
            f"some query rows see no key (seq_len_q {seq_q} past seq_len {seq_k} and the "
            f"{'window' if params['window'] else 'chunk'}): SDPA's masked softmax gives NaN there"
        )
    return None


def run_sdpa(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """torch SDPA, default backend dispatch (enable_gqa when torch has it); padded batches only"""
    return run_mode(w, lambda: _sdpa(w, gqa=SDPA_HAS_GQA))


def needs_cuda(device: torch.device) -> str | None:
    return None if torch.device(device).type == "cuda" else "needs CUDA"  # GPU-only below: CUDA kernels


def pinned_unavailable(backend: SDPBackend) -> Callable[..., str | None]:
    """A pinned SDPA peer's reason to skip: no CUDA, a case :func:`sdpa_unavailable` refuses, or a
    local mask on the flash backend, which takes no ``attn_mask``."""

    def unavailable(device: torch.device, params: dict[str, Any] | None = None) -> str | None:
        reason = needs_cuda(device) or sdpa_unavailable(device, params)
        local = params is not None and bool(params.get("window") or params.get("chunk"))
        if reason is None and local and backend == SDPBackend.FLASH_ATTENTION:
            return "SDPA's flash backend takes no attention mask, and a sliding window or a chunk needs one"
        return reason

    return unavailable


# Backends that rejected enable_gqa but ran with repeated k/v heads: later calls go straight to
# repeating. Learned on the first (warm-up) call, so timed calls never pay for a failed attempt.
_NO_GQA_BACKENDS: set[str] = set()


def pinned_sdpa(
    name: str, backend: SDPBackend
) -> Callable[[AttentionWorkload], torch.Tensor | dict[str, torch.Tensor]]:
    def attend(w: AttentionWorkload) -> torch.Tensor:
        grouped = w.q.shape[1] != w.k.shape[1]
        with sdpa_kernel(backend):
            try:
                if grouped and SDPA_HAS_GQA and name not in _NO_GQA_BACKENDS:
                    try:
                        return _sdpa(w, gqa=True)
                    except RuntimeError:
                        out = _sdpa(w, gqa=False)
                        _NO_GQA_BACKENDS.add(name)
                        return out
                return _sdpa(w, gqa=False)
            except RuntimeError as exc:  # e.g. the flash backend has no float32 kernel
                raise RuntimeError(f"SDPA backend {backend.name} cannot run this case: {exc}") from exc

    return lambda w: run_mode(w, lambda: attend(w))


# SDPA's backends, each a peer pinned to it (CUDA only).
PINNED_BACKENDS = (
    ("sdpa_flash", SDPBackend.FLASH_ATTENTION),
    ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
    ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
    ("sdpa_math", SDPBackend.MATH),
)


def flash_attn_unavailable(device: torch.device, params: dict[str, Any] | None = None) -> str | None:
    imported = optional_import("flash_attn", "flash_attn_func")
    if isinstance(imported, str):
        return imported
    if params is not None and params.get("chunk"):
        return "flash-attn has no chunked local attention (its window_size is a sliding window only)"
    return needs_cuda(device)


def _flash_attn(w: AttentionWorkload) -> torch.Tensor:
    if w.causal and w.causal_align == "top_left" and w.params["seq_len_q"] not in (0, w.params["seq_len"]):
        raise RuntimeError("flash-attn aligns causal bottom-right only (since 2.1); this case is top_left")
    # flash-attn's window_size (left, right): query i' sees keys i' - left .. i' + right, so a window
    # of w keys up to the query's own is (w - 1, 0); (-1, -1) is none
    window = (w.local["window"] - 1, 0) if w.local["window"] else (-1, -1)
    if w.docs is not None:
        d = w.docs
        return optional_import("flash_attn", "flash_attn_varlen_func")(
            w.q,
            w.k,
            w.v,
            d.cu_seqlens_q,
            d.cu_seqlens_k,
            d.max_seqlen_q,
            d.max_seqlen_k,
            causal=w.causal,
            window_size=window,
        )[: d.total_q]
    out = optional_import("flash_attn", "flash_attn_func")(
        w.q.transpose(1, 2), w.k.transpose(1, 2), w.v.transpose(1, 2), causal=w.causal, window_size=window
    )
    return out.transpose(1, 2)


def run_flash_attn(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """The flash-attn package (Dao et al.): flash_attn_func on (batch, seq, heads, head_dim), or
    flash_attn_varlen_func on the packed stream; causal bottom-right, a sliding window as its window_size"""
    return run_mode(w, lambda: _flash_attn(w))
