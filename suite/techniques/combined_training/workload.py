"""combined_training's workload: which optimizations each variant turns on (:class:`Options`,
:data:`VARIANTS`), :class:`CombinedWorkload` (the decoder's weights, packed rows, the metadata
cache), the checks of its params (:func:`workload_problems`) and :func:`build_workload`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from gpubench.contract import Workload
from gpubench.lib.gqa import decoder_head_dim, decoder_head_problems
from gpubench.lib.packing import draw_doc_lens
from gpubench.models.llama import LlamaConfig
from gpubench.models.moe import MoEConfig, routing_problems
from gpubench.models.moe_decoder import MoEDecoderWeights, random_moe_decoder
from gpubench.optimizations.packed_metadata import PackedMetadataCache

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BACKEND = "sdpa"  # the block-causal mask: what every device runs (flash-attn's varlen is packed_metadata's)


@dataclass(frozen=True)
class Options:
    """Which of the three optimizations a variant turns on."""

    cached_metadata: bool  # PackedMetadataCache, else build_metadata in every layer's attention call
    moe: str  # "sort_group" or "where_loop" (moe_grouping's paths)
    buffers: int  # offload staging buffers: 2 (overlapped reloads) or 1


OFF = Options(cached_metadata=False, moe="where_loop", buffers=1)


class VariantSpec(NamedTuple):
    """A variant of the technique: its role, which optimizations it turns on, its description."""

    role: str
    options: Options
    description: str


VARIANTS: dict[str, VariantSpec] = {
    "all_off": VariantSpec(
        "baseline",
        OFF,
        "packed metadata rebuilt in every layer (and again in its recompute), the "
        "per-expert torch.where loop, offloaded layer inputs reloaded through one staging buffer",
    ),
    "all_on": VariantSpec(
        "optimized",
        Options(True, "sort_group", 2),
        "metadata built once per step and cached, "
        "sort-and-group MoE (one host read per MoE call), reloads through two staging buffers",
    ),
    "cached_metadata": VariantSpec(
        "peer", Options(True, "where_loop", 1), "the baseline with only the metadata cache on"
    ),
    "sort_group": VariantSpec("peer", Options(False, "sort_group", 1), "the baseline with only sort-and-group MoE on"),
    "two_buffers": VariantSpec(
        "peer", Options(False, "where_loop", 2), "the baseline with only double-buffered reloads on"
    ),
}


@dataclass(kw_only=True)
class CombinedWorkload(Workload):
    weights: MoEDecoderWeights  # leaves requiring grad; reset restores them and clears their grads
    tokens: torch.Tensor  # (rows, seq_len)
    doc_lens: torch.Tensor  # (documents,) int32 on the device, row-major
    cache: PackedMetadataCache  # the cached variants'


def workload_problems(params: dict[str, Any]) -> list[str]:
    """The decoder's head and routing rules, and at least two documents per packed row."""
    # the attention's shape rules are activation_offload's, the router's moe_grouping's
    problems = decoder_head_problems(params) + routing_problems(params)
    if params["mean_doc_len"] >= params["seq_len"]:
        problems.append(
            f"mean_doc_len ({params['mean_doc_len']}) must be below seq_len ({params['seq_len']}): "
            "a packed row holds at least two documents"
        )
    return problems


def build_workload(params: dict[str, Any], device: torch.device, seed: int) -> CombinedWorkload:
    """A random decoder (its initial weights restored by ``reset``) and packed rows of random documents."""
    device = torch.device(device)
    hidden, heads = params["hidden"], params["heads"]  # head_dim: 0 means hidden / heads
    config = LlamaConfig(
        vocab_size=params["vocab"],
        hidden_size=hidden,
        num_layers=params["layers"],
        num_heads=heads,
        num_kv_heads=params["kv_heads"],
        head_dim=decoder_head_dim(params),
        intermediate_size=1,
        max_position=params["seq_len"],
    )
    moe = MoEConfig(experts=params["experts"], top_k=params["top_k"], hidden=hidden, expert_dim=params["expert_dim"])
    weights = random_moe_decoder(config, moe, seed, DTYPES[params["dtype"]], device)
    tensors = weights.parameters()
    for t in tensors:
        t.requires_grad_(True)
    initial = [t.detach().clone() for t in tensors]
    gen = torch.Generator().manual_seed(seed + 2)
    rows, seq = params["rows"], params["seq_len"]
    lens = draw_doc_lens(rows, seq, params["mean_doc_len"], gen)
    tokens = torch.randint(0, config.vocab_size, (rows, seq), generator=gen)

    def reset() -> None:
        with torch.no_grad():
            for t, t0 in zip(tensors, initial):
                t.copy_(t0)
                t.grad = None

    return CombinedWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        reset=reset,
        weights=weights,
        tokens=tokens.to(device),
        cache=PackedMetadataCache(),
        doc_lens=torch.tensor([n for row in lens for n in row], dtype=torch.int32, device=device),
    )
