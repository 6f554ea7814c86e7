"""Parameter counts and weight storage from a model config (pure arithmetic).

Counted matrix by matrix from the :class:`ModelConfig` the strict reader builds, as each family's
transformers modeling code lays out its weights:

- attention: q/k/v/o projections (Falcon: one fused qkv, its MQA keys and values; MLA: the
  low-rank q and kv projections with their norms); biases where the family has them (Qwen2 and
  Qwen2-MoE: q/k/v always; gpt-oss and others: ``attention_bias``; Falcon: ``bias``); per-head
  q/k norms (Qwen3, Qwen3-MoE, Gemma-3; Llama-4's qk norm has no weights); gpt-oss's per-head sinks;
- MLP per layer from ``cfg.moe``: routed experts (gate/up/down; gpt-oss with biases), the router
  (gpt-oss biased; DeepSeek-V3's noaux_tc adds a per-expert correction bias), shared experts
  (Qwen2-MoE's with its one-output gate), and the dense layers at ``dense_intermediate_size``
  (gated, or Falcon's up/down);
- norms: two per layer (Gemma-2/3: four; Falcon-7B's parallel block: one LayerNorm with bias;
  Falcon's new decoder architecture: two), a final norm;
- embeddings, and an LM head unless ``tie_word_embeddings``.

The main model only: DeepSeek-V3's multi-token-prediction module is not counted (as its published
671B is not), nor is a multimodal wrapper's vision tower (Llama-4, Gemma-3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpubench.models.config import DTYPE_ALIASES, DTYPE_BYTES, ModelConfig


@dataclass
class ParamCount:
    groups: dict[str, int] = field(default_factory=dict)  # group name -> parameters
    method: str = ""
    # group -> how its weights are stored when the checkpoint is quantized (else the dtype)
    quantized: dict[str, str] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.groups.values())

    def add(self, group: str, n: int) -> None:
        if n:
            self.groups[group] = self.groups.get(group, 0) + int(n)


def count_parameters(cfg: ModelConfig) -> ParamCount:
    kind = "MLA + MoE" if cfg.mla is not None else ("MoE" if cfg.moe is not None else "dense")
    pc = ParamCount(method=f"{cfg.family} {kind} decoder" + (" (main model, without MTP layers)" if cfg.mla else ""))
    _attention(cfg, pc)
    _mlp(cfg, pc)
    _norms(cfg, pc)
    _embeddings(cfg, pc)
    quant = cfg.raw.get("quantization_config") or {}
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "mxfp4" and cfg.family == "gpt_oss":
        pc.quantized["expert_weights"] = "mxfp4"
    elif method == "fp8" and cfg.family.startswith("deepseek"):
        for group in ("attention", "mlp", "expert_weights", "shared_experts"):
            if group in pc.groups:
                pc.quantized[group] = "fp8_block"
    return pc


def _attention(cfg: ModelConfig, pc: ParamCount) -> None:
    raw, h, n = cfg.raw, cfg.hidden_size, cfg.num_layers
    if cfg.mla is not None:
        mla, heads = cfg.mla, cfg.num_heads
        q_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank:  # q_a_proj, q_a_layernorm, q_b_proj
            q_proj = h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * heads * q_head
        else:
            q_proj = h * heads * q_head
        kv_proj = (  # kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj
            h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
            + mla.kv_lora_rank
            + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        )
        pc.add("attention", n * (q_proj + kv_proj + heads * mla.v_head_dim * h))
        return
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    if cfg.family == "falcon":
        bias = bool(raw.get("bias"))
        pc.add("attention", n * (h * (q + 2 * kv) + q * h + (q + 2 * kv + h) * bias))
        return
    if cfg.family in ("qwen2", "qwen2_moe"):
        qkv_bias, o_bias = True, False  # transformers' Qwen2: bias=True on q/k/v, none on o
    else:
        qkv_bias = o_bias = bool(raw.get("attention_bias"))
    pc.add("attention", n * (h * q + 2 * h * kv + q * h + (q + 2 * kv) * qkv_bias + h * o_bias))
    if cfg.family in ("qwen3", "qwen3_moe", "gemma3"):
        pc.add("attention", n * 2 * cfg.head_dim)  # q_norm, k_norm over head_dim
    if cfg.family == "gpt_oss":
        pc.add("attention_sinks", n * cfg.num_heads)


def _mlp(cfg: ModelConfig, pc: ParamCount) -> None:
    raw, h, moe = cfg.raw, cfg.hidden_size, cfg.moe
    dense = cfg.dense_intermediate_size or cfg.intermediate_size or 4 * h
    if cfg.gated_mlp:
        dense_params = 3 * h * dense + (2 * dense + h) * bool(raw.get("mlp_bias"))
    else:  # Falcon: dense_h_to_4h, dense_4h_to_h
        dense_params = 2 * h * dense + (dense + h) * bool(raw.get("bias"))
    for i in range(cfg.num_layers):
        if moe is None or not moe.layers[i]:
            pc.add("mlp", dense_params)
            continue
        e, d = moe.num_experts, moe.expert_dim
        pc.add("expert_weights", e * 3 * h * d)
        if cfg.family == "gpt_oss":
            pc.add("expert_biases", e * (2 * d + h))
            pc.add("router", h * e + e)
        else:
            pc.add("router", h * e + (e if raw.get("topk_method") == "noaux_tc" else 0))
        if moe.shared_experts and moe.shared_expert_dim:
            pc.add("shared_experts", moe.shared_experts * 3 * h * moe.shared_expert_dim)
        if cfg.family == "qwen2_moe":
            pc.add("router", h)  # shared_expert_gate: hidden -> 1


def _norms(cfg: ModelConfig, pc: ParamCount) -> None:
    raw, h, n = cfg.raw, cfg.hidden_size, cfg.num_layers
    if cfg.family == "falcon":  # LayerNorms, weight and bias (transformers' FalconDecoderLayer)
        lns = raw.get("num_ln_in_parallel_attn") or (2 if raw.get("new_decoder_architecture") else 1)
        per_layer = 2 if not raw.get("parallel_attn") else lns
        pc.add("norms", n * per_layer * 2 * h + 2 * h)
        return
    per_layer = 4 if cfg.family in ("gemma2", "gemma3") else 2
    pc.add("norms", n * per_layer * h + h)


def _embeddings(cfg: ModelConfig, pc: ParamCount) -> None:
    vocab = cfg.vocab_size or 0
    pc.add("embedding", vocab * cfg.hidden_size)
    if not cfg.tie_word_embeddings:
        pc.add("lm_head", vocab * cfg.hidden_size)


# Bytes per parameter of quantized storage, scales included:
#   mxfp4: 4-bit values + one 8-bit (e8m0) scale per 32 values -> 4.25 bits;
#   fp8_block: 1 byte + one fp32 scale per 128 x 128 block.
QUANT_BYTES = {"mxfp4": 4.25 / 8, "fp8_block": 1.0 + 4.0 / (128 * 128)}


@dataclass(frozen=True)
class WeightBytes:
    bytes: int
    note: str


def normalize_dtype(name: str) -> str:
    return DTYPE_ALIASES.get(name, name)


def weight_bytes(cfg: ModelConfig, weight_dtype: str | None = None) -> WeightBytes:
    """Weight storage from the parameter count: ``weight_dtype`` for every parameter when given,
    else the checkpoint's own storage (its ``quantization_config``, else ``torch_dtype``)."""
    pc = count_parameters(cfg)
    if weight_dtype is not None:
        dtype = normalize_dtype(weight_dtype)
        return WeightBytes(
            math.ceil(pc.total * DTYPE_BYTES[dtype]),
            f"{pc.total / 1e9:.2f}B parameters x {DTYPE_BYTES[dtype]:g} B ({dtype}); {pc.method}",
        )
    base = DTYPE_BYTES[cfg.torch_dtype]  # (the reader refuses a dtype it does not know)
    total = 0.0
    for group, n in pc.groups.items():
        fmt = pc.quantized.get(group)
        total += n * (QUANT_BYTES[fmt] if fmt else base)
    quant = ", ".join(sorted({f"{g} in {f}" for g, f in pc.quantized.items()}))
    note = f"{pc.total / 1e9:.2f}B parameters, {cfg.torch_dtype}" + (f" ({quant})" if quant else "") + f"; {pc.method}"
    return WeightBytes(math.ceil(total), note)
