"""Model configurations: Hugging Face ``config.json`` -> :class:`ModelConfig`.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpubench.errors import BadInput

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
DTYPE_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16",
                 "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float": "float32"}


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
    mla: MLA | None
    torch_dtype: str
    tie_word_embeddings: bool
    raw: dict[str, Any] = field(repr=False, compare=False)

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

    def with_layers(self, n: int) -> "ModelConfig":
        """The first ``n`` layers only (the same per-layer pattern): for allocating a model's real
        cache layout at a size a small machine can hold."""
        from dataclasses import replace

        return replace(self, num_layers=n, layer_windows=self.layer_windows[:n])


# Integer fields a plan reads, each with a bound far above any published model (layers: the largest
# have ~130; positions: ~10M) so that absurd values are refused before anything is built per layer.
CONFIG_LIMITS = {
    "num_hidden_layers": 10_000, "hidden_size": 2**20, "num_attention_heads": 2**16,
    "num_key_value_heads": 2**16, "head_dim": 2**16, "vocab_size": 2**24, "intermediate_size": 2**22,
    "max_position_embeddings": 2**30, "sliding_window": 2**30, "kv_lora_rank": 2**16,
    "qk_rope_head_dim": 2**16, "qk_nope_head_dim": 2**16, "v_head_dim": 2**16, "q_lora_rank": 2**20,
    "moe_intermediate_size": 2**22, "n_routed_experts": 2**16, "num_local_experts": 2**16,
}


def from_dict(raw: dict[str, Any], name: str, source: str) -> ModelConfig:
    """Parse a Hugging Face config; raise BadInput naming every missing or invalid field."""
    if isinstance(raw.get("text_config"), dict):  # multimodal wrappers keep the LM config inside
        raw = {**raw["text_config"], "architectures": raw.get("architectures")}
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads")
    missing = [k for k in required if raw.get(k) is None]
    mla_keys = ("kv_lora_rank", "qk_rope_head_dim")
    is_mla = raw.get("kv_lora_rank") is not None
    if is_mla:
        missing += [k for k in mla_keys + ("qk_nope_head_dim", "v_head_dim") if raw.get(k) is None]
    if missing:
        raise BadInput(f"{source}: the config lacks required field(s) {', '.join(missing)}; a KV-cache "
                       f"plan needs hidden_size, num_hidden_layers, num_attention_heads "
                       f"(and for MLA models kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim).")
    bad = [f"{k}={raw[k]!r}" for k in CONFIG_LIMITS
           if raw.get(k) is not None and (not isinstance(raw[k], int) or isinstance(raw[k], bool) or raw[k] <= 0)]
    if bad:
        raise BadInput(f"{source}: these fields must be positive integers: {', '.join(bad)}.")
    # Bounds before anything is built per layer: a config with 10^9 layers is refused at once.
    huge = [f"{k}={raw[k]:,} (allowed: 1 to {limit:,})" for k, limit in CONFIG_LIMITS.items()
            if raw.get(k) is not None and raw[k] > limit]
    if huge:
        raise BadInput(f"{source}: out of range: {'; '.join(huge)}. The bounds are far above any published "
                       f"model (at most a few hundred layers, a few million positions); fix the config.")
    heads = raw["num_attention_heads"]
    kv_heads = raw.get("num_key_value_heads") or heads  # HF convention: absent means MHA
    if heads % kv_heads:
        raise BadInput(f"{source}: num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads}).")
    head_dim = raw.get("head_dim")
    from_config = head_dim is not None
    if head_dim is None:
        head_dim = raw["hidden_size"] // heads
    layers = raw["num_hidden_layers"]
    mla = None
    if is_mla:
        mla = MLA(raw["kv_lora_rank"], raw["qk_rope_head_dim"], raw.get("q_lora_rank"),
                  raw["qk_nope_head_dim"], raw["v_head_dim"])
    return ModelConfig(
        name=name, model_type=str(raw.get("model_type") or "unknown"), hidden_size=raw["hidden_size"],
        num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        head_dim_from_config=from_config, vocab_size=raw.get("vocab_size"),
        intermediate_size=raw.get("intermediate_size"),
        max_position_embeddings=raw.get("max_position_embeddings"),
        layer_windows=_layer_windows(raw, layers, source), mla=mla,
        torch_dtype=DTYPE_ALIASES.get(str(raw.get("torch_dtype") or "bfloat16"), str(raw.get("torch_dtype") or "bfloat16")),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)), raw=raw,
    )


def _layer_windows(raw: dict[str, Any], layers: int, source: str) -> tuple[int | None, ...]:
    """Which layers attend through a sliding window, by each family's convention:

    - ``layer_types`` (gpt-oss, newer configs): "sliding_attention" layers use ``sliding_window``;
    - Qwen2-style ``use_sliding_window``: when true, layers from ``max_window_layers`` on slide
      (the first ``max_window_layers`` use full attention); when false, none does, whatever
      ``sliding_window`` says;
    - Mistral-style: a ``sliding_window`` with no switch applies to every layer.
    """
    window = raw.get("sliding_window")
    types = raw.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise BadInput(f"{source}: layer_types must list one type per layer ({layers}); it has "
                           f"{len(types) if isinstance(types, list) else 'no list'}.")
        if "sliding_attention" in types and window is None:
            raise BadInput(f"{source}: layer_types has sliding_attention layers but sliding_window is not set.")
        return tuple(window if t == "sliding_attention" else None for t in types)
    if "use_sliding_window" in raw:
        if not raw["use_sliding_window"] or window is None:
            return (None,) * layers
        first_sliding = raw.get("max_window_layers", 0) or 0
        return tuple(window if i >= first_sliding else None for i in range(layers))
    return (window,) * layers if window is not None else (None,) * layers


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
        raise BadInput(f"model preset {name!r} is unknown" + (f" (did you mean {', '.join(map(repr, hint))}?)" if hint else "")
                       + f"; presets: {', '.join(names)}; or pass --config path/to/config.json.")
    return json.loads((_presets_dir() / f"{name}.json").read_text())


def load_preset(name: str) -> ModelConfig:
    return from_dict(preset_raw(name), name, f"preset {name}")


def load_config_file(path: str | Path) -> ModelConfig:
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such config file; pass a Hugging Face config.json.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadInput(f"{path}: not a readable JSON config ({exc}).") from None
    if not isinstance(raw, dict):
        raise BadInput(f"{path}: a config must be a JSON object with hidden_size, num_hidden_layers, ...")
    return from_dict(raw, path.stem if path.name != "config.json" else path.parent.name or "config", str(path))
