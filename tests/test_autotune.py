"""Triton tunings are kept per GPU model and bucketed by length, so a second run tunes nothing
and a varlen loop does not re-tune at every new longest document.

No GPU here: a stand-in autotuner follows Triton's protocol (``tuner[grid](*args)``; a key missing
from ``tuner.cache`` is benchmarked over ``tuner.configs`` and the winner stored there), and one
test uses a real ``triton.autotune`` object for the load/save round trip.
"""

from __future__ import annotations

import json
import multiprocessing as mp

import pytest
import torch

from gpubench.measure import autotune, devicecache
from gpubench.measure.autotune import PersistentAutotuner, length_bucket

triton = pytest.importorskip("triton")


class FakeAutotuner:
    """Triton's Autotuner as PersistentAutotuner sees it; counts its benchmarks."""

    def __init__(self, key_args=(1,)):
        self.configs = [
            triton.Config({"BLOCK_M": bm, "BLOCK_N": 32}, num_warps=4, num_stages=s) for bm, s in ((64, 2), (128, 3))
        ]
        self.cache: dict[tuple, object] = {}
        self.benchmarks = 0
        self.key_args = key_args
        self.launched: list[object] = []

    def __getitem__(self, grid):
        def run(x, seq_bucket, causal):
            key = (seq_bucket, causal, str(x.dtype))
            if key not in self.cache:
                self.benchmarks += 1
                self.cache[key] = self.configs[seq_bucket % 2]  # "the fastest"
            self.launched.append(self.cache[key])

        return run


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(tmp_path))
    return tmp_path


def launch(tuner, seq_len, causal=True):
    x = torch.randn(4)
    tuner[lambda meta: (1,)](x, length_bucket(seq_len), causal)


def test_length_bucket_is_the_next_power_of_two_from_16():
    assert [length_bucket(n) for n in (0, 1, 15, 16, 17, 3000, 4096, 4097)] == [16, 16, 16, 16, 32, 4096, 4096, 8192]


def test_a_second_process_tunes_nothing(cache_dir):
    first = PersistentAutotuner(FakeAutotuner(), "kern")
    for seq in (512, 4096):
        launch(first, seq)
    assert first.tuner.benchmarks == 2 and first.tuned == 2

    second = PersistentAutotuner(FakeAutotuner(), "kern")  # a new worker process, same GPU model
    for seq in (512, 4096):
        launch(second, seq)
    assert second.tuner.benchmarks == 0 and second.reused == 2
    assert second.tuner.launched == first.tuner.launched  # the same configs, read back


def test_new_lengths_inside_a_bucket_reuse_its_tuning(cache_dir):
    tuner = PersistentAutotuner(FakeAutotuner(), "kern")
    for longest_document in (3001, 3500, 2049, 4096, 3999):  # a varlen loop's batches
        launch(tuner, longest_document)
    assert tuner.tuner.benchmarks == 1
    launch(tuner, 4097)
    assert tuner.tuner.benchmarks == 2


def test_tunings_are_kept_per_gpu_model_and_triton_version(cache_dir):
    tuner = PersistentAutotuner(FakeAutotuner(), "kern")
    launch(tuner, 512)
    path = tuner.path(torch.device("cpu"))
    assert path == cache_dir / "autotune" / "cpu" / f"triton-{triton.__version__}" / "kern.json"
    doc = json.loads(path.read_text())
    assert doc["kernel"] == "kern" and doc["triton"] == triton.__version__
    assert doc["entries"] == [
        {
            "key": [512, True, "torch.float32"],
            "config": {
                "kwargs": {"BLOCK_M": 64, "BLOCK_N": 32},
                "num_warps": 4,
                "num_stages": 2,
                "num_ctas": getattr(tuner.tuner.configs[0], "num_ctas", 1),
                "maxnreg": getattr(tuner.tuner.configs[0], "maxnreg", None),
            },
        }
    ]
    assert devicecache.slug("NVIDIA H200") == "NVIDIA-H200"


def test_a_config_no_longer_among_the_candidates_is_tuned_again(cache_dir):
    tuner = PersistentAutotuner(FakeAutotuner(), "kern")
    launch(tuner, 512)
    changed = FakeAutotuner()
    changed.configs = [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32}, num_warps=4, num_stages=2)] * 2
    again = PersistentAutotuner(changed, "kern")
    launch(again, 512)
    assert changed.benchmarks == 1 and again.reused == 0


@pytest.mark.parametrize("content", ["{not json", json.dumps({"schema": 99, "entries": []}), json.dumps([1, 2])])
def test_a_corrupt_or_foreign_file_costs_a_tuning_and_is_replaced(cache_dir, content):
    tuner = PersistentAutotuner(FakeAutotuner(), "kern")
    path = tuner.path(torch.device("cpu"))
    path.parent.mkdir(parents=True)
    path.write_text(content)
    launch(tuner, 512)
    assert tuner.tuner.benchmarks == 1
    assert json.loads(path.read_text())["schema"] == autotune.SCHEMA


def _tune_in_child(cache_dir: str, seq: int, together) -> None:
    import os

    os.environ["GPUBENCH_CACHE_DIR"] = cache_dir
    together.wait(60)  # every writer tunes and saves at the same moment
    launch(PersistentAutotuner(FakeAutotuner(), "kern"), seq)


def test_concurrent_writers_keep_every_tuning(cache_dir):
    """Four processes each tune a shape and save it at once (a barrier lines them up): the lock and
    the merge keep all four. Forked, as this process already imported torch and Triton: a spawned
    child would import them again, seconds each, and drift apart while it did."""
    ctx = mp.get_context("fork")
    seqs = (64, 128, 256, 512)
    together = ctx.Barrier(len(seqs))
    children = [ctx.Process(target=_tune_in_child, args=(str(cache_dir), seq, together)) for seq in seqs]
    for child in children:
        child.start()
    for child in children:
        child.join(120)
        assert child.exitcode == 0
    reader = PersistentAutotuner(FakeAutotuner(), "kern")
    assert reader.load(reader.path(torch.device("cpu"))) == 4


def test_round_trip_through_a_real_triton_autotuner(cache_dir):
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, n, n_bucket, BLOCK: tl.constexpr):
        pass

    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((64, 2), (128, 4), (256, 8))]
    real = triton.autotune(configs=configs, key=["n_bucket"])(kernel)
    writer = PersistentAutotuner(real, "real")
    path = writer.path(torch.device("cpu"))
    real.cache[(1024, "torch.float32")] = configs[1]  # what a launch would have tuned
    writer.save(path, [(1024, "torch.float32")])

    fresh = triton.autotune(configs=configs, key=["n_bucket"])(kernel)
    reader = PersistentAutotuner(fresh, "real")
    assert reader.load(path) == 1
    assert fresh.cache[(1024, "torch.float32")] is fresh.configs[1]


def test_flash_kernels_key_on_length_buckets_not_exact_lengths():
    from gpubench.lib.kernels import flash_attention_triton as fwd
    from gpubench.lib.kernels import flash_attention_triton_bwd as bwd

    for module, kernels in ((fwd, [fwd._flash_attention_fwd]), (bwd, [bwd._bwd_dq, bwd._bwd_dkdv])):
        assert "seq_q" not in module.AUTOTUNE_KEY and "seq_k" not in module.AUTOTUNE_KEY
        for kernel in kernels:
            assert {"seq_q_bucket", "seq_k_bucket"} <= set(kernel.arg_names)


def test_a_cache_that_cannot_be_written_costs_a_tuning_not_the_launch(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the cache directory would go")
    monkeypatch.setenv("GPUBENCH_CACHE_DIR", str(blocker))
    tuner = PersistentAutotuner(FakeAutotuner(), "kern")
    launch(tuner, 512)  # tuned, launched, not kept: no exception
    assert tuner.tuner.benchmarks == 1 and len(tuner.tuner.launched) == 1
