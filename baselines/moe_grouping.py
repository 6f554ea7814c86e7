"""The eager MoE loop over the experts that were hit (Hugging Face transformers' gpt-oss eager /
training path): one-hot mask, ``torch.where`` per expert for its tokens, gather, MLP, scale,
``index_add_``. Host reads (noted in ``syncs``): the experts hit, then one per expert hit.
"""

from __future__ import annotations

import torch

from gpubench.models.moe import MoEConfig, MoEWeights, SyncLog, dense_routing, expert_mlp, host_list, route


def moe_forward(x: torch.Tensor, weights: MoEWeights, config: MoEConfig, syncs: SyncLog | None = None) -> torch.Tensor:
    """gpt-oss MoE layer on ``x`` (tokens, hidden) -> (tokens, hidden), one expert at a time."""
    routing, experts = route(x, weights.router_weight, weights.router_bias, config.top_k)
    scores = dense_routing(routing, experts, config.experts)  # (tokens, experts), zero off the top-k
    out = torch.zeros_like(x)
    with torch.no_grad():
        # (experts, top_k, tokens): mask[e, j, t] is set when slot j of token t chose expert e
        mask = torch.nn.functional.one_hot(experts, num_classes=config.experts).permute(2, 1, 0)
        hit = mask.sum(dim=(1, 2)) > 0
    for e, was_hit in enumerate(host_list(hit, syncs, "experts hit")):
        if not was_hit:
            continue
        with torch.no_grad():
            _, token_idx = torch.where(mask[e])
        if syncs is not None:
            syncs.note(f"expert {e}: torch.where")
        # Weights indexed by a Python int as Hugging Face does (it uses 0-d device tensors, a further
        # sync each): autograd builds a full-size gradient per index and sums them.
        y = expert_mlp(
            x[token_idx],
            weights.gate_up[e],
            weights.gate_up_bias[e],
            weights.down[e],
            weights.down_bias[e],
            config.alpha,
            config.limit,
        )
        out.index_add_(0, token_idx, y * scores[token_idx, e, None])
    return out
