"""flash_attention's workload: its dtypes and modes, :class:`AttentionWorkload` (q, k, v padded or
packed, the upstream gradient in train mode, the tiled variants' output buffers), the checks of its
tile params (:func:`block_problems`), :func:`build_workload`, and :func:`run_mode` (one attention
call, or its forward + backward in train mode).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from gpubench.contract import DTYPE_TOLERANCE, Workload
from gpubench.lib.attention import Documents
from gpubench.lib.gqa import head_problems, kv_heads

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HEAD_DIMS = [32, 64, 96, 128, 192, 256]  # 192 / 128: DeepSeek's MLA prefill (q/k 192, v 128); 256: Gemma 2/3
MODES = ("forward", "train")
OUTPUT_KEYS = ("out", "dq", "dk", "dv")
# Gradients pass through more rounded steps than the output (the recomputed probabilities, then
# dS = P * (dP - rowsum(dO * O)), a difference of nearby numbers). float32 keeps the output's 1e-5;
# 16-bit inputs: the eager baseline's own bf16 gradients err up to 5.2e-3 against float64 at small
# sizes (measured here: seeds 0-9, GQA, varlen, MLA's 192/128, causal and not), so 2e-2 leaves the
# kernels room for their different rounding. A wrong dq, dk or dv errs 0.1 or more.
TRAIN_TOLERANCE = {**DTYPE_TOLERANCE, torch.float16: 2e-2, torch.bfloat16: 2e-2}
# varlen: rows of random data after the last document, as in a packed buffer of fixed capacity
# (flash-attn reads nothing past cu_seqlens[-1]). Nothing attends to them and they attend to
# nothing: the output is compared on the documents' rows, and their gradients must be 0.
PACKED_TAIL_ROWS = 5


class LocalMask(TypedDict):
    """A case's local attention (:mod:`gpubench.lib.attention`), as keyword arguments of the
    attention functions: a sliding window or a chunk of that many keys, each 0 for none."""

    window: int
    chunk: int


@dataclass(kw_only=True)
class AttentionWorkload(Workload):
    q: torch.Tensor  # (batch, heads, seq_q, head_dim); varlen (total_q + PACKED_TAIL_ROWS, heads, head_dim)
    k: torch.Tensor  # (batch, kv_heads, seq_k, head_dim); varlen (total_k + PACKED_TAIL_ROWS, kv_heads, head_dim)
    v: torch.Tensor  # as k, with head_dim_v channels
    causal: bool
    causal_align: str
    local: LocalMask
    train: bool  # q, k, v require grad; every variant returns the output and dq, dk, dv
    grad_out: torch.Tensor | None  # train: the upstream gradient, shaped like the output (varlen: documents' rows)
    docs: Documents | None  # varlen: the packing
    blocks: dict[str, int]  # block_m and block_n for the tiled variants, or empty: their defaults
    # Where the two tiled variants write in forward mode, one buffer each (the harness makes every
    # checked call before checking any). NaN until their first (checked) call, so an element a
    # kernel never writes fails the check instead of inheriting a correct value from memory.
    triton_out: torch.Tensor
    tiled_out: torch.Tensor
    # SDPA's boolean mask of a sliding window or a chunk, made by its first call (attend.local_mask)
    sdpa_mask: torch.Tensor | None = None


def block_problems(params: dict[str, Any]) -> list[str]:
    """The head params' problems, block_m / block_n: both or neither, each a power of two >= 16,
    and window / chunk: each only with causal, not both."""
    problems = head_problems(params)
    window, chunk = params["window"], params["chunk"]
    if window and chunk:
        problems.append(
            f"window ({window}) and chunk ({chunk}) are two kinds of local attention: give one, or neither (0)"
        )
    for name, size in (("window", window), ("chunk", chunk)):
        if size and not params["causal"]:
            problems.append(
                f"{name} {size} needs causal: true (a sliding window or a chunk narrows the causal mask); "
                f"set causal: true or {name}: 0"
            )
        if size == 1 and params["mode"] == "train":
            # softmax over one key is constant: dq and dk are exactly 0, and a variant's rounding
            # noise (1e-7 in fp32) against a float64 reference's (1e-16) is no relative error
            problems.append(
                f"{name} 1 in train mode: each query sees only itself, so dq and dk are exactly 0 and "
                "cannot be checked by their relative error; use mode: forward or a size >= 2"
            )
    block_m, block_n = params["block_m"], params["block_n"]
    if (block_m == 0) != (block_n == 0):
        problems.append(f"give both block_m and block_n, or neither (got {block_m}, {block_n})")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block and (block < 16 or block & (block - 1)):
            problems.append(f"{name} must be a power of two >= 16, or 0 (got {block})")
    return problems


def build_workload(params: dict[str, Any], device: torch.device, seed: int) -> AttentionWorkload:
    device = torch.device(device)
    batch, heads, kv = params["batch"], params["heads"], kv_heads(params)
    dim, dim_v = params["head_dim"], params["head_dim_v"] or params["head_dim"]
    seq_k, seq_q = params["seq_len"], params["seq_len_q"] or params["seq_len"]
    gen = torch.Generator().manual_seed(seed)
    docs = None
    shapes: tuple[tuple[int, ...], ...]  # q's, k's and v's
    if params["varlen"]:
        lens_k = torch.randint(1, seq_k + 1, (batch,), generator=gen).tolist()
        lens_q = torch.randint(1, seq_q + 1, (batch,), generator=gen).tolist() if params["seq_len_q"] else lens_k
        docs = Documents.of(lens_q, lens_k, device)
        rows_q, rows_k = sum(lens_q) + PACKED_TAIL_ROWS, sum(lens_k) + PACKED_TAIL_ROWS
        shapes = ((rows_q, heads, dim), (rows_k, kv, dim), (rows_k, kv, dim_v))
    else:
        shapes = ((batch, heads, seq_q, dim), (batch, kv, seq_k, dim), (batch, kv, seq_k, dim_v))
    dtype, train = DTYPES[params["dtype"]], params["mode"] == "train"
    q, k, v = (torch.randn(*shape, generator=gen).to(device=device, dtype=dtype) for shape in shapes)
    out_shape = (*q.shape[:-1], dim_v)
    grad_shape = (docs.total_q, *out_shape[1:]) if docs is not None else out_shape
    grad_out = torch.randn(*grad_shape, generator=gen).to(device=device, dtype=dtype) if train else None
    # Gradients come back from torch.autograd.grad, never accumulated: no reset between calls.
    return AttentionWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        q=q.requires_grad_(train),
        k=k.requires_grad_(train),
        v=v.requires_grad_(train),
        causal=params["causal"],
        causal_align=params["causal_align"],
        local=LocalMask(window=params["window"], chunk=params["chunk"]),
        train=train,
        grad_out=grad_out,
        docs=docs,
        blocks={name: params[name] for name in ("block_m", "block_n") if params[name]},
        triton_out=torch.full(out_shape, float("nan"), dtype=dtype, device=device),
        tiled_out=torch.full(out_shape, float("nan"), dtype=dtype, device=device),
    )


def run_mode(w: AttentionWorkload, attend: Callable[[], torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
    """``attend()`` in forward mode; in train mode also its backward of ``grad_out``, returning
    the output and the gradients of q, k and v by name."""
    if not w.train:
        return attend()
    with torch.enable_grad():
        out = attend()
        grads = torch.autograd.grad(out, (w.q, w.k, w.v), w.grad_out)
    return dict(zip(OUTPUT_KEYS, (out.detach(), *grads)))
