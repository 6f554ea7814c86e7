"""activation_offload: a bug planted in the two-buffer schedule fails the run's own check (loss and
every gradient against the step without checkpointing) in at least two smoke-like cases; a race
that only slow copies expose, in two cases with delayed copies."""

from __future__ import annotations

import pytest
from planted import caught, passed, run_planted, shipped
from planted import mutant as _mutant

import gpubench.optimizations.activation_offload as two_buffers

# Smoke's shapes: the layer sweep, and two stress cases whose every reload is held back 5 ms.
MODEL = dict(hidden=64, heads=4, kv_heads=2, batch=2, seq_len=64, vocab=256)
TWO_LAYERS = dict(MODEL, layers=2)
DELAYED_4 = dict(MODEL, layers=4, copy_delay_ms=5.0)
DELAYED_3 = dict(hidden=48, heads=4, kv_heads=2, batch=1, seq_len=40, vocab=128, layers=3, copy_delay_ms=5.0)


def _assert_caught_only_with(monkeypatch, params: dict, buggy) -> None:
    """The case passes as shipped, and fails by its check on two_buffers with ``buggy`` as its step."""
    assert passed(shipped("activation_offload", **params))
    monkeypatch.setattr(two_buffers, "train_step", buggy)
    record = run_planted("activation_offload", **params)
    assert caught(record), (record.status, record.failure)


@pytest.mark.parametrize("params", [TWO_LAYERS, DELAYED_4, DELAYED_3], ids=["2-layers", "4-delayed", "3-delayed"])
def test_reload_into_the_previous_layers_buffer_is_caught(monkeypatch, params):
    """Layer i's input is reloaded into the buffer of layer i - 1 while compute reads buffer i:
    every layer recomputes from another layer's input (or a buffer not yet written)."""
    buggy = _mutant(two_buffers.train_step, "copier.copy(buffers[i % n],", "copier.copy(buffers[(i - 1) % n],")
    _assert_caught_only_with(monkeypatch, params, buggy)


@pytest.mark.parametrize("params", [DELAYED_4, DELAYED_3], ids=["4-delayed", "3-delayed"])
def test_wait_for_the_reload_after_its_recompute_is_caught_with_slow_copies(monkeypatch, params):
    """The schedule waits for a reload only after the recompute that reads it (as if the wait
    guarded the buffer's reuse rather than its read): a slow copy is read before it lands."""
    wait, recompute = "copier.wait(landed.pop(i))", "step.backward_layer(i, buffers[i % n])"
    indent = "\n" + " " * 12  # the body of the loop over layers
    buggy = _mutant(two_buffers.train_step, wait + indent + recompute, recompute + indent + wait)
    _assert_caught_only_with(monkeypatch, params, buggy)


# Smoke's fallback entry: the second staging buffer refused (buffer_limit 1), slow copies.
FALLBACK = dict(hidden=48, heads=4, kv_heads=2, batch=1, seq_len=40, vocab=128, copy_delay_ms=5.0, buffer_limit=1)


@pytest.mark.parametrize("layers", [2, 3])
def test_one_buffer_fallback_recomputing_before_its_reload_lands_is_caught(monkeypatch, layers):
    """The wait for a reload guards only the two-buffer path: when the second buffer cannot be had,
    the fallback recomputes each layer from a buffer whose reload is still in flight (the previous
    layer's input, or nothing yet). No smoke case reached the fallback before buffer_limit; the
    cases with two buffers still pass with the bug."""
    params = dict(FALLBACK, layers=layers)
    control = run_planted("activation_offload", **params)
    assert passed(control), control.failure
    metrics = control.variants["two_buffers"].metrics
    assert metrics["buffers"] == 1 and "staging buffer 2 not allocated" in metrics["fallback"]
    buggy = _mutant(
        two_buffers.train_step, "copier.wait(landed.pop(i))", "if n > 1:\n                copier.wait(landed.pop(i))"
    )
    monkeypatch.setattr(two_buffers, "train_step", buggy)
    assert caught(run_planted("activation_offload", **params))
    assert passed(run_planted("activation_offload", **dict(params, buffer_limit=0)))  # two buffers: blind to it
