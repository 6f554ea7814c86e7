"""kv_cache: allocate a model's real KV cache, ``contiguous`` at max length vs ``paged`` blocks, and
check the bytes each holds against the calculator's (:mod:`gpubench.kvmath`) prediction, to the
byte. The layout is a preset's published config (its first ``layers`` layers, so the cache fits
any machine); every sequence's tokens (random data, never zeros) are written and read back
bit-exact through the allocator's addressing. Lengths are random, or ``edges``: at and around
block (and window) edges, where block arithmetic goes wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gpubench import kvmath
from gpubench.baselines.kv_cache import ContiguousKVCache
from gpubench.baselines.kv_cache import build_cache as build_contiguous
from gpubench.claims import vllm_kv_waste
from gpubench.contract import Bench, CheckResult, Headline, Measured, Param, Plot, Technique, Workload
from gpubench.errors import BadInput
from gpubench.kvstorage import SequenceKV, random_rows, same_bytes
from gpubench.models import config as model_config
from gpubench.models import params as model_params
from gpubench.optimizations.kv_cache import PagedKVCache
from gpubench.optimizations.kv_cache import build_cache as build_paged

TECHNIQUE = Technique(
    name="kv_cache",
    shape="analytic",
    summary="KV memory of a real model layout: contiguous max-length reservation vs paged blocks, "
            "measured bytes checked against the calculator.",
    anchor="vLLM: prior systems use 20.4-38.2% of KV memory for token states; vLLM wastes under 4%",
    claims=[vllm_kv_waste("utilization")],
    benchmarks=[Bench(model, {"model": model, "max_len": 512}) for model in ("llama-3.1-8b", "gpt-oss-20b")],
    headline_figures=(Headline("utilization", "KV utilization", percent=True),),
    gate_metric="bytes_reserved",
    gpu_specific="The bytes are the same on any device; the time (allocate and write the cache) "
                 "is a device figure, and on a CPU it says little about a GPU allocator.",
    params=[
        Param("model", str, "llama-2-7b", "published config whose layout is allocated",
              choices=model_config.preset_names()),
        Param("kv_dtype", str, "bf16", "KV storage format (scales included)", choices=list(kvmath.KV_FORMATS)),
        Param("layers", int, 2, "first N layers of the model (0 = all)", min=0),
        Param("requests", int, 4, "sequences in the cache (lengths: random)", min=1),
        Param("max_len", int, 1024, "longest sequence; what contiguous reserves", min=1),
        Param("lengths", str, "random", "random: `requests` lengths in [1, max_len]; edges: one sequence per "
              "length at and around block edges (1, B-1, B, B+1, 2B-1, .., max_len) and sliding-window edges",
              choices=["random", "edges"]),
        Param("block_size", int, 16, "tokens per paged block", min=1),
        Param("tp", int, 1, "tensor-parallel degree (one GPU's share is allocated)", min=1),
    ],
    plots=[
        Plot("KV bytes (MiB): measured allocation beside the calculator's prediction", kind="bars",
             y=("bytes_reserved", "bytes_predicted"), scale=2**-20, ylabel="MiB"),
        # A case's few sequences are a sliver of a GPU (DeepSeek-V3's four hold 0.1 GiB beside 39 GiB
        # of weights), so the breakdown fills the GPU with copies of them, as a server would.
        Plot("One GPU serving copies of this case's sequences until 90% of its memory is used (GiB): the "
             "model's weights split over the fewest GPUs that leave 10% of each for KV (the case's tp, "
             "doubled until they do), KV holding tokens, KV reserved but empty, free",
             kind="stacked", y=("weights_per_gpu_gib", "kv_holding_tokens_gib", "kv_reserved_but_empty_gib",
                                "free_gib"), ylabel="GiB per GPU"),
    ],
)


@dataclass(kw_only=True)
class KVCacheWorkload(Workload):
    layout: kvmath.KVLayout  # the first ``layers`` layers, one GPU's share
    lengths: list[int]  # tokens per sequence
    sequences: list[SequenceKV]  # their token data, every layer


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
def build(params: dict[str, Any], device: torch.device, seed: int) -> KVCacheWorkload:
    cfg = model_config.load_preset(params["model"])
    if params["layers"]:
        cfg = cfg.with_layers(params["layers"])
    layout = kvmath.layout_for(cfg, params["kv_dtype"], params["tp"])
    device = torch.device(device)
    if params["lengths"] == "edges":
        lengths = kvmath.block_edge_lengths(params["block_size"], params["max_len"], layout.windows)
    else:
        lengths = torch.randint(1, params["max_len"] + 1, (params["requests"],),
                                generator=torch.Generator().manual_seed(seed)).tolist()
    # Token data is drawn on the device itself (gigabytes at real sizes): the same for a seed on
    # a given device type.
    data_gen = torch.Generator(device=device).manual_seed(seed + 1)
    sequences = [SequenceKV(n, [random_rows(layout, n, data_gen) for _ in range(layout.num_layers)])
                 for n in lengths]
    return KVCacheWorkload(params=dict(params), device=device, seed=seed, layout=layout, lengths=lengths,
                           sequences=sequences)


@dataclass
class Allocation:
    """A variant's output: the cache it built and what it was asked to hold."""

    cache: ContiguousKVCache | PagedKVCache
    workload: KVCacheWorkload

    def storage_bytes(self) -> int:
        return self.cache.storage_bytes()


def _allocate(build_cache, w: KVCacheWorkload) -> Allocation:
    cache = build_cache(w.layout, w.sequences, max_len=w.params["max_len"], block_size=w.params["block_size"],
                        device=w.device, generator=w.generator(2))
    return Allocation(cache, w)


@TECHNIQUE.variant("contiguous", role="baseline")
def contiguous(w: KVCacheWorkload) -> Allocation:
    """max_len slots per sequence in every layer, reserved up front"""
    return _allocate(build_contiguous, w)


@TECHNIQUE.variant("paged", role="optimized")
def paged(w: KVCacheWorkload) -> Allocation:
    """block_size-token blocks on demand, window-aware for sliding layers"""
    return _allocate(build_paged, w)


ALLOCATORS = ("contiguous", "paged")  # each is also the kvmath policy it must match


@TECHNIQUE.reference
def reference(w: KVCacheWorkload) -> dict[str, int]:
    """The calculator's prediction of each allocator's tensor storage, in bytes."""
    p = w.params
    return {name: kvmath.cache_bytes(w.layout, w.lengths, name, p["block_size"], p["max_len"])
            for name in ALLOCATORS}


@dataclass
class ReadBack:
    """What a cache gave back for every sequence's live tokens (each layer's whole sequence, or
    its window for a sliding layer)."""

    mismatched: int = 0  # (sequence, layer) read-backs that differ from what was written
    missing: int = 0  # live tokens it never stored
    at_lengths: set[int] = field(default_factory=set)  # lengths of the sequences that differ
    live_bytes: int = 0  # bytes of the live tokens read back: a count independent of kvmath


def read_back(cache: ContiguousKVCache | PagedKVCache, w: KVCacheWorkload) -> ReadBack:
    out = ReadBack()
    for i, seq in enumerate(w.sequences):
        for layer, window in enumerate(w.layout.windows):
            start = max(0, seq.length - window) if window else 0
            got = cache.read(i, layer, start, seq.length)
            out.live_bytes += sum(t.nbytes for t in (got.values, got.scales) if t is not None)
            src = seq.layers[layer]
            ok = same_bytes(got.values, src.values[start:])
            if src.scales is not None:
                ok = ok and same_bytes(got.scales, src.scales[start:])
            if not ok:
                out.mismatched += 1
                out.missing += seq.length - start - got.values.shape[0]
                out.at_lengths.add(seq.length)
    return out


@TECHNIQUE.check
def check(reference_bytes: dict[str, int], output: Allocation) -> CheckResult:
    """Measured storage must equal the prediction to the byte, and every live token must read
    back bit-exact through the allocator's addressing (a token it never stored reads back
    missing). The bytes the metrics call holding tokens (:func:`kvmath.token_bytes`, whence
    utilization and the waste the claims read) must equal the bytes of the live tokens read back,
    and utilization lie in [0, 1]: above 1.0, waste is negative."""
    cache, w = output.cache, output.workload
    predicted = reference_bytes[cache.allocator]
    measured = cache.storage_bytes()
    got = read_back(cache, w)
    error = abs(measured - predicted)
    if error or got.mismatched:
        detail = f"measured {measured} B vs predicted {predicted} B"
        if got.mismatched:
            detail += (f"; {got.mismatched} (sequence, layer) read-backs differ ({got.missing} tokens not stored), "
                       f"at lengths {sorted(got.at_lengths)[:8]}")
        return CheckResult(False, float(error), 0.0, "bytes_off_prediction", detail)
    holding = kvmath.token_bytes(w.layout, w.lengths)
    utilization = holding / measured if measured else 0.0
    if holding != got.live_bytes or not 0.0 <= utilization <= 1.0:
        return CheckResult(False, float(abs(holding - got.live_bytes)), 0.0, "holding_bytes_off_live_count",
                           f"bytes holding tokens {holding} B (utilization {utilization:.4g}, waste "
                           f"{1 - utilization:.2%}) vs {got.live_bytes} B of live tokens read back "
                           f"(utilization {got.live_bytes / measured if measured else 0.0:.4g}); utilization must "
                           "lie in [0, 1]")
    return CheckResult(True, 0.0, 0.0, "bytes_off_prediction", "")


GIB = 2**30
REFERENCE_GPU_BYTES = 80 * GIB  # for the memory breakdown when the run is not on a GPU
UTILIZATION = 0.9  # of a GPU's memory the server fills (vLLM's default gpu_memory_utilization, the calculator's)
KV_ROOM = 0.1  # the least share of each GPU the weights must leave for KV


def gpus_for_weights(cfg: model_config.ModelConfig, kv_dtype: str, tp: int, gpu_bytes: int) -> int:
    """The case's tp, doubled until each GPU's share of the weights leaves :data:`KV_ROOM` of it
    under :data:`UTILIZATION` and the KV heads split evenly (DeepSeek-V3's 627 GiB on 80 GiB
    GPUs: 16)."""
    weights = model_params.weight_bytes(cfg).bytes
    n = tp
    while n < 4096:
        if weights / n <= (UTILIZATION - KV_ROOM) * gpu_bytes:
            try:
                kvmath.layout_for(cfg, kv_dtype, n)
                return n
            except BadInput:  # KV heads that n GPUs cannot share: try 2n
                pass
        n *= 2
    return n


def serving_memory(w: KVCacheWorkload, allocator: str) -> dict[str, Any]:
    """One GPU of a server that holds the whole model (all layers) over :func:`gpus_for_weights`
    GPUs and fills :data:`UTILIZATION` of its memory with copies of this case's sequences, laid
    out by ``allocator``: weights, KV holding tokens, KV reserved but empty, free, in GiB."""
    p = w.params
    cfg = model_config.load_preset(p["model"])
    on_gpu = w.device.type == "cuda"
    gpu = torch.cuda.get_device_properties(w.device).total_memory if on_gpu else REFERENCE_GPU_BYTES
    gpus = gpus_for_weights(cfg, p["kv_dtype"], p["tp"], gpu)
    layout = kvmath.layout_for(cfg, p["kv_dtype"], gpus)
    weights = -(-model_params.weight_bytes(cfg).bytes // gpus)
    fixed = kvmath.cache_bytes(layout, [], allocator, p["block_size"], p["max_len"])  # per-tensor scales
    one_copy = kvmath.cache_bytes(layout, w.lengths, allocator, p["block_size"], p["max_len"]) - fixed
    copies = max(0, (int(gpu * UTILIZATION) - weights - fixed) // one_copy) if one_copy else 0
    kv = copies * one_copy + (fixed if copies else 0)
    holding = copies * kvmath.token_bytes(layout, w.lengths)
    return {
        "gpus": gpus,
        "weights_per_gpu_gib": weights / GIB,
        "kv_holding_tokens_gib": holding / GIB,
        "kv_reserved_but_empty_gib": (kv - holding) / GIB,
        "free_gib": max(0, gpu - weights - kv) / GIB,
        "sequences_per_gpu": copies * len(w.lengths),
        "gpu_memory_gib": gpu / GIB,
        "gpu_memory_source": torch.cuda.get_device_name(w.device) if on_gpu else "reference 80 GiB GPU (run on CPU)",
    }


@TECHNIQUE.metrics
def metrics(w: KVCacheWorkload, measured: Measured) -> dict[str, Any]:
    out: Allocation = measured.output
    reserved = out.storage_bytes()
    holding = kvmath.token_bytes(w.layout, w.lengths)
    return {
        **serving_memory(w, out.cache.allocator),
        "bytes_reserved": reserved,
        "bytes_predicted": reference(w)[out.cache.allocator],
        "bytes_holding_tokens": holding,
        "utilization": holding / reserved if reserved else 0.0,
        "metadata_bytes": out.cache.metadata_bytes(),
        "tokens": sum(w.lengths),
        "sequences": len(w.lengths),
    }
