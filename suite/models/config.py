"""Model configurations: Hugging Face ``config.json`` -> :class:`ModelConfig`, one strict reader
for every family in :mod:`gpubench.models.families` (an unknown family or field is refused, naming
it; a transformers default stands in for an absent field only where the family table says so, and
:attr:`ModelConfig.defaults_used` lists each one).

Only what memory planning needs is read: layer count, attention heads and KV heads, head_dim
(from the config when it is there: it is not always hidden_size / num_attention_heads), the
attention kind (MHA/GQA/MQA, or MLA for DeepSeek-V2/V3), which layers use a sliding window, and
what the parameter count and weight storage are. Presets are published configs shipped in
``presets/`` (``gpubench kv-cache --list``).
"""

from __future__ import annotations

import difflib
import importlib.resources
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubench.errors import BadInput
from gpubench.models.families import (
    ARCHITECTURES,
    COMMON_FIELDS,
    FAMILIES,
    MODEL_TYPES,
    WRAPPER_TYPES,
    Family,
    family_list,
)

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
DTYPE_ALIASES = {
    "fp32": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float": "float32",
}


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention dims (DeepSeek-V2/V3): the cache holds one compressed latent
    (kv_lora_rank) plus the decoupled RoPE key (qk_rope_head_dim) per token per layer."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts MLP layers: routed experts, how many a token takes, their width, the
    always-on shared experts, and which layers have them (the others are dense MLPs)."""

    num_experts: int
    top_k: int
    expert_dim: int  # intermediate width of one routed expert
    shared_experts: int  # always-on experts per MoE layer (DeepSeek n_shared_experts; Qwen2-MoE, Llama-4: 1)
    shared_expert_dim: int | None  # their width (None: no shared expert)
    layers: tuple[bool, ...]  # per layer: True where the MLP is the MoE one

    @property
    def moe_layers(self) -> int:
        return sum(self.layers)


@dataclass(frozen=True)
class ModelConfig:
    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_from_config: bool
    vocab_size: int | None
    intermediate_size: int | None
    max_position_embeddings: int | None
    layer_windows: tuple[int | None, ...]  # per layer: None = full attention, else window size
    layer_chunks: tuple[int | None, ...]  # per layer: chunked local attention's chunk size, else None
    mla: MLA | None
    torch_dtype: str
    tie_word_embeddings: bool
    raw: dict[str, Any] = field(repr=False, compare=False)  # as read, the family's defaults filled in
    moe: MoE | None = None
    hidden_act: str = "silu"  # as the family's MLP reads it; gpt-oss: "swiglu_clamp"
    family: str = "llama"  # gpubench.models.families.FAMILIES key
    # Width of the dense (non-MoE) MLP layers: intermediate_size, but Llama-4's intermediate_size_mlp
    dense_intermediate_size: int | None = None
    gated_mlp: bool = True  # gate/up/down (SwiGLU, GeGLU); False: Falcon's up/down MLP
    swiglu_limit: float | None = None  # gpt-oss: the clamp of its SwiGLU
    swiglu_alpha: float | None = None  # gpt-oss: its sigmoid's scale (1.702)
    defaults_used: tuple[str, ...] = ()  # "field=value" for each transformers default applied
    ignored_fields: tuple[str, ...] = ()  # fields accepted unread (--ignore-field)

    @property
    def attention(self) -> str:
        if self.mla is not None:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def sliding_layers(self) -> int:
        return sum(w is not None for w in self.layer_windows)

    @property
    def chunked_layers(self) -> int:
        return sum(c is not None for c in self.layer_chunks)

    @property
    def summary(self) -> str:
        """One line of the shapes a technique measures, e.g. gpt-oss-20b: "24 layers; GQA 64 q / 8 kv
        heads x 64; sliding 128 on 12 layers; MoE 32 experts top-4 x 2880"."""
        parts = [f"{self.num_layers} layers"]
        if self.mla is not None:
            m = self.mla
            parts.append(f"MLA {self.num_heads} heads, latent {m.kv_lora_rank} + rope {m.qk_rope_head_dim}")
        else:
            parts.append(f"{self.attention} {self.num_heads} q / {self.num_kv_heads} kv heads x {self.head_dim}")
        for kind, spans in (("sliding", self.layer_windows), ("chunked", self.layer_chunks)):
            sizes = sorted({s for s in spans if s is not None})
            if sizes:
                count = sum(s is not None for s in spans)
                parts.append(f"{kind} {'/'.join(map(str, sizes))} on {count} layers")
        if self.moe is not None:
            moe = self.moe
            text = f"MoE {moe.num_experts} experts top-{moe.top_k} x {moe.expert_dim}"
            if moe.shared_experts and moe.shared_expert_dim:
                text += f" + {moe.shared_experts} shared x {moe.shared_expert_dim}"
            if moe.moe_layers < self.num_layers:
                text += f" on {moe.moe_layers} layers (dense x {self.dense_intermediate_size})"
            parts.append(text)
        return "; ".join(parts)

    def with_layers(self, n: int) -> ModelConfig:
        """The first ``n`` layers only (the same per-layer pattern): for allocating a model's real
        cache layout at a size a small machine can hold."""
        from dataclasses import replace

        moe = None if self.moe is None else replace(self.moe, layers=self.moe.layers[:n])
        return replace(
            self, num_layers=n, layer_windows=self.layer_windows[:n], layer_chunks=self.layer_chunks[:n], moe=moe
        )


# Integer fields a plan reads, each with a bound far above any published model (layers: the largest
# have ~130; positions: ~10M) so that absurd values are refused before anything is built per layer.
CONFIG_LIMITS = {
    "num_hidden_layers": 10_000,
    "hidden_size": 2**20,
    "num_attention_heads": 2**16,
    "num_key_value_heads": 2**16,
    "head_dim": 2**16,
    "vocab_size": 2**24,
    "intermediate_size": 2**22,
    "max_position_embeddings": 2**30,
    "sliding_window": 2**30,
    "kv_lora_rank": 2**16,
    "qk_rope_head_dim": 2**16,
    "qk_nope_head_dim": 2**16,
    "v_head_dim": 2**16,
    "q_lora_rank": 2**20,
    "moe_intermediate_size": 2**22,
    "n_routed_experts": 2**16,
    "num_local_experts": 2**16,
    "attention_chunk_size": 2**30,
    "num_experts": 2**16,
    "num_experts_per_tok": 2**16,
    "experts_per_token": 2**16,
    "shared_expert_intermediate_size": 2**22,
    "intermediate_size_mlp": 2**22,
    "ffn_hidden_size": 2**22,
    "num_kv_heads": 2**16,
    "decoder_sparse_step": 10_000,
    "interleave_moe_layer_step": 10_000,
    "moe_layer_freq": 10_000,
}


def _family_of(raw: dict[str, Any], source: str) -> Family:
    """The family a config belongs to: its ``model_type``, else its ``architectures``."""
    model_type = raw.get("model_type")
    if model_type is not None:
        family = MODEL_TYPES.get(str(model_type))
        if family is None:
            raise BadInput(
                f"{source}: model_type {model_type!r} is not a family gpubench reads; families (model_type): "
                f"{family_list()}. A model of another family needs its reader added "
                "(gpubench.models.families)."
            )
        return FAMILIES[family]
    archs = raw.get("architectures") or []
    found = [ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES]
    if not found:
        raise BadInput(
            f"{source}: the config has no model_type and its architectures ({archs or 'none'}) name no family "
            f"gpubench reads; families (model_type): {family_list()}."
        )
    return FAMILIES[found[0]]


def _unknown_fields(raw: dict[str, Any], allowed: frozenset[str], ignore: frozenset[str]) -> list[str]:
    return sorted(k for k in raw if not str(k).startswith("_") and k not in allowed and k not in ignore)


def _refuse_unknown(unknown: list[str], raw: dict[str, Any], family: Family, source: str, where: str = "") -> None:
    if not unknown:
        return
    shown = ", ".join(f"{k}={_short(raw[k])}" for k in unknown)
    raise BadInput(
        f"{source}: {where}field(s) {shown} are not known for the {family.name} family; gpubench reads a config "
        f"only where it knows what each field does to the measured shapes (allowed: the fields "
        f"transformers' {family.transformers_class} reads, listed in gpubench.models.families). If they "
        "change nothing a technique measures, go on with --ignore-field NAME (repeatable; "
        "from_dict(..., ignore_fields=[...]) in code); otherwise this model needs its reader extended."
    )


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def from_dict(raw: dict[str, Any], name: str, source: str, ignore_fields: Iterable[str] = ()) -> ModelConfig:
    """Parse a Hugging Face config strictly; raise BadInput naming every unknown, missing or
    invalid field. ``ignore_fields``: field names to accept unread (the user's word that they
    change nothing measured). Keys starting with "_" (the presets' notes) are never read."""
    ignore = frozenset(str(f) for f in ignore_fields)
    family = _family_of(raw, source)
    read = sorted(ignore & (COMMON_FIELDS | family.fields | family.wrapper_fields | set(family.aliases)))
    if read:
        raise BadInput(
            f"{source}: --ignore-field {', '.join(read)}: the {family.name} reader uses or knows "
            f"{'that field' if len(read) == 1 else 'those fields'}; ignore only a field it refuses as unknown."
        )
    ignored: set[str] = set()
    if isinstance(raw.get("text_config"), dict):  # multimodal wrappers keep the LM config inside
        if str(raw.get("model_type") or "") not in WRAPPER_TYPES and raw.get("model_type") is not None:
            raise BadInput(f"{source}: text_config is set but model_type {raw['model_type']!r} is not a wrapper.")
        outer = raw
        _refuse_unknown(
            _unknown_fields(outer, COMMON_FIELDS | family.wrapper_fields, ignore), outer, family, source, "wrapper "
        )
        ignored |= ignore & set(outer)
        inner = outer["text_config"]
        # the wrapper's own dtype / quantization / head tying apply where the text config does not
        # repeat them (transformers ties the wrapper's LM head by its top-level config)
        raw = {
            **{
                k: outer[k]
                for k in ("torch_dtype", "dtype", "quantization_config", "tie_word_embeddings")
                if k in outer
            },
            **inner,
            "architectures": outer.get("architectures"),
        }
        raw.setdefault("model_type", family.model_types[0])
        if MODEL_TYPES.get(str(raw["model_type"])) != family.name:
            raise BadInput(
                f"{source}: text_config.model_type {raw['model_type']!r} is not of the {family.name} family "
                f"its wrapper (model_type {outer.get('model_type')!r}) names."
            )
    known = COMMON_FIELDS | family.fields | set(family.aliases)
    _refuse_unknown(_unknown_fields(raw, frozenset(known), ignore), raw, family, source)
    ignored |= ignore & set(raw)
    raw = {k: v for k, v in raw.items() if k not in ignore}
    for alias, field_name in family.aliases.items():
        if alias in raw:
            if field_name in raw and raw[field_name] != raw[alias]:
                raise BadInput(
                    f"{source}: {alias}={_short(raw[alias])} and {field_name}={_short(raw[field_name])} name "
                    f"the same field of the {family.name} family ({family.transformers_class}) and differ."
                )
            raw[field_name] = raw.pop(alias)
    if family.name in ("gemma2", "gemma3") and raw.get("use_bidirectional_attention"):
        raise BadInput(
            f"{source}: use_bidirectional_attention is true: not a causal language model (an embedding "
            "model); the techniques measure causal decoders."
        )
    required = ["hidden_size", "num_hidden_layers", "num_attention_heads"]
    if family.name.startswith("deepseek"):
        required += ["kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"]
        if family.name == "deepseek_v2":
            required.append("num_experts_per_tok")  # DeepseekV2Config has no default for it
    missing = [k for k in required if raw.get(k) is None]
    if missing:
        raise BadInput(
            f"{source}: the config lacks required field(s) {', '.join(missing)}; every model needs hidden_size, "
            f"num_hidden_layers, num_attention_heads (and MLA models kv_lora_rank, qk_rope_head_dim, "
            f"qk_nope_head_dim, v_head_dim). No default stands in for them."
        )
    if "sliding_window_size" in raw and raw["sliding_window_size"] != raw.get("sliding_window"):
        raise BadInput(
            f"{source}: sliding_window_size={raw['sliding_window_size']!r} and sliding_window="
            f"{raw.get('sliding_window')!r} differ; transformers reads sliding_window: set both alike."
        )
    used = tuple(f"{k}={_short(v)}" for k, v in family.defaults.items() if k not in raw)
    from_config = raw.get("head_dim") is not None  # (not derived, not a family default)
    raw = {**family.defaults, **raw}
    if "use_sliding_window" in family.defaults and not raw.get("use_sliding_window"):
        # Qwen's window is off: transformers ignores sliding_window then (Qwen2MoeConfig saves 0)
        raw["sliding_window"] = None
    bad = [
        f"{k}={raw[k]!r}"
        for k in CONFIG_LIMITS
        if raw.get(k) is not None and (not isinstance(raw[k], int) or isinstance(raw[k], bool) or raw[k] <= 0)
    ]
    if bad:
        raise BadInput(f"{source}: these fields must be positive integers: {', '.join(bad)}.")
    # Bounds before anything is built per layer: a config with 10^9 layers is refused at once.
    huge = [
        f"{k}={raw[k]:,} (allowed: 1 to {limit:,})"
        for k, limit in CONFIG_LIMITS.items()
        if raw.get(k) is not None and raw[k] > limit
    ]
    if huge:
        raise BadInput(
            f"{source}: out of range: {'; '.join(huge)}. The bounds are far above any published "
            f"model (at most a few hundred layers, a few million positions); fix the config."
        )
    heads = raw["num_attention_heads"]
    mla_family = family.name.startswith("deepseek")
    if mla_family:
        # MLA caches one latent per token, and every query head gets its own key and value from it:
        # num_key_value_heads shapes no cache or weight (vLLM does not read it; transformers loads
        # any value; the published configs set it to the head count), so it is neither read nor
        # checked, nor listed as a default applied.
        kv_heads = heads
        used = tuple(u for u in used if not u.startswith("num_key_value_heads="))
    else:
        kv_heads = _kv_heads(raw, family, heads, source)
    if heads % kv_heads:
        defaulted = any(u.startswith("num_key_value_heads=") for u in used)
        raise BadInput(
            f"{source}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
            + (
                f" (the config has no num_key_value_heads: {kv_heads} is transformers' "
                f"{family.transformers_class} default; set it)."
                if defaulted
                else "."
            )
        )
    head_dim = raw.get("head_dim")
    if head_dim is None:
        head_dim = raw["hidden_size"] // heads
    layers = raw["num_hidden_layers"]
    mla = None
    if mla_family:
        qk = raw.get("qk_head_dim")
        if qk is not None and qk != raw["qk_nope_head_dim"] + raw["qk_rope_head_dim"]:
            raise BadInput(
                f"{source}: qk_head_dim={qk!r} is not qk_nope_head_dim + qk_rope_head_dim "
                f"({raw['qk_nope_head_dim']} + {raw['qk_rope_head_dim']}), as transformers derives it."
            )
        mla = MLA(
            raw["kv_lora_rank"],
            raw["qk_rope_head_dim"],
            raw.get("q_lora_rank"),
            raw["qk_nope_head_dim"],
            raw["v_head_dim"],
        )
    act, limit, alpha = _activation(raw, family, source)
    moe = _moe(raw, family, layers, source)
    gated = family.name != "falcon"
    if family.name == "falcon":
        inter = raw.get("ffn_hidden_size") or 4 * raw["hidden_size"]
        if raw.get("ffn_hidden_size") is None:
            used += (f"ffn_hidden_size={inter} (4 x hidden_size)",)
    else:
        inter = raw.get("intermediate_size")
    dense = inter
    if family.name == "llama4":
        dense = raw["intermediate_size_mlp"]
        if moe is None:  # no MoE layer: intermediate_size (an expert's width) is used by none
            inter = dense
    dtype = _dtype(raw, source)
    if dtype is None:  # (transformers' own: none; float32 on load)
        dtype = "bfloat16"
        used += ("torch_dtype='bfloat16' (assumed for weight bytes: the config names no dtype)",)
    return ModelConfig(
        name=name,
        model_type=str(raw.get("model_type") or family.model_types[0]),
        hidden_size=raw["hidden_size"],
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        head_dim_from_config=from_config,
        vocab_size=raw.get("vocab_size"),
        intermediate_size=inter,
        max_position_embeddings=raw.get("max_position_embeddings"),
        layer_windows=_layer_windows(raw, family.name, layers, source),
        layer_chunks=_layer_chunks(raw, family.name, layers, source),
        mla=mla,
        torch_dtype=dtype,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings")),
        raw=raw,
        moe=moe,
        hidden_act=act,
        family=family.name,
        dense_intermediate_size=dense,
        gated_mlp=gated,
        swiglu_limit=limit,
        swiglu_alpha=alpha,
        defaults_used=used,
        ignored_fields=tuple(sorted(ignored)),
    )


def _dtype(raw: dict[str, Any], source: str) -> str | None:
    """The weights' dtype the config names (``torch_dtype``, or ``dtype`` as transformers 5 saves
    it), one of :data:`DTYPE_BYTES` or its aliases; None when it names none. Anything else is
    refused: the weight bytes are read from it, and no default stands in for a dtype not known."""
    named = {k: raw[k] for k in ("torch_dtype", "dtype") if raw.get(k) is not None}
    read: dict[str, str] = {}
    for key, value in named.items():
        canonical = DTYPE_ALIASES.get(value, value) if isinstance(value, str) else None
        if canonical not in DTYPE_BYTES:
            raise BadInput(
                f"{source}: {key}={_short(value)} is not a weight dtype gpubench knows; allowed: "
                f"{', '.join(DTYPE_BYTES)} (or {', '.join(DTYPE_ALIASES)})."
            )
        read[key] = canonical
    if len(set(read.values())) > 1:
        raise BadInput(
            f"{source}: torch_dtype={named['torch_dtype']!r} and dtype={named['dtype']!r} name the weights' "
            "dtype twice and differ; set one (transformers 5 writes dtype)."
        )
    return next(iter(read.values()), None)


def _activation(raw: dict[str, Any], family: Family, source: str) -> tuple[str, float | None, float | None]:
    """The MLP activation as each family's modeling code reads it: Gemma's ``hidden_activation``
    (gelu_pytorch_tanh), Falcon's ``activation`` (gelu; a plain 4h MLP, not gated), gpt-oss's
    clamped SwiGLU ("swiglu_clamp": gate clamped above, linear part to +-``swiglu_limit``,
    gate * sigmoid(``swiglu_alpha`` gate) * (linear + 1), alpha 1.702), else ``hidden_act`` (silu:
    SwiGLU)."""
    if family.name == "gpt_oss":
        numbers: list[float] = []
        for key in ("swiglu_limit", "swiglu_alpha"):
            value = raw.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise BadInput(f"{source}: {key}={value!r}; allowed: a positive number (gpt-oss: 7.0 and 1.702).")
            numbers.append(float(value))
        return "swiglu_clamp", numbers[0], numbers[1]
    key = {"gemma2": "hidden_activation", "gemma3": "hidden_activation", "falcon": "activation"}.get(
        family.name, "hidden_act"
    )
    value = raw.get(key)
    if not isinstance(value, str) or not value:
        raise BadInput(f"{source}: {key}={value!r}; allowed: an activation name such as silu or gelu_pytorch_tanh.")
    return value, None, None


TOP_K_FIELDS = ("num_experts_per_tok", "experts_per_token")
MOE_FIELDS = {  # family -> (expert count field, expert width field)
    "mixtral": ("num_local_experts", "intermediate_size"),
    "gpt_oss": ("num_local_experts", "intermediate_size"),
    "llama4": ("num_local_experts", "intermediate_size"),
    "qwen2_moe": ("num_experts", "moe_intermediate_size"),
    "qwen3_moe": ("num_experts", "moe_intermediate_size"),
    "deepseek_v2": ("n_routed_experts", "moe_intermediate_size"),
    "deepseek_v3": ("n_routed_experts", "moe_intermediate_size"),
}


def _moe(raw: dict[str, Any], family: Family, layers: int, source: str) -> MoE | None:
    """The MoE layers as each family's modeling code builds them (transformers 5.25; vLLM alike):

    - Mixtral, gpt-oss: every layer; ``intermediate_size`` is one expert's width, no shared expert;
    - Qwen2-MoE / Qwen3-MoE: ``moe_intermediate_size`` wide; layer i is MoE unless it is in
      ``mlp_only_layers``, when (i + 1) % ``decoder_sparse_step`` == 0 (the others are dense MLPs
      ``intermediate_size`` wide); Qwen2-MoE always adds one shared expert
      ``shared_expert_intermediate_size`` wide (with a sigmoid gate), Qwen3-MoE none;
    - DeepSeek-V2/V3: ``moe_intermediate_size`` wide; layer i is MoE when i >= ``first_k_dense_replace``
      and i % ``moe_layer_freq`` == 0 (vLLM and DeepSeek's own code; transformers ignores the
      frequency, which every published config sets to 1); ``n_shared_experts`` shared experts of
      the same width (transformers builds them as one MLP n_shared x as wide: the same weights);
      the dense layers are ``intermediate_size`` wide;
    - Llama-4: ``intermediate_size`` wide, one shared expert of that width; the layers in
      ``moe_layers`` when given, else every ``interleave_moe_layer_step``-th ((i + 1) % step == 0);
      its dense layers are ``intermediate_size_mlp`` wide.

    A layer index in ``mlp_only_layers`` or ``moe_layers`` outside 0 .. layers - 1 is refused
    (transformers ignores it: a list written for another layer count). A config whose pattern
    leaves no layer MoE (every layer in ``mlp_only_layers``, ``moe_layers`` empty,
    ``first_k_dense_replace`` >= the layers, a sparse step above them) is what transformers builds
    from it, a dense model: read as one (None; every MLP at the dense width), so that no
    technique measures experts the model does not have.
    """
    if family.name not in MOE_FIELDS:  # (its strict field list has no expert fields)
        return None
    key, width_key = MOE_FIELDS[family.name]
    experts = raw.get(key)
    if not isinstance(experts, int) or isinstance(experts, bool) or experts <= 0:
        raise BadInput(f"{source}: {key}={experts!r}; allowed: a positive integer (the routed experts).")
    top = {k: raw[k] for k in TOP_K_FIELDS if raw.get(k) is not None}
    if len(set(top.values())) > 1:
        raise BadInput(f"{source}: {' and '.join(f'{k}={v}' for k, v in top.items())} disagree on experts per token.")
    if not top:
        raise BadInput(
            f"{source}: {key}={experts} says the model has experts, but no field says how many a token "
            f"takes; allowed: {' or '.join(TOP_K_FIELDS)} (a positive integer)."
        )
    top_key, top_k = next(iter(top.items()))
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k <= 0:
        raise BadInput(f"{source}: {top_key}={top_k!r}; allowed: a positive integer.")
    if top_k > experts:
        raise BadInput(f"{source}: {top_key}={top_k} exceeds {key}={experts} (a token cannot take more experts).")
    expert_dim = raw.get(width_key)
    if expert_dim is None:
        raise BadInput(f"{source}: an MoE config of the {family.name} family needs {width_key} (one expert's width).")

    def count(name: str, low: int = 0) -> int:
        value = raw.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise BadInput(f"{source}: {name}={value!r}; allowed: an integer >= {low}.")
        return value

    def index_list(name: str) -> list[int]:
        listed = raw.get(name) or []
        if not isinstance(listed, list) or any(not isinstance(i, int) or isinstance(i, bool) for i in listed):
            raise BadInput(f"{source}: {name} must be a list of layer indices.")
        outside = sorted({i for i in listed if not 0 <= i < layers})
        if outside:
            raise BadInput(
                f"{source}: {name} names layer(s) {', '.join(map(str, outside))}, but the model has {layers} "
                f"(num_hidden_layers); allowed: indices 0 to {layers - 1}."
            )
        return listed

    shared, shared_dim = 0, None
    if family.name.startswith("deepseek"):
        first_dense = count("first_k_dense_replace")
        freq = count("moe_layer_freq", low=1)
        pattern = tuple(i >= first_dense and i % freq == 0 for i in range(layers))
        shared = count("n_shared_experts")
        shared_dim = expert_dim if shared else None
    elif family.name in ("qwen2_moe", "qwen3_moe"):
        step = count("decoder_sparse_step", low=1)
        only_mlp = index_list("mlp_only_layers")
        pattern = tuple(i not in only_mlp and (i + 1) % step == 0 for i in range(layers))
        if family.name == "qwen2_moe":
            shared, shared_dim = 1, count("shared_expert_intermediate_size", low=1)
    elif family.name == "llama4":
        if raw.get("moe_layers") is not None:
            listed = index_list("moe_layers")
            pattern = tuple(i in listed for i in range(layers))
        else:
            step = count("interleave_moe_layer_step", low=1)
            pattern = tuple((i + 1) % step == 0 for i in range(layers))
        shared, shared_dim = 1, expert_dim
    else:
        pattern = (True,) * layers
    if not any(pattern):
        return None  # transformers builds every MLP dense (see above)
    return MoE(experts, top_k, expert_dim, shared, shared_dim, pattern)


# The fields a config may name its KV heads by, in the order vLLM's config code reads them (the
# strict field lists leave each family only its own: Falcon's num_kv_heads / n_head_kv, the others'
# num_key_value_heads).
KV_HEAD_FIELDS = ("n_head_kv", "num_kv_heads", "num_key_value_heads")


def _kv_heads(raw: dict[str, Any], family: Family, heads: int, source: str) -> int:
    """KV heads as vLLM's config code reads them: Falcon's ``multi_query`` (outside its new decoder
    architecture) is one KV head; else the first of :data:`KV_HEAD_FIELDS` the config sets (Falcon-40B
    says ``num_kv_heads``); else every attention head (MHA; the families whose transformers class
    defaults to a number have it filled in already). The family is the resolved one: a config
    naming Falcon by its ``architectures`` alone is Falcon too."""
    new_falcon = family.name == "falcon" and bool(raw.get("new_decoder_architecture"))
    if not new_falcon and raw.get("multi_query"):
        return 1
    for key in KV_HEAD_FIELDS:
        value = raw.get(key)
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise BadInput(f"{source}: {key}={value!r} must be a positive integer (the number of KV heads).")
            return value
    return heads


# Families (gpubench.models.families names, so a config naming its family by ``architectures``
# alone reads alike) whose configs may set ``sliding_window`` without saying which layers use it,
# and how transformers reads them (their configuration / modeling code, not a guess):
# layer i slides when i is even: Gemma2Config and GptOssConfig default layer_types to
# "sliding_attention" where (i + 1) % 2 (vLLM's gpt-oss alike)
INTERLEAVED_EVERY_OTHER = ("gemma2", "gpt_oss")
PATTERNED = {"gemma3": 6}  # full when (i + 1) % sliding_window_pattern == 0; its default
CHUNKED_FAMILIES = {"llama4": 4}  # RoPE layers chunked; no_rope_layer_interval's default


def _layer_windows(raw: dict[str, Any], family: str, layers: int, source: str) -> tuple[int | None, ...]:
    """Which layers attend through a sliding window, as transformers reads each family's config:

    - ``layer_types`` (gpt-oss, newer configs): "sliding_attention" layers use ``sliding_window``;
    - Qwen2-style ``use_sliding_window``: when false, no layer slides, whatever ``sliding_window``
      or ``layer_types`` say (transformers sets the window to None); when true, ``layer_types``
      if given, else layers from ``max_window_layers`` on slide;
    - ``sliding_window_pattern`` P (Gemma-3, Cohere2; Gemma-3's default P = 6 when the key is
      absent): layer i uses full attention when (i + 1) % P == 0, the others slide;
    - Gemma-2, gpt-oss (without ``layer_types``): layers alternate, starting with a sliding one;
    - Mistral / Mixtral, Phi-3 (the other families with a ``sliding_window``): one window for every layer, as
      vLLM reads a ``sliding_window`` that nothing else qualifies (its attention layers all take
      the config's window unless the model's own code interleaves them, which the families above
      cover). Phi-3-mini-4k publishes ``sliding_window: 2047`` and no pattern: vLLM serves it with
      every layer sliding.
    """
    window = raw.get("sliding_window")
    types = raw.get("layer_types")
    first_sliding = raw.get("max_window_layers")
    if first_sliding is not None and (
        not isinstance(first_sliding, int) or isinstance(first_sliding, bool) or first_sliding < 0
    ):
        raise BadInput(
            f"{source}: max_window_layers={_short(first_sliding)}; allowed: an integer >= 0 (layers from that "
            "index on use the sliding window when use_sliding_window is true, as transformers' Qwen2 reads it)."
        )
    if "use_sliding_window" in raw and not raw["use_sliding_window"]:
        return (None,) * layers  # Qwen: no window at all, whatever layer_types says (transformers)
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise BadInput(
                f"{source}: layer_types must list one type per layer ({layers}); it has "
                f"{len(types) if isinstance(types, list) else 'no list'}."
            )
        if "sliding_attention" in types and window is None:
            raise BadInput(f"{source}: layer_types has sliding_attention layers but sliding_window is not set.")
        return tuple(window if t == "sliding_attention" else None for t in types)
    if "use_sliding_window" in raw:
        if not raw["use_sliding_window"] or window is None:
            return (None,) * layers
        return tuple(window if i >= (first_sliding or 0) else None for i in range(layers))
    if window is None:
        return (None,) * layers
    pattern = raw.get("sliding_window_pattern", raw.get("_sliding_window_pattern", PATTERNED.get(family)))
    if pattern is not None:
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern <= 0:
            raise BadInput(
                f"{source}: sliding_window_pattern={pattern!r} does not say which layers slide; allowed: "
                "a positive integer P (layer i is full when (i + 1) % P == 0, as transformers reads it), "
                "or a layer_types list."
            )
        return tuple(None if (i + 1) % pattern == 0 else window for i in range(layers))
    if family in INTERLEAVED_EVERY_OTHER:
        return tuple(window if i % 2 == 0 else None for i in range(layers))
    return (window,) * layers  # Mistral, Mixtral, Phi-3: every layer, as vLLM reads it


def _layer_chunks(raw: dict[str, Any], family: str, layers: int, source: str) -> tuple[int | None, ...]:
    """Which layers use chunked local attention (Llama-4's ``attention_chunk_size``: a token attends
    only to the tokens of its own chunk), as transformers and vLLM read the config: layers whose
    ``layer_types`` entry is "chunked_attention", else Llama-4's RoPE layers (``no_rope_layers[i]``
    = 1; when that list is absent or empty, every ``no_rope_layer_interval``-th layer, default 4,
    is a NoPE layer with full attention)."""
    chunk = raw.get("attention_chunk_size")
    if chunk is None:
        return (None,) * layers
    types = raw.get("layer_types")
    if isinstance(types, list) and len(types) == layers and "chunked_attention" in types:
        return tuple(chunk if t == "chunked_attention" else None for t in types)
    if family not in CHUNKED_FAMILIES:
        model_type = str(raw.get("model_type") or "")
        raise BadInput(
            f"{source}: attention_chunk_size={chunk} is set but which layers use it cannot be known: "
            f"model_type {model_type or '(none)'!r} is not Llama-4 and layer_types has no "
            "\"chunked_attention\" entries. Allowed: layer_types with \"chunked_attention\" per chunked "
            "layer, or model_type llama4 / llama4_text (RoPE layers chunked, as no_rope_layers says)."
        )
    rope = raw.get("no_rope_layers")
    if not rope:
        interval = raw.get("no_rope_layer_interval", CHUNKED_FAMILIES[family])
        if not isinstance(interval, int) or isinstance(interval, bool) or interval <= 0:
            raise BadInput(f"{source}: no_rope_layer_interval={interval!r}; allowed: a positive integer.")
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(rope, list) or len(rope) != layers or any(v not in (0, 1) for v in rope):
        raise BadInput(
            f"{source}: no_rope_layers must list 0 (NoPE, full attention) or 1 (RoPE, chunked) for each "
            f"of the {layers} layers."
        )
    return tuple(chunk if use_rope else None for use_rope in rope)


# --------------------------------------------------------------------------------------------
# Presets


def _presets_dir():
    return importlib.resources.files("gpubench.models") / "presets"


def preset_names() -> list[str]:
    return sorted(Path(p.name).stem for p in _presets_dir().iterdir() if p.name.endswith(".json"))


def preset_raw(name: str) -> dict[str, Any]:
    names = preset_names()
    if name not in names:
        hint = difflib.get_close_matches(name.lower(), names, n=3, cutoff=0.5)
        raise BadInput(
            f"model preset {name!r} is unknown"
            + (f" (did you mean {', '.join(map(repr, hint))}?)" if hint else "")
            + f"; presets: {', '.join(names)}; or pass --config path/to/config.json."
        )
    return json.loads((_presets_dir() / f"{name}.json").read_text())


def load_preset(name: str, ignore_fields: Iterable[str] = ()) -> ModelConfig:
    return from_dict(preset_raw(name), name, f"preset {name}", ignore_fields)


def load_model(spec: str | Path, ignore_fields: Iterable[str] = ()) -> ModelConfig:
    """A model named the three ways a user names one: a preset (``gpubench kv-cache --list``), a
    Hugging Face ``config.json``, or a checkpoint directory holding one. ``ignore_fields``: config
    fields to accept unread (``--ignore-field``; see :func:`from_dict`)."""
    text = str(spec)
    if text in preset_names():
        return load_preset(text, ignore_fields)
    path = Path(text)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"{path}: a directory without config.json; give a Hugging Face checkpoint directory.")
        return load_config_file(path / "config.json", ignore_fields)
    if path.is_file():
        return load_config_file(path, ignore_fields)
    raise BadInput(f"model {text!r} {_names_nothing(text)}.")


def model_name_problem(text: str) -> str | None:
    """Why ``text`` names no model (no preset, no file or directory by that path), or None: the
    value check of a ``model`` param that takes a preset or a config (its ``Param.value_check``), so a
    misspelt preset is refused as the scenario is read, before torch loads. Whether the config it
    names is one the reader takes is :func:`load_model`'s to say."""
    if text in preset_names() or names_a_config(text):
        return None
    return f"{text!r} {_names_nothing(text)}"


def names_a_config(text: str) -> bool:
    """Whether ``text`` is a path to a file, or to a directory holding config.json (a name the
    file system refuses, too long or with a NUL, names none)."""
    if not text:
        return False
    try:
        path = Path(text)
        return path.is_file() or (path / "config.json").is_file()
    except (OSError, ValueError):
        return False


def _names_nothing(text: str) -> str:
    hint = difflib.get_close_matches(text.lower(), preset_names(), n=3, cutoff=0.5)
    return (
        "is neither a preset"
        + (f" (did you mean {', '.join(map(repr, hint))}?)" if hint else "")
        + f" nor an existing config.json or a checkpoint directory holding one; presets: {', '.join(preset_names())}"
    )


def load_config_file(path: str | Path, ignore_fields: Iterable[str] = ()) -> ModelConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such config file; pass a Hugging Face config.json.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: not a readable JSON config ({exc}).") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: a config must be a JSON object with hidden_size, num_hidden_layers, ...")
    name = path.stem if path.name != "config.json" else path.parent.name or "config"
    return from_dict(raw, name, str(path), ignore_fields)
