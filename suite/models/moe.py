"""The gpt-oss mixture-of-experts MLP layer that moe_grouping's paths share: its config and its
params' rule (:func:`routing_problems`), seeded weights, the router (:func:`route`), the expert
SwiGLU (:func:`swiglu`), and :class:`SyncLog`, the host reads a forward pass makes. Weights are
laid out as gpt-oss keeps them in transformers: ``gate_up`` (experts, hidden, 2 * expert_dim),
``down`` (experts, expert_dim, hidden), one tensor per weight, so every path's gradient is one full
tensor per weight.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from typing import Any

import torch

SWIGLU_ALPHA = 1.702  # gpt-oss: gate * sigmoid(1.702 * gate)
SWIGLU_LIMIT = 7.0  # gpt-oss: gate clamped to <= 7, linear to [-7, 7]

# Standard deviation of each weight, times 1 / sqrt(fan_in): for O(1) inputs the router's logits,
# the gate and linear halves and the output all come out O(1). At these scales gpt-oss's clamps
# (at 7) do not bind on random data; the tests exercise them with crafted values. (Where a clamp
# binds, its gradient jumps from 1 to 0 at the limit, so an entry within rounding of 7 can take
# either side in two correct implementations and the gradients then differ by far more than
# rounding: random data near the limit would make every check a lottery.)
ROUTER_STD = 1.0
GATE_UP_STD = 1.0
DOWN_STD = 1.0
BIAS_STD = 0.1


@dataclass(frozen=True)
class MoEConfig:
    """Sizes of one MoE layer. gpt-oss-20b: 32 experts, top-4, hidden 2880, expert_dim 2880;
    gpt-oss-120b: 128 experts, same otherwise (:meth:`from_preset`)."""

    experts: int
    top_k: int
    hidden: int
    expert_dim: int
    alpha: float = SWIGLU_ALPHA
    limit: float = SWIGLU_LIMIT

    def __post_init__(self) -> None:
        for name in ("experts", "top_k", "hidden", "expert_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"MoEConfig.{name} must be a positive integer, got {value!r}")
        if self.top_k > self.experts:
            raise ValueError(f"MoEConfig.top_k ({self.top_k}) exceeds experts ({self.experts})")

    @classmethod
    def from_preset(cls, name: str) -> MoEConfig:
        """The MoE layer of a shipped model preset (``gpt-oss-20b``, ``gpt-oss-120b``)."""
        from gpubench.models.config import preset_raw

        raw = preset_raw(name)
        experts = raw.get("num_local_experts")
        top_k = raw.get("num_experts_per_tok") or raw.get("experts_per_token")
        if not experts or not top_k:
            raise ValueError(f"preset {name!r} has no MoE layer (num_local_experts / num_experts_per_tok)")
        return cls(
            experts=experts,
            top_k=top_k,
            hidden=raw["hidden_size"],
            expert_dim=raw.get("intermediate_size") or raw["hidden_size"],
        )

    def expert_gemm_flops(self, tokens: int) -> tuple[int, int]:
        """(forward, backward) FLOPs of the expert GEMMs for ``tokens`` tokens: each of the
        tokens * top_k routed rows goes through a (hidden x 2 expert_dim) and an
        (expert_dim x hidden) matmul, 2 FLOPs per multiply-add; the backward does twice that
        (input and weight gradients). The router and the elementwise work are not counted."""
        forward = 2 * tokens * self.top_k * (self.hidden * 2 * self.expert_dim + self.expert_dim * self.hidden)
        return forward, 2 * forward


@dataclass
class MoEWeights:
    """The layer's parameters (see the module docstring for shapes)."""

    router_weight: torch.Tensor  # (experts, hidden)
    router_bias: torch.Tensor  # (experts,)
    gate_up: torch.Tensor  # (experts, hidden, 2 * expert_dim), gate/linear columns interleaved
    gate_up_bias: torch.Tensor  # (experts, 2 * expert_dim)
    down: torch.Tensor  # (experts, expert_dim, hidden)
    down_bias: torch.Tensor  # (experts, hidden)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(getattr(self, n) for n in self.names())

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.tensors())

    def map(self, fn) -> MoEWeights:
        """A new MoEWeights with ``fn`` applied to every tensor."""
        return MoEWeights(*(fn(t) for t in self.tensors()))


def routing_problems(params: dict[str, Any]) -> list[str]:
    """The rule of a router's params ``experts`` and ``top_k``: a token picks at most every expert."""
    if params["top_k"] > params["experts"]:
        return [f"top_k ({params['top_k']}) must not exceed experts ({params['experts']})"]
    return []


def init_weights(
    config: MoEConfig,
    generator: torch.Generator,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> MoEWeights:
    """Seeded random weights (normal, scaled by 1/sqrt(fan_in); biases small and nonzero), drawn
    on the CPU in float32 from ``generator`` and then cast and moved: the same values on every
    device."""
    e, h, d = config.experts, config.hidden, config.expert_dim

    def draw(*shape: int, std: float) -> torch.Tensor:
        t = torch.randn(*shape, generator=generator, dtype=torch.float32) * std
        return t.to(device=device, dtype=dtype)

    return MoEWeights(
        router_weight=draw(e, h, std=ROUTER_STD / h**0.5),
        router_bias=draw(e, std=BIAS_STD),
        gate_up=draw(e, h, 2 * d, std=GATE_UP_STD / h**0.5),
        gate_up_bias=draw(e, 2 * d, std=BIAS_STD),
        down=draw(e, d, h, std=DOWN_STD / d**0.5),
        down_bias=draw(e, h, std=BIAS_STD),
    )


def route(
    x: torch.Tensor, router_weight: torch.Tensor, router_bias: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """gpt-oss routing: (weights, experts), each (tokens, top_k). ``experts`` are the indices of
    the top_k largest logits (descending); ``weights`` the softmax over those logits only, in
    the logits' dtype. Differentiable in x and the router's weight and bias."""
    logits = torch.nn.functional.linear(x, router_weight, router_bias)
    top_logits, experts = torch.topk(logits, top_k, dim=-1)
    return torch.softmax(top_logits, dim=-1, dtype=top_logits.dtype), experts


def dense_routing(weights: torch.Tensor, experts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """The routing weights as a (tokens, experts) matrix, zero where an expert was not chosen
    (how the Hugging Face gpt-oss router hands them to its experts)."""
    return torch.zeros(weights.shape[0], num_experts, dtype=weights.dtype, device=weights.device).scatter(
        1, experts, weights
    )


def swiglu(h: torch.Tensor, alpha: float = SWIGLU_ALPHA, limit: float = SWIGLU_LIMIT) -> torch.Tensor:
    """gpt-oss's SwiGLU over the interleaved first projection ``h`` (..., 2 * expert_dim):
    gate = even columns clamped to at most ``limit``, linear = odd columns clamped to
    [-limit, limit], out = gate * sigmoid(alpha * gate) * (linear + 1)."""
    gate = h[..., 0::2].clamp(max=limit)
    linear = h[..., 1::2].clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (linear + 1)


def expert_mlp(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    gate_up_bias: torch.Tensor,
    down: torch.Tensor,
    down_bias: torch.Tensor,
    alpha: float = SWIGLU_ALPHA,
    limit: float = SWIGLU_LIMIT,
) -> torch.Tensor:
    """One expert on rows ``x`` (rows, hidden) -> (rows, hidden)."""
    return swiglu(x @ gate_up + gate_up_bias, alpha, limit) @ down + down_bias


@dataclass
class SyncLog:
    """The host reads a pass makes, as its code notes them: on a GPU each waits for the device to
    drain its queue (a device->host synchronization). On a CPU this is the count of syncs; on CUDA
    ``gpubench.measure.timing.count_cuda_syncs`` measures them too."""

    events: list[str] = field(default_factory=list)

    def note(self, what: str) -> None:
        self.events.append(what)

    def __len__(self) -> int:
        return len(self.events)


def host_list(t: torch.Tensor, syncs: SyncLog | None, what: str) -> list:
    """``t.tolist()``, noted in ``syncs``: one device->host copy (and synchronization) on a GPU."""
    if syncs is not None:
        syncs.note(what)
    return t.tolist()
