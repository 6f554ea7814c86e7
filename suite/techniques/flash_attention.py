"""flash_attention: eager attention (N x N scores in memory) against tiled online softmax (a
fused Triton kernel on CUDA, a PyTorch tile loop on CPU).

Peers: torch SDPA with its default dispatch, SDPA pinned to each CUDA backend, and the
flash-attn package when it is installed. The ground truth is float64 attention.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.torch_version import TorchVersion

from gpubench.baselines.flash_attention import attention
from gpubench.contract import CheckResult, Measured, Param, Technique, Workload, relative_l2_check
from gpubench.optimizations.flash_attention import flash_attention

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# Relative L2 error allowed against the float64 reference, by the output's dtype.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# Scores held at once by the reference, in float64 elements (256 MiB).
REFERENCE_CHUNK_ELEMENTS = 2**25

TECHNIQUE = Technique(
    name="flash_attention",
    shape="kernel",
    summary="Exact attention by tiles with an online softmax, never storing the N x N scores.",
    anchor="FA2: 50-73% of peak on A100; FA3: 740 TFLOP/s fp16 on H100 (75% of peak)",
    gpu_specific=(
        "The win is HBM traffic: on a GPU the fused kernel keeps each score tile on chip instead "
        "of writing N x N scores to memory and reading them back. A CPU runs the tiled loop from "
        "caches and pays Python overhead per tile, so its ratio says little about a GPU's. On a "
        "CPU the optimized variant is the tiled PyTorch loop; on CUDA it is the fused Triton kernel."
    ),
    params=[
        Param("batch", int, 2, "sequences per call", min=1),
        Param("heads", int, 4, "query heads", min=1),
        Param("kv_heads", int, 0, "key/value heads (GQA); 0 means the same as heads", min=0),
        Param("seq_len", int, 256, "tokens per sequence (queries and keys)", min=1),
        Param("head_dim", int, 64, "channels per head", choices=[32, 64, 96, 128]),
        Param("dtype", str, "float32", "dtype of q, k, v and the output",
              choices=["float32", "float16", "bfloat16"]),
        Param("causal", bool, False, "query i sees keys 0..i only"),
    ],
)


def _kv_heads(params: dict[str, Any]) -> int:
    return params["kv_heads"] or params["heads"]


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    heads, kv_heads = params["heads"], _kv_heads(params)
    if heads % kv_heads != 0:
        return [f"heads ({heads}) must be divisible by kv_heads ({kv_heads})"]
    return []


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> Workload:
    workload = Workload(params=dict(params), device=torch.device(device), seed=seed)
    batch, heads, seq, dim = params["batch"], params["heads"], params["seq_len"], params["head_dim"]
    kv_heads = _kv_heads(params)
    dtype = DTYPES[params["dtype"]]
    gen = workload.generator()
    # Drawn on the CPU in float32, then moved: the same values on every device.
    q, k, v = (torch.randn(batch, h, seq, dim, generator=gen).to(device=workload.device, dtype=dtype)
               for h in (heads, kv_heads, kv_heads))
    # The optimized variant writes into this NaN-filled buffer: its checked call is its first, so
    # an element the kernel never writes stays NaN and fails the check (a fresh torch.empty could
    # hand back memory that already holds a correct answer from an earlier call).
    workload.inputs.update(q=q, k=k, v=v, causal=params["causal"], out=torch.full_like(q, float("nan")))
    return workload


# -- variants ---------------------------------------------------------------------------------

@TECHNIQUE.variant("baseline", role="baseline")
def run_baseline(w: Workload) -> torch.Tensor:
    """Eager attention: materialized scores, float32 softmax, @ V (Hugging Face's eager path)."""
    return attention(w.q, w.k, w.v, causal=w.causal)


@TECHNIQUE.variant("optimized", role="optimized",
                   description="Online-softmax attention by tiles, never storing N x N: the fused Triton "
                               "kernel on CUDA, the tiled PyTorch loop on CPU.")
def run_optimized(w: Workload) -> torch.Tensor:
    return flash_attention(w.q, w.k, w.v, causal=w.causal, out=w.out)


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
def run_sdpa(w: Workload) -> torch.Tensor:
    """torch SDPA, default backend dispatch (enable_gqa when torch has it)."""
    return _sdpa(w.q, w.k, w.v, w.causal, gqa=SDPA_HAS_GQA)


def _needs_cuda(device: torch.device) -> str | None:
    return None if torch.device(device).type == "cuda" else "needs CUDA"


# Backends that rejected enable_gqa but ran with repeated k/v heads: later calls go straight to
# repeating. Learned on the first (warm-up) call, so timed calls never pay for a failed attempt.
_NO_GQA_BACKENDS: set[str] = set()


def _pinned_sdpa(name: str, backend: SDPBackend) -> Callable[[Workload], torch.Tensor]:
    def run(w: Workload) -> torch.Tensor:
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


@functools.cache
def _flash_attn_func() -> Callable[..., torch.Tensor] | str:
    """flash_attn_func, or why it cannot be imported."""
    try:
        from flash_attn import flash_attn_func
    except ModuleNotFoundError:
        return "flash_attn is not installed"
    except Exception as exc:  # an absent package or a build that does not match this torch
        return f"flash_attn does not import ({type(exc).__name__}: {exc})"
    return flash_attn_func


def _flash_attn_unavailable(device: torch.device) -> str | None:
    imported = _flash_attn_func()
    if isinstance(imported, str):
        return imported
    return _needs_cuda(device)


@TECHNIQUE.variant("flash_attn", unavailable=_flash_attn_unavailable)
def run_flash_attn(w: Workload) -> torch.Tensor:
    """The flash-attn package (Dao et al.), layout (batch, seq, heads, head_dim)."""
    fn = _flash_attn_func()
    out = fn(w.q.transpose(1, 2), w.k.transpose(1, 2), w.v.transpose(1, 2), causal=w.causal)
    return out.transpose(1, 2)


# -- correctness ------------------------------------------------------------------------------

@TECHNIQUE.reference
def reference(w: Workload) -> torch.Tensor:
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


@TECHNIQUE.check
def check(reference_output: torch.Tensor, output: torch.Tensor) -> CheckResult:
    """Relative L2 (Frobenius) error in float64, with a tolerance set by the output's dtype."""
    return relative_l2_check(reference_output, output, TOLERANCE)


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
def metrics(w: Workload, measured: Measured) -> dict[str, Any]:
    batch, heads, seq_len, head_dim = w.q.shape
    return {
        "flops": attention_flops(batch, heads, seq_len, head_dim, w.causal),
        "bytes_moved": attention_bytes(w.q, w.k, w.v),
        "tokens_per_s": batch * seq_len / measured.median_s,
    }


# -- report figures ---------------------------------------------------------------------------

PAIR = ("baseline", "optimized")


def _series(cases: list[dict[str, Any]], read: Callable[[dict[str, Any]], Any]
            ) -> dict[tuple[int, bool], dict[tuple[str, str], list[tuple[int, float]]]]:
    """(head_dim, causal) -> (variant, label) -> [(seq_len, value)], sorted by seq_len.

    Within one (head_dim, causal) panel, a param that takes several values at the same seq_len
    (a dtype sweep, say) splits the cases into separate lines, named by the label. A param that
    only moves with seq_len (gpu-quick's batch = 16k tokens / seq_len) stays on one line.
    """
    panels: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for case in cases:
        p = case.get("params") or {}
        if "seq_len" in p:
            panels.setdefault((p.get("head_dim"), bool(p.get("causal"))), []).append(case)
    grouping = ("head_dim", "causal", "seq_len")
    out: dict[tuple[int, bool], dict[tuple[str, str], list[tuple[int, float]]]] = {}
    for key, members in panels.items():
        names = sorted({k for c in members for k in c["params"] if k not in grouping})
        splitting = [k for k in names
                     if any(len({repr(c["params"].get(k)) for c in members if c["params"]["seq_len"] == seq}) > 1
                            for seq in {c["params"]["seq_len"] for c in members})]
        for case in members:
            p = case["params"]
            label = ", ".join(f"{k}={p.get(k)}" for k in splitting)
            for name in PAIR:
                value = read((case.get("variants") or {}).get(name) or {})
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    out.setdefault(key, {}).setdefault((name, label), []).append((p["seq_len"], float(value)))
    for panel in out.values():
        for points in panel.values():
            points.sort()
    return out


def _sweep_figure(panels: dict[tuple[int, bool], dict[tuple[str, str], list[tuple[int, float]]]],
                  ylabel: str, log_y: bool = False) -> Any:
    """One panel per (head_dim, causal), value against seq_len, a line per variant (and label).
    ``log_y``: a log value axis, used only when every value is positive."""
    from matplotlib.figure import Figure

    from gpubench.reports.figures import COLORS, WIDTH_IN

    keys = sorted(panels, key=lambda hk: (hk[0] is None, hk[0] or 0, hk[1]))
    cols = min(2, len(keys))
    rows = -(-len(keys) // cols)
    fig = Figure(figsize=(WIDTH_IN, 2.6 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, key in zip(axes.flat, keys):
        for (name, label), points in sorted(panels[key].items()):
            seq, values = zip(*points)
            ax.plot(seq, values, marker="o", color=COLORS[name],
                    linestyle="-" if name == "optimized" else "--",
                    label=name if not label else f"{name} ({label})")
        ax.set_xscale("log", base=2)
        if log_y and all(value > 0 for points in panels[key].values() for _, value in points):
            ax.set_yscale("log", base=2)
        ax.set_title(f"head_dim {key[0]}, {'causal' if key[1] else 'full'}")
        ax.set_xlabel("seq_len")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.set_visible(False)
    fig.tight_layout()
    return fig


@TECHNIQUE.figures
def figures(cases: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """TFLOP/s and peak memory against seq_len, baseline vs optimized, per (head_dim, causal).
    Peak memory is only recorded on CUDA; a figure without data is left out. The baseline's
    memory grows as seq_len^2 (its scores), the optimized one's as seq_len: hence a log axis."""
    out = []
    tflops = _series(cases, lambda v: (v.get("metrics") or {}).get("tflops"))
    if tflops:
        out.append(("Attention throughput (TFLOP/s) against sequence length", _sweep_figure(tflops, "TFLOP/s")))
    peak = _series(cases, lambda v: None if v.get("peak_memory_bytes") is None
                   else v["peak_memory_bytes"] / 2**20)
    if peak:
        out.append(("Peak memory of one call (MiB) against sequence length",
                    _sweep_figure(peak, "peak MiB", log_y=True)))
    return out
