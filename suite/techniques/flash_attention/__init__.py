"""flash_attention: eager attention (N x N scores in memory) against tiled online softmax (the
Triton kernels on CUDA, ``torch_tiled`` standing in elsewhere), checked against float64 attention.
``mode: train`` times forward + backward of a random upstream gradient in one call and checks the
gradients of q, k and v as well; ``varlen`` packs documents of random lengths into one stream
(flash-attn's varlen layout, cu_seqlens) and checks each document against itself run alone.
Peers: torch SDPA (default dispatch, and pinned to each CUDA backend) and flash-attn if installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.torch_version import TorchVersion

from gpubench.baselines.flash_attention import attention
from gpubench.contract import (
    DTYPE_TOLERANCE,
    Bench,
    CheckResult,
    Claim,
    Measured,
    Param,
    Plot,
    Technique,
    Workload,
    relative_l2_check,
    tensors_check,
)
from gpubench.lib.attention import (
    CAUSAL_ALIGNS,
    Documents,
    attention_bytes,
    attention_flops,
    attention_reference,
    attention_reference_varlen,
    reference_backward,
)
from gpubench.lib.gqa import head_params, head_problems, kv_heads
from gpubench.lib.optional import optional_import
from gpubench.lib.triton_support import interpreter_note, kernel_module, kernel_problem
from gpubench.optimizations.flash_attention import KERNEL, flash_attention_torch

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HEAD_DIMS = [32, 64, 96, 128, 192, 256]  # 192 / 128: DeepSeek's MLA prefill (q/k 192, v 128); 256: Gemma 2/3
MODES = ("forward", "train")
# The autograd functions of the Triton forward + backward (FlashAttention-2's recomputation from lse).
TRAIN_KERNELS = "gpubench.lib.kernels.flash_attention_triton_bwd"
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

TECHNIQUE = Technique(
    name="flash_attention",
    shape="kernel",
    summary="Exact attention by tiles with an online softmax, never storing the N x N scores; forward, "
    "or forward + backward (train); padded batches or packed variable-length documents.",
    anchor="FA2: 50-73% of peak on A100; FA3: 740 TFLOP/s fp16 on H100 (75% of peak)",
    claims=[
        Claim(
            "Dao, FlashAttention-2 (2023)",
            "https://arxiv.org/abs/2307.08691",
            text="50-73% of the A100's 312 TFLOP/s fp16/bf16 peak, forward (156-228 TFLOP/s)",
            figure=(156.0, 228.0),
            unit="tflops",
            reads="tflops",
            per_time=True,
            gpus=("A100",),
            measures="attention forward throughput of the fused kernel",
            conditions="A100 80GB, fp16/bf16, head_dim 64 or 128, seq_len 512-16k, batch x seq_len = 16k",
            when={
                "dtype": ("in", ("float16", "bfloat16")),
                "head_dim": ("in", (64, 128)),
                "seq_len": (">=", 512),
                "mode": ("==", "forward"),
                "varlen": ("==", False),
            },
            caveat="measured: the optimized variant (gpubench's Triton kernel, FA2's algorithm), "
            "not the FA2 CUDA kernel",
            device_reason="the win is HBM traffic of a fused GPU kernel",
        ),
        Claim(
            "Shah et al., FlashAttention-3 (2024)",
            "https://arxiv.org/abs/2407.08608",
            text="up to 740 TFLOP/s fp16 on H100 (75% of peak)",
            figure=(740.0, 740.0),
            unit="tflops",
            reads="tflops",
            per_time=True,
            gpus=("H100", "H200"),
            measures="attention forward throughput of the fused kernel",
            conditions="H100 SXM5, fp16, long sequences",
            when={
                "dtype": ("in", ("float16", "bfloat16")),
                "seq_len": (">=", 512),
                "mode": ("==", "forward"),
                "varlen": ("==", False),
            },
            caveat="measured: gpubench's Triton kernel (FA2's algorithm), not FA3's warp-specialized "
            "Hopper kernel; an H200 has the H100's compute with more HBM",
            device_reason="the win is HBM traffic of a fused GPU kernel",
        ),
    ],
    gpu_specific=(
        "The win is HBM traffic: on a GPU the fused kernels keep each score tile on chip instead "
        "of writing N x N scores to memory and reading them back (the backward recomputes them from "
        "the saved log-sum-exp instead of keeping them). On a CPU the optimized role is played by "
        "torch_tiled, the same forward algorithm as a PyTorch loop, which runs from caches and pays "
        "Python overhead per tile; in train mode autograd records every tile's intermediates for "
        "its backward, so neither its time nor its memory says anything about a GPU's. What a CPU "
        "run does show: the values, the gradients and the packing are right."
    ),
    params=[
        Param("batch", int, 2, "sequences per call; varlen: documents packed into one stream", min=1),
        *head_params(heads=4),
        Param(
            "seq_len",
            int,
            256,
            "keys per sequence (and queries, unless seq_len_q); varlen: the longest "
            "document, each document's length drawn uniformly from 1..seq_len",
            min=1,
        ),
        Param(
            "seq_len_q",
            int,
            0,
            "queries per sequence, 0: seq_len; fewer than the keys is a chunk of "
            "queries at the end of a KV cache (chunked prefill, several tokens decoded at once); varlen: "
            "each document's query length drawn from 1..seq_len_q",
            min=0,
        ),
        Param("head_dim", int, 64, "channels per head of q and k", choices=HEAD_DIMS),
        Param(
            "head_dim_v",
            int,
            0,
            "channels per head of v and the output; 0: head_dim (DeepSeek's MLA prefill: head_dim 192, head_dim_v 128)",
            choices=[0, *HEAD_DIMS],
        ),
        Param("dtype", str, "float32", "dtype of q, k, v and the output", choices=["float32", "float16", "bfloat16"]),
        Param("causal", bool, False, "each query sees only keys up to its own position"),
        Param(
            "causal_align",
            str,
            "bottom_right",
            "where the causal diagonal sits when queries and keys "
            "differ in number: bottom_right (flash-attn >= 2.1 and serving engines: query i sees keys "
            "j <= i + seq_len - seq_len_q) or top_left (SDPA's is_causal: j <= i); the same for equal lengths",
            choices=list(CAUSAL_ALIGNS),
        ),
        Param(
            "mode",
            str,
            "forward",
            "forward, or train: forward and the backward of a random upstream "
            "gradient timed together as one call (peak memory of both), dq, dk, dv checked too",
            choices=list(MODES),
        ),
        Param(
            "varlen",
            bool,
            False,
            "documents of random lengths packed into one stream (flash-attn's "
            "varlen layout, cu_seqlens), never attending across documents; the eager baseline pads them "
            "to the longest with a mask",
        ),
        # Fixed tiles let a short sequence cross several query and key tiles (the rescaling, the
        # causal skip and the ragged edges), where the default tiles would hold it whole.
        Param(
            "block_m",
            int,
            0,
            "query rows per tile of the tiled forward variants, a power of two >= 16 "
            "(0: the kernel's autotuned tiles, the loop's 1024); train mode's Triton backward tunes its own",
            min=0,
        ),
        Param("block_n", int, 0, "keys per tile, as block_m (0: autotuned, the loop's 512)", min=0),
    ],
    plots=[
        Plot(
            "Attention throughput (TFLOP/s) against sequence length",
            y="tflops",
            x="seq_len",
            panels=("head_dim", "causal"),
            ylabel="TFLOP/s",
        ),
        Plot(
            "Peak memory of one call (MiB) against sequence length: the scores grow as N^2",
            y="peak_memory",
            x="seq_len",
            panels=("head_dim", "causal"),
            ylabel="peak MiB",
            scale=2**-20,
            log_y=True,
        ),
    ],
    benchmarks=[
        Bench(name, {"batch": 1, "heads": 4, "seq_len": 512, "causal": causal, "mode": mode})
        for name, causal, mode in (
            ("full", False, "forward"),
            ("causal", True, "forward"),
            ("causal-train", True, "train"),
        )
    ],
)


@dataclass(kw_only=True)
class AttentionWorkload(Workload):
    q: torch.Tensor  # (batch, heads, seq_q, head_dim); varlen (total_q + PACKED_TAIL_ROWS, heads, head_dim)
    k: torch.Tensor  # (batch, kv_heads, seq_k, head_dim); varlen (total_k + PACKED_TAIL_ROWS, kv_heads, head_dim)
    v: torch.Tensor  # as k, with head_dim_v channels
    causal: bool
    causal_align: str
    train: bool  # q, k, v require grad; every variant returns the output and dq, dk, dv
    grad_out: torch.Tensor | None  # train: the upstream gradient, shaped like the output (varlen: documents' rows)
    docs: Documents | None  # varlen: the packing
    blocks: dict[str, int]  # block_m and block_n for the tiled variants, or empty: their defaults
    # Where the two tiled variants write in forward mode, one buffer each (the harness makes every
    # checked call before checking any). NaN until their first (checked) call, so an element a
    # kernel never writes fails the check instead of inheriting a correct value from memory.
    triton_out: torch.Tensor
    tiled_out: torch.Tensor


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    problems = head_problems(params)
    block_m, block_n = params["block_m"], params["block_n"]
    if (block_m == 0) != (block_n == 0):
        problems.append(f"give both block_m and block_n, or neither (got {block_m}, {block_n})")
    for name, block in (("block_m", block_m), ("block_n", block_n)):
        if block and (block < 16 or block & (block - 1)):
            problems.append(f"{name} must be a power of two >= 16, or 0 (got {block})")
    return problems


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> AttentionWorkload:
    device = torch.device(device)
    batch, heads, kv = params["batch"], params["heads"], kv_heads(params)
    dim, dim_v = params["head_dim"], params["head_dim_v"] or params["head_dim"]
    seq_k, seq_q = params["seq_len"], params["seq_len_q"] or params["seq_len"]
    gen = torch.Generator().manual_seed(seed)
    docs = None
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


# -- the pair -----------------------------------------------------------------------------------


def padded_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, docs: Documents, causal: bool, causal_align: str
) -> torch.Tensor:
    """Packed documents the eager way (Hugging Face's eager path with an attention mask): scattered
    into a zero-padded (documents, heads, longest, dim) batch, scores materialized and masked past
    each document's own keys (and by its causal diagonal), fp32 softmax, @ V, gathered back to the
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
    visible = visible[:, None]  # (n, 1, longest_q, longest_k)
    scores = torch.matmul(qp, kp.transpose(-2, -1)) * dim**-0.5
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1, dtype=torch.float32)
    # Padding rows and rows that see no key softmax to NaN: weights 0 there instead.
    probs = probs.masked_fill(~visible.any(dim=-1, keepdim=True), 0.0).to(v.dtype)
    out = torch.matmul(probs, vp).transpose(1, 2).flatten(0, 1)  # (n * longest_q, heads, head_dim_v)
    return out.index_select(0, rows_q)


@TECHNIQUE.variant("eager", role="baseline")
def eager(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """materialized scores, float32 softmax, @ V (Hugging Face's eager path); varlen: the documents
    padded to the longest with a mask; train: autograd's backward through it"""
    if w.docs is not None:
        return run_mode(w, lambda: padded_attention(w.q, w.k, w.v, w.docs, w.causal, w.causal_align))
    return run_mode(w, lambda: attention(w.q, w.k, w.v, causal=w.causal, causal_align=w.causal_align))


def _kernel_problem(device: torch.device) -> str | None:
    """On CUDA, or in Triton's interpreter on a CPU (checked there, never timed)."""
    return kernel_problem(KERNEL[0], device, interpreter_ok=True) or kernel_problem(
        TRAIN_KERNELS, device, interpreter_ok=True
    )


# Forward tiles where Triton's interpreter runs a case that fixes none (on a GPU the autotuner
# picks them): one of the GPU's candidate tiles, with BLOCK_M != BLOCK_N as the causal split
# wants. The interpreter runs a program per tile in NumPy: with these 1024 tokens take ~1-2 s on a
# 2-core AMD EPYC, with its own 32 x 16 ~25 s.
INTERPRETER_BLOCKS = {"block_m": 128, "block_n": 64}


@TECHNIQUE.variant("triton", role="optimized", unavailable=_kernel_problem, checked_only=interpreter_note(KERNEL[0]))
def triton_kernel(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """the fused Triton kernels: online softmax over K/V tiles held on chip (varlen: one stream cut by
    cu_seqlens); train: flash_attn_func / flash_attn_varlen_func, FlashAttention-2's backward
    recomputing the scores from the saved log-sum-exp"""
    args = dict(causal=w.causal, causal_align=w.causal_align)
    if w.train:
        functions = kernel_module(TRAIN_KERNELS)
        if w.docs is None:
            return run_mode(w, lambda: functions.flash_attn_func(w.q, w.k, w.v, **args))
        d = w.docs
        return run_mode(
            w,
            lambda: functions.flash_attn_varlen_func(
                w.q, w.k, w.v, d.cu_seqlens_q, d.cu_seqlens_k, d.max_seqlen_q, d.max_seqlen_k, **args
            )[: d.total_q],
        )
    kernels = kernel_module(KERNEL[0])
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
    outs = []
    for rows_q, rows_k in w.docs.spans():
        q, k, v = (t[rows].transpose(0, 1)[None] for t, rows in ((w.q, rows_q), (w.k, rows_k), (w.v, rows_k)))
        out = None if w.train else w.tiled_out[rows_q].transpose(0, 1)[None]
        outs.append(
            flash_attention_torch(q, k, v, causal=w.causal, causal_align=w.causal_align, out=out, **w.blocks)[
                0
            ].transpose(0, 1)
        )
    return torch.cat(outs) if w.train else w.tiled_out[: w.docs.total_q]


@TECHNIQUE.variant("torch_tiled", role="optimized")
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
        ),
    )


# -- peers --------------------------------------------------------------------------------------


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _sdpa(w: AttentionWorkload, gqa: bool) -> torch.Tensor:
    """SDPA on the workload's padded batch; bottom-right causal with unequal lengths through torch's
    ``causal_lower_right`` bias (``is_causal`` is top-left)."""
    if w.docs is not None:
        raise RuntimeError("SDPA takes padded batches; this case is varlen (flash_attn is its peer)")
    q, k, v = w.q, w.k, w.v
    heads, seq_q, seq_k = q.shape[1], q.shape[2], k.shape[2]
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


SDPA_HAS_GQA = TorchVersion(torch.__version__) >= (2, 5)  # enable_gqa arrived in torch 2.5


@TECHNIQUE.variant("sdpa")
def run_sdpa(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """torch SDPA, default backend dispatch (enable_gqa when torch has it); padded batches only"""
    return run_mode(w, lambda: _sdpa(w, gqa=SDPA_HAS_GQA))


def _needs_cuda(device: torch.device) -> str | None:
    return None if torch.device(device).type == "cuda" else "needs CUDA"


# Backends that rejected enable_gqa but ran with repeated k/v heads: later calls go straight to
# repeating. Learned on the first (warm-up) call, so timed calls never pay for a failed attempt.
_NO_GQA_BACKENDS: set[str] = set()


def _pinned_sdpa(name: str, backend: SDPBackend) -> Callable[[Workload], Any]:
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


for _name, _backend in (
    ("sdpa_flash", SDPBackend.FLASH_ATTENTION),
    ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
    ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
    ("sdpa_math", SDPBackend.MATH),
):
    TECHNIQUE.variant(
        _name,
        description=f"torch SDPA pinned to the {_backend.name} backend "
        "(repeats k/v heads when that backend has no GQA path); padded batches only",
        unavailable=_needs_cuda,
    )(_pinned_sdpa(_name, _backend))


def _flash_attn_unavailable(device: torch.device) -> str | None:
    imported = optional_import("flash_attn", "flash_attn_func")
    return imported if isinstance(imported, str) else _needs_cuda(device)


def _flash_attn(w: AttentionWorkload) -> torch.Tensor:
    if w.causal and w.causal_align == "top_left" and w.params["seq_len_q"] not in (0, w.params["seq_len"]):
        raise RuntimeError("flash-attn aligns causal bottom-right only (since 2.1); this case is top_left")
    if w.docs is not None:
        d = w.docs
        return optional_import("flash_attn", "flash_attn_varlen_func")(
            w.q, w.k, w.v, d.cu_seqlens_q, d.cu_seqlens_k, d.max_seqlen_q, d.max_seqlen_k, causal=w.causal
        )[: d.total_q]
    out = optional_import("flash_attn", "flash_attn_func")(
        w.q.transpose(1, 2), w.k.transpose(1, 2), w.v.transpose(1, 2), causal=w.causal
    )
    return out.transpose(1, 2)


@TECHNIQUE.variant("flash_attn", unavailable=_flash_attn_unavailable)
def run_flash_attn(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """The flash-attn package (Dao et al.): flash_attn_func on (batch, seq, heads, head_dim), or
    flash_attn_varlen_func on the packed stream; causal bottom-right"""
    return run_mode(w, lambda: _flash_attn(w))


# -- correctness ------------------------------------------------------------------------------


def _reference_varlen_backward(w: AttentionWorkload, out: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:func:`reference_backward` of each packed document alone, into packed gradients."""
    grads = [torch.zeros(t.shape, dtype=torch.float64, device=t.device) for t in (w.q, w.k, w.v)]
    as_batch = lambda t: t.transpose(0, 1)[None]
    for rows_q, rows_k in w.docs.spans():
        doc = reference_backward(
            as_batch(w.q[rows_q]),
            as_batch(w.k[rows_k]),
            as_batch(w.v[rows_k]),
            as_batch(out[rows_q]),
            lse[None, :, rows_q],
            as_batch(w.grad_out[rows_q]),
            w.causal,
            w.causal_align,
        )
        for grad, rows, part in zip(grads, (rows_q, rows_k, rows_k), doc):
            grad[rows] = part[0].transpose(0, 1)
    return tuple(grads)


@TECHNIQUE.reference
def reference(w: AttentionWorkload) -> torch.Tensor | dict[str, torch.Tensor]:
    """Attention in float64 (``attention_reference``; varlen: each document alone, the documents'
    rows); train mode adds dq, dk, dv by :func:`reference_backward`, a chunk of query rows at a
    time (varlen: exactly 0 on the tail after the last document)."""
    args = dict(causal=w.causal, causal_align=w.causal_align, return_lse=w.train)
    with torch.no_grad():
        if w.docs is None:
            result = attention_reference(w.q, w.k, w.v, **args)
        else:
            result = attention_reference_varlen(w.q, w.k, w.v, w.docs.cu_seqlens_q, w.docs.cu_seqlens_k, **args)
        if not w.train:
            return result
        out, lse = result
        if w.docs is None:
            grads = reference_backward(w.q, w.k, w.v, out, lse, w.grad_out, w.causal, w.causal_align)
        else:
            grads = _reference_varlen_backward(w, out, lse)
    return dict(zip(OUTPUT_KEYS, (out, *grads)))


@TECHNIQUE.check
def check(reference_output: torch.Tensor | dict[str, torch.Tensor], output: Any) -> CheckResult:
    """Forward: the output's relative L2 error within its dtype's tolerance. Train: the output and
    dq, dk, dv by name, the worst relative L2 error within TRAIN_TOLERANCE of the output's dtype."""
    if not isinstance(reference_output, dict):
        return relative_l2_check(reference_output, output)
    out = output.get("out") if isinstance(output, dict) else None
    return tensors_check(
        reference_output, output, TRAIN_TOLERANCE, dtype=out.dtype if isinstance(out, torch.Tensor) else None
    )


# -- metrics ----------------------------------------------------------------------------------


@TECHNIQUE.metrics
def metrics(w: AttentionWorkload, measured: Measured) -> dict[str, Any]:
    heads, head_dim, head_dim_v = w.q.shape[1], w.q.shape[-1], w.v.shape[-1]  # heads: dim 1 in both layouts
    if w.docs is None:
        problems = [(w.q.shape[0], w.q.shape[2], w.k.shape[2])]
    else:
        problems = [(1, n_q, n_k) for n_q, n_k in zip(w.docs.lens_q, w.docs.lens_k)]
    forward = sum(
        attention_flops(b, heads, s_q, s_k, head_dim, head_dim_v, w.causal, w.causal_align) for b, s_q, s_k in problems
    )
    tokens = sum(b * s_q for b, s_q, _ in problems)
    q, k, v = (
        (w.q, w.k, w.v) if w.docs is None else (w.q[: w.docs.total_q], w.k[: w.docs.total_k], w.v[: w.docs.total_k])
    )
    out: dict[str, Any] = {"bytes_moved": attention_bytes(q, k, v, w.train), "tokens_per_s": tokens / measured.median_s}
    if w.train:
        # The flash-attention repository's benchmark: backward 2.5x the forward, a step 3.5x.
        out.update(flops=forward * 7 // 2, forward_flops=forward, backward_flops=forward * 5 // 2)
    else:
        out["flops"] = forward
    return out
