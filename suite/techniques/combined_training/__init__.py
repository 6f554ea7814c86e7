"""combined_training: the three training optimizations together. One training step (forward,
backward, AdamW) of a small gpt-oss-style MoE decoder (:mod:`gpubench.models.moe_decoder`) on
packed rows, checkpointed with each layer's input offloaded to host memory. Baseline: all three
off (packed metadata rebuilt in every layer, the per-expert ``torch.where`` loop, reloads through
one staging buffer); optimized: all three on (metadata cached once per step, sort-and-group,
two staging buffers); peers: each one alone on top of the baseline, so the report shows how the
total splits.

Nothing here re-implements the single pairs: the builder, cache and attention are
:mod:`gpubench.lib.packing` and packed_metadata's :class:`PackedMetadataCache`, the MoE paths are
moe_grouping's, the offload schedules are activation_offload's (:mod:`gpubench.lib.offload` with this
model's layer). Every variant's loss and gradients are checked against the plain step (ordinary
autograd: no checkpointing, no offload, the metadata built once) of the same MoE path, and in
float32 against the other path's plain step too.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpubench.baselines import activation_offload as one_buffer_schedule
from gpubench.baselines.moe_grouping import moe_forward as per_expert_loop
from gpubench.contract import (
    DTYPE_TOLERANCE,
    Bench,
    CheckResult,
    Headline,
    Measured,
    Param,
    Plot,
    Recorder,
    Technique,
    Workload,
    tensors_check,
)
from gpubench.lib.gqa import decoder_head_problems
from gpubench.lib.gradients import learning_check
from gpubench.lib.packing import (
    IGNORE_INDEX,
    StepStats,
    build_metadata,
    document_positions,
    draw_doc_lens,
    next_token_labels,
    packed_attention,
    phase,
)
from gpubench.measure.timing import count_cuda_syncs
from gpubench.models.llama import LlamaConfig, head_loss, rope_cos_sin
from gpubench.models.moe import MoEConfig, MoEWeights, SyncLog, routing_problems
from gpubench.models.moe_decoder import (
    ATTENTION,
    MoEDecoderLayer,
    MoEDecoderWeights,
    moe_decoder_layer,
    random_moe_decoder,
)
from gpubench.models.moe_decoder_float64 import moe_decoder_layer_float64
from gpubench.optimizations import activation_offload as two_buffer_schedule
from gpubench.optimizations.moe_grouping import moe_forward as sort_and_group
from gpubench.optimizations.packed_metadata import PackedMetadataCache
from gpubench.records.claims import COMBINED_TRAINING

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BACKEND = "sdpa"  # the block-causal mask: what every device runs (flash-attn's varlen is packed_metadata's)
# Against the plain step of the same MoE path the variants compute the same values in another
# order (layers recomputed in separate graphs, reloaded inputs): float32 within DTYPE_TOLERANCE,
# bf16 within 2e-2 as activation_offload's gradients. The other path's plain step is compared in
# float32 only, within 1e-4: in bf16 the two paths' rounding differs by ~1e-2 in a layer's output,
# enough to flip a near-tie among the next layer's top-k router logits and move a token to
# another expert (a real divergence of two correct implementations, not a bug).
TOLERANCE = {**DTYPE_TOLERANCE, torch.bfloat16: 2e-2}
# On CUDA the attention backward and sort-and-group's one index_add_ (each token's top_k rows)
# accumulate with atomics, in bf16 in any order: two runs of the same plain step differ. Measured
# on an H200 at gpu-quick's widths: up to 7.6e-3 on the loop's variants, and on sort-and-group's
# 3.5e-2 at 2 layers and 0.104 at 4 in the router gradients (sums of cancelling softmax-backward
# terms, as moe_grouping found), under 0.1 in every other tensor. Hence two limits on CUDA: the
# router gradients' and the rest's. A wrong reload, stale metadata or a dropped routing weight errs
# by order 1 (the planted bugs: 1 to 1e7).
CUDA_TOLERANCE = {**TOLERANCE, torch.float32: 1e-4, torch.bfloat16: 1e-1}
CUDA_ROUTER_TOLERANCE = {**CUDA_TOLERANCE, torch.bfloat16: 3e-1}
ROUTER = (".experts.router_weight", ".experts.router_bias")
CROSS_PATH_TOLERANCE = {torch.float32: 1e-4}
# The layer code against its independent float64 reference (:func:`layer_check`): both in float64
# but for the layer code's RMSNorm, which normalizes in float32 as Llama does (~1e-7 relative).
LAYER_TOLERANCE = 1e-5
LAYER_TOKENS = 256  # the first tokens of row 0, its documents cut there
ROUTING_TIE = 1e-4  # a random input whose routing is this near a tie is drawn again (at most 8 times)
assert IGNORE_INDEX == -100  # head_loss's cross_entropy ignores -100, the packed labels' "no target"


@dataclass(frozen=True)
class Options:
    """Which of the three optimizations a variant turns on."""

    cached_metadata: bool  # PackedMetadataCache, else build_metadata in every layer's attention call
    moe: str  # "sort_group" or "where_loop" (moe_grouping's paths)
    buffers: int  # offload staging buffers: 2 (overlapped reloads) or 1


OFF = Options(cached_metadata=False, moe="where_loop", buffers=1)
VARIANTS = {  # name -> (role, options, description)
    "all_off": (
        "baseline",
        OFF,
        "packed metadata rebuilt in every layer (and again in its recompute), the "
        "per-expert torch.where loop, offloaded layer inputs reloaded through one staging buffer",
    ),
    "all_on": (
        "optimized",
        Options(True, "sort_group", 2),
        "metadata built once per step and cached, "
        "sort-and-group MoE (one host read per MoE call), reloads through two staging buffers",
    ),
    "cached_metadata": ("peer", Options(True, "where_loop", 1), "the baseline with only the metadata cache on"),
    "sort_group": ("peer", Options(False, "sort_group", 1), "the baseline with only sort-and-group MoE on"),
    "two_buffers": ("peer", Options(False, "where_loop", 2), "the baseline with only double-buffered reloads on"),
}
FORWARDS = {"where_loop": per_expert_loop, "sort_group": sort_and_group}  # moe_grouping's two paths
SPLIT = ("build_ms", "moe_forward_ms", "wait_ms", "optimizer_ms", "other_ms")

TECHNIQUE = Technique(
    name="combined_training",
    shape="training_step",
    summary="A training step of a small gpt-oss-style MoE decoder on packed sequences with offloaded "
    "checkpointing: packed-metadata caching, sort-and-group MoE and double-buffered offload all "
    "off against all on, each one alone as a peer.",
    anchor="Unsloth + NVIDIA: ~25% faster training with the three together (notably on consumer RTX GPUs)",
    claims=[COMBINED_TRAINING],
    gpu_specific=(
        "Two of the three wins are GPU effects that a CPU cannot show: the host syncs the baseline makes "
        "(a max_seqlen .item() per layer and per recompute, a torch.where per expert per MoE call) stall a "
        "GPU's queue but cost nothing on a CPU, and the second staging buffer hides PCIe reloads behind "
        "recompute on a copy stream, where a CPU has a memcpy on a worker thread. What a CPU ratio shows is "
        "the metadata's mask construction, the loop's per-expert op overhead and gradient assembly, and what "
        "a thread overlaps on these cores; the sync counts are the same on every device."
    ),
    headline_figures=(
        Headline("host_syncs_per_step", "host syncs per step", higher_is_better=False, replaces_time=False),
    ),
    benchmarks=[
        Bench(
            f"{n}-layers",
            {
                "layers": n,
                "hidden": 64,
                "experts": 8,
                "top_k": 2,
                "expert_dim": 64,
                "rows": 1,
                "seq_len": 256,
                "mean_doc_len": 48,
            },
        )
        for n in (2, 4)
    ],
    params=[
        Param("layers", int, 2, "decoder layers (each checkpointed, its input offloaded)", min=1),
        Param("hidden", int, 64, "model width (gpt-oss: 2880)", min=8),
        Param("heads", int, 4, "query heads (head_dim = hidden / heads, even)", min=1),
        Param("kv_heads", int, 2, "key/value heads", min=1),
        Param("vocab", int, 256, "vocabulary size", min=2),
        Param("experts", int, 8, "experts per MoE layer (gpt-oss-20b: 32)", min=1),
        Param("top_k", int, 2, "experts per token (gpt-oss: 4)", min=1),
        Param("expert_dim", int, 64, "expert intermediate width (gpt-oss: 2880)", min=1),
        Param("rows", int, 1, "packed rows per batch", min=1),
        Param("seq_len", int, 256, "tokens per row (documents packed without padding)", min=2),
        Param(
            "mean_doc_len",
            int,
            48,
            "mean document length; lengths uniform in [1, min(2 * mean - 1, "
            "seq_len - 1)], the last one cut to fill the row",
            min=1,
        ),
        Param("dtype", str, "float32", "weights and activations", choices=list(DTYPES)),
    ],
    plots=[
        Plot(
            "Step time split (metadata builds, MoE forward and recompute, reload waits, optimizer, the rest)",
            y=SPLIT,
            x="layers",
            kind="stacked",
            ylabel="ms per step",
        ),
        Plot(
            "Host syncs per step (metadata .item() and MoE host reads) against layers",
            y="host_syncs_per_step",
            x="layers",
            ylabel="syncs per step",
        ),
    ],
)


@dataclass(kw_only=True)
class CombinedWorkload(Workload):
    weights: MoEDecoderWeights  # leaves requiring grad; reset restores them and clears their grads
    tokens: torch.Tensor  # (rows, seq_len)
    doc_lens: torch.Tensor  # (documents,) int32 on the device, row-major
    cache: PackedMetadataCache  # the cached variants'


@TECHNIQUE.validate
def validate(params: dict[str, Any]) -> list[str]:
    # the attention's shape rules are activation_offload's, the router's moe_grouping's
    problems = decoder_head_problems(params) + routing_problems(params)
    if params["mean_doc_len"] >= params["seq_len"]:
        problems.append(
            f"mean_doc_len ({params['mean_doc_len']}) must be below seq_len ({params['seq_len']}): "
            "a packed row holds at least two documents"
        )
    return problems


@TECHNIQUE.build
def build(params: dict[str, Any], device: torch.device, seed: int) -> CombinedWorkload:
    device = torch.device(device)
    hidden, heads = params["hidden"], params["heads"]
    config = LlamaConfig(
        vocab_size=params["vocab"],
        hidden_size=hidden,
        num_layers=params["layers"],
        num_heads=heads,
        num_kv_heads=params["kv_heads"],
        head_dim=hidden // heads,
        intermediate_size=1,
        max_position=params["seq_len"],
    )
    moe = MoEConfig(experts=params["experts"], top_k=params["top_k"], hidden=hidden, expert_dim=params["expert_dim"])
    weights = random_moe_decoder(config, moe, seed, DTYPES[params["dtype"]], device)
    tensors = weights.parameters()
    for t in tensors:
        t.requires_grad_(True)
    initial = [t.detach().clone() for t in tensors]
    gen = torch.Generator().manual_seed(seed + 2)
    rows, seq = params["rows"], params["seq_len"]
    lens = draw_doc_lens(rows, seq, params["mean_doc_len"], gen)
    tokens = torch.randint(0, config.vocab_size, (rows, seq), generator=gen)

    def reset() -> None:
        with torch.no_grad():
            for t, t0 in zip(tensors, initial):
                t.copy_(t0)
                t.grad = None

    return CombinedWorkload(
        params=dict(params),
        device=device,
        seed=seed,
        reset=reset,
        weights=weights,
        tokens=tokens.to(device),
        cache=PackedMetadataCache(),
        doc_lens=torch.tensor([n for row in lens for n in row], dtype=torch.int32, device=device),
    )


# -- one step -----------------------------------------------------------------------------------


def train_step(
    w: CombinedWorkload, options: Options, stats: StepStats | None = None, syncs: SyncLog | None = None
) -> tuple[dict[str, Any], Any]:
    """One step with ``options``: the offloaded, checkpointed forward and backward of the
    schedule's buffer count (activation_offload's), every layer's attention metadata from the
    cache or rebuilt, every MoE call by ``options.moe``; then AdamW. Returns the loss and the
    gradients by name, and the schedule's OffloadStats."""
    weights, tokens, doc_lens = w.weights, w.tokens, w.doc_lens
    rows, seq = tokens.shape
    cache = w.cache if options.cached_metadata else None

    def metadata(dtype: torch.dtype):
        if cache is not None:
            return cache.get(doc_lens, rows, seq, BACKEND, dtype, stats)
        return build_metadata(doc_lens, rows, seq, BACKEND, dtype, stats)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return packed_attention(metadata(q.dtype), q, k, v)

    def moe_forward(x, experts, config, log):
        with phase(stats, "moe_forward"):
            return FORWARDS[options.moe](x, experts, config, log)

    def layer(weights_: MoEDecoderWeights, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        return moe_decoder_layer(weights_, i, x, cos, sin, attend, moe_forward, syncs)

    schedule = two_buffer_schedule if options.buffers == 2 else one_buffer_schedule
    with cache.batch() if cache is not None else contextlib.nullcontext():
        if cache is not None:
            positions = metadata(weights.dtype).position_ids
        else:  # as packed_metadata's per-layer baseline: RoPE positions straight from the lengths
            with phase(stats, "build"):
                positions = document_positions(doc_lens, rows, seq)
        loss, offload = schedule.train_step(
            weights, tokens, next_token_labels(tokens, positions), positions, layer=layer
        )
    return _finish(w, loss, stats), offload


def gradients(weights: MoEDecoderWeights) -> dict[str, torch.Tensor]:
    """Each parameter's gradient by name, copied; zeros where none reached it (a path that cuts
    the router off the loss still has a gradient to compare, and it is wrong)."""
    return {
        name: (t.grad.detach().clone() if t.grad is not None else torch.zeros_like(t))
        for name, t in weights.named_parameters().items()
    }


def _finish(w: CombinedWorkload, loss: torch.Tensor, stats: StepStats | None) -> dict[str, Any]:
    """Keep the gradients, then take the optimizer step (a fresh AdamW: reset restores the weights)."""
    named = w.weights.named_parameters()
    grads = gradients(w.weights)
    with phase(stats, "optimizer"):
        torch.optim.AdamW(list(named.values()), lr=1e-3).step()
    return {"loss": loss.detach().float(), "grads": grads}


def _run(w: CombinedWorkload, rec: Recorder, name: str) -> dict[str, Any]:
    options = VARIANTS[name][1]
    stats, syncs = StepStats(w.device), SyncLog()
    with phase(stats, "step"):
        out, offload = train_step(w, options, stats, syncs)
    summary = stats.summary()
    rec.record(
        **{key: summary[key] for key in ("build_ms", "moe_forward_ms", "optimizer_ms", "step_ms")},
        builds=stats.builds,
        metadata_syncs=stats.host_syncs,
        moe_host_reads=len(syncs),
        cache_hits=stats.cache_hits,
        cache_misses=stats.cache_misses,
        buffers=offload.buffers,
        wait_ms=offload.wait_ms,
        bytes_h2d=offload.bytes_h2d,
        bytes_d2h=offload.bytes_d2h,
        fallback=offload.fallback,
    )
    return {**out, "moe": options.moe}


def _declare(name: str) -> None:
    role, _, description = VARIANTS[name]

    def fn(w: CombinedWorkload, rec: Recorder) -> dict[str, Any]:
        return _run(w, rec, name)

    fn.__name__ = fn.__qualname__ = name
    TECHNIQUE.variant(name, role=role, description=description)(fn)


for _name in VARIANTS:
    _declare(_name)


# -- correctness ------------------------------------------------------------------------------


def plain_step(w: CombinedWorkload, moe: str) -> dict[str, Any]:
    """The step without any of the machinery under test: ordinary autograd through every layer
    (no checkpointing, no offload), the metadata built once with the builder, ``moe``'s path;
    from the initial weights (reset), the gradients left cleared."""
    w.reset()
    weights, tokens = w.weights, w.tokens
    rows, seq = tokens.shape
    meta = build_metadata(w.doc_lens, rows, seq, BACKEND, weights.dtype)
    cos, sin = rope_cos_sin(weights, meta.position_ids)
    x = F.embedding(tokens, weights.embed)
    for i in range(weights.config.num_layers):
        x = moe_decoder_layer(
            weights, i, x, cos, sin, lambda _, q, k, v: packed_attention(meta, q, k, v), FORWARDS[moe]
        )
    loss = head_loss(weights, x, next_token_labels(tokens, meta.position_ids))
    loss.backward()
    out = {"loss": loss.detach().float(), "grads": gradients(weights)}
    w.reset()
    return out


MOE_PATHS = ("where_loop", "sort_group")


def _layer_in_float64(layer: MoEDecoderLayer) -> MoEDecoderLayer:
    leaf = lambda t: t.detach().to(torch.float64).requires_grad_(True)
    return MoEDecoderLayer(**{name: leaf(getattr(layer, name)) for name in ATTENTION}, experts=layer.experts.map(leaf))


def _layer_params(layer: MoEDecoderLayer) -> dict[str, torch.Tensor]:
    return {
        **{name: getattr(layer, name) for name in ATTENTION},
        **dict(zip(MoEWeights.names(), layer.experts.tensors())),
    }


def _first_row_documents(w: CombinedWorkload, tokens: int) -> list[int]:
    """Row 0's document lengths (doc_lens is row-major, each row's sum to seq_len), cut at ``tokens``."""
    lens, total = [], 0
    for n in w.doc_lens.tolist():
        if total >= tokens:
            break
        lens.append(min(n, tokens - total))
        total += lens[-1]
    return lens


def layer_check(w: CombinedWorkload, moe: str) -> CheckResult:
    """Every layer as the model runs it (:func:`moe_decoder_layer` with ``moe``'s path and the
    packed attention, the layer's weights in float64) against :func:`moe_decoder_layer_float64`,
    written separately: on a random float64 input of row 0's first documents (redrawn while its
    routing is within ROUTING_TIE of a tie), the output and the gradients of the input and of
    every layer parameter for a random upstream gradient, within LAYER_TOLERANCE. A parameter
    whose gradient the independent reference says is nonzero and the layer code leaves at 0 is
    what this exists for: the plain step runs the same layer code as the variants, so comparing
    them cannot see it."""
    weights = w.weights
    c, m, device = weights.config, weights.moe, w.device
    lens = _first_row_documents(w, min(LAYER_TOKENS, w.tokens.shape[1]))
    n = sum(lens)
    meta = build_metadata(torch.tensor(lens, dtype=torch.int32, device=device), 1, n, BACKEND, torch.float64)
    empty = torch.empty(0, dtype=torch.float64, device=device)  # the layer reads no embedding or head
    worst = CheckResult(True, 0.0, LAYER_TOLERANCE, "max_rel_l2", "")
    for i in range(c.num_layers):
        layers = list(weights.layers)
        layers[i] = _layer_in_float64(weights.layers[i])  # one float64 copy at a time (GPU memory)
        result = _one_layer_check(
            MoEDecoderWeights(c, m, empty, layers, empty, empty),
            i,
            moe,
            meta,
            lens,
            torch.Generator().manual_seed(w.seed + 11 + i),
        )
        if not result.passed:
            return CheckResult(
                False,
                result.error,
                LAYER_TOLERANCE,
                result.metric,
                f"layer {i} ({moe}) against its independent float64 reference: {result.detail}",
            )
        if (result.error or 0) > (worst.error or 0):
            worst = CheckResult(True, result.error, LAYER_TOLERANCE, result.metric, f"layer {i}: {result.detail}")
    return worst


def _one_layer_check(
    model: MoEDecoderWeights, i: int, moe: str, meta, lens: list[int], gen: torch.Generator
) -> CheckResult:
    """Layer ``i`` of ``model`` (float64) by the layer code and by the independent reference."""
    c, m, device = model.config, model.moe, model.device
    cos, sin = rope_cos_sin(model, meta.position_ids)  # the tables are an input of both
    params = _layer_params(model.layers[i])
    leaves = list(params.values())
    for _ in range(8):
        x = torch.randn(len(cos[0]), c.hidden_size, generator=gen, dtype=torch.float64).to(device).requires_grad_(True)
        expected, nearest_tie = moe_decoder_layer_float64(c, m, params, x, cos[0], sin[0], lens)
        if nearest_tie >= ROUTING_TIE:
            break
    upstream = torch.randn(x.shape, generator=gen, dtype=torch.float64).to(device)
    want = torch.autograd.grad((expected * upstream).sum(), [x, *leaves])
    got_out = moe_decoder_layer(
        model, i, x[None], cos, sin, lambda _, q, k, v: packed_attention(meta, q, k, v), FORWARDS[moe]
    )[0]
    got = torch.autograd.grad((got_out * upstream).sum(), [x, *leaves], allow_unused=True)
    names = ["input", *params]
    return tensors_check(
        {"output": expected.detach(), **dict(zip(names, want))},
        {
            "output": got_out.detach(),
            **{n: torch.zeros_like(t) if g is None else g for n, g, t in zip(names, got, [x, *leaves])},
        },
        {torch.float64: LAYER_TOLERANCE},
        dtype=torch.float64,
    )


@TECHNIQUE.reference
def reference(w: CombinedWorkload) -> dict[str, Any]:
    """The plain step of each MoE path, by path, and each path's layer against its independent
    float64 reference (``layer_check``: path -> CheckResult)."""
    out: dict[str, Any] = {moe: plain_step(w, moe) for moe in MOE_PATHS}
    out["layer_check"] = {moe: layer_check(w, moe) for moe in MOE_PATHS}
    return out


def _flat(out: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {"loss": out.get("loss"), **out.get("grads", {})}


def same_path_check(
    ref: dict[str, torch.Tensor], out: dict[str, torch.Tensor], dtype: torch.dtype, cuda: bool
) -> CheckResult:
    """Against the plain step of the same MoE path: TOLERANCE on a CPU; on CUDA, the router
    gradients within CUDA_ROUTER_TOLERANCE and the rest within CUDA_TOLERANCE (the failing one, or
    the one with the larger error, is returned)."""
    if not cuda:
        return tensors_check(ref, out, TOLERANCE, dtype=dtype)
    router = {name for name in ref if name.endswith(ROUTER)}
    rest = tensors_check({k: v for k, v in ref.items() if k not in router}, out, CUDA_TOLERANCE, dtype=dtype)
    routed = tensors_check({k: ref[k] for k in router}, out, CUDA_ROUTER_TOLERANCE, dtype=dtype)
    if not rest.passed or not routed.passed:
        return rest if not rest.passed else routed
    return rest if (rest.error or 0) >= (routed.error or 0) else routed


@TECHNIQUE.check
def check(ref: dict[str, dict[str, Any]], out: dict[str, Any]) -> CheckResult:
    """Every parameter must learn (no all-zero gradient: :func:`gpubench.lib.gradients.learning_check`),
    and the variant's path's layer agree with its independent float64 reference (:func:`layer_check`);
    then the loss and every named gradient against the plain step of the variant's MoE path (within
    TOLERANCE of the weights' dtype; on CUDA see :func:`same_path_check`); in float32, against the other
    path's plain step as well (within CROSS_PATH_TOLERANCE). The error kept is the worst relative L2 against the same path."""
    moe = out.get("moe") if isinstance(out, dict) else None
    if moe not in MOE_PATHS:
        return CheckResult(False, None, None, "max_rel_l2", f"output names no MoE path of {list(MOE_PATHS)}")
    dead = learning_check(out.get("grads", {}), what=f"the {moe} variant's step")
    if dead is not None:
        return dead
    layer = ref.get("layer_check", {}).get(moe)
    if layer is not None and not layer.passed:
        return layer
    independent = f"; layer vs independent float64: {layer.error:.2g}" if layer is not None else ""
    dtype = next(iter(ref[moe]["grads"].values())).dtype  # the weights' (the loss is kept in float32)
    same = same_path_check(_flat(ref[moe]), _flat(out), dtype, cuda=ref[moe]["loss"].is_cuda)
    if not same.passed or dtype not in CROSS_PATH_TOLERANCE:
        own = "bit-identical" if same.passed and same.error == 0 else same.detail
        return CheckResult(
            same.passed, same.error, same.tolerance, same.metric, f"against the plain step ({moe}): {own}{independent}"
        )
    other = next(path for path in MOE_PATHS if path != moe)
    cross = tensors_check(_flat(ref[other]), _flat(out), CROSS_PATH_TOLERANCE, dtype=dtype)
    versus = f"{other} plain step: {cross.metric} {cross.error:.3g}" if cross.error is not None else other
    if not cross.passed:
        return CheckResult(
            False,
            cross.error,
            cross.tolerance,
            cross.metric,
            f"against the {other} plain step: {cross.detail} (own path: {same.error:.3g})",
        )
    own = "bit-identical" if same.error == 0 else same.detail
    return CheckResult(
        True, same.error, same.tolerance, same.metric, f"against the plain step ({moe}): {own}; {versus}{independent}"
    )


# -- metrics ----------------------------------------------------------------------------------

COUNTS = {
    "builds": "metadata_builds_per_step",
    "metadata_syncs": "metadata_syncs_per_step",
    "moe_host_reads": "moe_host_reads_per_step",
    "cache_hits": "cache_hits_per_step",
    "buffers": "buffers",
    "bytes_h2d": "bytes_reloaded_per_step",
}


@TECHNIQUE.metrics
def metrics(w: CombinedWorkload, measured: Measured) -> dict[str, Any]:
    tokens = w.tokens.numel()
    out: dict[str, Any] = {
        "tokens_per_s": tokens / measured.median_s,
        "ms_per_step": 1e3 * measured.median_s,
        "loss": float(measured.output["loss"]),
        "tokens": tokens,
        "documents": int(w.doc_lens.numel()),
        "params": w.weights.num_params(),
    }
    if measured.records:
        out.update({metric: int(measured.median_of(key)) for key, metric in COUNTS.items()})
        out["host_syncs_per_step"] = int(
            statistics.median(r["metadata_syncs"] + r["moe_host_reads"] for r in measured.records)
        )
        out.update({key: measured.median_of(key) for key in SPLIT[:-1]})
        # the rest of the step: attention, dense layers, head, backward passes, copies not waited for
        out["other_ms"] = statistics.median(
            r["step_ms"] - r["build_ms"] - r["moe_forward_ms"] - r["wait_ms"] - r["optimizer_ms"]
            for r in measured.records
        )
        out["fallback"] = next((r["fallback"] for r in measured.records if r.get("fallback")), "")
    if w.device.type == "cuda":  # GPU-only: sync debug mode sees CUDA syncs only
        # Sync debug mode perturbs timing: CUDA's own count comes from one extra, untimed step.
        w.reset()
        with count_cuda_syncs(True) as seen:
            train_step(w, VARIANTS[measured.variant][1])
        out["host_syncs_observed"] = seen["n"]
    return out
