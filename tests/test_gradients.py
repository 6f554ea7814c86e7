"""gpubench.lib.gradients: a step's parameters meant to learn must each get a gradient that is not all
zero (what a comparison with a reference running the same code cannot see), and combined_training's
check applies it and its independent float64 layer to every variant."""

from __future__ import annotations

import torch

from gpubench.contract import Recorder
from gpubench.lib.gradients import dead_parameters, learning_check
from gpubench.models import llama, moe_decoder
from gpubench.models.moe_decoder_float64 import moe_decoder_layer_float64
from gpubench.techniques import combined_training as ct
from gpubench.techniques.combined_training import correctness as ct_correctness

SMALL = dict(
    layers=2,
    hidden=32,
    heads=4,
    kv_heads=2,
    vocab=64,
    experts=4,
    top_k=2,
    expert_dim=16,
    rows=1,
    seq_len=64,
    mean_doc_len=12,
)


def test_a_missing_or_all_zero_gradient_is_dead_one_nonzero_element_learns_and_frozen_ones_are_exempt():
    grads = {"a": torch.randn(3, 4), "b": torch.zeros(5), "c": None, "d": torch.zeros(4, 4), "e": torch.zeros(2)}
    grads["d"][2, 1] = 1e-30  # an expert with one routed token: most rows zero, the tensor learns
    assert dead_parameters(grads) == ["b", "c", "e"]
    assert dead_parameters(grads, frozen=["e"]) == ["b", "c"]
    assert learning_check({"a": torch.ones(2)}) is None
    result = learning_check(grads, frozen=["e"], what="the step")
    assert not result.passed and result.metric == "zero_gradients" and result.error == 2.0
    assert result.detail == "the step: 2 parameter(s) meant to learn got an all-zero gradient: b, c"


def test_combined_training_fails_a_variant_whose_parameter_got_no_gradient():
    """A variant's output with one gradient zeroed fails the check by name, before any
    comparison (a zero that its plain step shares would pass the comparison)."""
    w = ct.build({**ct.TECHNIQUE.defaults(), **SMALL}, torch.device("cpu"), 0)
    ref = ct.reference(w)
    assert all(result.passed for result in ref.layer_checks.values()), ref.layer_checks
    w.reset()
    out = ct.TECHNIQUE.variants["all_on"].call(w, Recorder())
    assert ct.check(ref, out).passed
    out.grads["layers.1.attn_norm"].zero_()
    ref.plain["sort_group"].grads["layers.1.attn_norm"].zero_()  # the same zero in the plain step
    result = ct.check(ref, out)
    assert not result.passed and result.metric == "zero_gradients" and "layers.1.attn_norm" in result.detail


def test_the_independent_layer_reads_documents_and_routing_as_the_model_defines_them():
    """The float64 layer check passes on both MoE paths, in float32 and bf16 cases alike (the check
    runs in float64 whatever the case's dtype), with an error near float64's, not float32's
    tolerance; and it is not blind to the packing: the same layer against the wrong document
    boundaries fails."""
    for dtype in ("float32", "bfloat16"):
        w = ct.build({**ct.TECHNIQUE.defaults(), **SMALL, "dtype": dtype}, torch.device("cpu"), 1)
        for moe in ct_correctness.MOE_PATHS:
            result = ct_correctness.layer_check(w, moe)
            assert result.passed and result.error < 1e-6, (dtype, moe, result)
    w = ct.build({**ct.TECHNIQUE.defaults(), **SMALL}, torch.device("cpu"), 1)
    lens = ct_correctness.first_row_documents(w, 64)
    assert len(lens) >= 2 and sum(lens) == 64
    layer = ct_correctness.layer_in_float64(w.weights.layers[0])
    params = ct_correctness.layer_params(layer)
    model = moe_decoder.MoEDecoderWeights(
        w.weights.config, w.weights.moe, torch.empty(0, dtype=torch.float64), [layer], torch.empty(0), torch.empty(0)
    )
    positions = torch.cat([torch.arange(n) for n in lens])[None]
    cos, sin = llama.rope_cos_sin(model, positions)
    x = torch.randn(64, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    packed, _ = moe_decoder_layer_float64(model.config, model.moe, params, x, cos[0], sin[0], lens)
    merged, _ = moe_decoder_layer_float64(model.config, model.moe, params, x, cos[0], sin[0], [64])
    first = lens[0]
    assert torch.allclose(packed[:first], merged[:first], rtol=0, atol=1e-12)  # the first sees only itself
    assert not torch.allclose(packed[first:], merged[first:])  # later ones no longer see earlier documents
