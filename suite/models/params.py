"""Parameter counts and weight storage from a model config (pure arithmetic).

Counted per family, matrix by matrix:

- Llama-style dense models (llama, mistral, qwen2, and the fallback for unknown types);
- gpt-oss: biased attention projections, per-head attention sinks, a biased router, and
  experts with fused gate/up projections (MXFP4-quantized in the published checkpoint);
- DeepSeek-V2/V3: MLA projections (low-rank q and kv), dense MLPs in the first layers, routed
  and shared experts after (FP8 with 128x128 block scales in the published V3 checkpoint).
The main model only: DeepSeek-V3's multi-token-prediction module is not counted (as its
published 671B is not).
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
        self.groups[group] = self.groups.get(group, 0) + int(n)


def count_parameters(cfg: ModelConfig) -> ParamCount:
    if cfg.model_type == "gpt_oss":
        return _gpt_oss(cfg)
    if cfg.mla is not None:
        return _deepseek(cfg)
    return _dense(cfg)


def _embeddings(cfg: ModelConfig, pc: ParamCount) -> None:
    vocab = cfg.vocab_size or 0
    pc.add("embedding", vocab * cfg.hidden_size)
    if not cfg.tie_word_embeddings:
        pc.add("lm_head", vocab * cfg.hidden_size)
    pc.add("norms", cfg.hidden_size)  # final norm


def _dense(cfg: ModelConfig) -> ParamCount:
    raw, h = cfg.raw, cfg.hidden_size
    known = cfg.model_type in ("llama", "mistral", "qwen2", "qwen3")
    pc = ParamCount(
        method=f"{cfg.model_type} dense decoder"
        if known
        else f"unknown model_type {cfg.model_type!r}: counted as a Llama-style dense decoder"
    )
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    qkv_bias = bool(raw.get("attention_bias", cfg.model_type == "qwen2"))
    o_bias = bool(raw.get("attention_bias", False)) and cfg.model_type != "qwen2"
    inter = cfg.intermediate_size or 4 * h
    per_layer_attn = h * q + 2 * h * kv + q * h + (q + 2 * kv) * qkv_bias + h * o_bias
    per_layer_mlp = 3 * h * inter + (2 * inter + h) * bool(raw.get("mlp_bias", False))
    pc.add("attention", cfg.num_layers * per_layer_attn)
    pc.add("mlp", cfg.num_layers * per_layer_mlp)
    pc.add("norms", cfg.num_layers * 2 * h)
    _embeddings(cfg, pc)
    return pc


def _gpt_oss(cfg: ModelConfig) -> ParamCount:
    raw, h, n = cfg.raw, cfg.hidden_size, cfg.num_layers
    pc = ParamCount(method="gpt-oss MoE decoder")
    q, kv = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    experts = raw.get("num_local_experts") or 0
    inter = cfg.intermediate_size or h
    pc.add("attention", n * (h * q + q + 2 * (h * kv + kv) + q * h + h))
    pc.add("attention_sinks", n * cfg.num_heads)
    pc.add("router", n * (h * experts + experts))
    pc.add("expert_weights", n * experts * (h * 2 * inter + inter * h))
    pc.add("expert_biases", n * experts * (2 * inter + h))
    pc.add("norms", n * 2 * h)
    _embeddings(cfg, pc)
    quant = raw.get("quantization_config") or {}
    if quant.get("quant_method") == "mxfp4":
        pc.quantized["expert_weights"] = "mxfp4"
    return pc


def _deepseek(cfg: ModelConfig) -> ParamCount:
    raw, h, mla = cfg.raw, cfg.hidden_size, cfg.mla
    assert mla is not None
    pc = ParamCount(method=f"{cfg.model_type} MLA + MoE decoder (main model, without MTP layers)")
    heads = cfg.num_heads
    q_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    if mla.q_lora_rank:
        q_proj = h * mla.q_lora_rank + mla.q_lora_rank + mla.q_lora_rank * heads * q_head
    else:
        q_proj = h * heads * q_head
    kv_proj = (
        h * (mla.kv_lora_rank + mla.qk_rope_head_dim)
        + mla.kv_lora_rank
        + mla.kv_lora_rank * heads * (mla.qk_nope_head_dim + mla.v_head_dim)
    )
    o_proj = heads * mla.v_head_dim * h
    pc.add("attention", cfg.num_layers * (q_proj + kv_proj + o_proj))
    routed = raw.get("n_routed_experts") or 0
    shared = raw.get("n_shared_experts") or 0
    moe_inter = raw.get("moe_intermediate_size") or 0
    first_dense = raw.get("first_k_dense_replace", 0) or 0
    freq = raw.get("moe_layer_freq", 1) or 1
    for i in range(cfg.num_layers):
        if routed and i >= first_dense and i % freq == 0:
            pc.add("expert_weights", (routed + shared) * 3 * h * moe_inter)
            pc.add("router", routed * h + (routed if raw.get("topk_method") == "noaux_tc" else 0))
        else:
            pc.add("mlp", 3 * h * (cfg.intermediate_size or 4 * h))
    pc.add("norms", cfg.num_layers * 2 * h)
    _embeddings(cfg, pc)
    quant = raw.get("quantization_config") or {}
    if quant.get("quant_method") == "fp8":
        pc.quantized.update({"attention": "fp8_block", "mlp": "fp8_block", "expert_weights": "fp8_block"})
    return pc


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
    base = DTYPE_BYTES.get(cfg.torch_dtype, 2.0)
    total = 0.0
    for group, n in pc.groups.items():
        fmt = pc.quantized.get(group)
        total += n * (QUANT_BYTES[fmt] if fmt else base)
    quant = ", ".join(sorted({f"{g} in {f}" for g, f in pc.quantized.items()}))
    note = f"{pc.total / 1e9:.2f}B parameters, {cfg.torch_dtype}" + (f" ({quant})" if quant else "") + f"; {pc.method}"
    return WeightBytes(math.ceil(total), note)
