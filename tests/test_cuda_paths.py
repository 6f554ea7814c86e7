"""CUDA-only paths, run on a machine without a GPU through fakes (tests/fake_cuda.py, fake NVML,
fake ``torch.cuda`` memory queries): the order of stream, event and graph operations, the
staging buffer's reuse, the memory cap's arithmetic, the worker's CPU pinning. docs/cuda-paths.md
lists every CUDA-only line and the test that reaches it (or why none can).
"""

from __future__ import annotations

import contextlib
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
    rows = lambda decodes: SimpleNamespace(
        rows=[[1] for _ in decodes], slots=[10 + i for i in range(len(decodes))], lens=[s.cached + 1 for s in decodes]
    )
    return SimpleNamespace(
        spare_unit=3,
        device=CUDA0,
        max_len=8,
        decode_width=lambda: 1,
        padding_row=lambda columns: (99, [3] * columns),
        decode_rows=rows,
        decode_batch=lambda lens, table, width: SimpleNamespace(lens=lens),
    )


def test_decode_graphs_warm_up_on_a_side_stream_then_capture(fake):
    calls = []

    def forward(inputs):
        stream = fake.current_stream().name
        calls.append((stream, inputs.tokens.shape[0], inputs.slots.tolist()))
        fake.log.append(f"forward on {stream}")
        return torch.full((inputs.tokens.shape[0], VOCAB), float(len(calls)))

    graphs = DecodeGraphs(fake_kv(), Staging(CUDA0), 2, forward, capture=True)
    per_bucket = [
        "event synchronized",
        "copy queued on current",
        "event recorded",
        "side waits for current",
        "forward on side",
        "forward on side",
        "forward on side",
        "current waits for side",
    ]
    assert fake.log == (
        per_bucket
        + ["capture begins", "forward on capture", "capture ends"]
        + per_bucket
        + ["capture begins (shared pool)", "forward on capture", "capture ends", "synchronize"]
    )
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
    from gpubench.measure import env as envmod

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

    from gpubench.run import worker

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
    assert (
        "pinned to CPU cores 0-31,64-95 (NVML's affinity for this GPU; 64 of the process's 128 cores)"
        in capsys.readouterr().out
    )


def test_a_worker_stays_unpinned_where_the_mask_leaves_fewer_than_half_its_cores(pinning, capsys):
    """A mask of 16 of 128 cores would starve the worker's host-side work: it is logged, not applied."""
    use, pinned = pinning
    assert use(range(16)) is None and pinned == []
    out = capsys.readouterr().out
    assert (
        "not pinned to CPU cores: NVML's affinity for this GPU (0-15) leaves 16 of the process's 128 cores, "
        "fewer than half" in out
    )


def test_a_worker_pins_only_to_cores_it_may_use(pinning, monkeypatch, capsys):
    """A container's cpuset (the process's current cores) bounds the mask: cores outside it are
    dropped, and a mask with none of them leaves the worker unpinned."""
    from gpubench.run import worker

    use, pinned = pinning
    monkeypatch.setattr(worker.os, "sched_getaffinity", lambda pid: set(range(8, 16)))
    assert use(range(0, 12)) == tuple(range(8, 12)) and pinned == [tuple(range(8, 12))]
    assert use(range(32, 40)) is None and "holds none of the process's cores (8-15)" in capsys.readouterr().out


def test_a_worker_without_nvml_stays_unpinned_silently(monkeypatch, capsys):
    import sys

    from gpubench.run import worker

    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert worker._pin_near(object()) is None and capsys.readouterr().out == ""


def test_a_refused_pinning_leaves_the_worker_unpinned_and_says_so(pinning, monkeypatch, capsys):
    from gpubench.run import worker

    use, _ = pinning

    def refuse(pid, cores):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(worker.os, "sched_setaffinity", refuse)
    assert use(range(128)) is None and "pinning failed" in capsys.readouterr().out


# -- activation offload's copier: a copy stream guarded by events -----------------------------------


@pytest.mark.parametrize("delay_s", [0.0, 0.01])
def test_an_offloaded_tensor_reloads_intact_however_slow_the_copies(fake, delay_s):
    """The copier's CUDA path (gpubench.lib.offload.Copier): the offload waits for the compute queued
    before it, the reload for the offload, and compute for the reload; in the fake a copy lands
    only when something waits for it, so a missing wait shows as a wrong reload."""
    from gpubench.lib.offload import Copier

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


# -- what the harness asks a GPU about itself (torch.cuda's device queries, faked) --------------------


@pytest.fixture
def h200(monkeypatch):
    """torch.cuda's device queries as one H200 answers them."""
    props = SimpleNamespace(
        name="NVIDIA H200",
        total_memory=141 * 2**30,
        multi_processor_count=132,
        shared_memory_per_block_optin=227 * 1024,
        major=9,
        minor=0,
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: props)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: props.name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (props.major, props.minor))
    return props


def test_the_gpus_own_figures_are_read_where_a_gpu_runs(h200):
    """Tunings are kept per GPU model, the paged kernel splits for the GPU's SMs, grouped GEMM's
    path follows its compute capability, and kv_cache's serving figures use its memory."""
    from gpubench.lib.kernels import paged_attention_triton
    from gpubench.measure import autotune
    from gpubench.optimizations import moe_grouping
    from gpubench.techniques.kv_cache import server_memory as kv_server_memory

    assert autotune.gpu_model(CUDA0) == "NVIDIA H200"
    paged_attention_triton.sm_count.cache_clear()
    try:
        assert paged_attention_triton.sm_count(CUDA0) == 132
    finally:
        paged_attention_triton.sm_count.cache_clear()
    if moe_grouping.grouped_mm_function() is not None:
        assert "CUTLASS grouped-GEMM kernel (bf16, sm9x)" in moe_grouping.grouped_gemm_path(CUDA0, torch.bfloat16)
        assert "torch's fallback for float32 on sm9x" in moe_grouping.grouped_gemm_path(CUDA0, torch.float32)
    p = {"model": "llama-3.1-8b", "kv_dtype": "bf16", "tp": 1, "block_size": 16, "max_len": 4096}
    m = kv_server_memory.serving_memory(CUDA0, p, [1024, 2048], "paged")
    assert m["gpu_memory_gib"] == 141.0 and m["gpu_memory_source"] == "NVIDIA H200"


def test_devices_all_means_every_gpu_here(h200, monkeypatch):
    from gpubench.errors import BadInput
    from gpubench.run.run_options import resolve_devices

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_devices("all") == ["cuda:0", "cuda:1"] and resolve_devices("auto") == ["cuda:0"]
    assert resolve_devices("cuda,cuda:1,cpu") == ["cuda:0", "cuda:1", "cpu"]
    with pytest.raises(BadInput, match="does not exist; this machine has 2 CUDA device"):
        resolve_devices("cuda:2")


def test_kv_cache_plans_for_the_gpu_in_this_machine(h200):
    from click.testing import CliRunner

    from gpubench.cli import main

    out = CliRunner().invoke(main, ["kv-cache", "--model", "llama-3.1-8b", "--seq-len", "4096", "--json"])
    assert out.exit_code in (0, 1), out.output
    assert "NVIDIA H200" in out.output


# -- after a failure: is the CUDA context still usable? -----------------------------------------


def test_a_sticky_cuda_error_is_told_from_a_context_that_still_works(fake, monkeypatch):
    """After a failed case the worker asks whether its CUDA context still works; an illegal memory
    access is sticky (every later call fails alike), so the worker must be replaced."""
    from gpubench.run import runner

    assert runner.cuda_context_broken(CUDA0) is None and fake.log.count("synchronize") == 2

    def broken(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", broken)
    assert runner.cuda_context_broken(CUDA0) == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_nvtx_ranges_wrap_a_case_on_a_gpu_only(monkeypatch):
    from gpubench.measure import profiling

    pushed = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pushed.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: pushed.append("pop"))
    with pytest.raises(KeyError), profiling.nvtx_range("case[1]", CUDA0):
        raise KeyError("the case failed")  # popped all the same
    with profiling.nvtx_range("case[2]", torch.device("cpu")):
        pass
    assert pushed == ["push case[1]", "pop"]


def test_a_gpu_runs_environment_names_the_card(h200, monkeypatch):
    """env.json's gpu block (name, memory, SMs, capability) comes from torch.cuda; without NVML it
    says so instead of failing."""
    import sys

    from gpubench.errors import BadInput
    from gpubench.measure import env as envmod

    monkeypatch.setitem(sys.modules, "pynvml", None)
    env = envmod.capture_env(CUDA0)
    assert env["device_label"] == "NVIDIA H200"
    gpu = env["gpu"]
    assert (
        gpu["name"],
        gpu["index"],
        gpu["total_memory_bytes"],
        gpu["multiprocessors"],
        gpu["compute_capability"],
    ) == ("NVIDIA H200", 0, 141 * 2**30, 132, "9.0")
    assert gpu["nvml"].startswith("unavailable")
    with pytest.raises(BadInput, match="does not exist; this machine has 1 CUDA device"):
        envmod.resolve_device("cuda:3")


def test_a_variants_peak_memory_on_a_gpu_is_what_its_call_added(fake, monkeypatch):
    """runner._call_once on CUDA: the peak allocator bytes of the call above what was allocated
    before it, read between synchronizations."""
    from gpubench.run import runner

    memory = {"now": 100, "peak": 100}
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: memory.update(peak=memory["now"]))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: memory["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: memory["peak"])

    def call(workload):
        memory["peak"] = memory["now"] + 4096  # a temporary of 4 KiB, freed before the call returns
        fake.log.append("call")
        return "out"

    variant = SimpleNamespace(call=call)
    assert runner._call_once(variant, SimpleNamespace(reset=None), CUDA0) == ("out", 4096)
    assert fake.log == ["synchronize", "call", "synchronize"]
    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    runner._free_memory(CUDA0)
    assert emptied == [True]


def test_the_paged_backend_hands_the_triton_kernel_its_tables_as_int32():
    """On CUDA the paged decode kernel walks the block tables itself (int32, no mask built); on a
    CPU the engine's SDPA path gets a mask of live slots."""
    from gpubench.serving.kv import PagedKV

    rows, lens = torch.tensor([[0, 1], [2, 3]]), torch.tensor([5, 9])
    on_gpu = PagedKV.decode_batch(SimpleNamespace(device=CUDA0, block_size=8), lens, rows, 2)
    assert on_gpu.block_tables.dtype == on_gpu.context_lens.dtype == torch.int32
    assert on_gpu.live is None


def test_on_cuda_the_router_gradients_get_their_own_looser_tolerance():
    """combined_training's same-path check on CUDA: a router gradient off by 2e-1 in bf16 passes
    (within CUDA_ROUTER_TOLERANCE), the same error in any other gradient fails."""
    from gpubench.techniques.combined_training import correctness as ct_correctness

    ref = {"loss": torch.ones(64), "layer0" + ct_correctness.ROUTER[0]: torch.ones(64)}
    off = ref["layer0" + ct_correctness.ROUTER[0]] + 0.2
    assert ct_correctness.same_path_check(
        ref, {**ref, "layer0" + ct_correctness.ROUTER[0]: off}, torch.bfloat16, cuda=True
    ).passed
    assert not ct_correctness.same_path_check(ref, {**ref, "loss": off}, torch.bfloat16, cuda=True).passed
    assert not ct_correctness.same_path_check(
        ref, {**ref, "layer0" + ct_correctness.ROUTER[0]: off}, torch.bfloat16, cuda=False
    ).passed


def test_cudas_repeated_kv_heads_attend_as_sdpas_grouped_query_path(monkeypatch):
    """CUDA's mask-capable SDPA kernels take as many K/V heads as query heads, so a CUDA packed
    batch repeats them (packing.packed_attention's last branch); it must give what the GQA path a
    CPU takes gives."""
    from gpubench.lib import packing

    gen = torch.Generator().manual_seed(0)
    doc_lens = torch.tensor([5, 11, 3, 13], dtype=torch.int32)  # two rows of 16
    q, k, v = (torch.randn(2, 16, h, 16, generator=gen) for h in (4, 2, 2))
    meta = packing.build_metadata(doc_lens, 2, 16, "sdpa", torch.float32)
    grouped = packing.packed_attention(meta, q, k, v)
    monkeypatch.setattr(packing, "SDPA_HAS_GQA", False)  # the branch a CUDA tensor takes
    torch.testing.assert_close(packing.packed_attention(meta, q, k, v), grouped, rtol=1e-6, atol=1e-6)


def test_the_flash_kernels_plan_for_the_gpus_capability_and_shared_memory(h200):
    """The backward's sm90 configs and the TMA path's shared-memory fit read the tensor's GPU."""
    from fake_cuda import DeviceTensor

    from gpubench.lib.kernels import flash_attention_triton_bwd as bwd
    from gpubench.lib.kernels import flash_attention_triton_tiles as tiles

    on_gpu, on_cpu = torch.zeros(1).as_subclass(DeviceTensor), torch.zeros(1)
    assert bwd._compute_capability(on_gpu) == 9 and bwd._compute_capability(on_cpu) == 0
    assert tiles.shared_memory_limit(on_gpu) == 227 * 1024 and tiles.shared_memory_limit(on_cpu) is None


# -- measurement hygiene through NVML: other processes on the GPU, locked clocks ---------------------


class FakeNvmlHygiene:
    """pynvml as a GPU shared with one other process answers, locking allowed or refused."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    def __init__(self, ours, may_lock=True):
        self.calls, self.may_lock = [], may_lock
        proc = lambda pid, mib: SimpleNamespace(pid=pid, usedGpuMemory=mib * 2**20)
        self.compute = [proc(ours, 10), proc(4242, 512)]

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self.compute

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        raise self.NVMLError("not supported")

    def nvmlDeviceGetDefaultApplicationsClock(self, handle, clock):
        return 1755

    def nvmlDeviceSetGpuLockedClocks(self, handle, low, high):
        if not self.may_lock:
            raise self.NVMLError_NoPermission("Insufficient Permissions")
        self.calls.append(("lock", low, high))

    def nvmlDeviceResetGpuLockedClocks(self, handle):
        self.calls.append(("reset",))


@pytest.fixture
def nvml_hygiene(monkeypatch):
    import os
    import sys

    from gpubench.measure import hygiene

    closed = []
    monkeypatch.setattr(hygiene, "_source", lambda d: SimpleNamespace(handle=d, close=lambda: closed.append(d)))

    def use(**kwargs):
        fake = FakeNvmlHygiene(os.getpid(), **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return hygiene, use, closed


def test_other_processes_on_the_gpu_are_listed_and_ours_is_not(nvml_hygiene):
    hygiene, use, closed = nvml_hygiene
    use()
    (other,) = hygiene.gpu_processes("cuda:0")
    assert other["pid"] == 4242 and other["used_memory_mib"] == 512 and closed == ["cuda:0"]


def test_locked_clocks_are_restored_when_the_run_ends(nvml_hygiene):
    hygiene, use, _ = nvml_hygiene
    fake = use()
    with hygiene.ClockLock(["cuda:0", "cuda:0", "cpu"]) as lock:
        assert lock.state == {"cuda:0": {"locked": True, "sm_clock_mhz": 1755}}
    assert fake.calls == [("lock", 1755, 1755), ("reset",)] and lock.state["cuda:0"]["restored"] is True
    fake = use(may_lock=False)
    with hygiene.ClockLock(["cuda:0"]) as lock:
        assert not lock.state["cuda:0"]["locked"] and "needs root" in lock.state["cuda:0"]["reason"]
    assert fake.calls == []  # nothing locked, nothing to reset


# -- a CUDA profile's summary (the events' shapes as torch's FunctionEvent gives them) ---------------


def _event(name, start, end, parent=None, device="CPU", self_cpu=0.0):
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=end, elapsed_us=lambda: end - start),
        cpu_parent=parent,
        device_type=SimpleNamespace(name=device),
        self_cpu_time_total=self_cpu,
    )


def test_a_cuda_profile_counts_launches_syncs_and_kernel_time_per_call():
    """profiling.summarize on CUDA: kernels' device time inside each call through its drain, launches
    and runtime syncs of the host (each sync named by the op that made it), event waits apart."""
    from gpubench.measure import profiling

    events = []
    for i, t0 in enumerate((0, 100)):
        call = _event(f"{profiling.CALL_RANGE}{i}", t0, t0 + 50)
        drain = _event(profiling.DRAIN_RANGE, t0 + 50, t0 + 90)
        mm = _event("aten::mm", t0 + 1, t0 + 10, call)
        item = _event("aten::item", t0 + 11, t0 + 20, call)
        events += [
            call,
            drain,
            mm,
            item,
            _event("cudaLaunchKernel", t0 + 2, t0 + 3, mm),
            _event("cudaLaunchKernel", t0 + 4, t0 + 5, mm),
            _event("cudaStreamSynchronize", t0 + 12, t0 + 19, item),
            _event("cudaEventSynchronize", t0 + 21, t0 + 22, call),
            _event("gemm_kernel", t0 + 30, t0 + 60, device="CUDA"),  # ends after the call: drain's window
            _event("copy_kernel", t0 + 61, t0 + 65, device="CUDA"),
        ]
    events.append(_event("gemm_kernel", 300, 400, device="CUDA"))  # outside every call: not counted
    s = profiling.summarize(events, calls=2, cuda=True, trace=None)
    assert s["time_basis"] == "device" and s["kernel_launches_per_call"] == 2
    assert s["sync_ops"] == {"aten::item (cudaStreamSynchronize)": 1} and s["syncs_per_call"] == 1
    assert s["event_waits_per_call"] == 1 and s["ops_per_call"] == 2
    assert [(op["name"], op["self_us_per_call"]) for op in s["top_ops"]] == [
        ("gemm_kernel", 30.0),
        ("copy_kernel", 4.0),
    ]
    assert s["peak_memory_bytes"] is None and "no kernel launches on a CPU" not in s["notes"]


# -- the timing loop's CUDA graphs (policy cuda_graph) ------------------------------------------------


class LoggingClock:
    """A GPU clock that times nothing: it runs the call and logs it (the graph path is the point)."""

    def __init__(self, fake):
        self.fake, self.device = fake, CUDA0

    def basis(self, wanted):
        return wanted

    def time_call(self, fn, basis="device"):
        fn()
        return 1e-3

    def shares_one_call(self, headline_s):
        return False


def test_a_variant_is_captured_after_a_warm_up_on_a_side_stream_and_replayed_when_timed(fake, monkeypatch):
    """timing.capture_cuda_graph follows torch's rule (warm-up on a side stream that waits on the
    current one, the current one waiting back, then capture), and the timing loop replays the
    graph instead of calling the variant; a stateful variant (reset before every call) is timed
    eagerly and says why."""
    from gpubench.measure import timing

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(timing, "nvtx_range", lambda name, device: contextlib.nullcontext())  # NVTX: CUDA builds
    calls = []

    def variant(recorder):
        stream = fake.current_stream().name
        calls.append(stream)
        fake.log.append(f"variant on {stream}")

    policy = timing.Policy(
        warmup_s=0.0, min_reps=2, max_reps=2, min_time_s=0.0, target_iqr=1.0, cuda_graph=True, energy_s=0.0
    )
    out = timing.measure_interleaved({"a": variant}, LoggingClock(fake), policy, basis="device", other_clock=False)["a"]
    capture = fake.log[: fake.log.index("capture ends") + 1]
    assert capture == ["side waits for current"] + ["variant on side"] * 3 + [
        "current waits for side",
        "capture begins (shared pool)",
        "variant on capture",
        "capture ends",
    ]
    assert out.cuda_graph == "on" and out.n == 2
    assert fake.log[fake.log.index("capture ends") + 1 :] == ["synchronize"] + ["replay"] * 3  # warm-up + 2 timed
    assert calls == ["side"] * 3 + ["capture"]  # never called eagerly once captured

    fake.log.clear()
    stateful = timing.measure_interleaved(
        {"b": variant}, LoggingClock(fake), policy, reset=lambda: None, basis="device", other_clock=False
    )["b"]
    assert stateful.cuda_graph.startswith("failed: stateful") and "replay" not in fake.log
