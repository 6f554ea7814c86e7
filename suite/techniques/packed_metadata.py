"""packed_metadata: a full training step of a small Llama-style decoder on packed batches, with
the packed-sequence metadata (cu_seqlens, max_seqlen, position ids, block-causal mask or varlen
arguments) rebuilt in every layer (baseline) or built once per batch and reused (optimized).

A case is one batch of ``rows`` rows of ``seq_len`` tokens, each row several documents of random
lengths (drawn per row, mean ``mean_doc_len``, at least two per row) packed without padding, and
one step of AdamW on the shared model (:mod:`gpubench.models.llama`) from a fixed state: the
workload's ``reset`` puts fresh leaf copies of the seeded weights and of a seeded AdamW state in
place before every call, untimed. Both variants run the same builder and the same attention, so
their loss, gradients and updated weights are compared exactly on a CPU (bit for bit) and within
a stated tolerance on CUDA (atomics in the attention backward reorder float sums).

Each call also records its own split (metadata build, forward, backward, optimizer; CUDA events
on a GPU), the builds and host syncs it made and the mask bytes it held; ``metrics`` reports their
medians over the timed calls, and the report hook draws the split against the number of layers.

Attention backends: "sdpa" (torch SDPA with the additive block-causal mask; CPU and GPU) and
"flash_attn_varlen" (flash-attn's varlen kernel, CUDA with fp16/bf16, when the package is
installed); "auto" takes flash-attn where it can run, else SDPA. The suite's own Triton flash
attention (:mod:`gpubench.optimizations.flash_attention`) has no varlen (cu_seqlens) path, so it is
not a backend here.
"""
from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable

import torch

from gpubench.baselines import packed_metadata as base
from gpubench.baselines.packed_metadata import StepOutput, StepStats
from gpubench.contract import CheckResult, Measured, Param, Technique, Workload
from gpubench.errors import BadInput
from gpubench.models.llama import SIZES, LayerWeights, LlamaWeights, random_weights, with_overrides
from gpubench.optimizations import packed_metadata as opt
from gpubench.timing import count_cuda_syncs

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
HALF = ("float16", "bfloat16")
# On CUDA the attention backward (SDPA's kernels, flash-attn) accumulates with atomics, so two
# identical steps can differ by float rounding: relative L2 allowed per tensor, by dtype.
CUDA_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}
LR = 1e-4
ADAM_STEP0 = 10.0  # the restored optimizer state is that of a run 10 steps in

TECHNIQUE = Technique(
    name="packed_metadata",
    shape="training_step",
    summary="Packed-sequence attention metadata (cu_seqlens, max_seqlen, position ids, block-causal "
            "mask) built once per batch and shared by every layer, instead of rebuilt per layer.",
    anchor="Unsloth: +14.3% per training step, +43.3% forward (Qwen3-14B QLoRA)",
    gpu_specific=(
        "On a GPU each rebuild's max_seqlen .item() is a host sync: the host waits for the GPU to "
        "drain and stops queueing kernels ahead of it, so every layer's launches become exposed "
        "(layers syncs per step against one), and with SDPA the baseline keeps one rows x seq^2 mask "
        "per layer alive for the backward pass. On a CPU .item() is a plain read with no stall; what "
        "the CPU ratio shows is the cost of constructing the mask (elementwise work over rows x seq^2 "
        "per layer) against the step's compute, so it is not the GPU's ratio."
    ),
    headline="host_syncs_per_step",
    params=[
        Param("model", str, "tiny", "model size of gpubench.models.llama (random seeded weights)",
              choices=list(SIZES)),
        Param("layers", int, 0, "decoder layers; 0 keeps the model size's own", min=0),
        Param("rows", int, 2, "packed rows per batch", min=1),
        Param("seq_len", int, 256, "tokens per row (documents packed without padding)", min=2),
        Param("mean_doc_len", int, 64, "mean document length; lengths are uniform in "
              "[1, min(2 * mean - 1, seq_len - 1)], the last one cut to fill the row", min=1),
        Param("dtype", str, "float32", "dtype of weights, activations and the mask", choices=list(DTYPES)),
        Param("backend", str, "auto", "attention: sdpa (block-causal mask), flash_attn_varlen (flash-attn's "
              "varlen kernel, CUDA, fp16/bf16), auto (flash-attn when it can run, else sdpa); the suite's "
              "Triton flash attention has no varlen path", choices=["auto", *base.BACKENDS]),
    ],
)


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    problems = []
    if params["mean_doc_len"] >= params["seq_len"]:
        problems.append(f"mean_doc_len ({params['mean_doc_len']}) must be below seq_len ({params['seq_len']}): "
                        "a packed row holds at least two documents")
    if params["backend"] == "flash_attn_varlen" and params["dtype"] not in HALF:
        problems.append(f"backend flash_attn_varlen needs dtype float16 or bfloat16 (got {params['dtype']})")
    return problems


def config_of(params: dict[str, Any]):
    config = SIZES[params["model"]]
    return with_overrides(config, num_layers=params["layers"]) if params["layers"] else config


def flash_varlen_unavailable(device: torch.device, dtype: str) -> str | None:
    """Why flash-attn's varlen kernel cannot run here, or None."""
    imported = base.flash_attn_varlen()
    if isinstance(imported, str):
        return imported
    if torch.device(device).type != "cuda":
        return "flash-attn runs on CUDA only"
    if dtype not in HALF:
        return f"flash-attn has no {dtype} kernel"
    return None


def resolve_backend(choice: str, device: torch.device, dtype: str) -> str:
    """The backend a case runs: "auto" is flash_attn_varlen where it can run, else sdpa."""
    reason = flash_varlen_unavailable(device, dtype)
    if choice == "auto":
        return "sdpa" if reason else "flash_attn_varlen"
    if choice == "flash_attn_varlen" and reason:
        raise BadInput(f"packed_metadata: backend flash_attn_varlen cannot run here: {reason}; "
                       "use backend sdpa or auto")
    return choice


def draw_doc_lens(rows: int, seq: int, mean: int, gen: torch.Generator) -> list[list[int]]:
    """Document lengths of each row, drawn until the row is full (the last one cut to fit), so
    rows hold different documents; every row has at least two (no document is seq long)."""
    longest = max(1, min(2 * mean - 1, seq - 1))
    out = []
    for _ in range(rows):
        lens, left = [], seq
        while left:
            n = min(left, int(torch.randint(1, longest + 1, (1,), generator=gen)))
            lens.append(n)
            left -= n
        out.append(lens)
    return out


def rebind(template: LlamaWeights, params: list[torch.Tensor]) -> LlamaWeights:
    """``template`` with each of its parameters replaced by the tensor at the same place in
    ``params`` (LlamaWeights.parameters() order); tied embeddings stay tied."""
    by_id = {id(old): new for old, new in zip(template.parameters(), params)}
    layers = [LayerWeights(**{f: by_id[id(getattr(layer, f))] for f in LayerWeights.__dataclass_fields__})
              for layer in template.layers]
    return dataclasses.replace(template, embed=by_id[id(template.embed)], layers=layers,
                               final_norm=by_id[id(template.final_norm)], lm_head=by_id[id(template.lm_head)])


def parameter_names(weights: LlamaWeights) -> list[str]:
    names = ["embed", "final_norm"] + ([] if weights.lm_head is weights.embed else ["lm_head"])
    for i in range(len(weights.layers)):
        names += [f"layers.{i}.{f}" for f in LayerWeights.__dataclass_fields__]
    return names


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> Workload:
    workload = Workload(params=dict(params), device=torch.device(device), seed=seed)
    config = config_of(params)
    dtype = DTYPES[params["dtype"]]
    backend = resolve_backend(params["backend"], workload.device, params["dtype"])
    rows, seq = params["rows"], params["seq_len"]
    gen = workload.generator()
    lens = draw_doc_lens(rows, seq, params["mean_doc_len"], gen)
    tokens = torch.randint(0, config.vocab_size, (rows, seq), generator=gen)
    pristine = random_weights(config, seed, dtype, workload.device)
    # A mid-training AdamW state (seeded moments, step ADAM_STEP0), drawn on the CPU.
    moments = [((1e-3 * torch.randn(p.shape, generator=gen)).to(device=workload.device, dtype=dtype),
                (1e-6 * torch.rand(p.shape, generator=gen)).to(device=workload.device, dtype=dtype))
               for p in pristine.parameters()]
    inputs = workload.inputs
    inputs.update(
        config=config, backend=backend, lens=lens, tokens=tokens.to(workload.device),
        doc_lens=torch.tensor([n for row in lens for n in row], dtype=torch.int32, device=workload.device),
        names=parameter_names(pristine), cache=opt.PackedMetadataCache(),
        records={},  # variant -> [StepStats of every call]
    )

    def reset() -> None:
        """Fresh leaf parameters holding the seeded weights and a fresh AdamW holding the seeded
        state: every call does the same step, and an earlier call's outputs stay untouched."""
        live = [p.detach().clone().requires_grad_(True) for p in pristine.parameters()]
        optimizer = torch.optim.AdamW(live, lr=LR, weight_decay=0.01)
        for p, (m, v) in zip(live, moments):
            optimizer.state[p] = {"step": torch.tensor(ADAM_STEP0), "exp_avg": m.clone(), "exp_avg_sq": v.clone()}
        inputs.update(weights=rebind(pristine, live), optimizer=optimizer)

    workload.reset = reset
    reset()
    return workload


# -- variants ---------------------------------------------------------------------------------

def _run(w: Workload, name: str, step: Callable[..., StepOutput], **extra: Any) -> dict[str, Any]:
    stats = StepStats(w.device)
    records = w.records.setdefault(name, [])
    # The first call of a variant (the runner's checked call) also counts the syncs CUDA sees.
    with count_cuda_syncs(w.device.type == "cuda" and not records) as seen:
        out = step(w.weights, w.optimizer, w.tokens, w.doc_lens, backend=w.backend, stats=stats, **extra)
    stats.observed_syncs = seen["n"]
    records.append(stats)
    return {"loss": out.loss, "grads": out.grads, "params": out.params, "names": w.names, "backend": w.backend}


@TECHNIQUE.variant("baseline", role="baseline")
def run_baseline(w: Workload) -> dict[str, Any]:
    """Every layer's attention call rebuilds cu_seqlens, max_seqlen (.item()), position ids and
    the block-causal mask (or varlen arguments) from the document lengths."""
    return _run(w, "baseline", base.train_step)


@TECHNIQUE.variant("optimized", role="optimized")
def run_optimized(w: Workload) -> dict[str, Any]:
    """The same metadata built once per batch by a keyed cache, shared by RoPE, the loss and every
    layer, released when the step's backward pass is done."""
    return _run(w, "optimized", opt.train_step, cache=w.cache)


# -- correctness ------------------------------------------------------------------------------

@TECHNIQUE.check
def check(reference_output: dict[str, Any], output: dict[str, Any]) -> CheckResult:
    """Loss, every gradient and every updated parameter against the baseline's: exactly on a CPU
    (metric max_abs_diff, must be 0), relative L2 per tensor within CUDA_TOLERANCE on CUDA."""
    names = ["loss"] + [f"grad {n}" for n in reference_output["names"]] + [f"param {n}" for n in reference_output["names"]]
    refs = [reference_output["loss"], *reference_output["grads"], *reference_output["params"]]
    outs = [output["loss"], *output["grads"], *output["params"]]
    on_cuda = refs[0].is_cuda
    tolerance = CUDA_TOLERANCE.get(refs[-1].dtype, 2e-2) if on_cuda else None  # by the weights' dtype
    metric = "max_rel_l2" if on_cuda else "max_abs_diff"
    if len(outs) != len(refs):
        return CheckResult(False, None, tolerance, metric, f"{len(outs)} tensors against the baseline's {len(refs)}")
    worst, worst_name = 0.0, ""
    for name, ref, out in zip(names, refs, outs):
        if out is None or ref is None:
            return CheckResult(False, None, tolerance, metric, f"{name} is missing")
        if out.shape != ref.shape:
            return CheckResult(False, None, tolerance, metric, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}")
        bad = int((~out.isfinite()).sum())
        if bad:
            return CheckResult(False, float("nan"), tolerance, metric, f"{name} has {bad} NaN/Inf values")
        diff = out.double() - ref.double()
        if on_cuda:
            scale = torch.linalg.vector_norm(ref.double()).item()
            error = torch.linalg.vector_norm(diff).item() / (scale if scale > 0 else 1.0)
        else:
            error = diff.abs().max().item() if diff.numel() else 0.0
        if error > worst or not worst_name:
            worst, worst_name = error, name
    passed = worst <= tolerance if on_cuda else worst == 0.0
    detail = "" if passed else f"largest difference in {worst_name}: {worst:.3g}"
    return CheckResult(passed, worst, tolerance, metric, detail)


# -- metrics ----------------------------------------------------------------------------------

def matmul_params(config) -> int:
    """Parameters that take part in matmuls: all but the embedding table (a lookup), unless it is
    tied to the LM head."""
    return config.num_params() - (0 if config.tie_word_embeddings else config.vocab_size * config.hidden_size)


def _phase_medians(records: list[StepStats]) -> dict[str, float]:
    steady = records[1:] or records  # the first call is the checked (cold) one
    totals = [r.totals() for r in steady]
    return {name: statistics.median(t.get(name, 0.0) for t in totals)
            for name in ("build", "forward", "backward", "optimizer")}


@TECHNIQUE.metrics
def metrics(w: Workload, measured: Measured) -> dict[str, Any]:
    config = w.config
    tokens = w.tokens.numel()
    records = w.records.get(measured.variant) or []
    out: dict[str, Any] = {
        "backend": w.backend,
        "layers": config.num_layers,
        "tokens": tokens,
        "documents": int(w.doc_lens.numel()),
        "tokens_per_s": tokens / measured.median_s,
        "ms_per_step": 1e3 * measured.median_s,
        # 6 x parameters x tokens: the usual training estimate (2 forward, 4 backward), attention
        # scores not counted.
        "flops": 6 * matmul_params(config) * tokens,
    }
    if not records:
        return out
    phases = _phase_medians(records)
    last = records[-1]
    out.update({
        "build_ms": 1e3 * phases["build"],
        "forward_ms": 1e3 * phases["forward"],  # the build time included
        "backward_ms": 1e3 * phases["backward"],
        "optimizer_ms": 1e3 * phases["optimizer"],
        "split_calls": max(1, len(records) - 1),
        "metadata_builds_per_step": last.builds,
        # .item() calls made per step by the builds: host syncs on a GPU, plain reads on a CPU
        "host_syncs_per_step": last.host_syncs,
        "mask_bytes_held": last.mask_bytes_held,
        "metadata_bytes_held": last.metadata_bytes_held,
        "mask_bytes_built_per_step": last.mask_bytes_built,
    })
    if records[0].observed_syncs is not None:
        out["host_syncs_observed"] = records[0].observed_syncs  # CUDA sync debug mode, whole step
    if last.cache_hits or last.cache_misses:
        out["cache_hits_per_step"], out["cache_misses_per_step"] = last.cache_hits, last.cache_misses
    baseline = w.records.get(TECHNIQUE.baseline.name)
    if measured.variant != TECHNIQUE.baseline.name and baseline:
        ref = _phase_medians(baseline)
        for phase in ("forward", "backward"):
            if phases[phase] > 0:
                out[f"{phase}_speedup"] = ref[phase] / phases[phase]
    return out


# -- report figures ---------------------------------------------------------------------------

PHASES = (("build_ms", "metadata build"), ("forward_ms", "forward (rest)"), ("backward_ms", "backward"),
          ("optimizer_ms", "optimizer"))
PHASE_COLORS = ("#d62728", "#1f6fb4", "#2ca02c", "#9467bd")


def _panels(cases: list[dict[str, Any]]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """label of the params other than layers -> variant role -> layers -> metrics."""
    varying = sorted(k for k in {k for c in cases for k in c.get("params", {})}
                     if k != "layers" and len({repr(c.get("params", {}).get(k)) for c in cases}) > 1)
    out: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for case in cases:
        params = case.get("params") or {}
        label = ", ".join(f"{k}={params.get(k)}" for k in varying)
        for record in (case.get("variants") or {}).values():
            role, m = record.get("role"), record.get("metrics") or {}
            if role in ("baseline", "optimized") and isinstance(m.get("layers"), int) \
                    and all(isinstance(m.get(k), (int, float)) for k, _ in PHASES):
                out.setdefault(label, {}).setdefault(role, {})[m["layers"]] = m
    return out


def _breakdown_figure(panels: dict[str, dict[str, dict[int, dict[str, Any]]]]):
    from matplotlib.figure import Figure

    labels = sorted(panels)
    fig = Figure(figsize=(7.0, 2.8 * len(labels)))
    axes = fig.subplots(len(labels), 1, squeeze=False)[:, 0]
    for ax, label in zip(axes, labels):
        layers = sorted({n for by_layers in panels[label].values() for n in by_layers})
        for offset, role, hatch in ((-0.2, "baseline", "//"), (0.2, "optimized", "")):
            for x, n in enumerate(layers):
                m = panels[label].get(role, {}).get(n)
                if m is None:
                    continue
                bottom = 0.0
                rest = {"build_ms": m["build_ms"], "forward_ms": max(0.0, m["forward_ms"] - m["build_ms"]),
                        "backward_ms": m["backward_ms"], "optimizer_ms": m["optimizer_ms"]}
                for (key, phase), color in zip(PHASES, PHASE_COLORS):
                    ax.bar(x + offset, rest[key], width=0.38, bottom=bottom, color=color, hatch=hatch,
                           edgecolor="white", label=phase if x == 0 and role == "optimized" else None)
                    bottom += rest[key]
        ax.set_xticks(range(len(layers)), [str(n) for n in layers])
        ax.set_xlabel("layers (left bar: baseline, hatched; right bar: optimized)")
        ax.set_ylabel("ms per step")
        ax.set_title(label or "step-time breakdown")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _build_figure(panels: dict[str, dict[str, dict[int, dict[str, Any]]]]):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 3.0))
    ax = fig.add_subplot()
    colors = {"baseline": "#8c8c8c", "optimized": "#1f6fb4"}
    for label in sorted(panels):
        for role, by_layers in sorted(panels[label].items()):
            xs = sorted(by_layers)
            ax.plot(xs, [by_layers[n]["build_ms"] for n in xs], marker="o", color=colors[role],
                    linestyle="-" if role == "optimized" else "--", label=f"{role} {label}".strip())
    ax.set_xlabel("layers")
    ax.set_ylabel("metadata build, ms per step")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


@TECHNIQUE.figures
def figures(cases: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Step time split into metadata build, the rest of the forward pass, backward and the
    optimizer, baseline beside optimized, against the number of layers (a panel per setting of the
    other params); and the metadata build time per step against layers. Nothing without data."""
    panels = _panels(cases)
    if not panels:
        return []
    return [("Step-time breakdown (metadata build, forward, backward, optimizer) vs number of layers",
             _breakdown_figure(panels)),
            ("Metadata build time per step vs number of layers", _build_figure(panels))]
