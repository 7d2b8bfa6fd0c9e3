"""GpuSample -> contract families: exact names and labels, absent-not-zero, lost GPUs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufeed.collectors.base import TickData
from gpufeed.collectors.gpu import GpuCollector, build_gpu_collector, gpu_families
from gpufeed.exposition import render_text
from gpufeed.gpu.backend import GpuIdentity, GpuSample
from gpufeed.model import Family
from nvml_fake import FakeGpu, FakeNvml

ID0 = GpuIdentity(0, "GPU-aaaa", "NVIDIA H100 80GB HBM3", "550.54.15", "00000000:18:00.0")
ID1 = GpuIdentity(1, "GPU-bbbb", "NVIDIA H100 80GB HBM3", "550.54.15", "00000000:2A:00.0")
L0 = (("gpu", "0"), ("uuid", "GPU-aaaa"))
L1 = (("gpu", "1"), ("uuid", "GPU-bbbb"))

FULL = GpuSample(
    identity=ID0,
    utilization_ratio=0.5,
    sm_active_ratio=0.25,
    memory_bandwidth_utilization_ratio=0.125,
    memory_used_bytes=1024.0,
    memory_total_bytes=4096.0,
    power_watts=300.5,
    energy_joules_total=12345.0,
    temperature_celsius=61.0,
    sm_clock_hertz=1.98e9,
    clock_events_active=(("sw_power_cap", True), ("hw_slowdown", False)),
    pcie_transmit_bytes_total=10.0,
    pcie_receive_bytes_total=20.0,
    nvlink_transmit_bytes_total=30.0,
    nvlink_receive_bytes_total=40.0,
    xid_errors_total=((13, 2),),
    mig_enabled=False,
)


def series(families: list[Family]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, s.labels): s.value for fam in families for s in fam.samples}


def test_full_sample_gives_every_contract_series() -> None:
    got = series(gpu_families([FULL], "nvml"))
    info_labels = (
        ("backend", "nvml"),
        ("driver_version", "550.54.15"),
        ("gpu", "0"),
        ("name", "NVIDIA H100 80GB HBM3"),
        ("pci_bus_id", "00000000:18:00.0"),
        ("uuid", "GPU-aaaa"),
    )
    assert got == {
        ("gpufeed_gpu_info", info_labels): 1.0,
        ("gpufeed_gpu_up", L0): 1.0,
        ("gpufeed_gpu_utilization_ratio", L0): 0.5,
        ("gpufeed_gpu_sm_active_ratio", L0): 0.25,
        ("gpufeed_gpu_memory_bandwidth_utilization_ratio", L0): 0.125,
        ("gpufeed_gpu_memory_used_bytes", L0): 1024.0,
        ("gpufeed_gpu_memory_total_bytes", L0): 4096.0,
        ("gpufeed_gpu_power_watts", L0): 300.5,
        ("gpufeed_gpu_energy_joules_total", L0): 12345.0,
        ("gpufeed_gpu_temperature_celsius", L0): 61.0,
        ("gpufeed_gpu_sm_clock_hertz", L0): 1.98e9,
        ("gpufeed_gpu_clock_event_active", (("gpu", "0"), ("reason", "sw_power_cap"), L0[1])): 1.0,
        ("gpufeed_gpu_clock_event_active", (("gpu", "0"), ("reason", "hw_slowdown"), L0[1])): 0.0,
        ("gpufeed_gpu_pcie_transmit_bytes_total", L0): 10.0,
        ("gpufeed_gpu_pcie_receive_bytes_total", L0): 20.0,
        ("gpufeed_gpu_nvlink_transmit_bytes_total", L0): 30.0,
        ("gpufeed_gpu_nvlink_receive_bytes_total", L0): 40.0,
        ("gpufeed_gpu_xid_errors_total", (("gpu", "0"), ("uuid", "GPU-aaaa"), ("xid", "13"))): 2.0,
        ("gpufeed_gpu_mig_enabled", L0): 0.0,
    }


def test_types_follow_the_data() -> None:
    types = {f.name: f.type for f in gpu_families([FULL], "nvml")}
    assert all(t == "counter" for n, t in types.items() if n.endswith("_total"))
    assert all(t == "gauge" for n, t in types.items() if not n.endswith("_total"))


def test_values_the_hardware_does_not_give_are_absent_not_zero() -> None:
    bare = GpuSample(identity=ID1, temperature_celsius=0.0)  # 0 is a real reading
    got = series(gpu_families([bare], "nvml"))
    assert {name for name, _ in got} == {
        "gpufeed_gpu_info",
        "gpufeed_gpu_up",
        "gpufeed_gpu_temperature_celsius",
    }
    assert got[("gpufeed_gpu_temperature_celsius", L1)] == 0.0


def test_lost_gpu_has_info_up_zero_and_its_xid_counts_only() -> None:
    lost = GpuSample(identity=ID1, up=False, xid_errors_total=((79, 1),))
    got = series(gpu_families([FULL, lost], "nvml"))
    gpu1 = {name: v for (name, labels), v in got.items() if dict(labels).get("gpu") == "1"}
    assert gpu1 == {
        "gpufeed_gpu_info": 1.0,
        "gpufeed_gpu_up": 0.0,
        "gpufeed_gpu_xid_errors_total": 1.0,
    }
    # the healthy GPU is unaffected
    assert got[("gpufeed_gpu_utilization_ratio", L0)] == 0.5


def test_backend_label_says_simulated() -> None:
    (info,) = [f for f in gpu_families([FULL], "simulated") if f.name == "gpufeed_gpu_info"]
    assert info.samples[0].label("backend") == "simulated"


def test_exposition_passes_promtool() -> None:
    lost = GpuSample(identity=ID1, up=False, xid_errors_total=((79, 1),))
    text = render_text(gpu_families([FULL, lost], "nvml"))
    proc = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert b'gpufeed_gpu_up{gpu="1",uuid="GPU-bbbb"} 0.0' in text
    assert b"gpufeed_gpu_energy_joules_total" in text


def test_collector_over_nvml_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu("GPU-x"), FakeGpu("GPU-y", lost=True)])
    fake.install(monkeypatch.setattr)
    collector, reason = build_gpu_collector("nvml")
    assert isinstance(collector, GpuCollector) and "2 GPU(s)" in reason
    assert collector.produce(TickData()).gpu_samples == ()
    try:
        got = series(collector.collect())
    finally:
        collector.close()
    handed_on = collector.produce(TickData()).gpu_samples  # to the job layer's collectors
    assert [p.pid for p in handed_on[0].processes] == [4242]
    assert handed_on[1].processes == () and not handed_on[1].up
    assert got[("gpufeed_gpu_up", (("gpu", "0"), ("uuid", "GPU-x")))] == 1.0
    assert got[("gpufeed_gpu_up", (("gpu", "1"), ("uuid", "")))] == 0.0
    assert got[("gpufeed_gpu_utilization_ratio", (("gpu", "0"), ("uuid", "GPU-x")))] == 0.97
    assert fake.initialised == 0


def test_build_off_and_simulated_need_no_nvml() -> None:
    collector, reason = build_gpu_collector("off")
    assert collector is None and "off" in reason
    with pytest.raises(ValueError, match="simulated"):
        build_gpu_collector("simulated")


def test_importing_the_gpu_layer_does_not_load_pynvml() -> None:
    code = (
        "import sys, gpufeed.collectors.gpu, gpufeed.gpu.select, gpufeed.gpu.nvml; "
        "sys.exit(1 if 'pynvml' in sys.modules else 0)"
    )
    env = {"PYTHONPATH": str(Path(__file__).resolve().parent.parent / "exporter")}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode == 0


def test_gpu_collector_in_the_real_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's sampler runs the collector on its worker thread; a lost GPU is a value,
    not a collector failure."""
    from gpufeed.agent.sampler import Sampler
    from gpufeed.gpu.nvml import NvmlBackend

    fake = FakeNvml([FakeGpu("GPU-x"), FakeGpu("GPU-y")])
    fake.install(monkeypatch.setattr)
    sampler = Sampler(
        [GpuCollector(NvmlBackend(watch_xid=False))], interval_seconds=1.0, timeout_seconds=5.0
    )
    try:
        first = sampler.sample_once().text
        fake.gpus[1].lost = True
        second = sampler.sample_once().text
    finally:
        sampler.stop()
    assert b'gpufeed_gpu_up{gpu="1",uuid="GPU-y"} 1.0' in first
    assert b'gpufeed_gpu_up{gpu="1",uuid="GPU-y"} 0.0' in second
    assert b'gpufeed_gpu_power_watts{gpu="0",uuid="GPU-x"} 612.345' in second
    assert b'gpufeed_gpu_power_watts{gpu="1"' not in second
    assert b'gpufeed_collector_success{collector="gpu"} 1.0' in second
    assert fake.initialised == 0  # the sampler closed the collector, which shut NVML down
