"""moe_grouping baseline: the common eager MoE path, a Python loop over the experts that were hit.

The idea (as in Hugging Face transformers' gpt-oss eager/training path): build a one-hot mask
of the router's choices, find which experts received any token, then for each of them find its
tokens with ``torch.where``, gather them, run the expert's MLP, scale by the routing weight and
``index_add_`` the result back into the output.

Where it loses: ``torch.where`` has a data-dependent output size, so on a GPU the host waits for
the device once per expert (plus once to learn which experts were hit) before it can queue the
next expert's work: the GPU drains and idles at every expert, and every small per-expert matmul
and elementwise op is its own launch. The backward pays too: each expert's weights are taken by
indexing (``gate_up[e]``, as Hugging Face does), and autograd turns every such index into a
zero-filled gradient the size of the whole weight tensor, then sums them, once per expert hit;
the gathers ``x[token_idx]`` do the same at the size of the input. Sort-and-group
(``gpubench.optimizations.moe_grouping``) reads the host once per layer and assembles each
gradient once. Published figure: Unsloth reports gpt-oss training +15%, forward +23%,
backward +13%.

Host reads, exactly (noted in ``syncs``): one to list the experts hit, one ``torch.where`` per
expert hit; the backward pass reads nothing. (Hugging Face's loop also indexes its weights with
0-d device tensors, which costs further syncs per expert; this baseline uses Python ints there,
so it is not weaker than the common path.)
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
        y = expert_mlp(x[token_idx], weights.gate_up[e], weights.gate_up_bias[e], weights.down[e],
                       weights.down_bias[e], config.alpha, config.limit)
        out.index_add_(0, token_idx, y * scores[token_idx, e, None])
    return out
