"""flash_attention: eager attention (N x N scores in memory) against tiled online softmax (the
Triton kernel on CUDA, ``torch_tiled`` standing in elsewhere), checked against float64 attention.
Peers: torch SDPA (default dispatch, and pinned to each CUDA backend) and flash-attn if installed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.torch_version import TorchVersion

from gpubench.baselines.flash_attention import attention
from gpubench.gqa import head_params, head_problems, kv_heads
from gpubench.contract import Claim, Measured, Param, Plot, Technique, Workload, relative_l2_check
from gpubench.optimizations.flash_attention import KERNEL, flash_attention_torch
from gpubench.optional import optional_import
from gpubench.triton_support import kernel_module, kernel_problem

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Scores held at once by the reference, in float64 elements (256 MiB).
REFERENCE_CHUNK_ELEMENTS = 2**25

TECHNIQUE = Technique(
    name="flash_attention",
    shape="kernel",
    summary="Exact attention by tiles with an online softmax, never storing the N x N scores.",
    anchor="FA2: 50-73% of peak on A100; FA3: 740 TFLOP/s fp16 on H100 (75% of peak)",
    claims=[Claim("Dao, FlashAttention-2 (2023)", "https://arxiv.org/abs/2307.08691",
                  text="50-73% of the A100's 312 TFLOP/s fp16/bf16 peak, forward (156-228 TFLOP/s)",
                  figure=(156.0, 228.0), unit="tflops", reads="tflops", per_time=True, gpus=("A100",),
                  measures="attention forward throughput of the fused kernel",
                  conditions="A100 80GB, fp16/bf16, head_dim 64 or 128, seq_len 512-16k, batch x seq_len = 16k",
                  when={"dtype": ("in", ("float16", "bfloat16")), "head_dim": ("in", (64, 128)),
                        "seq_len": (">=", 512)},
                  caveat="measured: the optimized variant (gpubench's Triton kernel, FA2's algorithm), "
                         "not the FA2 CUDA kernel",
                  device_reason="the win is HBM traffic of a fused GPU kernel"),
            Claim("Shah et al., FlashAttention-3 (2024)", "https://arxiv.org/abs/2407.08608",
                  text="up to 740 TFLOP/s fp16 on H100 (75% of peak)", figure=(740.0, 740.0), unit="tflops",
                  reads="tflops", per_time=True, gpus=("H100", "H200"),
                  measures="attention forward throughput of the fused kernel",
                  conditions="H100 SXM5, fp16, long sequences",
                  when={"dtype": ("in", ("float16", "bfloat16")), "seq_len": (">=", 512)},
                  caveat="measured: gpubench's Triton kernel (FA2's algorithm), not FA3's warp-specialized "
                         "Hopper kernel; an H200 has the H100's compute with more HBM",
                  device_reason="the win is HBM traffic of a fused GPU kernel")],
    gpu_specific=(
        "The win is HBM traffic: on a GPU the fused kernel keeps each score tile on chip instead "
        "of writing N x N scores to memory and reading them back. On a CPU the optimized role is "
        "played by torch_tiled, the same algorithm as a PyTorch loop, which runs from caches and "
        "pays Python overhead per tile, so its ratio says little about a GPU's."
    ),
    params=[
        Param("batch", int, 2, "sequences per call", min=1),
        *head_params(heads=4),
        Param("seq_len", int, 256, "tokens per sequence (queries and keys)", min=1),
        Param("head_dim", int, 64, "channels per head", choices=[32, 64, 96, 128]),
        Param("dtype", str, "float32", "dtype of q, k, v and the output",
              choices=["float32", "float16", "bfloat16"]),
        Param("causal", bool, False, "query i sees keys 0..i only"),
        # Fixed tiles let a short sequence cross several query and key tiles (the rescaling, the
        # causal skip and the ragged edges), where the default tiles would hold it whole.
        Param("block_m", int, 0, "query rows per tile of the tiled variants, a power of two >= 16 "
              "(0: the kernel's autotuned tiles, the loop's 1024)", min=0),
        Param("block_n", int, 0, "keys per tile, as block_m (0: autotuned, the loop's 512)", min=0),
    ],
    plots=[
        Plot("Attention throughput (TFLOP/s) against sequence length", y="tflops", x="seq_len",
             panels=("head_dim", "causal"), ylabel="TFLOP/s"),
        Plot("Peak memory of one call (MiB) against sequence length: the scores grow as N^2",
             y="peak_memory", x="seq_len", panels=("head_dim", "causal"), ylabel="peak MiB",
             scale=2**-20, log_y=True),
    ],
)


@dataclass(kw_only=True)
class AttentionWorkload(Workload):
    q: torch.Tensor  # (batch, heads, seq, head_dim)
    k: torch.Tensor  # (batch, kv_heads, seq, head_dim)
    v: torch.Tensor
    causal: bool
    blocks: dict[str, int]  # block_m and block_n for the tiled variants, or empty: their defaults
    # Where the two tiled variants write, one buffer each (the harness makes every checked call
    # before checking any). NaN until their first (checked) call, so an element a kernel never
    # writes fails the check instead of inheriting a correct value from memory.
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
    batch, heads, seq, dim = params["batch"], params["heads"], params["seq_len"], params["head_dim"]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(batch, h, seq, dim, generator=gen).to(device=device, dtype=DTYPES[params["dtype"]])
               for h in (heads, kv_heads(params), kv_heads(params)))
    return AttentionWorkload(params=dict(params), device=device, seed=seed, q=q, k=k, v=v, causal=params["causal"],
                             blocks={name: params[name] for name in ("block_m", "block_n") if params[name]},
                             triton_out=torch.full_like(q, float("nan")), tiled_out=torch.full_like(q, float("nan")))


@TECHNIQUE.variant("eager", role="baseline")
def eager(w: AttentionWorkload) -> torch.Tensor:
    """materialized scores, float32 softmax, @ V (Hugging Face's eager path)"""
    return attention(w.q, w.k, w.v, causal=w.causal)


@TECHNIQUE.variant("triton", role="optimized", unavailable=lambda device: kernel_problem(KERNEL[0], device))
def triton_kernel(w: AttentionWorkload) -> torch.Tensor:
    """the fused Triton kernel: online softmax over K/V tiles held on chip"""
    return getattr(kernel_module(KERNEL[0]), KERNEL[1])(w.q, w.k, w.v, causal=w.causal, out=w.triton_out, **w.blocks)


@TECHNIQUE.variant("torch_tiled", role="optimized")
def torch_tiled(w: AttentionWorkload) -> torch.Tensor:
    """the same online softmax as a loop of PyTorch tile operations (stands in where the kernel cannot run)"""
    return flash_attention_torch(w.q, w.k, w.v, causal=w.causal, out=w.tiled_out, **w.blocks)


def _repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, gqa: bool) -> torch.Tensor:
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    if gqa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    heads = q.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(k, heads), _repeat_kv(v, heads), is_causal=causal)


SDPA_HAS_GQA = TorchVersion(torch.__version__) >= (2, 5)  # enable_gqa arrived in torch 2.5


@TECHNIQUE.variant("sdpa")
def run_sdpa(w: AttentionWorkload) -> torch.Tensor:
    """torch SDPA, default backend dispatch (enable_gqa when torch has it)."""
    return _sdpa(w.q, w.k, w.v, w.causal, gqa=SDPA_HAS_GQA)


def _needs_cuda(device: torch.device) -> str | None:
    return None if torch.device(device).type == "cuda" else "needs CUDA"


# Backends that rejected enable_gqa but ran with repeated k/v heads: later calls go straight to
# repeating. Learned on the first (warm-up) call, so timed calls never pay for a failed attempt.
_NO_GQA_BACKENDS: set[str] = set()


def _pinned_sdpa(name: str, backend: SDPBackend) -> Callable[[Workload], torch.Tensor]:
    def run(w: AttentionWorkload) -> torch.Tensor:
        grouped = w.q.shape[1] != w.k.shape[1]
        with sdpa_kernel(backend):
            try:
                if grouped and SDPA_HAS_GQA and name not in _NO_GQA_BACKENDS:
                    try:
                        return _sdpa(w.q, w.k, w.v, w.causal, gqa=True)
                    except RuntimeError:
                        out = _sdpa(w.q, w.k, w.v, w.causal, gqa=False)
                        _NO_GQA_BACKENDS.add(name)
                        return out
                return _sdpa(w.q, w.k, w.v, w.causal, gqa=False)
            except RuntimeError as exc:  # e.g. the flash backend has no float32 kernel
                raise RuntimeError(f"SDPA backend {backend.name} cannot run this case: {exc}") from exc

    return run


for _name, _backend in (("sdpa_flash", SDPBackend.FLASH_ATTENTION),
                        ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION),
                        ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_math", SDPBackend.MATH)):
    TECHNIQUE.variant(_name, description=f"torch SDPA pinned to the {_backend.name} backend "
                      "(repeats k/v heads when that backend has no GQA path)",
                      unavailable=_needs_cuda)(_pinned_sdpa(_name, _backend))


def _flash_attn_unavailable(device: torch.device) -> str | None:
    imported = optional_import("flash_attn", "flash_attn_func")
    return imported if isinstance(imported, str) else _needs_cuda(device)


@TECHNIQUE.variant("flash_attn", unavailable=_flash_attn_unavailable)
def run_flash_attn(w: AttentionWorkload) -> torch.Tensor:
    """The flash-attn package (Dao et al.), layout (batch, seq, heads, head_dim)."""
    flash_attn_func = optional_import("flash_attn", "flash_attn_func")
    out = flash_attn_func(w.q.transpose(1, 2), w.k.transpose(1, 2), w.v.transpose(1, 2), causal=w.causal)
    return out.transpose(1, 2)


# -- correctness ------------------------------------------------------------------------------

@TECHNIQUE.reference
def reference(w: AttentionWorkload) -> torch.Tensor:
    """Attention in float64, a chunk of query rows at a time so memory stays bounded."""
    q, k, v = (t.to(torch.float64) for t in (w.q, w.k, w.v))
    batch, heads, seq_q, head_dim = q.shape
    kv_heads, seq_k = k.shape[1], k.shape[2]
    q = q.unflatten(1, (kv_heads, heads // kv_heads))  # (b, kv_heads, group, s, d)
    out = torch.empty_like(q)
    rows = max(1, REFERENCE_CHUNK_ELEMENTS // (batch * heads * seq_k))
    key_pos = torch.arange(seq_k, device=q.device)
    for start in range(0, seq_q, rows):
        stop = min(start + rows, seq_q)
        scores = torch.einsum("bkgqd,bknd->bkgqn", q[:, :, :, start:stop], k) * head_dim ** -0.5
        if w.causal:
            query_pos = torch.arange(start, stop, device=q.device)
            scores.masked_fill_(key_pos[None, :] > query_pos[:, None], float("-inf"))
        out[:, :, :, start:stop] = torch.einsum("bkgqn,bknd->bkgqd", scores.softmax(dim=-1), v)
    return out.flatten(1, 2)


check = TECHNIQUE.check(relative_l2_check)


# -- metrics ----------------------------------------------------------------------------------

def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> int:
    """Forward FLOPs as the flash-attention repository counts them: two matmuls of
    2 * seq^2 * head_dim each per head, halved when causal."""
    flops = 4 * batch * seq_len * seq_len * heads * head_dim
    return flops // 2 if causal else flops


def attention_bytes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Least HBM traffic one call can do: read q, k, v once and write an output shaped like q."""
    return (2 * q.numel() * q.element_size() + k.numel() * k.element_size()
            + v.numel() * v.element_size())


@TECHNIQUE.metrics
def metrics(w: AttentionWorkload, measured: Measured) -> dict[str, Any]:
    batch, heads, seq_len, head_dim = w.q.shape
    return {
        "flops": attention_flops(batch, heads, seq_len, head_dim, w.causal),
        "bytes_moved": attention_bytes(w.q, w.k, w.v),
        "tokens_per_s": batch * seq_len / measured.median_s,
    }
