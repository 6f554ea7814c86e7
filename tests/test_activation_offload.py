"""activation_offload: offloaded checkpointing gives the loss and gradients of plain training for
any depth, with one buffer or two, however slow the copies; its guards are what make that true;
it falls back to one buffer when a second cannot be had; its byte counts are exact."""
from __future__ import annotations

import pytest
import torch

from gpubench.baselines import activation_offload as baseline_mod
from gpubench.contract import Measured
from gpubench.optimizations import activation_offload as optimized_mod
from gpubench.techniques.activation_offload import TECHNIQUE, reference

CPU = torch.device("cpu")
SMALL = {"hidden": 32, "heads": 4, "kv_heads": 2, "batch": 2, "seq_len": 24, "vocab": 64}


def make(seed=0, **overrides):
    params = {**TECHNIQUE.defaults(), **SMALL, **overrides}
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def run(w, variant):
    w.reset()
    return TECHNIQUE.variants[variant].fn(w)


@pytest.mark.parametrize("layers", [1, 2, 5])
@pytest.mark.parametrize("variant", ["baseline", "optimized", "checkpoint"])
def test_loss_and_gradients_equal_training_without_checkpointing(layers, variant):
    """Every gradient (embedding, each layer, norms, head) and the loss match the step that keeps
    all activations, for 1, 2 and 5 layers."""
    w = make(layers=layers)
    ref = reference(w)
    result = TECHNIQUE.check_fn(ref, run(w, variant))
    assert result.passed and result.error <= 1e-6, result


@pytest.mark.parametrize("variant", ["baseline", "optimized"])
def test_slow_copies_still_give_identical_gradients(variant):
    """Stress: every reload held back 20 ms (longer than a layer's recompute here): compute must
    wait for it rather than read a buffer still holding another layer's input."""
    w = make(layers=4, copy_delay_ms=20.0)
    out = run(w, variant)
    assert TECHNIQUE.check_fn(reference(w), out).passed
    assert out["stats"]["wait_s"] > 0.01


def test_without_the_reload_guard_slow_copies_corrupt_gradients(monkeypatch):
    """The stress test has teeth: if compute did not wait for its reload, the same slow copies give
    wrong gradients (so the passing test above is the guard working, not luck)."""
    w = make(layers=4, copy_delay_ms=20.0)
    ref = reference(w)
    monkeypatch.setattr(optimized_mod._Copier, "wait", lambda self, handle: None)
    try:
        out = run(w, "optimized")
    except RuntimeError as exc:  # the late copy landed mid-recompute and autograd caught the write
        assert "modified by an inplace operation" in str(exc)
    else:
        assert not TECHNIQUE.check_fn(ref, out).passed


def test_two_buffers_fall_back_to_one_when_the_second_cannot_be_allocated():
    """A failed second allocation is not an error: one buffer, the reason recorded, gradients right."""
    w = make(layers=3)
    calls = []

    def allocate(like):
        calls.append(1)
        if len(calls) > 1:
            raise torch.OutOfMemoryError("no room for a second buffer")
        return torch.empty_like(like)

    w.reset()
    loss, stats = optimized_mod.train_step(w.weights, w.tokens, w.targets, w.positions, allocate=allocate)
    grads = [t.grad.clone() for t in w.tensors]
    assert stats.buffers == 1 and "one buffer" in stats.fallback and stats.extra_buffer_bytes == 0
    w.reset()
    ref_loss, _ = baseline_mod.train_step(w.weights, w.tokens, w.targets, w.positions)
    assert torch.equal(loss, ref_loss) and all(torch.equal(g, t.grad) for g, t in zip(grads, w.tensors))


def test_bytes_moved_and_buffers_are_counted_exactly():
    """Each layer's input goes out once and comes back once; the second buffer costs one input."""
    w = make(layers=3)
    per_layer = SMALL["batch"] * SMALL["seq_len"] * SMALL["hidden"] * 4
    for variant, buffers in (("baseline", 1), ("optimized", 2)):
        out = run(w, variant)
        m = TECHNIQUE.metrics_fn(w, Measured(variant, [0.01], 0.01, out, CPU))
        assert m["bytes_d2h"] == m["bytes_h2d"] == 3 * per_layer
        assert m["buffers"] == buffers and m["extra_buffer_bytes"] == (buffers - 1) * per_layer
        assert m["tokens_per_s"] == pytest.approx(SMALL["batch"] * SMALL["seq_len"] / 0.01)


def test_reset_restores_weights_so_every_step_does_the_same_work():
    """The optimizer step changes the weights; reset puts them back, so repeated steps agree."""
    w = make(layers=2)
    first = run(w, "optimized")
    second = run(w, "optimized")
    assert torch.equal(first["loss"], second["loss"])
    assert all(torch.equal(a, b) for a, b in zip(first["grads"], second["grads"]))


def test_check_fails_on_a_wrong_gradient_and_names_it():
    """A gradient off by more than the tolerance fails with its index."""
    w = make(layers=2)
    ref = reference(w)
    out = run(w, "optimized")
    out["grads"][3] = out["grads"][3] * 1.01
    result = TECHNIQUE.check_fn(ref, out)
    assert not result.passed and "index 4" in result.detail


def test_validate_rejects_bad_head_shapes():
    """hidden must split into heads of even size and heads into kv_heads groups."""
    assert TECHNIQUE.validate_fn({**TECHNIQUE.defaults(), "hidden": 30, "heads": 4})
    assert TECHNIQUE.validate_fn({**TECHNIQUE.defaults(), "heads": 4, "kv_heads": 3})


def test_figure_draws_step_and_wait_time_against_layers():
    """With a sweep over layers the report gets one figure of step and wait time per variant."""
    cases = [{"params": {"layers": n}, "variants": {
        "baseline": {"stats": {"median": 0.01 * n}, "metrics": {"wait_ms": 1.0 * n}},
        "optimized": {"stats": {"median": 0.008 * n}, "metrics": {"wait_ms": 0.2 * n}}}} for n in (1, 2, 4)]
    figs = TECHNIQUE.figures_fn(cases)
    assert [t for t, _ in figs] == ["Step time and reload wait vs layers"]
    assert TECHNIQUE.figures_fn(cases[:1]) == []
