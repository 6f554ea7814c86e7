"""Which model a technique's ``model`` param names, and what the Llama-style stand-in of it keeps.

A technique that runs the decoder of :mod:`gpubench.models.llama` (packed_metadata, the serving
pairs) takes its ``model`` four ways: a built-in size (seeded random weights), a preset or a
``config.json`` (seeded random weights at that model's shapes), or a checkpoint directory (its
weights where it holds them). The stand-in keeps a model's attention shapes (hidden size, query
and KV heads, head_dim), its vocabulary, RoPE base and tied embeddings; what a Llama layer cannot
hold is said in :func:`stand_in_note`, which a case records so a report is honest about it.

Torch-free (it reads config files only), so what only checks or describes a model (the
techniques' param rules, the generator of model scenarios) needs nothing of the decoder.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpubench.errors import BadInput
from gpubench.models.config import ModelConfig, load_model, names_a_config, preset_names

# The names of gpubench.models.llama.SIZES (kept equal there, by an assertion at its import).
BUILT_IN_SIZES = ("tiny", "small", "100m", "1b")
# Files that say a directory holds weights, not a config alone (transformers' names).
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")


# The checkpoints gpubench.models.llama.load_hf reads as they are (its rules: checkpoint_problems).
HF_LOADABLE = ("llama", "mistral")


def checkpoint_problems(raw: Mapping[str, Any]) -> list[str]:
    """Why :func:`gpubench.models.llama.load_hf` cannot load a checkpoint whose ``config.json`` is
    ``raw`` (its own rules, checked before it loads anything, and by the generator of model
    scenarios before it writes a speculative target): a model_type that is not a bias-free
    Llama-shaped decoder (Qwen2's q/k/v projections always carry biases; MoE, MLA and other
    families have other layers), bias terms the config turns on, or RoPE scaling (plain RoPE only)."""
    problems = []
    model_type = raw.get("model_type")
    if model_type == "qwen2":
        problems.append("model_type 'qwen2' has bias terms on its q/k/v projections (only bias-free models load)")
    elif model_type not in HF_LOADABLE:
        problems.append(f"model_type {model_type!r} is not Llama-shaped; allowed: {', '.join(HF_LOADABLE)}")
    biased = [key for key in ("attention_bias", "mlp_bias") if raw.get(key)]
    if biased:
        problems.append(f"{' and '.join(biased)} set: the checkpoint has bias terms (only bias-free models load)")
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type")) if isinstance(rope, Mapping) else rope
    if kind not in (None, "default"):
        problems.append(f"RoPE scaling {kind!r} is not supported (plain RoPE only)")
    return problems


def early_draft_problem(draft: str, layers: int | None) -> str | None:
    """Why a speculative draft ``early:N`` cannot be the first N of a target's ``layers`` (None:
    not known), or None (also for a draft that is not ``early:N``): N must be a whole number from
    1 to ``layers`` - 1. The speculative_decoding technique's rule (gpubench.models.decode_pair),
    here torch-free so that ``gpubench run --model --draft`` checks it before importing torch."""
    if not draft.startswith("early:"):
        return None
    try:
        n = int(draft.split(":", 1)[1])
    except ValueError:
        n = -1
    if n < 1 or (layers is not None and n >= layers):
        return f"draft {draft!r}: N must be a whole number from 1 to the target's layers - 1" + (
            f" ({layers - 1})" if layers else ""
        )
    return None


@dataclass(frozen=True)
class ModelSpec:
    """A ``model`` value resolved: ``kind`` is "size" (a built-in size), "checkpoint" (a directory
    with weights, loaded) or "config" (a preset, a config.json or a directory without weights:
    random weights at its shapes, ``config`` its parsed config)."""

    text: str
    kind: str
    config: ModelConfig | None = None


IGNORE_FIELDS_HELP = (
    "config.json fields to accept unread, comma-separated (gpubench run --model ... --ignore-field NAME "
    "writes them here): the user's word that they change nothing the case measures"
)


def ignore_list(text: str | None) -> tuple[str, ...]:
    """An ``ignore_fields`` param ("a,b", "" for none) as the names
    :func:`gpubench.models.config.load_model` takes."""
    return tuple(name.strip() for name in (text or "").split(",") if name.strip())


def allowed_models() -> str:
    """What a ``model`` param accepts, in words (for help texts and refusals)."""
    return (
        f"a built-in size ({', '.join(BUILT_IN_SIZES)}), a preset ({', '.join(preset_names())}), "
        "a config.json path, or a Hugging Face checkpoint directory"
    )


def model_name_problem(text: str) -> str | None:
    """Why ``text`` names no model (no built-in size, preset, file or directory), or None: the
    value check of a stand-in's ``model`` param (its ``Param.value_check``), torch-free, so a misspelt
    model is refused as the scenario is read; whether the stand-in can run the model it names is
    :func:`model_problems`' to say."""
    if text in BUILT_IN_SIZES or text in preset_names() or names_a_config(text):
        return None
    hint = difflib.get_close_matches(text.lower(), [*BUILT_IN_SIZES, *preset_names()], n=3, cutoff=0.5)
    return (
        f"{text!r} names nothing known"
        + (f" (did you mean {', '.join(map(repr, hint))}?)" if hint else "")
        + f"; allowed: {allowed_models()}"
    )


def has_weights(path: Path) -> bool:
    return path.is_dir() and any(next(path.glob(p), None) is not None for p in WEIGHT_PATTERNS)


def resolve(text: str, weights: bool = True, ignore_fields: str = "") -> ModelSpec:
    """``text`` resolved (BadInput naming what is allowed when it names nothing). ``weights``:
    whether a checkpoint directory with weights is to be loaded (else random at its shapes).
    ``ignore_fields``: the config fields to accept unread (:func:`ignore_list`)."""
    if text in BUILT_IN_SIZES:
        return ModelSpec(text, "size")
    if weights and has_weights(Path(text)):
        return ModelSpec(text, "checkpoint")
    try:
        return ModelSpec(text, "config", load_model(text, ignore_list(ignore_fields)))
    except BadInput:
        if text in preset_names() or Path(text).exists():  # it names a config, which is wrong
            raise
        raise BadInput(f"model {text!r} names nothing known; allowed: {allowed_models()}.") from None


def model_problems(text: str, layers: int = 0, weights: bool = True, ignore_fields: str = "") -> list[str]:
    """Why ``model`` (with its first ``layers`` layers, 0 = all) cannot be run by the Llama-style
    decoder: it names nothing, or :func:`config_problems`; a checkpoint directory with weights,
    :func:`checkpoint_problems` of its config.json (torch-free, so a scenario naming one the loader
    refuses is refused when it loads, not case by case)."""
    try:
        spec = resolve(text, weights, ignore_fields)
    except BadInput as exc:
        return [str(exc)]
    if spec.kind == "checkpoint":
        config = Path(text) / "config.json"
        try:
            raw = json.loads(config.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return [f"{config}: not a readable JSON config ({exc})"]
        if not isinstance(raw, dict):
            return [f"{config}: a config must be a JSON object"]
        return [f"checkpoint {text}: {problem}" for problem in checkpoint_problems(raw)]
    return [] if spec.config is None else config_problems(spec.config, layers)


def config_problems(cfg: ModelConfig, layers: int = 0) -> list[str]:
    """Why the stand-in cannot take ``cfg`` (its first ``layers``): an MLA model, more layers than
    it has, an odd head_dim, or no vocabulary or MLP width in its config."""
    problems = []
    if cfg.mla is not None:
        problems.append(mla_refusal(cfg))
    if layers > cfg.num_layers:
        problems.append(
            f"layers ({layers}) exceeds {cfg.name}'s {cfg.num_layers} layers; allowed: 0 (all) to {cfg.num_layers}"
        )
    if cfg.head_dim % 2:
        problems.append(f"{cfg.name}: head_dim {cfg.head_dim} is odd; RoPE rotates pairs of channels")
    if cfg.vocab_size is None:
        problems.append(f"{cfg.name}: the config has no vocab_size; the stand-in needs it for its embedding")
    if cfg.moe is None and cfg.intermediate_size is None:
        problems.append(f"{cfg.name}: the config has no intermediate_size; the stand-in needs its MLP width")
    return problems


def case_note(text: str, layers: int = 0, weights: bool = True, ignore_fields: str = "") -> str:
    """What a case at ``model`` records about it: :func:`stand_in_note` for a preset or config
    (random weights at its shapes), "" for a built-in size or a checkpoint's own weights."""
    spec = resolve(text, weights, ignore_fields)
    return stand_in_note(spec.config, layers) if spec.config is not None else ""


def mla_refusal(cfg: ModelConfig) -> str:
    """Why an MLA model (``cfg.mla`` set) cannot be run by the stand-in, and what is allowed."""
    assert cfg.mla is not None  # (asked only of MLA models)
    return (
        f"{cfg.name} uses multi-head latent attention (MLA: a {cfg.mla.kv_lora_rank}-wide latent plus a "
        f"{cfg.mla.qk_rope_head_dim}-wide RoPE key cached per token), which the Llama-style stand-in cannot "
        "hold: its cache keeps full K and V per KV head, so it would measure another model's memory and "
        "time. Allowed: a model with MHA, GQA or MQA attention (a Llama, Qwen, Mistral, gpt-oss preset or "
        "config); the MLA cache itself is measured by kv_cache."
    )


def active_mlp_width(cfg: ModelConfig) -> int:
    """The stand-in's dense MLP width: the model's ``intermediate_size``, or for an MoE model the
    width a token's MLP computes through, top_k routed experts plus the shared ones
    (``top_k * expert_dim + shared_experts * shared_expert_dim``)."""
    if cfg.moe is None:
        assert cfg.intermediate_size is not None  # (config_problems refuses a config without it)
        return cfg.intermediate_size
    moe = cfg.moe
    return moe.top_k * moe.expert_dim + moe.shared_experts * (moe.shared_expert_dim or 0)


def gated_mlp_note(cfg: ModelConfig) -> str:
    """What the stand-in's gated MLP makes of a model whose MLP is plain up/down (Falcon's,
    ``cfg.gated_mlp`` False): the same width with a gate added, so 1.5x the MLP's weights and
    FLOPs (three width x hidden matrices instead of two)."""
    width = cfg.intermediate_size or 4 * cfg.hidden_size
    return (
        f"{cfg.name}'s plain MLP (up/down, width {width}) as a gated SwiGLU one of the same width: "
        "1.5x its MLP weights and FLOPs"
    )


def stand_in_note(cfg: ModelConfig, layers: int = 0) -> str:
    """One paragraph a case records: which model the random-weight stand-in stands for, at which
    shapes, how many of its layers, and what of it is not applied."""
    used = layers or cfg.num_layers
    parts = [
        f"Llama-style stand-in at {cfg.name}'s attention shapes ({cfg.attention} {cfg.num_heads} q / "
        f"{cfg.num_kv_heads} kv heads x {cfg.head_dim}, hidden {cfg.hidden_size}), {used} of "
        f"{cfg.num_layers} layers, seeded random weights"
    ]
    if cfg.moe is not None:
        moe = cfg.moe
        shared = f" + {moe.shared_experts} shared x {moe.shared_expert_dim}" if moe.shared_experts else ""
        text = (
            f"MoE as a dense MLP of the active width (top-{moe.top_k} x {moe.expert_dim}{shared} = "
            f"{active_mlp_width(cfg)}; the {moe.num_experts} experts and their routing not modelled"
        )
        sparse = sum(moe.layers[:used])
        if sparse < used:
            text += f"; {used - sparse} of the {used} layers run are dense in the model and get this width too"
        parts.append(text + ")")
    if not getattr(cfg, "gated_mlp", True):
        parts.append(gated_mlp_note(cfg))
    for what, per_layer, label in (
        ("sliding windows", cfg.layer_windows, "window"),
        ("chunked attention", cfg.layer_chunks, "chunk"),
    ):
        sizes = [n for n in per_layer[:used] if n is not None]
        if sizes:
            widths = "/".join(str(n) for n in sorted(set(sizes)))
            parts.append(f"{what} not applied ({label} {widths} on {len(sizes)} of the {used} layers run)")
    return "; ".join(parts)
