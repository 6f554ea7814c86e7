"""Sort-and-group MoE: stable-argsort the routed (token, slot) rows by expert, read the
per-expert counts once, run each expert on its contiguous slice, and restore token order with
one ``index_add_`` (:func:`moe_forward`); :func:`moe_forward_grouped_mm` runs both projections as
torch grouped GEMMs with the offsets left on the device. Host reads (noted in ``syncs``): one and none.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpubench.models.moe import MoEConfig, MoEWeights, SyncLog, host_list, route, swiglu


@dataclass
class Grouping:
    """The routed rows sorted by expert. Row r of the sorted order is slot ``order[r] % top_k``
    of token ``token[r]``, sent to expert ``expert[r]``; expert e owns rows
    ``offsets[e] - counts[e] : offsets[e]``, and within an expert rows keep token order."""

    order: torch.Tensor  # (rows,) positions in the flattened (tokens, top_k) choices
    token: torch.Tensor  # (rows,) the token of each sorted row
    expert: torch.Tensor  # (rows,) the expert of each sorted row (non-decreasing)
    counts: torch.Tensor  # (experts,) rows per expert, on the device
    offsets: torch.Tensor  # (experts,) int32 end of each expert's rows (cumulative counts)


def group_by_expert(experts: torch.Tensor, num_experts: int) -> Grouping:
    """Sort the (token, slot) choices ``experts`` (tokens, top_k) by expert, stably. Nothing is
    read on the host. Counts come from a scatter-add: ``torch.bincount`` would do the same, but
    on CUDA it reads its input's maximum to the host to size its output (an extra sync)."""
    flat = experts.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device).scatter_add_(0, flat, torch.ones_like(flat))
    return Grouping(
        order=order,
        token=torch.div(order, experts.shape[1], rounding_mode="floor"),
        expert=flat.index_select(0, order),
        counts=counts,
        offsets=counts.cumsum(0).to(torch.int32),
    )


def _gather_rows(x: torch.Tensor, routing: torch.Tensor, g: Grouping) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sorted row's input (rows, hidden) and routing weight (rows, 1)."""
    return x.index_select(0, g.token), routing.reshape(-1).index_select(0, g.order).unsqueeze(1)


def _scatter_back(x: torch.Tensor, y: torch.Tensor, g: Grouping) -> torch.Tensor:
    """Sum each token's weighted rows into its output row: one ``index_add_``."""
    return torch.zeros_like(x).index_add_(0, g.token, y)


def moe_forward(x: torch.Tensor, weights: MoEWeights, config: MoEConfig, syncs: SyncLog | None = None) -> torch.Tensor:
    """gpt-oss MoE layer on ``x`` (tokens, hidden) -> (tokens, hidden): sort-and-group, one host
    read of the per-expert counts, then an ``addmm`` per expert on its contiguous slice."""
    routing, experts = route(x, weights.router_weight, weights.router_bias, config.top_k)
    g = group_by_expert(experts, config.experts)
    counts = host_list(g.counts, syncs, "rows per expert")
    rows, scale = _gather_rows(x, routing, g)
    # split and unbind each have one backward node (a cat, a stack), where slicing or indexing per
    # expert would build a full-size gradient per expert and sum them.
    gate_up, gate_up_bias, down, down_bias = (
        t.unbind(0) for t in (weights.gate_up, weights.gate_up_bias, weights.down, weights.down_bias)
    )
    hit = [e for e, n in enumerate(counts) if n]
    parts = rows.split(counts)
    h = torch.cat([torch.addmm(gate_up_bias[e], parts[e], gate_up[e]) for e in hit])
    parts = swiglu(h, config.alpha, config.limit).split(counts)
    y = torch.cat([torch.addmm(down_bias[e], parts[e], down[e]) for e in hit])
    return _scatter_back(x, y * scale, g)


# -- grouped GEMM ------------------------------------------------------------------------------


@functools.cache
def grouped_mm_function() -> Callable[..., torch.Tensor] | None:
    """torch's grouped GEMM (``torch.nn.functional.grouped_mm``, else ``torch._grouped_mm``),
    or None when this torch has neither."""
    fn = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    return fn


def grouped_gemm_path(device: torch.device, dtype: torch.dtype) -> str:
    """Which implementation torch's grouped_mm dispatches to for ``device`` and ``dtype``, by
    torch's rule: on CUDA, bf16 on compute capability 9.x / 10.x runs the CUTLASS grouped-GEMM
    kernel (one launch per call, offsets read on the device); anything else runs torch's
    fallback, a loop of matmuls over the groups that first copies the offsets to the host."""
    fn = grouped_mm_function()
    if fn is None:
        return f"none: torch {torch.__version__} has no grouped_mm"
    name = (
        "torch.nn.functional.grouped_mm"
        if fn is getattr(torch.nn.functional, "grouped_mm", None)
        else "torch._grouped_mm"
    )
    device = torch.device(device)
    if device.type != "cuda":
        return f"{name}, {device.type} implementation (a loop of matmuls over the groups inside torch)"
    major, _ = torch.cuda.get_device_capability(device)
    if dtype == torch.bfloat16 and major in (9, 10):
        return f"{name}, CUTLASS grouped-GEMM kernel (bf16, sm{major}x): one launch per projection"
    return (
        f"{name}, torch's fallback for {str(dtype).removeprefix('torch.')} on sm{major}x: a loop of "
        "matmuls over the groups, offsets copied to the host"
    )


def grouped_mm_problem(config: MoEConfig, dtype: torch.dtype) -> str | None:
    """Why torch's grouped_mm cannot take this layer, or None: it needs every matrix row to be a
    multiple of 16 bytes (hidden and expert_dim multiples of 8 in bf16, of 4 in float32)."""
    if grouped_mm_function() is None:
        return f"torch {torch.__version__} has no grouped_mm"
    size = torch.empty((), dtype=dtype).element_size()
    bad = [
        f"{name} {n} x {size} bytes"
        for name, n in (("hidden", config.hidden), ("expert_dim", config.expert_dim))
        if (n * size) % 16
    ]
    if bad:
        return f"torch's grouped_mm needs rows of a multiple of 16 bytes; here {', '.join(bad)}"
    return None


def moe_forward_grouped_mm(
    x: torch.Tensor, weights: MoEWeights, config: MoEConfig, syncs: SyncLog | None = None
) -> torch.Tensor:
    """gpt-oss MoE layer on ``x`` (tokens, hidden) -> (tokens, hidden): sort-and-group with one
    grouped GEMM per projection; the group offsets never leave the device."""
    problem = grouped_mm_problem(config, x.dtype)
    if problem is not None:
        raise RuntimeError(problem)
    grouped_mm = grouped_mm_function()
    assert grouped_mm is not None  # grouped_mm_problem says why where there is none
    routing, experts = route(x, weights.router_weight, weights.router_bias, config.top_k)
    g = group_by_expert(experts, config.experts)
    rows, scale = _gather_rows(x, routing, g)
    h = grouped_mm(rows, weights.gate_up, offs=g.offsets) + weights.gate_up_bias.index_select(0, g.expert)
    act = swiglu(h, config.alpha, config.limit).contiguous()
    y = grouped_mm(act, weights.down, offs=g.offsets) + weights.down_bias.index_select(0, g.expert)
    return _scatter_back(x, y * scale, g)
