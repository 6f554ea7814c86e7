"""A small Llama-style decoder (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU), shared
by the techniques that need a real model: the serving engine, speculative decoding, packed-sequence
training.

The layers are plain functions over a :class:`LlamaWeights` so each caller brings its own
attention: :func:`forward` computes everything but attention itself and hands each layer's
``q, k, v`` (rotary embeddings applied) to an ``attend(layer, q, k, v) -> out`` callback. A serving
engine writes ``k, v`` into its KV cache there and attends over it; a training step builds a
block-diagonal mask; a reference generation concatenates. Leading dimensions are free: tokens may
be ``(n,)`` (a flat batch of tokens, as serving engines lay them out) or ``(batch, seq)``.

Weights are seeded random by default (sizes from :data:`SIZES`, ~1M to ~1B parameters, or a
real model's shapes from its preset or config.json: :meth:`LlamaConfig.from_model`), or read
from a local Hugging Face Llama-style checkpoint directory with :func:`load_hf` (needs the
optional ``transformers`` package; never downloads). :func:`model_from` takes any of these.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from gpubench.errors import BadInput
from gpubench.models import stand_in
from gpubench.models.config import ModelConfig


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 352
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    max_position: int = 4096
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even (rotary embeddings pair channels)")

    def num_params(self) -> int:
        h, d, kv, inter = self.hidden_size, self.head_dim, self.num_kv_heads, self.intermediate_size
        per_layer = (
            2 * h  # two RMSNorm weights
            + h * self.num_heads * d
            + 2 * h * kv * d
            + self.num_heads * d * h  # q, k, v, o
            + 3 * h * inter
        )  # gate, up, down
        embed = self.vocab_size * h
        return embed * (1 if self.tie_word_embeddings else 2) + self.num_layers * per_layer + h

    def kv_bytes_per_token(self, element_size: int) -> int:
        """K and V of one token in every layer."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_model(cls, cfg: ModelConfig, layers: int = 0) -> LlamaConfig:
        """The Llama-style stand-in of a model's config (:mod:`gpubench.models.stand_in`): its
        hidden size, query and KV heads, head_dim (the config's, which is not always hidden /
        heads), vocabulary, RoPE base, RMSNorm eps and tied embeddings, its first ``layers``
        layers (0: all). An MoE model's MLP becomes a dense SwiGLU as wide as what one token
        computes through, ``top_k * expert_dim`` plus the shared experts' width (the active
        width; :func:`~gpubench.models.stand_in.stand_in_note` says so in what a case records).
        Sliding and chunked layers attend fully here. BadInput for an MLA model (a Llama layer
        cannot hold a latent cache) and for more layers than the model has."""
        problems = stand_in.config_problems(cfg, layers)
        if problems:
            raise BadInput("; ".join(problems) + ".")
        assert cfg.vocab_size is not None  # (config_problems refuses a config without it)
        raw = cfg.raw
        params = raw.get("rope_parameters")  # transformers 5 keeps rope_theta there
        rope: dict = params if isinstance(params, dict) else {}
        theta = raw.get("rope_theta") or rope.get("rope_theta") or 10000.0
        return cls(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=layers or cfg.num_layers,
            num_heads=cfg.num_heads,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            intermediate_size=stand_in.active_mlp_width(cfg),
            rope_theta=float(theta),
            rms_eps=float(raw.get("rms_norm_eps") or raw.get("layer_norm_epsilon") or 1e-5),
            max_position=cfg.max_position_embeddings or 4096,
            tie_word_embeddings=cfg.tie_word_embeddings,
        )


# Named sizes: "tiny" for CPU tests (~0.4M parameters), up to ~1B for a GPU.
SIZES: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(),
    "small": LlamaConfig(
        vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=32, intermediate_size=704
    ),
    "100m": LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        num_kv_heads=4,
        head_dim=64,
        intermediate_size=2048,
    ),
    "1b": LlamaConfig(
        vocab_size=32000,
        hidden_size=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        intermediate_size=5632,
    ),
}
assert tuple(SIZES) == stand_in.BUILT_IN_SIZES, "stand_in.BUILT_IN_SIZES names SIZES for torch-free checks"


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor
    wq: torch.Tensor  # (heads * head_dim, hidden), as nn.Linear stores it
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor
    mlp_norm: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor


class AttentionWeights(Protocol):
    """What :func:`attention_residual` reads of a layer: a Llama layer's, or one whose MLP is
    something else (the MoE decoder's)."""

    attn_norm: torch.Tensor
    wq: torch.Tensor
    wk: torch.Tensor
    wv: torch.Tensor
    wo: torch.Tensor


class DecoderWeights(Protocol):
    """What :func:`rope_cos_sin` and :func:`head_loss` read of a model: a :class:`LlamaWeights`, or
    a decoder's whose layers are something else (the MoE decoder's), with the same config, final
    norm, LM head and RoPE table cache."""

    config: LlamaConfig
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    _rope: dict

    @property
    def dtype(self) -> torch.dtype: ...


@dataclass
class LlamaWeights:
    config: LlamaConfig
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    source: str = "random"
    _rope: dict = field(default_factory=dict, repr=False)
    _fused: dict = field(default_factory=dict, repr=False, init=False, compare=False)  # see fused_qkv

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def parameters(self) -> list[torch.Tensor]:
        out = [self.embed, self.final_norm]
        if self.lm_head is not self.embed:
            out.append(self.lm_head)
        for layer in self.layers:
            out += [getattr(layer, f) for f in LayerWeights.__dataclass_fields__]
        return out

    def named_parameters(self) -> dict[str, torch.Tensor]:
        """:meth:`parameters` by name (``embed``, ``layers.0.wq``, ...)."""
        out = {"embed": self.embed, "final_norm": self.final_norm}
        if self.lm_head is not self.embed:
            out["lm_head"] = self.lm_head
        for i, layer in enumerate(self.layers):
            out.update({f"layers.{i}.{f}": getattr(layer, f) for f in LayerWeights.__dataclass_fields__})
        return out

    def with_parameters(self, params: list[torch.Tensor]) -> LlamaWeights:
        """These weights with each parameter replaced by the tensor at the same place in ``params``
        (:meth:`parameters` order); tied embeddings stay tied."""
        by_id = {id(old): new for old, new in zip(self.parameters(), params)}
        layers = [
            LayerWeights(**{f: by_id[id(getattr(layer, f))] for f in LayerWeights.__dataclass_fields__})
            for layer in self.layers
        ]
        return replace(
            self,
            embed=by_id[id(self.embed)],
            layers=layers,
            final_norm=by_id[id(self.final_norm)],
            lm_head=by_id[id(self.lm_head)],
        )


def random_weights(
    config: LlamaConfig, seed: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
) -> LlamaWeights:
    """Seeded random weights, drawn on the CPU (the same values on every device). Projections are
    scaled by 1/sqrt(fan_in) and norms start near 1, so activations keep their size through the
    layers and the logits spread widely (greedy decoding has clear winners, not near-ties)."""
    g = torch.Generator().manual_seed(seed)

    def mat(rows: int, cols: int, gain: float = 1.0) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=g) * gain / math.sqrt(cols)).to(device=device, dtype=dtype)

    def norm(n: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(n, generator=g)).to(device=device, dtype=dtype)

    c = config
    h, d = c.hidden_size, c.head_dim
    layers = [
        LayerWeights(
            attn_norm=norm(h),
            wq=mat(c.num_heads * d, h),
            wk=mat(c.num_kv_heads * d, h),
            wv=mat(c.num_kv_heads * d, h),
            wo=mat(h, c.num_heads * d, 0.5),
            mlp_norm=norm(h),
            w_gate=mat(c.intermediate_size, h),
            w_up=mat(c.intermediate_size, h),
            w_down=mat(h, c.intermediate_size, 0.5),
        )
        for _ in range(c.num_layers)
    ]
    embed = torch.randn(c.vocab_size, h, generator=g).to(device=device, dtype=dtype)
    lm_head = embed if c.tie_word_embeddings else mat(c.vocab_size, h, 4.0)
    return LlamaWeights(c, embed, layers, norm(h), lm_head)


# -- building blocks --------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm computed in float32 (as Llama does), returned in x's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rope_cos_sin(weights: DecoderWeights, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for ``positions`` (any shape), each ``positions.shape + (head_dim,)``, in the
    "rotate half" layout Hugging Face's Llama uses (channel i pairs with i + head_dim/2)."""
    c = weights.config
    key = (positions.device,)
    inv = weights._rope.get(key)
    if inv is None:
        inv = 1.0 / (
            c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32, device=positions.device) / c.head_dim)
        )
        weights._rope[key] = inv
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(weights.dtype), emb.sin().to(weights.dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (..., heads, head_dim); cos/sin: (..., head_dim) broadcast over heads."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)


def mlp(x: torch.Tensor, layer: LayerWeights) -> torch.Tensor:
    """SwiGLU: down(silu(gate(x)) * up(x))."""
    return F.linear(F.silu(F.linear(x, layer.w_gate)) * F.linear(x, layer.w_up), layer.w_down)


Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def forward(
    weights: LlamaWeights,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    attend: Attend,
    logits_at: torch.Tensor | None = None,
) -> torch.Tensor:
    """Logits of the model over ``tokens`` (any leading shape, int64) at ``positions`` (same shape).

    ``attend(layer, q, k, v)`` gets q ``(*lead, heads, head_dim)`` and k, v
    ``(*lead, kv_heads, head_dim)`` of this call's tokens, rotary embeddings applied, and returns
    ``(*lead, heads, head_dim)``: how tokens see each other (causality, documents, the cache) is
    entirely its business. ``logits_at``: indices into the flattened tokens whose logits are
    wanted (a serving step wants each sequence's last token only); default all, shaped like
    ``tokens`` plus ``(vocab,)``.
    """
    c = weights.config
    x = F.embedding(tokens, weights.embed)
    cos, sin = rope_cos_sin(weights, positions)
    for i in range(c.num_layers):
        x = decoder_layer(weights, i, x, cos, sin, attend)
    if logits_at is not None:
        x = x.reshape(-1, c.hidden_size)[logits_at]
    return F.linear(rms_norm(x, weights.final_norm, c.rms_eps), weights.lm_head)


def decoder_layer(
    weights: LlamaWeights, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend
) -> torch.Tensor:
    """Layer ``i`` on hidden states ``x`` ``(*lead, hidden)``: pre-norm attention and SwiGLU MLP,
    each with its residual. ``cos``/``sin`` from :func:`rope_cos_sin` at the tokens' positions."""
    c, layer = weights.config, weights.layers[i]
    x = attention_residual(c, layer, i, x, cos, sin, attend)
    return x + mlp(rms_norm(x, layer.mlp_norm, c.rms_eps), layer)


def attention_residual(
    c: LlamaConfig,
    layer: AttentionWeights,
    i: int,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    attend: Attend,
) -> torch.Tensor:
    """The attention half of layer ``i``: ``x`` plus attention over its pre-norm states. ``layer``
    needs only attn_norm, wq, wk, wv and wo (a layer whose MLP is something else shares it)."""
    lead = x.shape[:-1]
    hs = rms_norm(x, layer.attn_norm, c.rms_eps)
    q = apply_rope(F.linear(hs, layer.wq).view(*lead, c.num_heads, c.head_dim), cos, sin)
    k = apply_rope(F.linear(hs, layer.wk).view(*lead, c.num_kv_heads, c.head_dim), cos, sin)
    v = F.linear(hs, layer.wv).view(*lead, c.num_kv_heads, c.head_dim)
    attn = attend(i, q, k, v)
    return x + F.linear(attn.reshape(*lead, c.num_heads * c.head_dim), layer.wo)


def fused_qkv(weights: LlamaWeights) -> list[torch.Tensor]:
    """Per layer the q, k and v projections stacked into one matrix (as vLLM's QKVParallelLinear
    holds them). Copies, made once and remade only when a projection is replaced or changed in
    place (its tensor version moves); no gradient reaches wq, wk, wv through them."""
    key = tuple((id(t), t._version) for layer in weights.layers for t in (layer.wq, layer.wk, layer.wv))
    if weights._fused.get("key") != key:
        with torch.no_grad():
            stacked = [torch.cat([layer.wq, layer.wk, layer.wv]) for layer in weights.layers]
        weights._fused.update(key=key, qkv=stacked)
    return weights._fused["qkv"]


def fused_forward(
    weights: LlamaWeights,
    tokens: torch.Tensor,
    positions: torch.Tensor,
    attend: Attend,
    logits_at: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`forward` with fewer ops, for serving: q, k and v from one matmul (:func:`fused_qkv`),
    rotary embeddings of q and k in one call. The same arithmetic per element; only the matmul's
    shape (so at most its rounding) differs. Inference only (no gradient reaches wq, wk, wv).
    (Gate and up stay two matmuls: stacked, the SwiGLU product reads strided halves, which
    measured slower on a CPU.)"""
    c = weights.config
    heads, kv_heads, d = c.num_heads, c.num_kv_heads, c.head_dim
    x = F.embedding(tokens, weights.embed)
    cos, sin = rope_cos_sin(weights, positions)
    lead = x.shape[:-1]
    for i, (layer, wqkv) in enumerate(zip(weights.layers, fused_qkv(weights))):
        qkv = F.linear(rms_norm(x, layer.attn_norm, c.rms_eps), wqkv).view(*lead, heads + 2 * kv_heads, d)
        qk = apply_rope(qkv[..., : heads + kv_heads, :], cos, sin)
        attn = attend(i, qk[..., :heads, :], qk[..., heads:, :], qkv[..., heads + kv_heads :, :])
        x = x + F.linear(attn.reshape(*lead, heads * d), layer.wo)
        x = x + mlp(rms_norm(x, layer.mlp_norm, c.rms_eps), layer)
    if logits_at is not None:
        x = x.reshape(-1, c.hidden_size)[logits_at]
    return F.linear(rms_norm(x, weights.final_norm, c.rms_eps), weights.lm_head)


def head_loss(weights: DecoderWeights, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Final norm, LM head and mean next-token cross-entropy of hidden states ``x`` (float32 logits)."""
    logits = F.linear(rms_norm(x, weights.final_norm, weights.config.rms_eps), weights.lm_head)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def causal_attend(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """An ``attend`` for rows of a batch, each causal: :func:`batched_causal_attention` in every layer."""
    return batched_causal_attention(q, k, v)


def batched_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention over rows of a batch: q ``(batch, seq, heads, d)``, k/v ``(batch, seq,
    kv_heads, d)`` (GQA by repeating K/V heads); SDPA."""
    group = q.shape[2] // k.shape[2]
    k, v = (t.repeat_interleave(group, dim=2) for t in (k, v))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    past_k: torch.Tensor | None = None,
    past_v: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of one sequence's new tokens q ``(n, heads, d)`` over its past keys (``(p, kv_heads,
    d)`` or None) and its own (causal among the new ones). SDPA in the input dtype; GQA by repeating
    K/V heads."""
    if past_k is not None and past_v is not None and past_k.shape[0]:
        k, v = torch.cat([past_k, k]), torch.cat([past_v, v])
    n, heads = q.shape[0], q.shape[1]
    group = heads // k.shape[1]
    kt = k.repeat_interleave(group, dim=1).transpose(0, 1)  # (heads, total, d)
    vt = v.repeat_interleave(group, dim=1).transpose(0, 1)
    total = kt.shape[1]
    past = total - n
    if past == 0:
        out = F.scaled_dot_product_attention(q.transpose(0, 1), kt, vt, is_causal=n > 1)
    else:  # query i (at position past + i) sees keys 0..past + i
        mask = torch.ones(n, total, dtype=torch.bool, device=q.device).tril(diagonal=past)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), kt, vt, attn_mask=mask)
    return out.transpose(0, 1)


# -- Hugging Face checkpoints -----------------------------------------------------------------


def load_hf(path: str | Path, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> LlamaWeights:
    """Weights of a local Hugging Face Llama-style checkpoint directory (config.json and weights),
    read through ``transformers`` with ``local_files_only`` (nothing is downloaded). BadInput when
    transformers is missing, the directory is not a checkpoint, or the architecture is not
    Llama-shaped (RMSNorm, RoPE, GQA, SwiGLU, no biases)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise BadInput(
            f"{path}: not a Hugging Face checkpoint directory (no config.json there); "
            "give a local directory holding config.json and the weights"
        )
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise BadInput(f"{path / 'config.json'}: not readable as JSON ({exc})") from None
    problems = stand_in.checkpoint_problems(raw if isinstance(raw, dict) else {})
    if problems:
        raise BadInput(f"{path}: cannot be loaded as a Llama-shaped checkpoint: {'; '.join(problems)}")
    try:
        import transformers
    except ImportError as exc:
        raise BadInput(
            f"{path}: loading a Hugging Face checkpoint needs the optional package "
            f"'transformers' (pip install 'gpubench[hf]'); it is not installed ({exc})"
        ) from None
    try:
        version = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
        dtype_key = "dtype" if version >= (4, 56) else "torch_dtype"  # renamed in transformers 4.56
        model = transformers.AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, **{dtype_key: torch.float32}
        )
    except Exception as exc:  # noqa: BLE001 - any loader failure is the user's checkpoint
        raise BadInput(f"{path}: transformers could not load this checkpoint: {exc}") from None
    hf = model.config
    heads = hf.num_attention_heads
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // heads
    # transformers 5 keeps RoPE settings in rope_parameters; 4.x in rope_theta / rope_scaling.
    rope = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    theta = rope.get("rope_theta") or getattr(hf, "rope_theta", None) or 10000.0
    config = LlamaConfig(
        vocab_size=hf.vocab_size,
        hidden_size=hf.hidden_size,
        num_layers=hf.num_hidden_layers,
        num_heads=heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
        head_dim=head_dim,
        intermediate_size=hf.intermediate_size,
        rope_theta=float(theta),
        rms_eps=float(hf.rms_norm_eps),
        max_position=hf.max_position_embeddings,
        tie_word_embeddings=bool(getattr(hf, "tie_word_embeddings", False)),
    )
    state = model.state_dict()
    if any(name.endswith(".bias") for name in state):
        raise BadInput(
            f"{path}: the checkpoint has bias terms ({next(n for n in state if n.endswith('.bias'))}); "
            "only bias-free Llama-shaped models are supported"
        )
    take = lambda name: state[name].to(device=device, dtype=dtype).contiguous()
    layers = []
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        layers.append(
            LayerWeights(
                attn_norm=take(p + "input_layernorm.weight"),
                wq=take(p + "self_attn.q_proj.weight"),
                wk=take(p + "self_attn.k_proj.weight"),
                wv=take(p + "self_attn.v_proj.weight"),
                wo=take(p + "self_attn.o_proj.weight"),
                mlp_norm=take(p + "post_attention_layernorm.weight"),
                w_gate=take(p + "mlp.gate_proj.weight"),
                w_up=take(p + "mlp.up_proj.weight"),
                w_down=take(p + "mlp.down_proj.weight"),
            )
        )
    embed = take("model.embed_tokens.weight")
    lm_head = embed if config.tie_word_embeddings or "lm_head.weight" not in state else take("lm_head.weight")
    return LlamaWeights(config, embed, layers, take("model.norm.weight"), lm_head, source=str(path))


def model_from(
    spec: str, seed: int, dtype: torch.dtype, device: torch.device | str, layers: int = 0, ignore_fields: str = ""
) -> LlamaWeights:
    """The decoder a technique's ``model`` param names (:mod:`gpubench.models.stand_in`):

    - a built-in size of :data:`SIZES`: seeded random weights (``layers``: that many layers
      instead of its own, any number);
    - a checkpoint directory holding weights: those weights (``layers``: its first ones);
    - a preset, a config.json, or a checkpoint directory without weights: seeded random weights at
      that model's shapes (:meth:`LlamaConfig.from_model`; its first ``layers`` layers).

    ``layers`` 0 keeps the model's own; ``ignore_fields``: config fields to accept unread
    (:func:`gpubench.models.stand_in.ignore_list`). BadInput naming what is allowed when ``spec``
    names nothing, and for MLA models."""
    resolved = stand_in.resolve(spec, ignore_fields=ignore_fields)
    if resolved.kind == "size":
        config = SIZES[spec]
        return random_weights(replace(config, num_layers=layers) if layers else config, seed, dtype, device)
    if resolved.kind == "checkpoint":
        weights = load_hf(spec, dtype, device)
        if layers > weights.config.num_layers:
            raise BadInput(
                f"layers ({layers}) exceeds {spec}'s {weights.config.num_layers} layers; "
                f"allowed: 0 (all) to {weights.config.num_layers}."
            )
        if layers:
            weights = replace(
                weights, config=replace(weights.config, num_layers=layers), layers=weights.layers[:layers]
            )
        return weights
    assert resolved.config is not None  # (resolve parses every "config" spec)
    weights = random_weights(LlamaConfig.from_model(resolved.config, layers), seed, dtype, device)
    weights.source = f"random at {resolved.config.name}'s shapes"
    return weights


def with_overrides(config: LlamaConfig, **overrides) -> LlamaConfig:
    return replace(config, **overrides)
