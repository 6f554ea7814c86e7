"""CUDA-only paths, run on a machine without a GPU through fakes (tests/fake_cuda.py, fake NVML,
fake ``torch.cuda`` memory queries): the order of stream, event and graph operations, the
staging buffer's reuse, the memory cap's arithmetic, the worker's CPU pinning. docs/cuda-paths.md
lists every CUDA-only line and the test that reaches it (or why none can).
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from fake_cuda import FakeCuda

from gpubench.serving.graphs import DecodeGraphs
from gpubench.serving.step_inputs import Staging

CUDA0 = torch.device("cuda", 0)


@pytest.fixture
def fake(monkeypatch):
    return FakeCuda().install(monkeypatch)


# -- the staging buffer: pinned host memory, copied without blocking, reused ----------------------

def test_staging_never_overwrites_host_memory_a_copy_may_still_read(fake):
    staging = Staging(CUDA0, capacity=8)
    first, second = torch.zeros(3, dtype=torch.long, device=CUDA0), torch.zeros(3, dtype=torch.long, device=CUDA0)
    staging.put([1, 2, 3], into=first)
    staging.put([4, 5, 6], into=second)  # nothing in between reads the first copy's result back
    fake.synchronize()
    assert first.tolist() == [1, 2, 3] and second.tolist() == [4, 5, 6]
    assert fake.log[:4] == ["event synchronized", "copy queued on current", "event recorded", "event synchronized"]


def test_staging_grows_its_buffers_for_a_step_larger_than_them(fake):
    staging = Staging(CUDA0, capacity=2)
    small = staging.put([7, 8])
    big = staging.put(list(range(5)))
    fake.synchronize()
    assert staging.host.numel() >= 5 and big.tolist() == list(range(5))
    assert small.tolist() == [7, 8]  # the copy from before the growth still lands


# -- decode CUDA graphs: warm-up on a side stream, then capture -------------------------------------

VOCAB = 5


def fake_kv():
    rows = lambda decodes: SimpleNamespace(rows=[[1] for _ in decodes], slots=[10 + i for i in range(len(decodes))],
                                           lens=[s.cached + 1 for s in decodes])
    return SimpleNamespace(spare_unit=3, device=CUDA0, max_len=8, decode_width=lambda: 1,
                           padding_row=lambda columns: (99, [3] * columns), decode_rows=rows,
                           decode_batch=lambda lens, table, width: SimpleNamespace(lens=lens))


def test_decode_graphs_warm_up_on_a_side_stream_then_capture(fake):
    calls = []

    def forward(inputs):
        stream = fake.current_stream().name
        calls.append((stream, inputs.tokens.shape[0], inputs.slots.tolist()))
        fake.log.append(f"forward on {stream}")
        return torch.full((inputs.tokens.shape[0], VOCAB), float(len(calls)))

    graphs = DecodeGraphs(fake_kv(), Staging(CUDA0), 2, forward, capture=True)
    per_bucket = ["event synchronized", "copy queued on current", "event recorded",
                  "side waits for current", "forward on side", "forward on side", "forward on side",
                  "current waits for side"]
    assert fake.log == (per_bucket + ["capture begins", "forward on capture", "capture ends"]
                        + per_bucket + ["capture begins (shared pool)", "forward on capture", "capture ends",
                                        "synchronize"])
    # every warm-up call read the staged padding rows: the copy was done before the side stream ran
    assert all(slots == [99] * bucket for _, bucket, slots in calls)
    assert sorted(graphs.graphs) == [1, 2]

    fake.log.clear()
    seq = SimpleNamespace(tokens=[4, 2], cached=1)
    logits = graphs.run([seq])
    assert fake.log == ["event synchronized", "copy queued on current", "event recorded", "replay"]
    assert logits.shape == (1, VOCAB) and graphs.replays[1] == 1
    assert logits[0, 0] == graphs.graphs[1][1][0, 0]  # the captured output buffer, not a new forward


# -- calibration ------------------------------------------------------------------------------------

class Reached(Exception):
    pass


@pytest.mark.parametrize("quick", [True, False])
def test_a_gpus_calibration_matmul_is_large_even_when_quick(monkeypatch, quick):
    """At n=4096 an H200 reaches well under its matmul peak, which inflates every share of it: a
    run's quick calibration measures at n=8192 on a GPU, as the full one does."""
    from gpubench import env as envmod

    shapes = []

    def randn(shape, dtype, device):
        shapes.append((shape, dtype, device))
        raise Reached

    monkeypatch.setattr(envmod, "use_device", lambda d: CUDA0)
    monkeypatch.setattr(envmod.timing, "Clock", lambda *a, **k: None)
    monkeypatch.setattr(envmod, "device_label", lambda d: "fake GPU")
    monkeypatch.setattr(envmod, "_randn", randn)
    with pytest.raises(Reached):
        envmod.calibrate(CUDA0, quick=quick)
    assert shapes == [((8192, 8192), torch.bfloat16, CUDA0)]


# -- the worker's CPU pinning near its GPU (NVML) -------------------------------------------------

class FakeNvmlAffinity:
    """pynvml's CPU affinity of a GPU: 64-bit words of a core mask."""

    def __init__(self, cores):
        self.cores = cores

    def nvmlDeviceGetCpuAffinity(self, handle, words):
        return [sum(1 << (c - 64 * w) for c in self.cores if 64 * w <= c < 64 * (w + 1)) for w in range(words)]


@pytest.fixture
def pinning(monkeypatch):
    import sys

    from gpubench import worker

    pinned = []
    monkeypatch.setattr(worker.os, "cpu_count", lambda: 128)
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: set(range(128)))
    monkeypatch.setattr(worker.os, "sched_setaffinity", lambda pid, cores: pinned.append(tuple(cores)))

    def use(cores):
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvmlAffinity(cores))
        return worker._pin_near(handle=object())
    return use, pinned


def test_a_worker_pins_to_its_gpus_cores_and_logs_the_mask(pinning, capsys):
    use, pinned = pinning
    near = list(range(0, 32)) + list(range(64, 96))  # NVML's mask spans two 64-bit words
    assert use(near) == tuple(near) and pinned == [tuple(near)]
    assert "pinned to CPU cores 0-31,64-95 (NVML's affinity for this GPU; 64 of the process's 128 cores)" \
        in capsys.readouterr().out


def test_a_worker_stays_unpinned_where_the_mask_leaves_fewer_than_half_its_cores(pinning, capsys):
    """A mask of 16 of 128 cores would starve the worker's host-side work: it is logged, not applied."""
    use, pinned = pinning
    assert use(range(16)) is None and pinned == []
    out = capsys.readouterr().out
    assert "not pinned to CPU cores: NVML's affinity for this GPU (0-15) leaves 16 of the process's 128 cores, " \
           "fewer than half" in out


def test_a_worker_pins_only_to_cores_it_may_use(pinning, monkeypatch, capsys):
    """A container's cpuset (the process's current cores) bounds the mask: cores outside it are
    dropped, and a mask with none of them leaves the worker unpinned."""
    from gpubench import worker

    use, pinned = pinning
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: set(range(8, 16)))
    assert use(range(0, 12)) == tuple(range(8, 12)) and pinned == [tuple(range(8, 12))]
    assert use(range(32, 40)) is None and "holds none of the process's cores (8-15)" in capsys.readouterr().out


def test_a_worker_without_nvml_stays_unpinned_silently(monkeypatch, capsys):
    import sys

    from gpubench import worker

    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert worker._pin_near(object()) is None and capsys.readouterr().out == ""


def test_a_refused_pinning_leaves_the_worker_unpinned_and_says_so(pinning, monkeypatch, capsys):
    from gpubench import worker

    use, _ = pinning

    def refuse(pid, cores):
        raise OSError(22, "Invalid argument")
    monkeypatch.setattr(worker.os, "sched_setaffinity", refuse)
    assert use(range(128)) is None and "pinning failed" in capsys.readouterr().out


# -- activation offload's copier: a copy stream guarded by events -----------------------------------

@pytest.mark.parametrize("delay_s", [0.0, 0.01])
def test_an_offloaded_tensor_reloads_intact_however_slow_the_copies(fake, delay_s):
    """The copier's CUDA path (gpubench.offload.Copier): the offload waits for the compute queued
    before it, the reload for the offload, and compute for the reload; in the fake a copy lands
    only when something waits for it, so a missing wait shows as a wrong reload."""
    from gpubench.offload import Copier

    with Copier(CUDA0, delay_s=delay_s) as copier:
        activation = torch.arange(6.0).as_subclass(type(torch.empty(1, device=CUDA0)))
        host = copier.host_buffer(activation)
        offloaded = copier.copy(host, activation, copier.marker(), reload=False)
        back = torch.zeros(6, device=CUDA0)
        reloaded = copier.copy(back, host, offloaded, reload=True)
        copier.wait(reloaded)
        assert back.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        stats = copier.finish()
    assert stats.bytes_d2h == stats.bytes_h2d == 24
    assert stats.h2d_ms == 1.0 and stats.d2h_ms == 1.0  # one fake copy each, timed by their events
    assert "tensor kept for side" in fake.log  # the device source is not reused before its copy ran
    assert ("sleep" in fake.log) == bool(delay_s)
