"""Telemetry sampler: logic tested on the CPU with injected sources, clocks and a fake NVML."""

from __future__ import annotations

import collections
import sys
import threading
import time
from types import SimpleNamespace

import pandas as pd
import pytest

from gpubench.measure import telemetry_source
from gpubench.measure.telemetry import (
    BENIGN_REASONS,
    SAMPLE_COLUMNS,
    NvmlSource,
    TelemetrySampler,
    TelemetrySource,
    TelemetryUnavailable,
    decode_throttle_reasons,
    next_tick_index,
    resolve_cuda_index,
)

# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeSource:
    """Deterministic source. ``values`` may be a dict or a function of the read number; a read
    number in ``fail_on`` raises; ``read_cost_s`` advances ``clock`` (a slow read)."""

    def __init__(self, values=None, fail_on=(), clock: FakeClock | None = None, read_cost_s: float = 0.0):
        self.values = values or {
            "power_w": 100.0,
            "sm_clock_mhz": 1980,
            "mem_clock_mhz": 2619,
            "temp_c": 40,
            "util_gpu_pct": 90,
            "util_mem_pct": 50,
            "mem_used_mb": 1024.0,
            "throttle_mask": 0,
        }
        self.fail_on = set(fail_on)
        self.clock = clock
        self.read_cost_s = read_cost_s
        self.reads = 0
        self.energy = 0.0
        self.closed = False

    def read(self):
        n = self.reads
        self.reads += 1
        if self.clock is not None:
            self.clock.t += self.read_cost_s
        if n in self.fail_on:
            raise RuntimeError(f"boom on read {n}")
        self.energy += 10.0
        return dict(self.values(n) if callable(self.values) else self.values)

    def energy_mj(self):
        return self.energy

    def close(self):
        self.closed = True


def wait_until(predicate, timeout_s: float = 3.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


def test_fake_source_satisfies_protocol():
    assert isinstance(FakeSource(), TelemetrySource)


# ---------------------------------------------------------------------------------------------
# tagging, scheduling, robustness
# ---------------------------------------------------------------------------------------------


def test_samples_are_tagged_with_the_case_and_variant_current_at_sampling_time():
    clock = FakeClock()
    s = TelemetrySampler(FakeSource(), interval_s=0.05, clock=clock)
    s.sample_once()
    s.set_tag("case-a", "baseline")
    clock.t += 0.05
    s.sample_once()
    s.set_tag("case-a", "optimized")
    clock.t += 0.05
    s.sample_once()
    s.set_tag(None, None)
    s.sample_once()
    tags = [(x["case"], x["variant"]) for x in s.samples]
    assert tags == [(None, None), ("case-a", "baseline"), ("case-a", "optimized"), (None, None)]
    assert [round(x["t_s"], 9) for x in s.samples] == [0.0, 0.05, 0.1, 0.1]


def test_thread_tags_follow_set_tag_in_order():
    s = TelemetrySampler(FakeSource(), interval_s=0.005)
    s.set_tag("c1", "baseline")
    with s:
        assert wait_until(lambda: len(s.samples) >= 3)
        s.set_tag("c2", "optimized")
        assert wait_until(lambda: sum(x["case"] == "c2" for x in s.samples) >= 3)
    tags = [(x["case"], x["variant"]) for x in s.samples]
    first_c2 = tags.index(("c2", "optimized"))
    assert set(tags[:first_c2]) == {("c1", "baseline")}
    assert set(tags[first_c2:]) == {("c2", "optimized")}


def test_interval_is_respected_in_real_time():
    s = TelemetrySampler(FakeSource(), interval_s=0.02)
    s.start()
    time.sleep(0.4)
    s.stop()
    n = len(s.samples)
    # ~20 expected; a busy loop would give thousands, a broken schedule a handful.
    assert 8 <= n <= 30, n
    assert not s.running


def _run_on_fake_time(read_cost_s: float, interval_s: float, horizon_s: float):
    clock = FakeClock()
    t0 = clock.t

    def fake_sleep(seconds: float) -> bool:
        if clock.t - t0 >= horizon_s:
            return True  # stops the thread
        clock.t += seconds
        return False

    s = TelemetrySampler(
        FakeSource(clock=clock, read_cost_s=read_cost_s), interval_s=interval_s, clock=clock, sleep=fake_sleep
    )
    s.start()
    assert wait_until(lambda: not s.running)
    s.stop()
    return s


def test_ticks_do_not_drift_when_reads_take_time():
    s = _run_on_fake_time(read_cost_s=0.01, interval_s=0.05, horizon_s=0.5)
    times = [round(x["t_s"], 9) for x in s.samples]
    # Ticks at k * interval, not (interval + read time) apart.
    assert times == [round(0.05 * k, 9) for k in range(len(times))]
    assert len(times) >= 10
    assert s.run_summary()["skipped_ticks"] == 0


def test_missed_ticks_are_skipped_not_bunched():
    s = _run_on_fake_time(read_cost_s=0.12, interval_s=0.05, horizon_s=0.9)
    times = [round(x["t_s"], 9) for x in s.samples]
    assert times == [round(0.15 * k, 9) for k in range(len(times))]  # 0, 0.15, 0.30 ...
    assert len(times) >= 5
    assert s.run_summary()["skipped_ticks"] == 2 * (len(times) - 1) + 2  # every tick misses two


def test_next_tick_index_skips_past_ticks():
    assert next_tick_index(0, 0.01, 0.05) == 1
    assert next_tick_index(0, 0.12, 0.05) == 3
    assert next_tick_index(5, 0.0, 0.05) == 6  # never goes backwards


def test_failed_read_does_not_stop_the_thread_and_is_counted():
    src = FakeSource(fail_on={0, 2})
    s = TelemetrySampler(src, interval_s=0.005)
    s.start()
    assert wait_until(lambda: len(s.samples) >= 4)
    s.stop()
    summary = s.run_summary()
    assert summary["read_errors"] == 2
    assert "boom on read" in summary["last_read_error"]
    assert summary["n_samples"] == len(s.samples) == src.reads - 2


def test_failed_read_records_nothing_for_that_tick():
    s = TelemetrySampler(FakeSource(fail_on={1}), interval_s=0.05, clock=FakeClock())
    assert s.sample_once() is not None
    assert s.sample_once() is None
    assert s.sample_once() is not None
    assert len(s.samples) == 2
    assert s.run_summary()["read_errors"] == 1


def test_missing_fields_become_none_and_extra_fields_are_kept():
    s = TelemetrySampler(FakeSource(values={"power_w": 50.0, "fan_pct": 30}), clock=FakeClock())
    sample = s.sample_once()
    assert sample["temp_c"] is None and sample["throttle_mask"] is None
    assert sample["throttle_reasons"] == []
    assert sample["fan_pct"] == 30
    assert s.to_dataframe().columns[-1] == "fan_pct"


def test_samples_property_returns_a_copy():
    s = TelemetrySampler(FakeSource(), clock=FakeClock())
    s.sample_once()
    got = s.samples
    got[0]["case"] = "mutated"
    got.append({})
    assert len(s.samples) == 1 and s.samples[0]["case"] is None


def test_start_is_idempotent_and_stop_is_safe_twice_or_without_start():
    s = TelemetrySampler(FakeSource(), interval_s=0.01)
    s.stop()  # never started
    s.start()
    s.start()
    assert sum(t.name == "gpubench-telemetry" for t in threading.enumerate()) == 1
    s.stop()
    s.stop()
    assert not s.running
    assert sum(t.name == "gpubench-telemetry" for t in threading.enumerate()) == 0


def test_energy_mj_reads_the_counter_now():
    src = FakeSource()
    s = TelemetrySampler(src, clock=FakeClock())
    src.energy = 1234.0
    assert s.energy_mj() == 1234.0


def test_close_releases_the_source_but_keeps_results():
    src = FakeSource()
    s = TelemetrySampler(src, clock=FakeClock())
    s.sample_once()
    s.close()
    assert src.closed
    assert s.available and s.run_summary()["n_samples"] == 1
    assert s.energy_mj() is None


def test_rejects_non_positive_interval():
    with pytest.raises(ValueError):
        TelemetrySampler(FakeSource(), interval_s=0)


# ---------------------------------------------------------------------------------------------
# throttle reasons and summaries
# ---------------------------------------------------------------------------------------------


def test_throttle_bits_decode_to_names():
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(None) == []
    assert decode_throttle_reasons(0x4) == ["sw_power_cap"]
    assert decode_throttle_reasons(0x1 | 0x8 | 0x40) == ["gpu_idle", "hw_slowdown", "hw_thermal_slowdown"]
    assert decode_throttle_reasons(0x20 | 0x80 | 0x10) == ["sync_boost", "sw_thermal_slowdown", "hw_power_brake"]
    assert decode_throttle_reasons(0x2 | 0x100) == ["applications_clocks_setting", "display_clocks_setting"]
    assert decode_throttle_reasons(0x10000) == ["unknown_0x10000"]
    assert BENIGN_REASONS == {"gpu_idle", "applications_clocks_setting", "display_clocks_setting"}


def test_throttle_bits_match_pynvml_constants():
    pynvml = pytest.importorskip("pynvml")
    for const, name in [
        ("SwPowerCap", "sw_power_cap"),
        ("HwSlowdown", "hw_slowdown"),
        ("HwThermalSlowdown", "hw_thermal_slowdown"),
        ("SwThermalSlowdown", "sw_thermal_slowdown"),
        ("HwPowerBrakeSlowdown", "hw_power_brake"),
        ("SyncBoost", "sync_boost"),
        ("GpuIdle", "gpu_idle"),
        ("ApplicationsClocksSetting", "applications_clocks_setting"),
        ("DisplayClockSetting", "display_clocks_setting"),
    ]:
        bit = getattr(pynvml, "nvmlClocksThrottleReason" + const)
        assert decode_throttle_reasons(bit) == [name]


def _sampler_with_masks(masks, case="c"):
    clock = FakeClock()
    s = TelemetrySampler(FakeSource(values=lambda n: {"throttle_mask": masks[n], "power_w": 10.0}), clock=clock)
    s.set_tag(case, "v")
    for _ in masks:
        s.sample_once()
        clock.t += 0.05
    return s


def test_benign_reasons_do_not_count_as_throttling():
    s = _sampler_with_masks([0x1, 0x2 | 0x100, 0x0])
    run, case = s.run_summary(), s.case_summary("c")
    for summary in (run, case):
        assert summary["throttled"] is False
        assert summary["throttle_reasons"] == []
        assert summary["benign_reasons"] == ["applications_clocks_setting", "display_clocks_setting", "gpu_idle"]
    assert [x["throttle_mask"] for x in s.samples] == [0x1, 0x2 | 0x100, 0x0]  # raw masks kept


def test_harmful_reason_sets_throttled_and_is_listed_apart_from_benign():
    s = _sampler_with_masks([0x1, 0x4 | 0x1, 0x40, 0x0])
    run = s.run_summary()
    assert run["throttled"] is True
    assert run["throttle_reasons"] == ["hw_thermal_slowdown", "sw_power_cap"]
    assert run["benign_reasons"] == ["gpu_idle"]
    assert run["throttled_fraction"] == pytest.approx(0.5)


def test_case_summary_aggregates_only_that_cases_samples():
    clock = FakeClock()
    values = {
        0: (100.0, 1900, 40, 0x0),
        1: (200.0, 1800, 50, 0x4),
        2: (300.0, 1700, 60, 0x0),
        3: (999.0, 100, 99, 0x40),
    }
    src = FakeSource(
        values=lambda n: dict(
            zip(("power_w", "sm_clock_mhz", "temp_c", "throttle_mask"), values[n]),
            mem_used_mb=10.0 * (n + 1),
            util_gpu_pct=10 * (n + 1),
        )
    )
    s = TelemetrySampler(src, clock=clock)
    s.set_tag("a", "baseline")
    s.sample_once()
    s.sample_once()
    s.set_tag("a", "optimized")
    s.sample_once()
    s.set_tag("b", "baseline")
    s.sample_once()
    a = s.case_summary("a")
    assert a["n_samples"] == 3
    assert a["power_w_mean"] == pytest.approx(200.0)
    assert a["power_w_max"] == 300.0
    assert a["temp_c_max"] == 60
    assert a["sm_clock_mhz_min"] == 1700
    assert a["sm_clock_mhz_mean"] == pytest.approx(1800.0)
    assert a["mem_used_mb_max"] == 30.0
    assert a["util_gpu_pct_mean"] == pytest.approx(20.0)
    assert a["throttle_reasons"] == ["sw_power_cap"]  # b's hw_thermal_slowdown does not leak in
    assert a["energy_j_sampled"] == pytest.approx(0.02)  # counter 10 -> 30 mJ
    assert a["variants"]["baseline"]["n_samples"] == 2
    assert a["variants"]["optimized"]["power_w_mean"] == pytest.approx(300.0)
    assert s.case_summary("missing")["n_samples"] == 0
    assert s.case_summary("missing")["power_w_mean"] is None


def test_summaries_are_json_safe():
    import json

    s = _sampler_with_masks([0x4, 0x0])
    json.dumps(s.run_summary(), allow_nan=False)
    json.dumps(s.case_summary("c").to_dict(), allow_nan=False)
    json.dumps(s.case_summary("nothing").to_dict(), allow_nan=False)


# ---------------------------------------------------------------------------------------------
# CSV
# ---------------------------------------------------------------------------------------------


def test_write_csv_is_readable_by_pandas_with_expected_columns(tmp_path):
    s = _sampler_with_masks([0x4 | 0x1, 0x0, 0x40])
    path = tmp_path / "sub" / "telemetry.csv"
    s.write_csv(path)
    df = pd.read_csv(path)
    assert list(df.columns) == list(SAMPLE_COLUMNS)
    assert len(df) == 3
    assert df["throttle_reasons"][0] == "gpu_idle|sw_power_cap"
    assert df["throttle_mask"].tolist() == [5, 0, 64]
    assert (df["case"] == "c").all() and (df["variant"] == "v").all()
    assert df["t_s"].tolist() == pytest.approx([0.0, 0.05, 0.1])
    assert list(tmp_path.joinpath("sub").iterdir()) == [path]  # no temp file left behind


def test_unsupported_integer_fields_stay_empty_not_float(tmp_path):
    s = TelemetrySampler(FakeSource(values=lambda n: {"sm_clock_mhz": None if n else 1410}), clock=FakeClock())
    s.sample_once()
    s.sample_once()
    s.write_csv(tmp_path / "t.csv")
    lines = (tmp_path / "t.csv").read_text().splitlines()
    col = lines[0].split(",").index("sm_clock_mhz")
    assert lines[1].split(",")[col] == "1410"
    assert lines[2].split(",")[col] == ""


# ---------------------------------------------------------------------------------------------
# unavailable paths
# ---------------------------------------------------------------------------------------------


def _exercise_unavailable(s: TelemetrySampler, tmp_path):
    s.start()
    assert not s.running
    s.set_tag("c", "v")
    assert s.energy_mj() is None
    assert s.sample_once() is None
    s.stop()
    s.stop()
    with s:
        pass
    summary = s.run_summary()
    assert summary["status"] == "unavailable"
    assert summary["reason"] == s.reason
    assert summary["n_samples"] == 0 and summary["throttled"] is False
    assert s.case_summary("c")["n_samples"] == 0
    s.write_csv(tmp_path / "telemetry.csv")
    df = pd.read_csv(tmp_path / "telemetry.csv")
    assert list(df.columns) == list(SAMPLE_COLUMNS) and len(df) == 0
    return summary


def test_cpu_device_is_unavailable_and_everything_still_works(tmp_path):
    s = TelemetrySampler.for_device("cpu")
    assert s.available is False
    assert "cpu" in s.reason
    _exercise_unavailable(s, tmp_path)


def test_torch_cpu_device_object_is_accepted():
    torch = pytest.importorskip("torch")
    s = TelemetrySampler.for_device(torch.device("cpu"))
    assert not s.available and "cpu" in s.reason


def test_cuda_on_this_machine_is_unavailable_or_real_never_a_crash(tmp_path):
    s = TelemetrySampler.for_device("cuda:0")
    if s.available:  # a machine with an NVIDIA driver
        s.sample_once()
        assert s.run_summary()["status"] == "ok"
        s.close()
    else:
        assert s.reason.startswith("NVML unavailable:") or "nvidia-ml-py" in s.reason
        _exercise_unavailable(s, tmp_path)


def test_nvml_init_failure_gives_nvmls_error_text(monkeypatch, tmp_path):
    pynvml = pytest.importorskip("pynvml")

    def failing_init(*a, **k):
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", failing_init)
    s = TelemetrySampler.for_device("cuda:0")
    assert not s.available
    assert s.reason == "NVML unavailable: Driver Not Loaded"
    _exercise_unavailable(s, tmp_path)


def test_missing_nvidia_ml_py_is_reported(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    s = TelemetrySampler.for_device("cuda:0")
    assert not s.available and s.reason == "nvidia-ml-py not installed"
    _exercise_unavailable(s, tmp_path)
    with pytest.raises(TelemetryUnavailable, match="nvidia-ml-py not installed"):
        NvmlSource(0)


def test_sampler_without_source_needs_no_reason():
    s = TelemetrySampler(None)
    assert not s.available and s.reason


# ---------------------------------------------------------------------------------------------
# NvmlSource against a fake NVML module
# ---------------------------------------------------------------------------------------------

NOT_SUPPORTED, FUNCTION_NOT_FOUND, GPU_IS_LOST, UNKNOWN = 3, 13, 15, 999


class FakeNVMLError(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {
            NOT_SUPPORTED: "Not Supported",
            FUNCTION_NOT_FOUND: "Function Not Found",
            GPU_IS_LOST: "GPU is lost",
        }.get(self.value, "Unknown Error")


class FakeNvml:
    """Just enough of pynvml for NvmlSource; three GPUs with handles 0, 1, 2."""

    NVMLError = FakeNVMLError
    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVML_FI_DEV_POWER_INSTANT = 186
    NVML_VALUE_TYPE_UNSIGNED_INT = 1
    UUIDS = ["GPU-aaaa-0000", "GPU-bbbb-1111", "GPU-cccc-2222"]

    def __init__(self, instant_return=0, unsupported=(), event_reasons=True, broken=None):
        self.calls = collections.Counter()
        self.instant_return = instant_return
        self.unsupported = set(unsupported)
        self.broken = broken  # error code every reading raises (a lost GPU)
        self.init_count = 0
        if not event_reasons:
            self.nvmlDeviceGetCurrentClocksEventReasons = self._missing_fn

    def _missing_fn(self, h):
        raise FakeNVMLError(FUNCTION_NOT_FOUND)

    def _reading(self, name, value):
        self.calls[name] += 1
        if self.broken is not None:
            raise FakeNVMLError(self.broken)
        if name in self.unsupported:
            raise FakeNVMLError(NOT_SUPPORTED)
        return value

    def nvmlInit(self):
        self.init_count += 1

    def nvmlShutdown(self):
        self.init_count -= 1

    def nvmlDeviceGetCount(self):
        return len(self.UUIDS)

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.UUIDS):
            raise FakeNVMLError(2)
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        if uuid not in self.UUIDS:
            raise FakeNVMLError(6)
        return self.UUIDS.index(uuid)

    def nvmlDeviceGetUUID(self, h):
        return self.UUIDS[h].encode()

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlDeviceGetIndex(self, h):
        return h

    def nvmlDeviceGetFieldValues(self, h, ids):
        self.calls["field_values"] += 1
        assert ids == [186]
        if self.broken is not None:
            raise FakeNVMLError(self.broken)
        return [SimpleNamespace(nvmlReturn=self.instant_return, valueType=1, value=SimpleNamespace(uiVal=300500))]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._reading("power_usage", 120000)

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return self._reading("energy", 5_000_000 + h)

    def nvmlDeviceGetClockInfo(self, h, kind):
        return self._reading("clock_sm" if kind == 1 else "clock_mem", 1980 if kind == 1 else 2619)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return self._reading("temp", 55)

    def nvmlDeviceGetUtilizationRates(self, h):
        return self._reading("util", SimpleNamespace(gpu=97, memory=40))

    def nvmlDeviceGetMemoryInfo(self, h):
        return self._reading("memory", SimpleNamespace(used=3 * 2**30))

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return self._reading("enforced_limit", 700_000)

    def nvmlDeviceGetPowerManagementLimit(self, h):
        return self._reading("management_limit", 650_000)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self._reading("event_reasons", 0x4)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return self._reading("throttle_reasons", 0x40)


def test_nvml_source_reads_every_field_and_prefers_instant_power():
    nv = FakeNvml()
    src = NvmlSource(1, nvml=nv)
    sample = src.read()
    assert sample == {
        "power_w": 300.5,
        "sm_clock_mhz": 1980,
        "mem_clock_mhz": 2619,
        "temp_c": 55,
        "util_gpu_pct": 97,
        "util_mem_pct": 40,
        "mem_used_mb": 3072.0,
        "throttle_mask": 0x4,
    }
    assert nv.calls["power_usage"] == 0
    assert src.energy_mj() == 5_000_001.0
    assert src.info["power_source"] == "instant"
    assert src.info["uuid"] == "GPU-bbbb-1111" and src.info["name"] == "Fake GPU"
    src.close()
    src.close()
    assert nv.init_count == 0
    assert src.energy_mj() is None


def test_nvml_source_falls_back_to_power_usage_without_instant_field():
    src = NvmlSource(0, nvml=FakeNvml(instant_return=NOT_SUPPORTED))
    assert src.read()["power_w"] == 120.0
    assert src.info["power_source"] == "power_usage"


def test_nvml_source_uses_older_throttle_reasons_call_on_old_drivers():
    src = NvmlSource(0, nvml=FakeNvml(event_reasons=False))
    assert src.read()["throttle_mask"] == 0x40


def test_unsupported_nvml_field_becomes_none_and_is_not_asked_again():
    nv = FakeNvml(unsupported={"temp", "energy"})
    src = NvmlSource(0, nvml=nv)
    for _ in range(3):
        sample = src.read()
        assert sample["temp_c"] is None and sample["sm_clock_mhz"] == 1980
        assert src.energy_mj() is None
    assert nv.calls["temp"] == 1 and nv.calls["energy"] == 1
    assert src.unsupported == {"temp_c", "energy_mj"}


def test_power_limit_is_the_enforced_one_else_the_management_limit_else_unknown():
    nv = FakeNvml()
    s = TelemetrySampler(NvmlSource(0, nvml=nv), clock=FakeClock())
    assert s.power_limit_w() == 700.0  # mW from NVML, W here
    nv.unsupported.add("enforced_limit")
    assert s.power_limit_w() == 650.0
    nv.unsupported.add("management_limit")
    assert s.power_limit_w() is None
    s.close()
    assert s.power_limit_w() is None


def test_without_nvml_there_is_no_power_limit_and_the_reason_is_kept():
    s = TelemetrySampler.for_device("cpu")
    assert s.power_limit_w() is None and s.energy_mj() is None
    assert s.run_summary()["status"] == "unavailable" and "device is cpu" in s.run_summary()["reason"]
    assert TelemetrySampler(FakeSource()).power_limit_w() is None  # a source that does not offer one


def test_nvml_read_that_fails_entirely_raises_and_sampler_counts_it():
    nv = FakeNvml()
    src = NvmlSource(0, nvml=nv)
    s = TelemetrySampler(src, clock=FakeClock())
    s.sample_once()
    nv.broken = GPU_IS_LOST
    assert s.sample_once() is None
    nv.broken = None
    s.sample_once()
    summary = s.run_summary()
    assert summary["n_samples"] == 2 and summary["read_errors"] == 1
    assert "GPU is lost" in summary["last_read_error"]
    assert summary["device"]["power_source"] == "instant"


def test_nvml_source_missing_gpu_is_unavailable_and_shuts_nvml_down():
    nv = FakeNvml()
    with pytest.raises(TelemetryUnavailable, match="index 7"):
        NvmlSource(7, nvml=nv)
    assert nv.init_count == 0


def test_nvml_source_finds_gpu_by_uuid_or_unique_prefix():
    nv = FakeNvml()
    assert NvmlSource(None, uuid="GPU-cccc-2222", nvml=nv).info["nvml_index"] == 2
    src = NvmlSource(None, uuid="GPU-bbbb", nvml=nv)
    assert src.info["nvml_index"] == 1 and src.info["matched_by"] == "uuid_prefix"
    with pytest.raises(TelemetryUnavailable, match="GPU-"):
        NvmlSource(None, uuid="GPU-", nvml=nv)  # ambiguous prefix


def test_resolve_cuda_index_maps_through_cuda_visible_devices():
    assert resolve_cuda_index(1, None) == (1, None)
    assert resolve_cuda_index(1, "") == (1, None)
    assert resolve_cuda_index(1, "3, 2") == (2, None)
    assert resolve_cuda_index(0, "GPU-bbbb-1111,GPU-aaaa") == (None, "GPU-bbbb-1111")
    with pytest.raises(TelemetryUnavailable, match="CUDA_VISIBLE_DEVICES"):
        resolve_cuda_index(2, "0,1")


@pytest.mark.parametrize(
    "visible, device, nvml_index",
    [
        (None, "cuda:2", 2),
        ("2,0", "cuda:0", 2),
        ("2,0", "cuda:1", 0),
        ("GPU-bbbb-1111", "cuda:0", 1),
        ("GPU-cccc", "cuda:0", 2),
    ],
)
def test_for_device_picks_the_nvml_gpu_cuda_means(monkeypatch, visible, device, nvml_index):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setattr(telemetry_source, "_torch_gpu_uuid", lambda i: None)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    s = TelemetrySampler.for_device(device)
    assert s.available, s.reason
    assert s.run_summary()["device"]["nvml_index"] == nvml_index
    s.close()


def test_for_device_prefers_torchs_uuid_for_the_device(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setattr(telemetry_source, "_torch_gpu_uuid", lambda i: "GPU-cccc-2222")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    s = TelemetrySampler.for_device("cuda:0")
    assert s.run_summary()["device"]["nvml_index"] == 2
    s.close()


def test_for_device_out_of_range_is_unavailable_not_a_crash(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    monkeypatch.setattr(telemetry_source, "_torch_gpu_uuid", lambda i: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    s = TelemetrySampler.for_device("cuda:3")
    assert not s.available and "CUDA_VISIBLE_DEVICES" in s.reason


def test_the_sampler_keeps_each_energy_read_with_its_instants_while_its_thread_runs():
    # Energy per call of long calls is taken from these reads (gpubench.measure.energy.measure_over_calls):
    # each is the sample's own energy_mj, on the sampler's clock; offered only while the thread runs.
    clock = FakeClock()
    s = TelemetrySampler(FakeSource(), interval_s=0.05, clock=clock)
    for _ in range(3):
        s.sample_once()
        clock.t += 0.05
    assert s.energy_log is None  # not started: nothing reads the counter during the calls
    assert s._energy_log.clock is clock
    reads = s._energy_log.readings()
    assert [r.mj for r in reads] == [x["energy_mj"] for x in s.samples] == [10.0, 20.0, 30.0]
    assert [r.t0 for r in reads] == pytest.approx([100.0 + x["t_s"] for x in s.samples])
    with TelemetrySampler(FakeSource(), interval_s=0.005) as running:
        assert wait_until(lambda: len(running.samples) >= 2)
        assert running.energy_log is not None and running.energy_log.clock is time.monotonic
        assert len(running.energy_log.readings()) >= 2
    assert running.energy_log is None
    # A source without an energy counter: nothing kept.
    quiet = FakeSource()
    quiet.energy_mj = lambda: None
    t = TelemetrySampler(quiet, interval_s=0.05, clock=FakeClock())
    t.sample_once()
    assert t._energy_log.readings() == []
