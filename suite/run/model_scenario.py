"""``gpubench run --model``: a scenario built from a model's config (issue 37).

:func:`build_model_scenario` reads a :class:`~gpubench.models.config.ModelConfig` and writes the
plain scenario mapping a user would otherwise write by hand (the YAML shape of ``scenarios/*.yaml``):
every technique that applies to the architecture, at the model's own shapes (its heads, KV heads
and head dims, its sliding and chunked layers, its experts, context and vocabulary), sized to the
device, and under the top-level ``model`` key what was generated, how it was sized and which
techniques do not apply, each with its reason. The mapping then goes through the ordinary scenario
loader, so ``--emit-scenario`` writes a file that re-runs the same cases.

Arithmetic (the device's memory comes from the caller), then the techniques' own rules on each
entry (:func:`_drop_unsupported`: their code, so torch, imported once the request is valid).

Sizing. A case must fit ``MEMORY_SHARE`` of the device's memory (what it allocates, estimated
below from the shapes: weights, gradients, optimizer state, activations, caches) and, on a CPU,
``CPU_FLOPS`` floating-point operations per call (so that a run takes minutes, not hours). Where
the model's shapes do not fit, the generator shrinks what does not change the technique's shape,
in this order: layers (one or a few instead of all), then the batch, then the tokens; never the
heads, head dims, experts or widths. A case whose smallest form does not fit is listed as not
applicable with the figure that does not fit. Every shrink is said in ``model.sizing``.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpubench.errors import BadInput
from gpubench.models import stand_in
from gpubench.models.config import ModelConfig
from gpubench.models.params import count_parameters
from gpubench.records.model_origin import ModelOrigin, NotApplicable
from gpubench.records.stats import MIN_CI_SAMPLES

WORKLOADS = ("train", "serve", "both")
DEVICES = ("cuda", "cpu")
GIB = 2**30

# The defaults of --seq-len and --batch, and the rule the `model` block and docs/model-runs.md state.
DEFAULT_SEQ_LEN = {"cuda": 4096, "cpu": 256}
DEFAULT_BATCH = {"cuda": 4, "cpu": 1}
DEFAULTS_RULE = (
    "seq_len: min(max_position_embeddings, 4096) on cuda, min(max_position_embeddings, 256) on cpu; "
    "batch: 4 on cuda, 1 on cpu; each case then fits 60% of the device's memory (cuda) or 40% of the "
    "machine's available memory and 2e10 FLOPs a call (cpu), shrinking layers, then batch, then tokens"
)
MEMORY_SHARE = {"cuda": 0.6, "cpu": 0.4}
CPU_FLOPS = 2e10  # per call on a CPU: ~0.1-1 s on a few cores, so that a case takes seconds
DTYPE = {"cuda": "bfloat16", "cpu": "float32"}
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}
KV_DTYPE = {"cuda": "bf16", "cpu": "fp32"}

FLASH_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # flash_attention's head_dim choices
PAGED_HEAD_DIMS = (64, 128)  # paged_attention's
# Families whose layers the Llama-style decoder (gpubench.models.llama) holds nearly as they are;
# for the others (MoE MLPs, other norms and activations) the model-taking techniques' stand-in at
# their attention shapes leaves more out, and the entry's note says so. Which checkpoints load as a
# speculative target is load_hf's own rule (gpubench.models.stand_in.checkpoint_problems).
LLAMA_STYLE = ("llama", "mistral", "qwen2", "qwen3", "phi3")
FEW_LAYERS = {"cuda": 4, "cpu": 2}  # "a few layers" for the multi-layer training and serving cases
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")

# The measurement policies: smoke's on a CPU, gpu-first's on a GPU, and the serving/generation
# runs' (each run is the whole trace). Every policy takes at least MIN_CI_SAMPLES samples, so that
# each case gets a confidence interval and can be ranked in the answer table.
POLICY = {
    "cpu": {
        "warmup_s": 0.02,
        "min_reps": 5,
        "max_reps": 30,
        "min_time_s": 0.05,
        "max_time_s": 1.5,
        "target_iqr": 0.1,
        "case_timeout_s": 300,
    },
    "cuda": {
        "warmup_s": 0.05,
        "min_reps": 10,
        "max_reps": 100,
        "min_time_s": 0.1,
        "max_time_s": 2.5,
        "target_iqr": 0.03,
        "case_timeout_s": 120,
        "flush_l2": True,
        "energy_s": 0.2,
    },
}
RUN_POLICY = {"warmup_s": 0, "min_reps": MIN_CI_SAMPLES, "max_reps": MIN_CI_SAMPLES, "min_time_s": 0}
STEP_POLICY = {
    "cpu": {"max_reps": 10, "max_time_s": 2.0},
    "cuda": {
        "warmup_s": 0,
        "min_reps": MIN_CI_SAMPLES,
        "max_reps": 10,
        "min_time_s": 0,
        "max_time_s": 4.0,
        "case_timeout_s": 300,
    },
}

# Every technique the generator knows, in the order its entries are written.
TECHNIQUES = (
    "flash_attention",
    "paged_attention",
    "moe_grouping",
    "combined_training",
    "activation_offload",
    "packed_metadata",
    "kv_cache",
    "paged_kv_serving",
    "continuous_batching",
    "speculative_decoding",
)
TRAIN = ("flash_attention", "moe_grouping", "combined_training", "activation_offload", "packed_metadata")
SERVE = (
    "flash_attention",
    "paged_attention",
    "moe_grouping",
    "kv_cache",
    "paged_kv_serving",
    "continuous_batching",
    "speculative_decoding",
)


@dataclass
class _Plan:
    """What the generator decided: entries, sizing notes, techniques left out with their reason."""

    cfg: ModelConfig
    device: str
    budget: float  # bytes a case may allocate
    seq_len: int
    batch: int
    dtype: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    sizing: list[str] = field(default_factory=list)
    not_applicable: list[dict[str, str]] = field(default_factory=list)

    @property
    def b(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def fits(self, nbytes: float, flops: float = 0.0) -> bool:
        return nbytes <= self.budget and (self.device != "cpu" or flops <= CPU_FLOPS)

    def over(self, nbytes: float, flops: float = 0.0) -> str:
        """What of (``nbytes``, ``flops``) is over the device's limits, with the limit."""
        parts = []
        if nbytes > self.budget:
            parts.append(f"{_gib(nbytes)}, over {_why(self)}")
        if self.device == "cpu" and flops > CPU_FLOPS:
            parts.append(f"{flops:.1e} FLOPs a call, over the {CPU_FLOPS:.0e} a CPU case is given")
        return " and ".join(parts) or "nothing over the limits"

    def size(self, text: str | None) -> None:
        if text and text not in self.sizing:
            self.sizing.append(text)

    def skip(self, technique: str, reason: str) -> None:
        if not any(n["technique"] == technique for n in self.not_applicable):
            self.not_applicable.append({"technique": technique, "reason": reason})

    def add(self, technique: str, params: dict[str, Any], note: str | None = None, policy: dict | None = None) -> None:
        entry: dict[str, Any] = {"technique": technique, "params": copy.deepcopy(params)}
        if policy:
            entry["policy"] = dict(policy)
        if note:
            entry["note"] = note
        self.entries.append(entry)


def default_seq_len(cfg: ModelConfig, device: str) -> int:
    return min(cfg.max_position_embeddings or DEFAULT_SEQ_LEN[device], DEFAULT_SEQ_LEN[device])


def default_batch(device: str) -> int:
    return DEFAULT_BATCH[device]


def build_model_scenario(
    cfg: ModelConfig,
    workload: str,
    seq_len: int | None,
    batch: int | None,
    device: str,
    memory_bytes: int,
    draft: str | None = None,
    *,
    spec: str | None = None,
    supported_only: bool = True,
    ignore_fields: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The scenario mapping for ``cfg`` (``spec``: the model as the user named it, a preset or a
    path; default ``cfg.name``) on ``device`` ("cuda" or "cpu") holding ``memory_bytes``.
    ``seq_len`` / ``batch`` None: the defaults (:data:`DEFAULTS_RULE`). ``draft``: speculative
    decoding's draft model (a checkpoint directory or ``early:N``), with a checkpoint directory only.
    ``supported_only``: leave out the entries this build's techniques cannot take (said in the
    ``model`` block); False keeps every entry as the mapping writes it. ``ignore_fields``: the
    config fields the user accepts unread (--ignore-field), written into each entry whose ``model``
    reads the config (its ``ignore_fields`` param), so the techniques read it as the generator did.
    BadInput for a workload,
    device or size that is not allowed, or a model no technique applies to."""
    check_request(workload, seq_len, batch)
    if device not in DEVICES:
        raise BadInput(f"device {device!r}: a model scenario is built for {' or '.join(DEVICES)}.")
    spec = spec if spec is not None else cfg.name
    checkpoint = check_draft(spec, workload, draft, cfg.num_layers)
    default_len = default_seq_len(cfg, device)
    plan = _Plan(
        cfg=cfg,
        device=device,
        budget=MEMORY_SHARE[device] * memory_bytes,
        seq_len=seq_len if seq_len is not None else default_len,
        batch=batch if batch is not None else default_batch(device),
        dtype=DTYPE[device],
    )
    if cfg.max_position_embeddings and plan.seq_len > cfg.max_position_embeddings:
        plan.size(
            f"seq_len {plan.seq_len} is past the model's max_position_embeddings "
            f"({cfg.max_position_embeddings}): measured as asked"
        )
    wanted = set(TRAIN if workload == "train" else SERVE if workload == "serve" else TRAIN + SERVE)
    model_param = _model_param(spec)
    for technique in TECHNIQUES:
        if technique not in wanted:
            other = "serve or both" if technique in SERVE else "train or both"
            kind = "a serving" if technique in SERVE else "a training"
            plan.skip(technique, f"{kind} technique; not in --workload {workload} (use {other})")
            continue
        GENERATORS[technique](plan, workload, model_param, checkpoint, draft)
    if ignore_fields:
        for entry in plan.entries:
            if "model" in entry["params"]:
                # sorted, once each: the same fields in any order or repeated are the same case id
                entry["params"]["ignore_fields"] = ",".join(sorted(dict.fromkeys(ignore_fields)))
    if supported_only:
        _drop_unsupported(plan)
    if not plan.entries:
        raise BadInput(
            f"--model {spec}: no technique applies to this model on {device} (--workload {workload}): "
            + "; ".join(f"{n['technique']}: {n['reason']}" for n in plan.not_applicable)
            + "."
        )
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"model-{cfg.name}-{workload}").strip("-")
    return {
        "name": name,
        "description": f"{cfg.name} ({workload}) at its own shapes on {device}, generated by gpubench run --model",
        "device": device,
        "model": ModelOrigin(
            name=str(spec),
            source=_source(spec),
            family=str(getattr(cfg, "family", None) or cfg.model_type),
            workload=workload,
            seq_len=plan.seq_len,
            batch=plan.batch,
            device=device,
            dtype=plan.dtype,
            memory_gib=round(memory_bytes / GIB, 1),
            summary=summary(cfg),
            defaults=DEFAULTS_RULE,
            sizing=tuple(plan.sizing),
            not_applicable=tuple(NotApplicable(n["technique"], n["reason"]) for n in plan.not_applicable),
        ).to_dict(),
        "policy": dict(POLICY[device]),
        "entries": plan.entries,
    }


class _PlainDumper(yaml.SafeDumper):
    """YAML without anchors and aliases: every entry reads whole, as a user would write it."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(doc: dict[str, Any], header: str = "") -> str:
    """The scenario mapping as the YAML text a user can edit and re-run (``header``: comment lines)."""
    body = yaml.dump(doc, Dumper=_PlainDumper, sort_keys=False, width=110, allow_unicode=True)
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    return ("\n".join(lines) + "\n" if lines else "") + body


def check_request(workload: str, seq_len: int | None, batch: int | None) -> None:
    """BadInput for a --workload, --seq-len or --batch that is not allowed."""
    if workload not in WORKLOADS:
        raise BadInput(f"--workload: {workload!r} is not valid; allowed: {', '.join(WORKLOADS)}.")
    for flag, value, low in (("--seq-len", seq_len, 2), ("--batch", batch, 1)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < low):
            raise BadInput(f"{flag}: {value!r} is not valid; allowed: an integer >= {low}.")


def check_draft(spec: str, workload: str, draft: str | None, layers: int | None = None) -> Path | None:
    """``spec`` as a checkpoint directory holding weights (else None); BadInput for a ``draft``
    without one, with --workload train, an ``early:N`` that is not 1 to ``layers`` - 1 (the
    target's layers), or a draft directory the target's loader cannot load."""
    checkpoint = _checkpoint_dir(spec)
    if draft is None:
        return checkpoint
    if checkpoint is None:
        raise BadInput(
            f"--draft {draft}: a draft model needs the target's weights; give --model a checkpoint "
            f"directory holding them (config.json and *.safetensors), not {spec!r}."
        )
    if workload == "train":
        raise BadInput("--draft: speculative decoding is a serving case; use --workload serve or both.")
    if not (draft.startswith("early:") or Path(draft).is_dir()):
        raise BadInput(f"--draft {draft}: allowed: a checkpoint directory or early:N (the target's first N layers).")
    problem = stand_in.early_draft_problem(draft, layers)
    if problem:
        raise BadInput(f"--draft {draft}: {problem} (early:N: the target's first N layers).")
    if Path(draft).is_dir():
        path = Path(draft) / "config.json"
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise BadInput(f"--draft {draft}: {path} is not a readable config.json ({exc}).") from None
        problems = stand_in.checkpoint_problems(raw if isinstance(raw, dict) else {})
        if problems:
            raise BadInput(
                f"--draft {draft}: the draft's loader cannot load this checkpoint: {'; '.join(problems)}; "
                f"allowed: a bias-free {' or '.join(stand_in.HF_LOADABLE)} checkpoint with plain RoPE, or early:N."
            )
    return checkpoint


# --------------------------------------------------------------------------------------------
# What the model is


def summary(cfg: ModelConfig) -> str:
    """One line: layers; attention (kind, heads, head dims); sliding / chunked layers; MoE."""
    if cfg.mla is not None:
        m = cfg.mla
        attention = (
            f"MLA {cfg.num_heads} heads, latent {m.kv_lora_rank} + rope {m.qk_rope_head_dim}, "
            f"q/k {m.qk_nope_head_dim + m.qk_rope_head_dim} / v {m.v_head_dim}"
        )
    else:
        attention = f"{cfg.attention} {cfg.num_heads} q / {cfg.num_kv_heads} kv heads x {cfg.head_dim}"
    parts = [f"{cfg.num_layers} layers", attention]
    for window, count in _groups(cfg.layer_windows).items():
        parts.append(f"sliding {window} on {count} layers")
    for chunk, count in _groups(cfg.layer_chunks).items():
        parts.append(f"chunked {chunk} on {count} layers")
    if cfg.moe is not None:
        moe = cfg.moe
        text = f"MoE {moe.num_experts} experts top-{moe.top_k} x {moe.expert_dim}"
        if moe.moe_layers != cfg.num_layers:
            text += f" on {moe.moe_layers} layers"
        if moe.shared_experts:
            text += f" + {moe.shared_experts} shared x {moe.shared_expert_dim}"
        parts.append(text)
    else:
        parts.append(f"dense MLP x {cfg.intermediate_size or 4 * cfg.hidden_size}")
    parts.append(f"hidden {cfg.hidden_size}, vocab {cfg.vocab_size or '?'}")
    return "; ".join(parts)


def _groups(per_layer: tuple[int | None, ...]) -> dict[int, int]:
    out: dict[int, int] = {}
    for value in per_layer:
        if value is not None:
            out[value] = out.get(value, 0) + 1
    return out


def _family(cfg: ModelConfig) -> str:
    return str(getattr(cfg, "family", None) or cfg.model_type)


def _source(spec: str) -> str:
    path = Path(spec)
    if path.is_dir():
        return str(path / "config.json")
    if path.is_file():
        return str(path)
    return f"preset {spec}"


def _model_param(spec: str) -> str:
    """The model as a technique's ``model`` param names it: a preset's name, or an absolute path
    (the emitted scenario re-runs from any directory). A checkpoint directory is named by its
    ``config.json``: the stand-in entries run seeded random weights at its shapes, sized for a few
    layers; the directory itself would load the whole checkpoint's weights (only a speculative
    target does that, from its own ``target`` param)."""
    path = Path(spec)
    if path.is_dir():
        return str((path / "config.json").resolve())
    return str(path.resolve()) if path.exists() else spec


def _checkpoint_dir(spec: str) -> Path | None:
    """``spec`` as a checkpoint directory holding weights, else None."""
    path = Path(spec)
    if path.is_dir() and any(next(path.glob(pattern), None) is not None for pattern in WEIGHT_FILES):
        return path.resolve()
    return None


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def _attention_dims(cfg: ModelConfig) -> tuple[int, int, int, int]:
    """heads, kv_heads, q/k head_dim, v head_dim as an attention kernel sees them (MLA's prefill:
    every head its own key and value, q/k = nope + rope, v = v_head_dim)."""
    if cfg.mla is not None:
        m = cfg.mla
        return cfg.num_heads, cfg.num_heads, m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim
    return cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.head_dim


def _layer_groups(cfg: ModelConfig, seq_len: int) -> list[tuple[str, int, int, int]]:
    """(kind, size, layers, of which) per attention pattern: each sliding window, each chunk size,
    then full; a window or chunk at least seq_len attends as a full layer at this length."""
    full = 0
    sliding: dict[int, int] = {}
    chunked: dict[int, int] = {}
    for window, chunk in zip(cfg.layer_windows, cfg.layer_chunks):
        if window is not None and window < seq_len:
            sliding[window] = sliding.get(window, 0) + 1
        elif chunk is not None and chunk < seq_len:
            chunked[chunk] = chunked.get(chunk, 0) + 1
        else:
            full += 1
    # The local patterns first: a reader matching a case to the first entry whose params it was
    # drawn from (the report's notes) finds a sliding case under its own entry, not under the full
    # one, whose params leave window and chunk at their defaults.
    groups = [("window", w, n, cfg.num_layers) for w, n in sliding.items()]
    groups += [("chunk", c, n, cfg.num_layers) for c, n in chunked.items()]
    return groups + ([("full", 0, full, cfg.num_layers)] if full else [])


def _group_note(kind: str, size: int, layers: int, total: int, seq_len: int) -> str:
    if kind == "window":
        return f"sliding layers ({layers} of {total}), window {size}"
    if kind == "chunk":
        return f"chunked layers ({layers} of {total}), chunk {size}"
    return f"full-attention layers ({layers} of {total})" + ("" if layers == total else f" at {seq_len} tokens")


def _shrink(
    plan: _Plan, technique: str, params: dict[str, Any], knobs: list[tuple[str, int]], cost, what: str
) -> dict[str, Any] | None:
    """``params`` with each knob in turn halved (down to its floor) until ``cost(params)``
    (bytes, flops) fits the plan's device; None when the floors do not fit, the technique then
    listed as not applicable with ``what`` (the case at its smallest) and what is over."""
    p = dict(params)
    for key, floor in knobs:
        while not plan.fits(*cost(p)) and p[key] > floor:
            p[key] = max(floor, p[key] // 2)
    if plan.fits(*cost(p)):
        return p
    smallest = ", ".join(f"{k} {p[k]}" for k, _ in knobs)
    plan.skip(technique, f"{what} ({smallest}) needs {plan.over(*cost(p))}")
    return None


def _shrunk_note(
    technique: str, before: dict[str, Any], after: dict[str, Any], keys: list[str], why: str
) -> str | None:
    changed = [f"{k} {after[k]} (of {before[k]})" for k in keys if after[k] != before[k]]
    return f"{technique}: {', '.join(changed)} to fit {why}" if changed else None


def _why(plan: _Plan) -> str:
    """The limits a case is fitted to, in words."""
    what = "the GPU's memory" if plan.device == "cuda" else "the machine's available memory"
    limit = f"{_gib(plan.budget)} ({int(MEMORY_SHARE[plan.device] * 100)}% of {what})"
    return limit + (f" and {CPU_FLOPS:.0e} FLOPs a call" if plan.device == "cpu" else "")


# --------------------------------------------------------------------------------------------
# One generator per technique: an entry (or several) at the model's shapes, or the reason none


def _flash_attention(plan: _Plan, workload: str, *_: Any) -> None:
    cfg = plan.cfg
    heads, kv_heads, dim, dim_v = _attention_dims(cfg)
    bad = [d for d in {dim, dim_v} if d not in FLASH_HEAD_DIMS]
    if bad:
        plan.skip(
            "flash_attention", f"head_dim {bad[0]}: the kernels take head dims {', '.join(map(str, FLASH_HEAD_DIMS))}"
        )
        return
    mode: Any = {"train": "train", "serve": "forward", "both": ["forward", "train"]}[workload]
    train = workload != "serve"
    b = plan.b

    def cost(p: dict[str, Any]) -> tuple[float, float]:
        seq, batch = p["seq_len"], p["batch"]
        tensors = batch * seq * (heads * (dim + dim_v) + kv_heads * (dim + dim_v)) * b * (2 if train else 1)
        scores = batch * heads * seq * seq * max(b, 4) * (4 if train else 2)  # the eager baseline's N x N
        flops = 2 * batch * heads * seq * seq * (dim + dim_v) * (3.5 if train else 1.0)
        return tensors + scores, flops

    for kind, size, layers, total in _layer_groups(cfg, plan.seq_len):
        params: dict[str, Any] = {
            "batch": plan.batch,
            "heads": heads,
            "kv_heads": kv_heads,
            "seq_len": plan.seq_len,
            "head_dim": dim,
        }
        if dim_v != dim:
            params["head_dim_v"] = dim_v
        params.update(dtype=plan.dtype, causal=True, mode=mode)
        if kind != "full":
            params[kind] = size
        fitted = _shrink(plan, "flash_attention", params, [("batch", 1), ("seq_len", 16)], cost, "the smallest case")
        if fitted is None:
            return
        plan.size(_shrunk_note("flash_attention", params, fitted, ["batch", "seq_len"], _why(plan)))
        mla = "; MLA prefill: q/k nope + rope, v its own head dim, every head its own key and value"
        plan.add(
            "flash_attention",
            fitted,
            _group_note(kind, size, layers, total, fitted["seq_len"]) + (mla if cfg.mla else ""),
        )


def _paged_attention(plan: _Plan, *_: Any) -> None:
    cfg = plan.cfg
    if cfg.mla is not None:
        plan.skip(
            "paged_attention",
            "MLA: the cache holds one latent per token (kv_lora_rank + rope), not per-head keys and values; "
            "the decode kernel reads per-head K/V",
        )
        return
    if cfg.head_dim not in PAGED_HEAD_DIMS:
        plan.skip(
            "paged_attention",
            f"head_dim {cfg.head_dim}: the paged decode kernel takes {' or '.join(map(str, PAGED_HEAD_DIMS))}",
        )
        return
    b = plan.b

    def cost(p: dict[str, Any]) -> tuple[float, float]:
        kv = p["batch"] * p["context_len"] * cfg.num_kv_heads * cfg.head_dim * 2 * b
        return 3 * kv, 4 * p["batch"] * cfg.num_heads * p["context_len"] * cfg.head_dim

    for kind, size, layers, total in _layer_groups(cfg, plan.seq_len):
        context = plan.seq_len if kind == "full" else min(plan.seq_len, size)
        params = {
            "batch": plan.batch,
            "heads": cfg.num_heads,
            "kv_heads": cfg.num_kv_heads,
            "head_dim": cfg.head_dim,
            "context_len": context,
            "block_size": 16,
            "dtype": plan.dtype,
        }
        fitted = _shrink(
            plan, "paged_attention", params, [("batch", 1), ("context_len", 16)], cost, "the smallest case"
        )
        if fitted is None:
            return
        note = _shrunk_note("paged_attention", params, fitted, ["batch", "context_len"], _why(plan))
        if note:
            plan.size(note)
        text = _group_note(kind, size, layers, total, fitted["context_len"])
        if kind == "window":
            text += f": decode reads the last {size} tokens"
        elif kind == "chunk":
            text += f": decode reads at most its own chunk, measured at context {context}"
        plan.add("paged_attention", fitted, text)


def _moe_cost(plan: _Plan, hidden: int, expert_dim: int, experts: int, top_k: int):
    b = plan.b

    def cost(p: dict[str, Any]) -> tuple[float, float]:
        weights = experts * (3 * hidden * expert_dim + 2 * expert_dim + hidden) + experts * (hidden + 1)
        rows = p["tokens"] * top_k
        acts = rows * (4 * expert_dim + 3 * hidden) + p["tokens"] * hidden * 4
        return (2 * weights + 3 * acts) * b, 3 * 2 * rows * 3 * hidden * expert_dim

    return cost


def _moe_grouping(plan: _Plan, workload: str, *_: Any) -> None:
    cfg, moe = plan.cfg, plan.cfg.moe
    if moe is None:
        plan.skip("moe_grouping", "no MoE layers")
        return
    params: dict[str, Any] = {
        "experts": moe.num_experts,
        "top_k": moe.top_k,
        "hidden": cfg.hidden_size,
        "expert_dim": moe.expert_dim,
        "tokens": plan.batch * plan.seq_len,
        "dtype": plan.dtype,
    }
    cost = _moe_cost(plan, cfg.hidden_size, moe.expert_dim, moe.num_experts, moe.top_k)
    what = f"one MoE layer of {moe.num_experts} experts with their gradients"
    fitted = _shrink(plan, "moe_grouping", params, [("tokens", min(plan.batch * plan.seq_len, 64))], cost, what)
    if fitted is None:
        return
    note = _shrunk_note("moe_grouping", params, fitted, ["tokens"], _why(plan))
    if note:
        plan.size(note)
    parts = [f"MoE layers ({moe.moe_layers} of {cfg.num_layers}); forward + backward of one layer"]
    if _family(cfg) != "gpt_oss":
        parts.append(
            f"the layer is gpt-oss's (clamped SwiGLU, biased experts); {_family(cfg)}'s experts use "
            f"{cfg.hidden_act} without biases: the routing and grouping are the same, the activation differs"
        )
    if moe.shared_experts:
        parts.append(f"its {moe.shared_experts} shared expert(s) (dense, every token) are not in the layer")
    plan.add("moe_grouping", fitted, "; ".join(parts))


def _attention_params(cfg: ModelConfig) -> int:
    heads, kv_heads, dim, dim_v = _attention_dims(cfg)
    return cfg.hidden_size * (heads * dim + kv_heads * (dim + dim_v)) + heads * dim_v * cfg.hidden_size


def _decoder_shape(cfg: ModelConfig) -> dict[str, int]:
    heads, kv_heads, dim, _ = _attention_dims(cfg)
    return {"hidden": cfg.hidden_size, "heads": heads, "kv_heads": kv_heads, "head_dim": dim}


def _combined_training(plan: _Plan, *_: Any) -> None:
    cfg, moe = plan.cfg, plan.cfg.moe
    if moe is None:
        plan.skip("combined_training", "no MoE layers (it trains an MoE decoder)")
        return
    vocab = cfg.vocab_size or 32000
    b, h = plan.b, cfg.hidden_size
    per_layer = _attention_params(cfg) + moe.num_experts * (3 * h * moe.expert_dim + 2 * moe.expert_dim + 2 * h)
    embed = vocab * h * 2

    def cost(p: dict[str, Any]) -> tuple[float, float]:
        tokens = p["rows"] * p["seq_len"]
        params_ = p["layers"] * per_layer + embed
        acts = tokens * (p["layers"] * h + 12 * h + moe.top_k * 4 * moe.expert_dim) * b + tokens * vocab * 4 * 2
        active = p["layers"] * (_attention_params(cfg) + moe.top_k * 3 * h * moe.expert_dim) + embed
        return 4 * params_ * b + acts, 6 * tokens * active

    params = {
        "layers": min(cfg.num_layers, FEW_LAYERS[plan.device]),
        **_decoder_shape(cfg),
        "vocab": vocab,
        "experts": moe.num_experts,
        "top_k": moe.top_k,
        "expert_dim": moe.expert_dim,
        "rows": plan.batch,
        "seq_len": plan.seq_len,
    }
    what = "one MoE layer and the embeddings with their gradients and AdamW state"
    fitted = _shrink(plan, "combined_training", params, [("layers", 1), ("rows", 1), ("seq_len", 64)], cost, what)
    if fitted is None:
        return
    fitted["mean_doc_len"] = max(1, fitted["seq_len"] // 8)
    fitted["dtype"] = plan.dtype
    plan.size(f"combined_training: {fitted['layers']} of {cfg.num_layers} layers (a few: the step's pattern)")
    note = _shrunk_note("combined_training", params, fitted, ["rows", "seq_len"], _why(plan))
    if note:
        plan.size(note)
    text = f"{fitted['layers']} MoE decoder layers with packed rows and offloaded checkpoints"
    if cfg.mla is not None:
        text += "; attention as MHA at the MLA's q/k head dim (the decoder has no latent attention)"
    plan.add("combined_training", fitted, text, STEP_POLICY[plan.device])


def _activation_offload(plan: _Plan, *_: Any) -> None:
    cfg = plan.cfg
    vocab = cfg.vocab_size or 32000
    h = cfg.hidden_size
    inter = _mlp_width(cfg)
    b = plan.b
    per_layer = _attention_params(cfg) + 3 * h * inter
    embed = vocab * h * (1 if cfg.tie_word_embeddings else 2)

    def cost(p: dict[str, Any]) -> tuple[float, float]:
        tokens = p["batch"] * p["seq_len"]
        params_ = p["layers"] * per_layer + embed
        acts = tokens * (p["layers"] * h + 12 * h + 4 * inter) * b + tokens * vocab * 4 * 2
        return 4 * params_ * b + acts, 6 * tokens * params_

    params = {
        "layers": min(cfg.num_layers, FEW_LAYERS[plan.device]),
        **_decoder_shape(cfg),
        "intermediate": inter,
        "batch": plan.batch,
        "seq_len": plan.seq_len,
        "vocab": vocab,
    }
    what = "one layer and the embeddings with their gradients and AdamW state"
    fitted = _shrink(plan, "activation_offload", params, [("layers", 1), ("batch", 1), ("seq_len", 64)], cost, what)
    if fitted is None:
        return
    fitted["dtype"] = plan.dtype
    plan.size(f"activation_offload: {fitted['layers']} of {cfg.num_layers} layers (offload overlaps layer by layer)")
    note = _shrunk_note("activation_offload", params, fitted, ["batch", "seq_len"], _why(plan))
    if note:
        plan.size(note)
    text = f"{fitted['layers']} decoder layers, each checkpointed with its input offloaded"
    if cfg.moe is not None:
        text += (
            f"; the MoE MLP stood in by a dense one of the active width ({inter}: top-{cfg.moe.top_k} x expert width)"
        )
    if cfg.mla is not None:
        text += "; attention as MHA at the MLA's q/k head dim"
    plan.add("activation_offload", fitted, text, STEP_POLICY[plan.device])


def _stand_in_params(cfg: ModelConfig) -> tuple[int, int, int]:
    """(parameters of one layer, of the embeddings and head, the MLP width) of the Llama-style
    stand-in the model-taking techniques build at ``cfg``'s shapes: for a Llama-style dense family
    its layer as gpubench.models.params counts it; for another, its attention and a dense MLP of
    the width a token computes through (an MoE's top-k experts and shared ones)."""
    h = cfg.hidden_size
    if cfg.moe is None and _family(cfg) in LLAMA_STYLE:
        pc = count_parameters(cfg.with_layers(1))
        outside = pc.groups.get("embedding", 0) + pc.groups.get("lm_head", 0) + h
        return pc.total - outside, outside, cfg.intermediate_size or 4 * h
    width = _mlp_width(cfg)
    outside = (cfg.vocab_size or 32000) * h * (1 if cfg.tie_word_embeddings else 2) + h
    return _attention_params(cfg) + 3 * h * width + 2 * h, outside, width


def _mlp_width(cfg: ModelConfig) -> int:
    """The dense MLP width a stand-in gives ``cfg``: its own, or an MoE's active width."""
    if cfg.moe is None:
        return cfg.intermediate_size or cfg.hidden_size * 8 // 3
    moe = cfg.moe
    return moe.top_k * moe.expert_dim + moe.shared_experts * (moe.shared_expert_dim or 0)


def _stand_in_blocker(cfg: ModelConfig) -> str | None:
    """Why a Llama-style stand-in cannot hold ``cfg`` (its MLA), or None."""
    if cfg.mla is not None:
        return "MLA: the Llama-style stand-in caches full keys and values per KV head, an MLA model a latent"
    return None


def _stand_in_note(cfg: ModelConfig) -> str:
    """What of the model a stand-in leaves out, for a family that is not Llama-style."""
    if cfg.moe is not None:
        return f"; a Llama-style stand-in: the MoE MLP as a dense one of the active width ({_mlp_width(cfg)})"
    if _family(cfg) not in LLAMA_STYLE:
        text = f"; a Llama-style stand-in at {_family(cfg)}'s shapes (its own norms and activation not applied)"
        if not getattr(cfg, "gated_mlp", True):
            text += "; " + stand_in.gated_mlp_note(cfg)
        return text
    return ""


def _packed_metadata(plan: _Plan, workload: str, model_param: str, *_: Any) -> None:
    cfg = plan.cfg
    blocker = _stand_in_blocker(cfg)
    if blocker:
        plan.skip("packed_metadata", blocker)
        return
    layer, outside, inter = _stand_in_params(cfg)
    b, h, vocab = plan.b, cfg.hidden_size, cfg.vocab_size or 32000

    def cost(p: dict[str, Any]) -> tuple[float, float]:
        tokens = p["rows"] * p["seq_len"]
        n = p["layers"] * layer + outside
        acts = tokens * p["layers"] * (14 * h + 4 * inter) * b + tokens * vocab * 4 * 2
        return 4 * n * b + acts, 6 * tokens * n

    params = {"model": model_param, "layers": cfg.num_layers, "rows": plan.batch, "seq_len": plan.seq_len}
    what = "one layer and the embeddings with their gradients and AdamW state"
    fitted = _shrink(plan, "packed_metadata", params, [("layers", 1), ("rows", 1), ("seq_len", 64)], cost, what)
    if fitted is None:
        return
    whole = fitted["layers"] == cfg.num_layers
    if whole:
        fitted["layers"] = 0
        plan.size(f"packed_metadata: the whole model ({cfg.num_layers} layers)")
    else:
        plan.size(
            f"packed_metadata: {fitted['layers']} of {cfg.num_layers} layers measured: the whole model's weights, "
            f"gradients and AdamW state do not fit {_why(plan)} (the per-layer rebuild it saves scales with layers)"
        )
    note = _shrunk_note("packed_metadata", params, fitted, ["rows", "seq_len"], _why(plan))
    if note:
        plan.size(note)
    fitted.update(
        mean_doc_len=max(1, fitted["seq_len"] // 8),
        dtype=plan.dtype,
        backend="sdpa" if plan.device == "cpu" else "auto",
    )
    text = "AdamW step of the model's decoder on packed documents" + _stand_in_note(cfg)
    plan.add("packed_metadata", fitted, text, STEP_POLICY[plan.device])


def _kv_layer_bytes(cfg: ModelConfig, b: int) -> int:
    """KV bytes per token per layer at ``b`` bytes an element (MLA: the latent and the rope key)."""
    if cfg.mla is not None:
        return (cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim) * b
    return 2 * cfg.num_kv_heads * cfg.head_dim * b


# kv_cache's waste figure is over requests of random lengths: from one request (a CPU's batch) it
# would be one draw of one length, so the cache holds at least this many (the batch where larger).
KV_MIN_REQUESTS = 16


def _kv_cache(plan: _Plan, workload: str, model_param: str, *_: Any) -> None:
    cfg = plan.cfg
    token_bytes = plan.seq_len * _kv_layer_bytes(cfg, plan.b)
    # the token data, the contiguous reservation and the paged blocks: three copies per layer; the
    # floor of requests gives way (down to the batch) where one layer of them does not fit
    fit_requests = int(plan.budget // max(1, 3 * token_bytes))
    requests = max(plan.batch, min(KV_MIN_REQUESTS, fit_requests))
    per_layer = requests * token_bytes
    fit_layers = int(plan.budget // max(1, 3 * per_layer))
    if fit_layers < 1:
        plan.skip("kv_cache", f"one layer's cache for {requests} x {plan.seq_len} tokens does not fit {_why(plan)}")
        return
    if requests < KV_MIN_REQUESTS:  # the floor gave way
        plan.size(
            f"kv_cache: {requests} requests (not {KV_MIN_REQUESTS}): one layer's cache for more at "
            f"{plan.seq_len} tokens does not fit {_why(plan)}"
        )
    layers = min(cfg.num_layers, fit_layers)
    params = {
        "model": model_param,
        "kv_dtype": KV_DTYPE[plan.device],
        "layers": 0 if layers == cfg.num_layers else layers,
        "requests": requests,
        "max_len": plan.seq_len,
    }
    if layers == cfg.num_layers:
        plan.size(f"kv_cache: the whole model ({cfg.num_layers} layers) allocated")
    else:
        plan.size(
            f"kv_cache: the first {layers} of {cfg.num_layers} layers allocated; all of them need "
            f"{_gib(3 * per_layer * cfg.num_layers)}, more than {_why(plan)}"
        )
    plan.add("kv_cache", params, "the model's cache layout, contiguous vs paged, checked against the calculator")


def _serving(technique: str):
    def generate(plan: _Plan, workload: str, model_param: str, *_: Any) -> None:
        cfg = plan.cfg
        blocker = _stand_in_blocker(cfg)
        if blocker:
            plan.skip(technique, blocker)
            return
        layer, outside, _width = _stand_in_params(cfg)
        b = 4 if plan.device == "cpu" else plan.b
        dtype = "float32" if plan.device == "cpu" else plan.dtype
        cpu = plan.device == "cpu"
        max_len = max(64, min(plan.seq_len, 512 if cpu else 1024))  # a trace's prompt + output fit
        max_batch = 8 if cpu else 64
        kv_token = _kv_layer_bytes(cfg, b)

        def cost(p: dict[str, Any]) -> tuple[float, float]:
            weights = (p["layers"] * layer + outside) * b
            kv = p["layers"] * kv_token * max_len * max_batch
            return weights + 2 * kv, 2 * (p["layers"] * layer + outside) * max_batch

        params = {"model": model_param, "layers": min(cfg.num_layers, FEW_LAYERS[plan.device])}
        fitted = _shrink(plan, technique, params, [("layers", 1)], cost, "one layer and the embeddings")
        if fitted is None:
            return
        kv_mib = fitted["layers"] * kv_token * max_len * max(2, max_batch // 2) / 2**20
        prompt_hi = max(16, max_len // 4)
        fitted.update(
            dtype=dtype,
            requests=12 if cpu else 120,
            arrival="poisson:20" if cpu else "poisson:60",
            prompt_len=f"uniform:{min(16, prompt_hi)}:{prompt_hi}",
            output_len=f"exp:{max(8, max_len // 16)}:{max(16, max_len // 4)}",
            max_len=max_len,
            kv_budget_mib=round(max(0.01, kv_mib), 3),
            max_batch=max_batch,
            check_requests=2 if cpu else 16,
        )
        if technique == "continuous_batching":
            fitted["kv"] = "contiguous"
        plan.size(
            f"{technique}: {fitted['layers']} of {cfg.num_layers} layers (seeded random weights at the model's "
            f"shapes), max_len {max_len}, KV budget {fitted['kv_budget_mib']} MiB (half the batch at full length)"
        )
        policy = dict(RUN_POLICY, case_timeout_s=300 if cpu else 240)
        text = f"{fitted['layers']} decoder layers serving a Poisson trace" + _stand_in_note(cfg)
        plan.add(technique, fitted, text, policy)

    return generate


def _speculative_decoding(
    plan: _Plan, workload: str, model_param: str, checkpoint: Path | None, draft: str | None
) -> None:
    cfg = plan.cfg
    if checkpoint is None:
        plan.skip(
            "speculative_decoding",
            "acceptance depends on the model's weights: give --model a checkpoint directory holding them",
        )
        return
    try:
        raw = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raw = {"model_type": f"unreadable config.json ({exc})"}
    problems = stand_in.checkpoint_problems(raw if isinstance(raw, dict) else {})
    if problems:
        plan.skip("speculative_decoding", "the target's loader cannot load this checkpoint: " + "; ".join(problems))
        return
    weights = count_parameters(cfg).total * 4  # loaded in float32
    if weights > plan.budget:
        plan.skip(
            "speculative_decoding", f"the checkpoint's weights in float32 ({_gib(weights)}) do not fit {_why(plan)}"
        )
        return
    prompt_len = min(64 if plan.device == "cpu" else 128, max(2, plan.seq_len // 2))
    base = {
        "target": str(checkpoint),
        "k": 4,
        "prompts": 2,
        "prompt_len": prompt_len,
        "max_new_tokens": 32 if plan.device == "cpu" else 128,
    }
    policy = (
        {"max_reps": 10, "max_time_s": 2.0, "case_timeout_s": 300}
        if plan.device == "cpu"
        else dict(STEP_POLICY["cuda"], case_timeout_s=240)
    )
    plan.add(
        "speculative_decoding",
        {**base, "drafter": "ngram"},
        "the checkpoint as target, prompt-lookup (n-gram) drafts",
        policy,
    )
    if draft is not None:
        draft_param = draft if draft.startswith("early:") else str(Path(draft).resolve())
        plan.add(
            "speculative_decoding",
            {**base, "drafter": "draft_model", "draft": draft_param},
            f"draft model {draft}",
            policy,
        )


def _drop_unsupported(plan: _Plan) -> None:
    """Leave out the entries whose params this build's techniques do not declare or refuse (a
    gpubench older than a param the generator writes, or a plug-in shadowing a built-in), or that
    a technique's own rules across params refuse (its ``validate_fn``, as the scenario loader runs
    it: an odd head_dim RoPE cannot rotate, a config without the MLP width the stand-in needs), so
    the generated scenario always loads: a technique left with no entry is listed as not
    applicable with the reason (the rule's own words), an entry left out beside others is said in
    ``model.sizing``. The rules are code: this imports the techniques (torch)."""
    from gpubench.run import scenario as scenariomod
    from gpubench.techniques import catalog

    kept: list[tuple[dict[str, Any], None]] = []
    dropped: list[tuple[dict[str, Any], str]] = []
    for entry in plan.entries:
        declared = catalog.declaration(entry["technique"])
        problem = _unsupported(declared, entry)
        if problem is None:
            try:
                problem = "; ".join(scenariomod.rule_problems(declared, entry["params"])) or None
            except Exception:  # noqa: BLE001 - a rule that raises is a bug: the loader reports it as one
                problem = None
        if problem is None:
            kept.append((entry, None))
        else:
            dropped.append((entry, problem))
    plan.entries = [entry for entry, _ in kept]
    measured = {entry["technique"] for entry in plan.entries}
    for entry, problem in dropped:
        technique = entry["technique"]
        if technique in measured:
            plan.size(f"{technique}: the entry for {entry.get('note') or 'a case'} is left out: {problem}")
        else:
            plan.skip(technique, f"{problem} (needed for {entry.get('note') or 'its case'})")
            plan.sizing = [line for line in plan.sizing if not line.startswith(f"{technique}: ")]


def _unsupported(declared: Any, entry: dict[str, Any]) -> str | None:
    """Why this build's ``declared`` technique cannot take ``entry``'s params, or None."""
    technique = entry["technique"]
    if declared is None:
        return f"{technique} is not a technique of this gpubench"
    for key, value in entry["params"].items():
        spec = declared.param(key)
        if spec is None:
            return f"this gpubench's {technique} takes no {key} param"
        for v in value if isinstance(value, list) else [value]:
            problem = spec.problem(v)
            if problem is not None:
                return f"this gpubench's {technique}.{key}: {problem}"
    return None


GENERATORS = {
    "flash_attention": _flash_attention,
    "paged_attention": _paged_attention,
    "moe_grouping": _moe_grouping,
    "combined_training": _combined_training,
    "activation_offload": _activation_offload,
    "packed_metadata": _packed_metadata,
    "kv_cache": _kv_cache,
    "paged_kv_serving": _serving("paged_kv_serving"),
    "continuous_batching": _serving("continuous_batching"),
    "speculative_decoding": _speculative_decoding,
}
