"""A small gpt-oss-style decoder: the Llama attention half of :mod:`gpubench.models.llama`
(RMSNorm, RoPE, grouped-query attention, the caller's ``attend``) and, in place of the dense
SwiGLU, the gpt-oss mixture-of-experts MLP of :mod:`gpubench.models.moe`, run by whichever MoE
path the caller passes (the per-expert loop, sort-and-group). Used by ``combined_training``.

:class:`MoEDecoderWeights` has what :mod:`gpubench.lib.offload` and :func:`gpubench.models.llama.head_loss`
read of a LlamaWeights (embed, config, final_norm, lm_head, dtype, the RoPE table cache), so the
shared offload schedules run it unchanged with :func:`moe_decoder_layer` as their layer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from gpubench.models.llama import Attend, LlamaConfig, attention_residual, random_weights, rms_norm
from gpubench.models.moe import MoEConfig, MoEWeights, SyncLog, init_weights

# (x (tokens, hidden), weights, config, syncs) -> (tokens, hidden): a path of gpubench.baselines /
# gpubench.optimizations moe_grouping.
MoEForward = Callable[[torch.Tensor, MoEWeights, MoEConfig, SyncLog | None], torch.Tensor]

ATTENTION = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm")


@dataclass
class MoEDecoderLayer:
    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    experts: MoEWeights


@dataclass
class MoEDecoderWeights:
    config: LlamaConfig  # embedding, attention and norm sizes (its intermediate_size is unused)
    moe: MoEConfig  # every layer's MoE MLP
    embed: torch.Tensor
    layers: list[MoEDecoderLayer]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    _rope: dict = field(default_factory=dict, repr=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter by name (``embed``, ``layers.0.wq``, ``layers.0.experts.gate_up``, ...)."""
        out = {"embed": self.embed, "final_norm": self.final_norm, "lm_head": self.lm_head}
        for i, layer in enumerate(self.layers):
            out.update({f"layers.{i}.{name}": getattr(layer, name) for name in ATTENTION})
            out.update(
                {f"layers.{i}.experts.{name}": t for name, t in zip(MoEWeights.names(), layer.experts.tensors())}
            )
        return out

    def parameters(self) -> list[torch.Tensor]:
        return list(self.named_parameters().values())

    def num_params(self) -> int:
        return sum(t.numel() for t in self.parameters())


def random_moe_decoder(
    config: LlamaConfig,
    moe: MoEConfig,
    seed: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> MoEDecoderWeights:
    """Seeded weights, drawn on the CPU (the same values on every device): the attention, norms,
    embedding and head as :func:`gpubench.models.llama.random_weights` draws them, each layer's
    experts as :func:`gpubench.models.moe.init_weights` does (from ``seed + 1``)."""
    if moe.hidden != config.hidden_size:
        raise ValueError(f"MoE hidden {moe.hidden} != model hidden_size {config.hidden_size}")
    dense = random_weights(config, seed, dtype, device)
    gen = torch.Generator().manual_seed(seed + 1)
    layers = [
        MoEDecoderLayer(
            **{name: getattr(layer, name) for name in ATTENTION}, experts=init_weights(moe, gen, dtype, device)
        )
        for layer in dense.layers
    ]
    return MoEDecoderWeights(config, moe, dense.embed, layers, dense.final_norm, dense.lm_head)


def moe_decoder_layer(
    weights: MoEDecoderWeights,
    i: int,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attend: Attend,
    moe_forward: MoEForward,
    syncs: SyncLog | None = None,
) -> torch.Tensor:
    """Layer ``i`` on ``x`` (rows, seq, hidden): pre-norm attention through ``attend``, then the
    pre-norm MoE MLP over every token of the batch (flattened), each with its residual."""
    c, layer = weights.config, weights.layers[i]
    x = attention_residual(c, layer, i, x, cos, sin, attend)
    hs = rms_norm(x, layer.mlp_norm, c.rms_eps)
    return x + moe_forward(hs.reshape(-1, c.hidden_size), layer.experts, weights.moe, syncs).view_as(x)
