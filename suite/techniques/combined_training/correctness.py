"""combined_training's correctness: the plain step (:func:`plain_step`: ordinary autograd, none of
the machinery under test) of each MoE path, each path's layer against its independent float64
reference (:func:`layer_check`), the reference of a case (:class:`Reference`) and the check of a
variant's :class:`~gpubench.techniques.combined_training.step.Step` against it (:func:`step_check`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gpubench.contract import DTYPE_TOLERANCE, CheckResult, tensors_check
from gpubench.lib.gradients import learning_check
from gpubench.lib.packing import IGNORE_INDEX, build_metadata, next_token_labels, packed_attention
from gpubench.models.llama import head_loss, rope_cos_sin
from gpubench.models.moe import MoEWeights
from gpubench.models.moe_decoder import ATTENTION, MoEDecoderLayer, MoEDecoderWeights, moe_decoder_layer
from gpubench.models.moe_decoder_float64 import moe_decoder_layer_float64
from gpubench.techniques.combined_training.step import FORWARDS, Step, gradients
from gpubench.techniques.combined_training.workload import BACKEND, CombinedWorkload

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


def plain_step(w: CombinedWorkload, moe: str) -> Step:
    """The step without any of the machinery under test: ordinary autograd through every layer
    (no checkpointing, no offload), the metadata built once with the builder, ``moe``'s path;
    from the initial weights (reset), the gradients left cleared."""
    assert w.reset is not None  # (build_workload sets it)
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
    out = Step(loss.detach().float(), gradients(weights), moe)
    w.reset()
    return out


MOE_PATHS = ("where_loop", "sort_group")


def layer_in_float64(layer: MoEDecoderLayer) -> MoEDecoderLayer:
    leaf = lambda t: t.detach().to(torch.float64).requires_grad_(True)
    return MoEDecoderLayer(**{name: leaf(getattr(layer, name)) for name in ATTENTION}, experts=layer.experts.map(leaf))


def layer_params(layer: MoEDecoderLayer) -> dict[str, torch.Tensor]:
    return {
        **{name: getattr(layer, name) for name in ATTENTION},
        **dict(zip(MoEWeights.names(), layer.experts.tensors())),
    }


def first_row_documents(w: CombinedWorkload, tokens: int) -> list[int]:
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
    lens = first_row_documents(w, min(LAYER_TOKENS, w.tokens.shape[1]))
    n = sum(lens)
    meta = build_metadata(torch.tensor(lens, dtype=torch.int32, device=device), 1, n, BACKEND, torch.float64)
    empty = torch.empty(0, dtype=torch.float64, device=device)  # the layer reads no embedding or head
    worst = CheckResult(True, 0.0, LAYER_TOLERANCE, "max_rel_l2", "")
    for i in range(c.num_layers):
        layers = list(weights.layers)
        layers[i] = layer_in_float64(weights.layers[i])  # one float64 copy at a time (GPU memory)
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
    params = layer_params(model.layers[i])
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


@dataclass
class Reference:
    """A case's reference: the plain step of each MoE path (:func:`plain_step`), and each path's
    layer against its independent float64 reference (:func:`layer_check`), by path."""

    plain: dict[str, Step]
    layer_checks: dict[str, CheckResult]


def reference_steps(w: CombinedWorkload) -> Reference:
    """The plain step of each MoE path, and each path's layer against its independent float64
    reference."""
    return Reference(
        plain={moe: plain_step(w, moe) for moe in MOE_PATHS},
        layer_checks={moe: layer_check(w, moe) for moe in MOE_PATHS},
    )


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


def step_check(ref: Reference, out: Any) -> CheckResult:
    """Every parameter must learn (no all-zero gradient: :func:`gpubench.lib.gradients.learning_check`),
    and the variant's path's layer agree with its independent float64 reference (:func:`layer_check`);
    then the loss and every named gradient against the plain step of the variant's MoE path (within
    TOLERANCE of the weights' dtype; on CUDA see :func:`same_path_check`); in float32, against the other
    path's plain step as well (within CROSS_PATH_TOLERANCE). The error kept is the worst relative L2 against the same path."""
    if not isinstance(out, Step):
        return CheckResult(False, None, None, "max_rel_l2", f"expected a Step, got {type(out).__name__}")
    moe = out.moe
    if moe not in MOE_PATHS:
        return CheckResult(False, None, None, "max_rel_l2", f"output names no MoE path of {list(MOE_PATHS)}")
    dead = learning_check(out.grads, what=f"the {moe} variant's step")
    if dead is not None:
        return dead
    layer = ref.layer_checks.get(moe)
    if layer is not None and not layer.passed:
        return layer
    independent = f"; layer vs independent float64: {layer.error:.2g}" if layer is not None else ""
    own_plain = ref.plain[moe]
    dtype = next(iter(own_plain.grads.values())).dtype  # the weights' (the loss is kept in float32)
    same = same_path_check(own_plain.flat(), out.flat(), dtype, cuda=own_plain.loss.is_cuda)
    if not same.passed or dtype not in CROSS_PATH_TOLERANCE:
        own = "bit-identical" if same.passed and same.error == 0 else same.detail
        return CheckResult(
            same.passed, same.error, same.tolerance, same.metric, f"against the plain step ({moe}): {own}{independent}"
        )
    other = next(path for path in MOE_PATHS if path != moe)
    cross = tensors_check(ref.plain[other].flat(), out.flat(), CROSS_PATH_TOLERANCE, dtype=dtype)
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
