"""Every CUDA entry point accepts ``cuda``, ``cuda:N`` and a torch.device of either form.

The H200's first `gpubench env --calibrate` died on ``torch.cuda.set_device("cuda")``: torch
rejects a CUDA device without an index there. These tests stand a strict fake in for
``torch.cuda`` (it rejects what the real one rejects) and drive each entry point up to the
first line after it selects the device, on a machine without a GPU.
"""

from __future__ import annotations

import pytest
import torch

from gpubench.measure import env as envmod
from gpubench.run import in_process


class Reached(Exception):
    """The entry point got past selecting its device."""


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda as a 2-GPU machine sees it, as far as selecting a device goes; the current
    device is 1, so a ``cuda`` that silently became ``cuda:0`` is caught too."""
    selected: list[int] = []

    def set_device(device):
        # torch.cuda.set_device -> torch.cuda._utils._get_device_index(device, optional=False)
        if isinstance(device, str):
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type != "cuda" or device.index is None:
                raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
            device = device.index
        selected.append(int(device))

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    return selected


FORMS = ["cuda", "cuda:0", "cuda:1", torch.device("cuda"), torch.device("cuda", 0)]
EXPECTED = [1, 0, 1, 1, 0]  # "cuda" alone is the current device (1 in the fake)


@pytest.mark.parametrize("form,index", list(zip(FORMS, EXPECTED)), ids=[str(f) for f in FORMS])
def test_calibrate_selects_the_device_in_every_form(fake_cuda, monkeypatch, form, index):
    def stop(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(envmod.timing, "Clock", stop)  # the line after selecting the device
    with pytest.raises(Reached):
        envmod.calibrate(form, quick=True)
    assert fake_cuda == [index]


@pytest.mark.parametrize("form,index", list(zip(FORMS, EXPECTED)), ids=[str(f) for f in FORMS])
def test_use_device_returns_the_indexed_device(fake_cuda, form, index):
    assert envmod.use_device(form) == torch.device("cuda", index)
    assert fake_cuda == [index]


def test_use_device_leaves_a_cpu_alone(fake_cuda):
    assert envmod.use_device("cpu") == torch.device("cpu")
    assert fake_cuda == []


@pytest.mark.parametrize("requested,index", [("auto", 1), ("cuda", 1), ("cuda:0", 0)])
def test_resolve_device_always_names_an_index(fake_cuda, requested, index):
    assert envmod.resolve_device(requested) == torch.device("cuda", index)


def test_in_process_device_selects_cuda_without_index(fake_cuda, monkeypatch):
    def stop(*args, **kwargs):
        raise Reached

    monkeypatch.setattr(envmod, "capture_env", stop)  # the line after selecting the device
    dev = in_process.InProcess("cuda", calibrate=False, telemetry_interval_s=0.1)
    with pytest.raises(Reached):
        dev.start()
    assert fake_cuda == [1] and dev.device == torch.device("cuda", 1)


def test_cuda_device_refuses_a_cpu():
    with pytest.raises(ValueError, match="not a CUDA device"):
        envmod.cuda_device("cpu")


# -- a smaller card's memory on a bigger GPU (policy gpu_memory_gib) -----------------------------


def test_memory_cap_gives_the_allocator_what_a_smaller_card_would_and_lifts_it(fake_cuda, monkeypatch):
    """A "24" scenario on an H200 gets what a 24 GB card's caching allocator gets (about 22.5 GiB
    before the CUDA context, issue 33, less the context's allowance), never more than the card in
    hand has free for it, and a cap is lifted when a case asks for none."""
    from types import SimpleNamespace

    from gpubench.run import runner

    GiB = 2**30
    fractions, free = [], {"bytes": 139 * GiB}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=141 * GiB))
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: (free["bytes"], 141 * GiB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 1 * GiB)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: fractions.append((f, d)))
    monkeypatch.setattr(runner, "_memory_capped", set())
    dev = torch.device("cuda", 0)
    assert runner.allocator_cap_bytes(24) == 22 * GiB  # 24 - 1.5 (the card keeps) - 0.5 (the CUDA context)
    assert runner.cap_gpu_memory(dev, 0) is None and fractions == []  # never capped: nothing to lift
    assert runner.cap_gpu_memory(dev, 24) == pytest.approx(22 / 141)
    assert runner.cap_gpu_memory(dev, 500) == pytest.approx(140 / 141)  # the card's free bytes + its own
    free["bytes"] = 10 * GiB  # another process holds most of the card: the cap is what is left
    assert runner.cap_gpu_memory(dev, 24) == pytest.approx(11 / 141)
    assert runner.cap_gpu_memory(dev, 0) is None
    assert [f for f, _ in fractions] == pytest.approx([22 / 141, 140 / 141, 11 / 141, 1.0])
    assert runner.allocator_cap_bytes(1) == GiB // 2  # a tiny card: never below half of it


def test_a_capped_run_says_its_compute_is_still_the_big_gpus():
    from gpubench.records.results import RunRecord
    from gpubench.run.closing import memory_cap_warning
    from gpubench.run.scenario import load as load_scenario

    scen = load_scenario("gpu-consumer")
    cases = scen.cases()
    assert cases and all(c.policy.gpu_memory_gib == 24 for c in cases)
    run = RunRecord(
        run_id="r",
        device="cuda",
        device_label="NVIDIA H200",
        scenario={},
        env={"gpu": {"total_memory_bytes": 150_000_000_000}},
        devices={"cuda:0": {"type": "cuda"}},
    )
    text = memory_cap_warning(run, cases)
    assert "capped as on a 24 GiB card" in text and "about 22.0 GiB of its 140 GiB" in text
    assert "approximate" in text and "caching allocator only" in text and "still the NVIDIA H200's" in text
    run.devices = {"cpu": {"type": "cpu"}}
    assert "does nothing on a cpu device" in memory_cap_warning(run, cases)  # a CPU run caps nothing, and says so
