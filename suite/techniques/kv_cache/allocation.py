"""A model's KV cache as the kv_cache pair allocates it, whichever allocator: the workload (a
model's layout, from a preset or config.json, and seeded token data for every sequence), a variant's output
(:class:`Allocation`), the calculator's prediction of its bytes (:func:`predicted_bytes`), the
read-back of every live token through the allocator's addressing, the check of both, and the
figures derived from an allocation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from gpubench.checks import CheckResult
from gpubench.contract import Measured, Workload
from gpubench.errors import BadInput
from gpubench.lib import kvmath
from gpubench.lib.kvstorage import SequenceKV, TokenRows, random_rows, same_bytes
from gpubench.models import config as model_config
from gpubench.models import stand_in
from gpubench.techniques.kv_cache.server_memory import serving_memory

ALLOCATORS = ("contiguous", "paged")  # each is also the kvmath policy it must match


class KVCache(Protocol):
    """What the pair's allocators (contiguous, paged) share: their kvmath policy's name, their
    tensor storage, and a token range of one sequence and layer read back."""

    allocator: str

    def storage_bytes(self) -> int: ...

    def metadata_bytes(self) -> int: ...

    def read(self, index: int, layer: int, start: int, end: int) -> TokenRows: ...


@dataclass(kw_only=True)
class KVCacheWorkload(Workload):
    layout: kvmath.KVLayout  # the first ``layers`` layers, one GPU's share
    lengths: list[int]  # tokens per sequence
    sequences: list[SequenceKV]  # their token data, every layer


def load_config(params: Mapping[str, Any]) -> model_config.ModelConfig:
    """The model ``params["model"]`` names, its ``ignore_fields`` (comma-separated) accepted unread."""
    return model_config.load_model(params["model"], stand_in.ignore_list(params.get("ignore_fields", "")))


def layout_problems(params: dict[str, Any]) -> list[str]:
    """Why the model (a preset or a config.json: :func:`gpubench.models.config.load_model`) cannot
    give the layout ``params`` ask for (it names nothing, too many layers, a KV format or
    tensor-parallel degree it does not take)."""
    try:
        cfg = load_config(params)
    except BadInput as exc:
        return [str(exc)]
    if params["layers"] > cfg.num_layers:
        return [f"layers ({params['layers']}) exceeds {params['model']}'s {cfg.num_layers} layers"]
    try:
        kvmath.layout_for(cfg, params["kv_dtype"], params["tp"])
    except Exception as exc:  # noqa: BLE001 - BadInput with the reason
        return [str(exc)]
    return []


def build_workload(params: dict[str, Any], device: torch.device, seed: int) -> KVCacheWorkload:
    """The model's layout (a preset or config.json; its first ``layers`` layers, one GPU's share of ``tp``), the sequence
    lengths (seeded random, or at and around block and window edges) and their token data."""
    cfg = load_config(params)
    if params["layers"]:
        cfg = cfg.with_layers(params["layers"])
    layout = kvmath.layout_for(cfg, params["kv_dtype"], params["tp"])
    device = torch.device(device)
    if params["lengths"] == "edges":
        lengths = kvmath.block_edge_lengths(params["block_size"], params["max_len"], layout.windows)
    else:
        lengths = torch.randint(
            1, params["max_len"] + 1, (params["requests"],), generator=torch.Generator().manual_seed(seed)
        ).tolist()
    # Token data is drawn on the device itself (gigabytes at real sizes): the same for a seed on
    # a given device type.
    data_gen = torch.Generator(device=device).manual_seed(seed + 1)
    sequences = [SequenceKV(n, [random_rows(layout, n, data_gen) for _ in range(layout.num_layers)]) for n in lengths]
    return KVCacheWorkload(
        params=dict(params), device=device, seed=seed, layout=layout, lengths=lengths, sequences=sequences
    )


@dataclass
class Allocation:
    """A variant's output: the cache it built and what it was asked to hold."""

    cache: KVCache
    workload: KVCacheWorkload

    def storage_bytes(self) -> int:
        return self.cache.storage_bytes()


def allocate(build_cache: Callable[..., KVCache], w: KVCacheWorkload) -> Allocation:
    """The workload's sequences stored by an allocator's ``build_cache``."""
    cache = build_cache(
        w.layout,
        w.sequences,
        max_len=w.params["max_len"],
        block_size=w.params["block_size"],
        device=w.device,
        generator=w.generator(2),
    )
    return Allocation(cache, w)


def predicted_bytes(w: KVCacheWorkload) -> dict[str, int]:
    """The calculator's prediction of each allocator's tensor storage, in bytes."""
    p = w.params
    return {name: kvmath.cache_bytes(w.layout, w.lengths, name, p["block_size"], p["max_len"]) for name in ALLOCATORS}


@dataclass
class ReadBack:
    """What a cache gave back for every sequence's live tokens (each layer's whole sequence, or
    its window for a sliding layer)."""

    mismatched: int = 0  # (sequence, layer) read-backs that differ from what was written
    missing: int = 0  # live tokens it never stored
    at_lengths: set[int] = field(default_factory=set)  # lengths of the sequences that differ
    live_bytes: int = 0  # bytes of the live tokens read back: a count independent of kvmath


def read_back(cache: KVCache, w: KVCacheWorkload) -> ReadBack:
    out = ReadBack()
    for i, seq in enumerate(w.sequences):
        for layer, window in enumerate(w.layout.windows):
            start = max(0, seq.length - window) if window else 0
            got = cache.read(i, layer, start, seq.length)
            out.live_bytes += sum(t.nbytes for t in (got.values, got.scales) if t is not None)
            src = seq.layers[layer]
            ok = same_bytes(got.values, src.values[start:])
            if src.scales is not None:
                ok = ok and got.scales is not None and same_bytes(got.scales, src.scales[start:])
            if not ok:
                out.mismatched += 1
                out.missing += seq.length - start - got.values.shape[0]
                out.at_lengths.add(seq.length)
    return out


def allocation_check(reference_bytes: dict[str, int], output: Allocation) -> CheckResult:
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
            detail += (
                f"; {got.mismatched} (sequence, layer) read-backs differ ({got.missing} tokens not stored), "
                f"at lengths {sorted(got.at_lengths)[:8]}"
            )
        return CheckResult(False, float(error), 0.0, "bytes_off_prediction", detail)
    holding = kvmath.token_bytes(w.layout, w.lengths)
    utilization = holding / measured if measured else 0.0
    if holding != got.live_bytes or not 0.0 <= utilization <= 1.0:
        return CheckResult(
            False,
            float(abs(holding - got.live_bytes)),
            0.0,
            "holding_bytes_off_live_count",
            f"bytes holding tokens {holding} B (utilization {utilization:.4g}, waste "
            f"{1 - utilization:.2%}) vs {got.live_bytes} B of live tokens read back "
            f"(utilization {got.live_bytes / measured if measured else 0.0:.4g}); utilization must "
            "lie in [0, 1]",
        )
    return CheckResult(True, 0.0, 0.0, "bytes_off_prediction", "")


def allocation_metrics(w: KVCacheWorkload, measured: Measured) -> dict[str, Any]:
    """Bytes reserved, predicted and holding tokens, utilization, the allocator's own metadata, and
    one GPU of a server filled with copies of the case's sequences (:func:`serving_memory`)."""
    out: Allocation = measured.output
    reserved = out.storage_bytes()
    holding = kvmath.token_bytes(w.layout, w.lengths)
    p = w.params
    return {
        **serving_memory(w.device, p, w.lengths, out.cache.allocator),
        "bytes_reserved": reserved,
        "bytes_predicted": predicted_bytes(w)[out.cache.allocator],
        "bytes_holding_tokens": holding,
        "utilization": holding / reserved if reserved else 0.0,
        "metadata_bytes": out.cache.metadata_bytes(),
        "tokens": sum(w.lengths),
        "sequences": len(w.lengths),
    }
