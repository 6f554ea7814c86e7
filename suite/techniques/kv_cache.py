"""kv_cache: allocate a model's real KV cache, contiguous at max length vs paged blocks, and check
the bytes each holds against the calculator's prediction (to the byte).

The calculator (:mod:`gpubench.kvmath`, ``gpubench kv-cache``) plans memory; this technique
proves its arithmetic on real allocations: the layout (KV heads per GPU, head_dim, MLA latent,
sliding-window layers, KV dtype with its scales) comes from a preset's published config, the
first ``layers`` layers of it so the cache fits any machine, and sequence lengths are drawn at
random up to ``max_len``. Each variant writes every sequence's tokens (random data, never zeros)
and the check reads them back through the variant's addressing (block tables for paged).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpubench import kvmath
from gpubench.baselines import kv_cache as contiguous
from gpubench.contract import CheckResult, Measured, Param, Technique, Workload
from gpubench.kvstorage import SequenceKV, random_rows, same_bytes
from gpubench.models import config as model_config
from gpubench.models import params as model_params
from gpubench.optimizations import kv_cache as paged

TECHNIQUE = Technique(
    name="kv_cache",
    shape="analytic",
    summary="KV memory of a real model layout: contiguous max-length reservation vs paged blocks, "
            "measured bytes checked against the calculator.",
    anchor="vLLM: prior systems use 20.4-38.2% of KV memory for token states; vLLM wastes under 4%",
    headline="utilization",
    gate_metric="bytes_reserved",
    gpu_specific="The bytes are the same on any device; the time (allocate and write the cache) "
                 "is a device figure, and on a CPU it says little about a GPU allocator.",
    params=[
        Param("model", str, "llama-2-7b", "published config whose layout is allocated",
              choices=model_config.preset_names()),
        Param("kv_dtype", str, "bf16", "KV storage format (scales included)", choices=list(kvmath.KV_FORMATS)),
        Param("layers", int, 2, "first N layers of the model (0 = all)", min=0),
        Param("requests", int, 4, "sequences in the cache", min=1),
        Param("max_len", int, 1024, "longest sequence; what contiguous reserves", min=1),
        Param("block_size", int, 16, "tokens per paged block", min=1),
        Param("tp", int, 1, "tensor-parallel degree (one GPU's share is allocated)", min=1),
    ],
)


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    cfg = model_config.load_preset(params["model"])
    if params["layers"] > cfg.num_layers:
        return [f"layers ({params['layers']}) exceeds {params['model']}'s {cfg.num_layers} layers"]
    try:
        kvmath.layout_for(cfg, params["kv_dtype"], params["tp"])
    except Exception as exc:  # noqa: BLE001 - BadInput with the reason
        return [str(exc)]
    return []


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> Workload:
    cfg = model_config.load_preset(params["model"])
    if params["layers"]:
        cfg = cfg.with_layers(params["layers"])
    layout = kvmath.layout_for(cfg, params["kv_dtype"], params["tp"])
    w = Workload(dict(params), torch.device(device), seed)
    lengths = torch.randint(1, params["max_len"] + 1, (params["requests"],), generator=w.generator()).tolist()
    # Token data is drawn on the device itself (gigabytes at real sizes): the same for a seed on
    # a given device type.
    data_gen = torch.Generator(device=w.device).manual_seed(seed + 1)
    sequences = [SequenceKV(n, [random_rows(layout, n, data_gen) for _ in range(layout.num_layers)])
                 for n in lengths]
    w.inputs.update(layout=layout, lengths=lengths, sequences=sequences)
    return w


@dataclass
class Allocation:
    """A variant's output: the cache it built and what it was asked to hold."""

    cache: Any  # ContiguousKVCache or PagedKVCache
    workload: Workload

    def storage_bytes(self) -> int:
        return self.cache.storage_bytes()


def _build(module, w: Workload) -> Allocation:
    cache = module.build_cache(w.layout, w.sequences, max_len=w.params["max_len"],
                               block_size=w.params["block_size"], device=w.device, generator=w.generator(2))
    return Allocation(cache, w)


@TECHNIQUE.variant("baseline", role="baseline")
def run_contiguous(w: Workload) -> Allocation:
    """Contiguous: max_len slots per sequence in every layer, reserved up front."""
    return _build(contiguous, w)


@TECHNIQUE.variant("optimized", role="optimized")
def run_paged(w: Workload) -> Allocation:
    """Paged: block_size-token blocks on demand, window-aware for sliding layers."""
    return _build(paged, w)


ALLOCATORS = ("contiguous", "paged")  # each is also the kvmath policy it must match


@TECHNIQUE.reference
def reference(w: Workload) -> dict[str, int]:
    """The calculator's prediction of each allocator's tensor storage, in bytes."""
    p = w.params
    return {name: kvmath.cache_bytes(w.layout, w.lengths, name, p["block_size"], p["max_len"])
            for name in ALLOCATORS}


@TECHNIQUE.check
def check(reference_bytes: dict[str, int], output: Allocation) -> CheckResult:
    """Measured storage must equal the prediction to the byte, and every live token must read
    back bit-exact through the allocator's addressing."""
    cache, w = output.cache, output.workload
    predicted = reference_bytes[cache.allocator]
    measured = cache.storage_bytes()
    mismatched = 0
    for i, seq in enumerate(w.sequences):
        for layer, window in enumerate(w.layout.windows):
            start = max(0, seq.length - window) if window else 0
            got = cache.read(i, layer, start, seq.length)
            src = seq.layers[layer]
            ok = same_bytes(got.values, src.values[start:])
            if src.scales is not None:
                ok = ok and same_bytes(got.scales, src.scales[start:])
            mismatched += not ok
    error = abs(measured - predicted)
    passed = error == 0 and mismatched == 0
    detail = "" if passed else (f"measured {measured} B vs predicted {predicted} B; "
                                f"{mismatched} (sequence, layer) read-backs differ")
    return CheckResult(passed, float(error), 0.0, "bytes_off_prediction", detail)


REFERENCE_GPU_BYTES = 80 * 2**30  # for the memory breakdown when the run is not on a GPU


def _full_model_breakdown(w: Workload) -> dict[str, Any]:
    """The whole model (all layers) with this case's sequences, on one GPU of the tp group: what
    the memory breakdown figure shows."""
    cfg = model_config.load_preset(w.params["model"])
    layout = kvmath.layout_for(cfg, w.params["kv_dtype"], w.params["tp"])
    on_gpu = w.device.type == "cuda"
    gpu = torch.cuda.get_device_properties(w.device).total_memory if on_gpu else REFERENCE_GPU_BYTES
    return {
        "full_model_weight_bytes_per_gpu": -(-model_params.weight_bytes(cfg).bytes // w.params["tp"]),
        "full_model_kv_contiguous_bytes": kvmath.cache_bytes(layout, w.lengths, "contiguous",
                                                             w.params["block_size"], w.params["max_len"]),
        "full_model_kv_paged_bytes": kvmath.cache_bytes(layout, w.lengths, "paged", w.params["block_size"],
                                                        w.params["max_len"]),
        "gpu_memory_bytes": gpu,
        "gpu_memory_source": torch.cuda.get_device_name(w.device) if on_gpu else "reference 80 GiB GPU (run on CPU)",
    }


@TECHNIQUE.metrics
def metrics(w: Workload, measured: Measured) -> dict[str, Any]:
    out: Allocation = measured.output
    reserved = out.storage_bytes()
    holding = kvmath.token_bytes(w.layout, w.lengths)
    return {
        **_full_model_breakdown(w),
        "bytes_reserved": reserved,
        "bytes_predicted": reference(w)[out.cache.allocator],
        "bytes_holding_tokens": holding,
        "utilization": holding / reserved if reserved else 0.0,
        "metadata_bytes": out.cache.metadata_bytes(),
        "tokens": sum(w.lengths),
    }


@TECHNIQUE.figures
def figures(cases: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """Predicted vs measured bytes per case and allocator; a memory breakdown (weights, KV,
    free) of one GPU per model, full model, with each case's sequences."""
    import matplotlib.pyplot as plt

    rows = []
    for case in cases:
        v = case.get("variants", {})
        base = (v.get("baseline") or {}).get("metrics") or {}
        opt = (v.get("optimized") or {}).get("metrics") or {}
        needed = ("bytes_reserved", "bytes_predicted", "gpu_memory_bytes", "full_model_weight_bytes_per_gpu",
                  "full_model_kv_contiguous_bytes")
        if all(k in base for k in needed) and "full_model_kv_paged_bytes" in opt and "bytes_predicted" in opt:
            label = f"{case['params'].get('model')} {case['params'].get('kv_dtype')}"
            rows.append((label, base, opt))
    if not rows:
        return []
    mib = 2**20
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.55 * len(rows)))
    y = range(len(rows))
    for offset, (name, key) in enumerate((("contiguous", 1), ("paged", 2))):
        measured = [r[key]["bytes_reserved"] / mib for r in rows]
        predicted = [r[key]["bytes_predicted"] / mib for r in rows]
        pos = [i + (offset - 0.5) * 0.38 for i in y]
        ax.barh(pos, measured, height=0.36, label=f"{name}: measured", color=("#c44e52", "#4c72b0")[offset])
        ax.scatter(predicted, pos, marker="|", s=300, color="black", zorder=3,
                   label="predicted" if offset else None)
    ax.set_yticks(list(y), [r[0] for r in rows])
    ax.set_xlabel("KV tensor storage (MiB)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = [("KV bytes: measured allocation vs the calculator's prediction", fig)]

    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.8 * len(rows)))
    gib = 2**30
    labels = []
    for i, (label, base, opt) in enumerate(rows):
        total = base["gpu_memory_bytes"]
        for j, (alloc, kv) in enumerate((("contiguous", base["full_model_kv_contiguous_bytes"]),
                                         ("paged", opt["full_model_kv_paged_bytes"]))):
            weights = base["full_model_weight_bytes_per_gpu"]
            free = max(0, total - weights - kv)
            pos = 2 * i + j
            ax.barh(pos, weights / gib, color="#4c72b0", label="weights" if pos == 0 else None)
            ax.barh(pos, kv / gib, left=weights / gib, color="#55a868", label="KV" if pos == 0 else None)
            ax.barh(pos, free / gib, left=(weights + kv) / gib, color="#dddddd", label="free" if pos == 0 else None)
            labels.append(f"{label} {alloc}")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_xlabel(f"GiB of one GPU ({rows[0][1]['gpu_memory_source']})")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out.append(("Memory breakdown of one GPU: full model weights, KV of this case's sequences (all layers), free", fig))
    return out
