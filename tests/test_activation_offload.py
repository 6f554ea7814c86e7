"""activation_offload: offloaded checkpointing gives the loss and gradients of plain training for
any depth, with one buffer or two, however slow the copies; its guards are what make that true;
it falls back to one buffer when a second cannot be had; its byte counts are exact; its metrics
come from the timed calls' records."""

from __future__ import annotations

import pytest
import torch

from gpubench.baselines import activation_offload as baseline_mod
from gpubench.contract import Measured, Recorder
from gpubench.lib import offload
from gpubench.optimizations import activation_offload as optimized_mod
from gpubench.reports import figures
from gpubench.techniques.activation_offload import TECHNIQUE, reference

CPU = torch.device("cpu")
SMALL = {"hidden": 32, "heads": 4, "kv_heads": 2, "batch": 2, "seq_len": 24, "vocab": 64}


def make(seed=0, **overrides):
    params = {**TECHNIQUE.defaults(), **SMALL, **overrides}
    assert TECHNIQUE.validate_fn(params) == []
    return TECHNIQUE.build_fn(params, CPU, seed)


def run(w, variant, rec=None):
    w.reset()
    return TECHNIQUE.variants[variant].call(w, rec)


def test_variants_play_their_roles():
    """one_buffer is the baseline, two_buffers the optimized, the plain steps are peers."""
    assert TECHNIQUE.incomplete() == []
    assert {n: role for n, (role, _) in TECHNIQUE.cast(CPU).items()} == {
        "one_buffer": "baseline",
        "two_buffers": "optimized",
        "no_checkpoint": "peer",
        "checkpoint": "peer",
    }


@pytest.mark.parametrize("layers", [1, 2, 4, 5])
@pytest.mark.parametrize("variant", ["one_buffer", "two_buffers", "checkpoint"])
def test_loss_and_gradients_equal_training_without_checkpointing(layers, variant):
    """Every gradient (embedding, each layer, norms, head) and the loss match the step that keeps
    all activations, for 1, 2, 4 and 5 layers."""
    w = make(layers=layers)
    ref = reference(w)
    result = TECHNIQUE.check_fn(ref, run(w, variant))
    assert result.passed and result.error <= 1e-6, result


@pytest.mark.parametrize("variant", ["one_buffer", "two_buffers"])
def test_slow_copies_still_give_identical_gradients(variant):
    """Stress: every reload held back 20 ms (longer than a layer's recompute here): compute must
    wait for it rather than read a buffer still holding another layer's input."""
    w = make(layers=4, copy_delay_ms=20.0)
    rec = Recorder()
    out = run(w, variant, rec)
    assert TECHNIQUE.check_fn(reference(w), out).passed
    assert rec.values["wait_ms"] > 10


def test_without_the_reload_guard_slow_copies_corrupt_gradients(monkeypatch):
    """The stress test has teeth: if compute did not wait for its reload, the same slow copies give
    wrong gradients (so the passing test above is the guard working, not luck)."""
    w = make(layers=4, copy_delay_ms=20.0)
    ref = reference(w)
    monkeypatch.setattr(offload.Copier, "wait", lambda self, handle: None)
    try:
        out = run(w, "two_buffers")
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
    grads = [t.grad.clone() for t in w.weights.parameters()]
    assert stats.buffers == 1 and "1 buffer" in stats.fallback and stats.extra_buffer_bytes == 0
    w.reset()
    ref_loss, _ = baseline_mod.train_step(w.weights, w.tokens, w.targets, w.positions)
    assert torch.equal(loss, ref_loss) and all(torch.equal(g, t.grad) for g, t in zip(grads, w.weights.parameters()))


def test_bytes_moved_and_buffers_are_counted_exactly():
    """Each layer's input goes out once and comes back once; the second buffer costs one input."""
    w = make(layers=3)
    per_layer = SMALL["batch"] * SMALL["seq_len"] * SMALL["hidden"] * 4
    for variant, buffers in (("one_buffer", 1), ("two_buffers", 2)):
        rec = Recorder()
        out = run(w, variant, rec)
        m = TECHNIQUE.metrics_fn(w, Measured(variant, [0.01], 0.01, out, CPU, records=[rec.values]))
        assert m["bytes_d2h"] == m["bytes_h2d"] == 3 * per_layer
        assert m["buffers"] == buffers and m["extra_buffer_bytes"] == (buffers - 1) * per_layer
        assert m["fallback"] == ""
        assert m["tokens_per_s"] == pytest.approx(SMALL["batch"] * SMALL["seq_len"] / 0.01)


def test_metrics_are_medians_of_the_timed_calls_records():
    """Copy waits and rates come from the records of the timed calls, not from the checked output."""
    w = make(layers=2)
    out = run(w, "two_buffers")
    records = [
        {
            "buffers": 2,
            "fallback": "",
            "bytes_d2h": 1000,
            "bytes_h2d": 1000,
            "extra_buffer_bytes": 10,
            "d2h_ms": d,
            "h2d_ms": 2 * d,
            "wait_ms": wait,
        }
        for d, wait in ((1.0, 5.0), (2.0, 1.0), (4.0, 3.0))
    ]
    m = TECHNIQUE.metrics_fn(w, Measured("two_buffers", [0.01] * 3, 0.01, out, CPU, records=records))
    assert m["wait_ms"] == 3.0
    assert m["d2h_gbps"] == pytest.approx(1000 / 2e-3 / 1e9) and m["h2d_gbps"] == pytest.approx(1000 / 4e-3 / 1e9)
    assert (m["buffers"], m["bytes_d2h"], m["extra_buffer_bytes"]) == (2, 1000, 10)
    fell_back = [*records[:2], {**records[2], "buffers": 1, "fallback": "no room"}]
    assert (
        TECHNIQUE.metrics_fn(w, Measured("two_buffers", [0.01] * 3, 0.01, out, CPU, records=fell_back))["fallback"]
        == "no room"
    )
    peer = TECHNIQUE.metrics_fn(w, Measured("checkpoint", [0.01], 0.01, run(w, "checkpoint"), CPU))
    assert "wait_ms" not in peer and peer["ms_per_step"] == pytest.approx(10.0)


def test_reset_restores_weights_so_every_step_does_the_same_work():
    """The optimizer step changes the weights; reset puts them back, so repeated steps agree."""
    w = make(layers=2)
    first = run(w, "two_buffers")
    second = run(w, "two_buffers")
    assert torch.equal(first["loss"], second["loss"])
    assert all(torch.equal(first["grads"][k], second["grads"][k]) for k in first["grads"])


def test_check_fails_on_a_wrong_gradient_and_names_it():
    """A gradient off by more than the tolerance fails, named; a NaN gradient fails too."""
    w = make(layers=2)
    ref = reference(w)
    out = run(w, "two_buffers")
    wrong = {**out, "grads": {**out["grads"], "layers.0.wq": out["grads"]["layers.0.wq"] * 1.01}}
    result = TECHNIQUE.check_fn(ref, wrong)
    assert not result.passed and "layers.0.wq" in result.detail
    nan = {**out, "grads": {**out["grads"], "lm_head": torch.full_like(out["grads"]["lm_head"], float("nan"))}}
    result = TECHNIQUE.check_fn(ref, nan)
    assert not result.passed and "lm_head" in result.detail


def test_bf16_check_uses_the_widened_tolerance():
    """bf16 gradients are checked at 2e-2 (a backward pass through every layer), fp32 at 1e-5."""
    w = make(layers=2, dtype="bfloat16")
    result = TECHNIQUE.check_fn(reference(w), run(w, "two_buffers"))
    assert result.passed and result.tolerance == 2e-2
    assert TECHNIQUE.check_fn(reference(make(layers=1)), run(make(layers=1), "one_buffer")).tolerance == 1e-5


def test_validate_rejects_bad_head_shapes():
    """hidden must split into heads of even size and heads into kv_heads groups."""
    assert TECHNIQUE.validate_fn({**TECHNIQUE.defaults(), "hidden": 30, "heads": 4})
    assert TECHNIQUE.validate_fn({**TECHNIQUE.defaults(), "heads": 4, "kv_heads": 3})


def _case(layers):
    roles = {"one_buffer": "baseline", "two_buffers": "optimized", "no_checkpoint": "peer", "checkpoint": "peer"}
    time = {"one_buffer": 0.010, "two_buffers": 0.008, "no_checkpoint": 0.006, "checkpoint": 0.007}
    wait = {"one_buffer": 1.0, "two_buffers": 0.2}
    return {
        "technique": "activation_offload",
        "params": {**TECHNIQUE.defaults(), "layers": layers},
        "variants": {
            name: {
                "role": role,
                "stats": {"median": time[name] * layers},
                "peak_memory_bytes": None,
                "metrics": {"wait_ms": wait[name] * layers} if name in wait else {},
            }
            for name, role in roles.items()
        },
    }


def _lines(fig):
    return {
        line.get_label(): list(line.get_ydata()) for ax in fig.axes for line in ax.get_lines() if len(line.get_xdata())
    }


def test_figures_draw_step_time_of_all_four_and_wait_of_the_pair_against_layers():
    """Over a sweep of layers: step time (ms) of every variant, reload wait of the offloading pair;
    no peak-memory figure on a CPU (none measured), and nothing from one case."""
    cases = [_case(n) for n in (1, 2, 4)]
    drawn = {plot.title: figures.declared(plot, cases) for plot in TECHNIQUE.plots}
    step = _lines(drawn["Step time (ms) against layers"])
    assert set(step) == {"one_buffer", "two_buffers", "no_checkpoint", "checkpoint"}
    assert step["two_buffers"] == pytest.approx([8.0, 16.0, 32.0])
    wait = _lines(drawn["Time compute waited for reloads (ms per step) against layers"])
    assert wait == {"one_buffer": [1.0, 2.0, 4.0], "two_buffers": pytest.approx([0.2, 0.4, 0.8])}
    assert drawn["Peak device memory (MiB) against layers"] is None
    assert all(figures.declared(plot, cases[:1]) is None for plot in TECHNIQUE.plots)


def test_head_dim_and_intermediate_set_the_real_shapes_and_the_step_stays_right():
    """head_dim need not be hidden / heads (Qwen3-0.6B: hidden 1024, 16 heads of 128) and the MLP
    width is its own: the weights take those shapes, offloaded steps still give plain training's
    loss and gradients, and the bytes moved are still the layer inputs (hidden wide)."""
    w = make(layers=2, head_dim=16, intermediate=40)  # 4 heads x 16 = 64 != hidden 32
    layer = w.weights.layers[0]
    assert layer.wq.shape == (4 * 16, 32) and layer.wk.shape == (2 * 16, 32) and layer.wo.shape == (32, 64)
    assert layer.w_gate.shape == (40, 32) and layer.w_down.shape == (32, 40)
    ref = reference(w)
    per_layer = SMALL["batch"] * SMALL["seq_len"] * SMALL["hidden"] * 4
    for variant in ("one_buffer", "two_buffers"):
        rec = Recorder()
        out = run(w, variant, rec)
        assert TECHNIQUE.check_fn(ref, out).passed
        m = TECHNIQUE.metrics_fn(w, Measured(variant, [0.01], 0.01, out, CPU, records=[rec.values]))
        assert m["bytes_d2h"] == m["bytes_h2d"] == 2 * per_layer


def test_head_dim_and_intermediate_default_to_todays_rule():
    """0 keeps hidden / heads and hidden * 8 // 3: old scenarios build the same decoder."""
    assert (TECHNIQUE.defaults()["head_dim"], TECHNIQUE.defaults()["intermediate"]) == (0, 0)
    c = make().weights.config
    assert (c.head_dim, c.intermediate_size) == (32 // 4, 32 * 8 // 3)


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"head_dim": 7}, "head_dim 7 must be even"),
        ({"hidden": 30, "heads": 4}, "not a multiple of heads 4 (or set head_dim)"),
    ],
)
def test_validate_names_a_bad_head_dim(bad, words):
    problems = TECHNIQUE.validate_fn({**TECHNIQUE.defaults(), **SMALL, **bad})
    assert any(words in p for p in problems), problems
    assert TECHNIQUE.validate_fn({**TECHNIQUE.defaults(), **SMALL, "hidden": 30, "heads": 4, "head_dim": 8}) == []
