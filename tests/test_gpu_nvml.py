"""NvmlBackend against a fake libnvidia-ml (tests/nvml_fake.py) installed on the real pynvml.

Each error code NVML can return takes its own path; these tests drive every one of them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from gpufeed.gpu.backend import GpuProcess, GpuSample
from gpufeed.gpu.counters import WrappingCounter
from gpufeed.gpu.nvml import NvmlBackend, NvmlUnavailable
from gpufeed.gpu.select import make_backend
from nvml_fake import ALL_LINKS, GPM_BOGUS, FakeGpu, FakeNvml

UUID0 = "GPU-00000000-1111-2222-3333-444444444444"
UUID1 = "GPU-11111111-1111-2222-3333-444444444444"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Callable[..., FakeNvml]:
    def make(gpus: list[FakeGpu] | None = None, **kw: Any) -> FakeNvml:
        kw.setdefault("clock", clock)
        fake = FakeNvml(gpus if gpus is not None else [FakeGpu(UUID0), FakeGpu(UUID1)], **kw)
        fake.install(monkeypatch.setattr)
        return fake

    return make


@pytest.fixture
def open_backend(clock: Clock) -> Iterator[Callable[..., NvmlBackend]]:
    opened: list[NvmlBackend] = []

    def make(**kw: Any) -> NvmlBackend:
        kw.setdefault("watch_xid", False)
        kw.setdefault("clock", clock)
        backend = NvmlBackend(**kw)
        opened.append(backend)
        return backend

    yield make
    for b in opened:
        b.close()


def by_name(s: GpuSample) -> dict[str, bool]:
    return dict(s.clock_events_active or ())


def test_every_reading_in_base_units(nvml: Any, open_backend: Any, clock: Clock) -> None:
    fake = nvml()
    backend = open_backend()
    clock.now += 1.0
    g0, g1 = backend.sample()
    assert g0.up and g1.up
    assert g0.identity.uuid == UUID0 and g1.identity.index == 1
    assert g0.identity.pci_bus_id == "00000000:18:00.0"
    assert g0.identity.driver_version == "550.54.15"
    assert g0.utilization_ratio == pytest.approx(0.97)
    assert g0.memory_bandwidth_utilization_ratio == pytest.approx(0.41)
    assert g0.memory_used_bytes == 60 * 2**30  # v2: as nvidia-smi, without reserved
    assert g0.memory_reserved_bytes == 512 * 2**20
    assert g0.memory_total_bytes == 80 * 2**30
    assert g0.power_watts == pytest.approx(612.345)
    assert g0.energy_joules_total == pytest.approx(9_876_543.21)
    assert g0.temperature_celsius == 64
    assert g0.sm_clock_hertz == pytest.approx(1.98e9)
    assert g0.sm_active_ratio == pytest.approx(0.83)
    assert g0.sm_occupancy_ratio == pytest.approx(0.45)
    assert g0.tensor_active_ratio == pytest.approx(0.61)
    assert g0.dram_bandwidth_utilization_ratio == pytest.approx(0.38)
    # GPM's PCIe rates times the interval: no traffic yet
    assert backend.pcie_source(0) == "gpm"
    assert g0.pcie_transmit_bytes_total == 0 and g0.pcie_receive_bytes_total == 0
    assert g0.busy_seconds_total == 0.0  # the first sample starts the sum
    assert g0.nvlink_transmit_bytes_total == 3_000 * 1024
    assert g0.nvlink_receive_bytes_total == 4_000 * 1024
    assert by_name(g0) == {
        "gpu_idle": False,
        "applications_clocks_setting": False,
        "sw_power_cap": True,
        "hw_slowdown": False,
        "sync_boost": True,
        "sw_thermal_slowdown": False,
        "hw_thermal_slowdown": False,
        "hw_power_brake_slowdown": False,
        "display_clock_setting": False,
    }
    assert g0.processes == (GpuProcess(4242, 2**30),)
    assert g0.mig_enabled is False
    # a change on the device shows in the next sample (nothing is cached)
    fake.gpus[0].util_gpu = 12
    fake.gpus[0].gpm_sm_util = 7.0
    fake.gpus[0].pcie_rx += 3 * 2**30
    clock.now += 2.0
    g0 = backend.sample()[0]
    assert g0.utilization_ratio == pytest.approx(0.12)
    assert g0.sm_active_ratio == pytest.approx(0.07)
    assert g0.pcie_receive_bytes_total == pytest.approx(3 * 2**30)
    assert g0.busy_seconds_total == pytest.approx(0.12 * 2.0)


def test_field_values_one_batch_per_gpu_and_no_blocking_pcie_call(
    nvml: Any, open_backend: Any
) -> None:
    fake = nvml()
    backend = open_backend()
    probes = fake.calls["nvmlDeviceGetFieldValues"]  # the link count, once per GPU at open
    assert probes == 2
    for _ in range(3):
        backend.sample()
    assert fake.calls["nvmlDeviceGetFieldValues"] == probes + 3 * 2
    batches = fake.field_value_calls[probes:]
    assert [i for i, _ in batches] == [0, 1] * 3
    assert batches[0][1] == [(197, 0), (198, 0), (138, ALL_LINKS), (139, ALL_LINKS)]
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    ],
)
def test_unsupported_value_is_absent_logged_once_and_not_asked_again(
    nvml: Any, open_backend: Any, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    fake = nvml()
    fake.gpus[0].errors["nvmlDeviceGetPowerUsage"] = code
    backend = open_backend()
    caplog.set_level(logging.INFO, logger="gpufeed.gpu.nvml")
    for _ in range(4):
        g0, g1 = backend.sample()
        assert g0.power_watts is None
        assert g0.temperature_celsius == 64  # the rest of the GPU still reports
        assert g1.power_watts == pytest.approx(612.345)  # and the other GPU fully
    # GPU 0 asked once, GPU 1 every time
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1 + 4
    lines = [r.getMessage() for r in caplog.records if "power" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("GPU 0: power not available")


def test_transient_error_leaves_value_out_of_that_sample_only(nvml: Any, open_backend: Any) -> None:
    fake = nvml()
    backend = open_backend()
    fake.gpus[1].errors["nvmlDeviceGetTemperatureV"] = pynvml.NVML_ERROR_TIMEOUT
    assert backend.sample()[1].temperature_celsius is None
    del fake.gpus[1].errors["nvmlDeviceGetTemperatureV"]
    assert backend.sample()[1].temperature_celsius == 64


def test_missing_field_is_dropped_from_later_batches(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0, gpm_supported=False, field_errors={198: 2})])
    backend = open_backend()
    (g,) = backend.sample()
    assert g.pcie_transmit_bytes_total == 111_000 and g.pcie_receive_bytes_total is None
    (g,) = backend.sample()
    assert fake.field_value_calls[-1][1] == [(197, 0), (138, ALL_LINKS), (139, ALL_LINKS)]
    assert g.pcie_receive_bytes_total is None and g.pcie_transmit_bytes_total == 111_000


def test_pcie_only_board_has_nvlink_absent_and_never_asks(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0, nvlink=False)])
    backend = open_backend()
    for _ in range(2):
        (g,) = backend.sample()
        assert g.nvlink_transmit_bytes_total is None and g.nvlink_receive_bytes_total is None
    assert fake.field_value_calls[-1][1] == [(197, 0), (198, 0)]
    assert fake.calls["nvmlDeviceGetNvLinkState"] == 0  # field 91 said 0 links: none probed


def test_driver_refusing_all_links_scope_gets_the_links_summed(
    nvml: Any, open_backend: Any
) -> None:
    fake = nvml([FakeGpu(UUID0, nvlink_aggregate=False, nvlink_links=4)])
    backend = open_backend()
    (g,) = backend.sample()
    assert g.nvlink_transmit_bytes_total is None  # the refused aggregate
    (g,) = backend.sample()
    assert g.nvlink_transmit_bytes_total == 3_000 * 1024
    assert g.nvlink_receive_bytes_total == 4_000 * 1024
    tx_scopes = [scope for fid, scope in fake.field_value_calls[-1][1] if fid == 138]
    # the GPU's own 4 links (field 91), not the library's maximum of 36 probed
    assert tx_scopes == [0, 1, 2, 3]
    assert max(fake.calls.values()) < 20


def test_a_summed_link_that_stops_answering_keeps_its_last_value(
    nvml: Any, open_backend: Any
) -> None:
    fake = nvml([FakeGpu(UUID0, nvlink_aggregate=False, nvlink_links=4)])
    backend = open_backend()
    backend.sample()  # the aggregate is refused: per-link from here
    (g,) = backend.sample()
    assert g.nvlink_transmit_bytes_total == 3_000 * 1024
    # Link 2 dies (refused, then a transient error): the sum neither drops (a false counter
    # reset) nor disappears; it goes on with the live links' traffic.
    fake.gpus[0].link_errors[2] = pynvml.NVML_ERROR_NOT_SUPPORTED
    fake.gpus[0].nvlink_tx_kib = 7_000  # 1 750 KiB per live link now
    (g,) = backend.sample()
    assert g.nvlink_transmit_bytes_total == (3 * 1_750 + 750) * 1024
    fake.gpus[0].link_errors[2] = pynvml.NVML_ERROR_TIMEOUT
    (g,) = backend.sample()
    assert g.nvlink_transmit_bytes_total == (3 * 1_750 + 750) * 1024
    assert g.up and g.nvlink_receive_bytes_total is not None
    del fake.gpus[0].link_errors[2]
    (g,) = backend.sample()
    assert g.nvlink_transmit_bytes_total == 7_000 * 1024


def test_gpu_with_no_active_nvlink_has_nvlink_absent_not_zero(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0, links_down={0, 1, 2, 3}), FakeGpu(UUID1, links_down={1})])
    backend = open_backend()
    g0, g1 = backend.sample()
    assert g0.nvlink_transmit_bytes_total is None and g0.nvlink_receive_bytes_total is None
    assert g1.nvlink_transmit_bytes_total == 3_000 * 1024
    gpu0_batches = [ids for i, ids in fake.field_value_calls if i == 0]
    assert all(fid in (91, 197, 198) for fid, _ in gpu0_batches[-1])


def test_field_values_call_unsupported_stops_asking(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0)])
    fake.gpus[0].errors["nvmlDeviceGetFieldValues"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = open_backend()
    for _ in range(3):
        (g,) = backend.sample()
        assert g.pcie_receive_bytes_total is None
        assert g.utilization_ratio == pytest.approx(0.97)
    # the link-count probe at open, then one refused batch
    assert fake.calls["nvmlDeviceGetFieldValues"] == 2


def test_lost_gpu_is_down_and_the_other_keeps_reporting(nvml: Any, open_backend: Any) -> None:
    fake = nvml()
    backend = open_backend()
    backend.sample()
    fake.gpus[1].lost = True
    g0, g1 = backend.sample()
    assert g0.up and g0.utilization_ratio == pytest.approx(0.97)
    assert not g1.up
    assert g1.identity.uuid == UUID1
    assert (g1.utilization_ratio, g1.power_watts, g1.memory_used_bytes, g1.processes) == (
        None,
        None,
        None,
        (),
    )
    before = fake.calls["nvmlDeviceGetUtilizationRates"]
    g0, g1 = backend.sample()
    assert not g1.up and g0.up
    # the lost GPU is not asked again until re-initialisation
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == before + 1


def test_lost_gpu_comes_back_after_reinit_back_off(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    fake = nvml()
    backend = open_backend(reinit_initial_seconds=5.0, reinit_max_seconds=20.0)
    fake.gpus[1].lost = True
    backend.sample()
    assert backend.next_reinit_at == 1005.0
    inits = fake.init_calls
    clock.now = 1004.9
    assert not backend.sample()[1].up
    assert fake.init_calls == inits  # not yet
    clock.now = 1005.0
    g0, g1 = backend.sample()
    assert fake.init_calls == inits + 1 and not g1.up and g0.up
    assert backend.next_reinit_at == 1015.0  # 5 s doubled to 10 s
    clock.now = 1015.0
    backend.sample()
    assert backend.next_reinit_at == 1035.0  # 20 s, the maximum
    clock.now = 1035.0
    backend.sample()
    assert backend.next_reinit_at == 1055.0  # stays at the maximum
    fake.gpus[1].lost = False
    clock.now = 1055.0
    g0, g1 = backend.sample()
    assert g1.up and g1.utilization_ratio == pytest.approx(0.97) and g0.up
    assert backend.next_reinit_at is None
    assert fake.initialised == 1  # every shutdown matched its init
    # a new loss starts the back-off from the beginning again
    fake.gpus[0].lost = True
    backend.sample()
    assert backend.next_reinit_at == 1060.0


def test_gpu_lost_at_start_up_recovers(nvml: Any, open_backend: Any, clock: Clock) -> None:
    fake = nvml()
    fake.gpus[0].lost = True
    backend = open_backend()
    g0, g1 = backend.sample()
    assert not g0.up and g0.identity.uuid == "" and g1.up
    fake.gpus[0].lost = False
    clock.now += 5
    g0, _ = backend.sample()
    assert g0.up and g0.identity.uuid == UUID0 and g0.power_watts is not None


def test_failed_nvml_reinit_marks_every_gpu_down_then_recovers(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    fake = nvml()
    backend = open_backend()
    fake.gpus[0].lost = True
    backend.sample()
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    clock.now += 5
    assert [s.up for s in backend.sample()] == [False, False]
    fake.init_error = None
    fake.gpus[0].lost = False
    clock.now += 10
    assert [s.up for s in backend.sample()] == [True, True]


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "no NVIDIA driver on this host"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "versions differ"),
    ],
)
def test_no_driver_raises_nvml_unavailable(nvml: Any, code: int, words: str) -> None:
    nvml(init_error=code)
    with pytest.raises(NvmlUnavailable, match=words):
        NvmlBackend()
    choice = make_backend("auto")
    assert choice.backend is None and words in choice.reason
    with pytest.raises(NvmlUnavailable, match=words):
        make_backend("nvml")


def test_no_gpu_raises_nvml_unavailable(nvml: Any) -> None:
    fake = nvml([])
    with pytest.raises(NvmlUnavailable, match="no GPU"):
        NvmlBackend()
    assert fake.initialised == 0


def test_real_library_on_a_host_without_driver() -> None:
    """No fake: the real pynvml on this machine. On a GPU host there is nothing to test."""
    try:
        backend = NvmlBackend(watch_xid=False)
    except NvmlUnavailable as exc:
        assert "libnvidia-ml.so.1" in str(exc) or "driver" in str(exc)
        return
    backend.close()
    pytest.skip("this host has a working NVML")


def test_mig_enabled_gpu_reports_what_nvml_gives(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0, mig_mode=pynvml.NVML_DEVICE_MIG_ENABLE)])
    backend = open_backend()
    (g,) = backend.sample()
    assert g.up and g.mig_enabled is True
    assert g.utilization_ratio is None and g.memory_bandwidth_utilization_ratio is None
    assert g.memory_used_bytes == 60 * 2**30 and g.power_watts is not None
    backend.sample()
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 1
    # MIG switched off (after a GPU reset): utilization is probed again
    fake.gpus[0].mig_mode = 0
    (g,) = backend.sample()
    assert g.mig_enabled is False and g.utilization_ratio == pytest.approx(0.97)


def test_gpu_without_mig_has_mig_absent(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0)])
    fake.gpus[0].errors["nvmlDeviceGetMigMode"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    (g,) = open_backend().sample()
    assert g.mig_enabled is None and g.utilization_ratio == pytest.approx(0.97)


def test_old_driver_uses_throttle_reasons_found_once(nvml: Any, open_backend: Any) -> None:
    fake = nvml(missing={"nvmlDeviceGetCurrentClocksEventReasons"})
    backend = open_backend()
    for _ in range(3):
        g0, g1 = backend.sample()
        assert by_name(g0)["sw_power_cap"] and by_name(g1)["sync_boost"]
    assert fake.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 3 * 2


def test_no_clock_reason_call_at_all_is_absent(nvml: Any, open_backend: Any) -> None:
    nvml(
        missing={
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        }
    )
    g0, g1 = open_backend().sample()
    assert g0.clock_events_active is None and g1.clock_events_active is None
    assert g0.power_watts is not None


def test_processes_fall_back_to_v2(nvml: Any, open_backend: Any) -> None:
    fake = nvml(
        [FakeGpu(UUID0, processes=[(10, 5 * 2**20), (11, None)]), FakeGpu(UUID1, processes=[])],
        missing={"nvmlDeviceGetComputeRunningProcesses_v3"},
    )
    backend = open_backend()
    g0, g1 = backend.sample()
    backend.sample()
    assert g0.processes == (GpuProcess(10, 5 * 2**20), GpuProcess(11, None))
    assert g1.processes == ()
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert fake.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 4


def test_gpm_unsupported_leaves_sm_active_absent(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    fake = nvml([FakeGpu(UUID0, gpm_supported=False), FakeGpu(UUID1)])
    backend = open_backend()
    clock.now += 1
    g0, g1 = backend.sample()
    assert g0.sm_active_ratio is None and g0.utilization_ratio is not None
    assert g1.sm_active_ratio == pytest.approx(0.83)
    backend.close()
    assert fake.gpm_samples_allocated == 0  # both GPM buffers of GPU 1 freed


def wait_for(cond: Callable[[], bool], timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_xid_watcher_counts_and_xid_79_marks_that_gpu_lost(nvml: Any, open_backend: Any) -> None:
    fake = nvml()
    backend = open_backend(watch_xid=True, event_timeout_ms=20)
    assert backend.xid_watched == (0, 1)
    fake.events.put((0, 13))
    fake.events.put((0, 13))
    fake.events.put((1, 79))
    assert wait_for(lambda: backend.sample()[1].up is False)
    g0, g1 = backend.sample()
    assert g0.up and g0.xid_errors_total == ((13, 2),)
    assert g1.xid_errors_total == ((79, 1),)
    assert g1.utilization_ratio is None
    backend.close()
    assert fake.freed_event_sets == 1


def test_xid_watcher_skips_a_gpu_without_events(nvml: Any, open_backend: Any) -> None:
    fake = nvml()
    fake.gpus[0].errors["nvmlDeviceRegisterEvents"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    backend = open_backend(watch_xid=True, event_timeout_ms=20)
    assert backend.xid_watched == (1,)
    fake.events.put((1, 48))
    assert wait_for(lambda: backend.sample()[1].xid_errors_total == ((48, 1),))


def test_xid_watcher_does_not_block_sampling(nvml: Any, open_backend: Any) -> None:
    fake = nvml()
    fake.release_waits.clear()  # the watcher's nvmlEventSetWait now blocks "in the driver"
    backend = open_backend(watch_xid=True, event_timeout_ms=20)
    assert fake.in_wait.wait(3.0)
    samples = [backend.sample() for _ in range(3)]  # would hang here if sampling waited
    assert all(s.up for batch in samples for s in batch)
    fake.release_waits.set()


def test_gpu_lost_while_setting_up_gpm_does_not_stop_the_backend(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    fake = nvml()
    fake.gpus[1].errors["nvmlGpmQueryDeviceSupport"] = pynvml.NVML_ERROR_GPU_IS_LOST
    backend = open_backend()
    clock.now += 1
    g0, g1 = backend.sample()
    assert g0.up and g0.sm_active_ratio == pytest.approx(0.83)
    assert not g1.up


def test_sample_after_close_is_empty(nvml: Any, open_backend: Any) -> None:
    fake = nvml()
    backend = open_backend()
    backend.close()
    assert backend.sample() == []
    assert fake.initialised == 0


def test_driver_without_event_wait_stops_the_watcher_not_the_backend(
    nvml: Any, open_backend: Any
) -> None:
    fake = nvml(missing={"nvmlEventSetWait_v2"})
    backend = open_backend(watch_xid=True, event_timeout_ms=20)
    assert wait_for(lambda: fake.calls["nvmlEventSetWait_v2"] >= 1)
    g0, g1 = backend.sample()
    assert g0.up and g1.up and g0.xid_errors_total == ()
    time.sleep(0.1)
    assert fake.calls["nvmlEventSetWait_v2"] == 1  # gave up instead of spinning


# -- issue 15: NVML semantics, each reproduced on the fake ---------------------------------


def test_32_bit_pcie_fields_without_gpm_are_absent_not_undercounted(
    nvml: Any, open_backend: Any, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    # No GPM (pre-Hopper) and 32-bit fields: read once per 1 s sample, 10 GiB a second is
    # 2.5 turns of the field between reads, and only the remainder would be counted (an
    # undercount that looks like a plausible rate). The counters are left out instead.
    gpu = FakeGpu(UUID0, gpm_supported=False, pcie_width_bits=32, pcie_rx=2**32 - 1000)
    fake = nvml([gpu])
    backend = open_backend()
    with caplog.at_level(logging.INFO, logger="gpufeed.gpu.nvml"):
        for _ in range(5):
            gpu.pcie_rx += 10 * 2**30
            gpu.pcie_tx += 10 * 2**30
            clock.now += 1.0
            (g,) = backend.sample()
            assert g.pcie_receive_bytes_total is None and g.pcie_transmit_bytes_total is None
            assert g.utilization_ratio is not None  # the rest of the GPU is still read
    assert backend.pcie_source(0) is None
    said = [r.getMessage() for r in caplog.records if "PCIe byte counters left out" in r.message]
    assert len(said) == 1 and "32 bits" in said[0], said  # said once, not per sample
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_the_wrapping_counter_keeps_every_turn_it_is_read_within() -> None:
    # The 64-bit unwrapper the wide fields go through (and the truth check uses): a 32-bit
    # raw value read at least once per turn loses nothing; the value type says 32 bits
    # before a value could.
    counter, true = WrappingCounter(), 2**32 - 1000
    start = counter.update(true % 2**32, 32)
    for _ in range(20):
        true += 3_000_000_000
        assert counter.update(true % 2**32, 32) == start + true - (2**32 - 1000)
    wide = WrappingCounter()
    wide.update(5 * 2**32)
    assert wide.update(6 * 2**32 + 7) == 6 * 2**32 + 7  # 64 bits: more than a 32-bit turn


def test_pcie_field_wider_than_32_bits_is_not_taken_for_a_wrap(
    nvml: Any, open_backend: Any
) -> None:
    gpu = FakeGpu(UUID0, gpm_supported=False, pcie_tx=5 * 2**32)
    nvml([gpu])
    backend = open_backend()
    assert backend.sample()[0].pcie_transmit_bytes_total == 5 * 2**32
    gpu.pcie_tx += 2**32 + 7  # more than a 32-bit turn in one interval: only 64 bits can say
    assert backend.sample()[0].pcie_transmit_bytes_total == 6 * 2**32 + 7


def test_pcie_source_waits_for_gpms_first_reading(nvml: Any, open_backend: Any) -> None:
    # The agent's first sample comes right after start-up, before GPM's first 100 ms: the
    # source must not fall to the (wrapping) fields for that reason.
    nvml([FakeGpu(UUID0)])
    backend = open_backend()
    (g,) = backend.sample()
    assert backend.pcie_source(0) is None and g.pcie_receive_bytes_total is None


def test_hopper_pcie_counters_come_from_gpm_rates_immune_to_the_wrap(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    gpu = FakeGpu(UUID0, pcie_width_bits=32)
    nvml([gpu])
    backend = open_backend()
    clock.now += 1.0
    backend.sample()
    assert backend.pcie_source(0) == "gpm"
    gpu.pcie_tx += 25 * 2**32  # 100 GiB in 1 s: 25 turns of the 32-bit field between reads
    clock.now += 1.0
    (g,) = backend.sample()
    assert g.pcie_transmit_bytes_total == pytest.approx(25 * 2**32)
    assert g.pcie_receive_bytes_total == 0


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH,
        pynvml.NVML_ERROR_UNINITIALIZED,
    ],
)
def test_library_lifecycle_error_takes_every_gpu_down_and_reinitialises(
    nvml: Any, open_backend: Any, clock: Clock, code: int
) -> None:
    fake = nvml()
    backend = open_backend(reinit_initial_seconds=5.0)
    assert all(s.up for s in backend.sample())
    fake.library_error = code  # a driver unloaded or upgraded under the agent
    fake.init_error = code
    assert [s.up for s in backend.sample()] == [False, False]  # not "up with nothing"
    assert backend.next_reinit_at == clock.now + 5.0
    clock.now += 5.0
    assert [s.up for s in backend.sample()] == [False, False]
    assert backend.next_reinit_at == clock.now + 10.0  # backing off
    inits = fake.init_calls
    fake.library_error = fake.init_error = None
    clock.now += 10.0
    g0, g1 = backend.sample()
    assert fake.init_calls == inits + 1
    assert g0.up and g1.up and g1.utilization_ratio == pytest.approx(0.97)


@pytest.mark.parametrize(
    "code", [pynvml.NVML_ERROR_RESET_REQUIRED, pynvml.NVML_ERROR_GPU_NOT_FOUND]
)
def test_reset_required_or_not_found_is_that_gpu_lost(
    nvml: Any, open_backend: Any, code: int
) -> None:
    fake = nvml()
    backend = open_backend()
    fake.gpus[1].errors["nvmlDeviceGetPowerUsage"] = code
    g0, g1 = backend.sample()
    assert g0.up and not g1.up and backend.next_reinit_at is not None


def test_gpm_samples_closer_than_100_ms_give_no_bogus_value(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    fake = nvml()
    backend = open_backend(reinit_initial_seconds=5.0)
    clock.now += 1.0
    assert backend.sample()[0].sm_active_ratio == pytest.approx(0.83)
    # GPU 1 is lost: every re-initialisation attempt retakes GPU 0's GPM baseline, and the
    # sample right after reads it a few ms later.
    fake.gpus[1].lost = True
    backend.sample()
    for _ in range(3):
        clock.now += 5.0 * 8  # past any back-off
        g0, _ = backend.sample()  # re-init, then a reading 0 ms after the new baseline
        assert g0.up
        assert g0.sm_active_ratio != pytest.approx(GPM_BOGUS / 100)
        assert g0.sm_active_ratio is None  # absent once, not garbage
        clock.now += 1.0
        assert backend.sample()[0].sm_active_ratio == pytest.approx(0.83)


def test_a_mig_mode_change_retakes_the_gpm_baseline_and_waits_100_ms(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    gpu = FakeGpu(UUID0)
    fake = nvml([gpu])
    backend = open_backend()
    clock.now += 1.0
    assert backend.sample()[0].sm_active_ratio == pytest.approx(0.83)
    for mode in (pynvml.NVML_DEVICE_MIG_ENABLE, pynvml.NVML_DEVICE_MIG_DISABLE):
        allocated, gets = fake.calls["nvmlGpmSampleAlloc"], fake.calls["nvmlGpmMetricsGet"]
        gpu.mig_mode = mode
        clock.now += 1.0
        seen = []
        for _ in range(3):  # the change, then 62.5 and 125 ms after the new baseline
            seen.append(backend.sample()[0].sm_active_ratio)
            clock.now += 0.0625  # exact in binary
        assert fake.calls["nvmlGpmSampleAlloc"] - allocated == 2  # a new session, new baseline
        # No reading over the old session's samples, none over < 100 ms (GPM_BOGUS here):
        # absent until the new baseline is 100 ms old, then the GPU's value.
        assert seen == [None, None, pytest.approx(0.83)], (mode, seen)
        assert fake.calls["nvmlGpmMetricsGet"] - gets == 1
    assert fake.gpm_samples_allocated == 2  # the old sessions' buffers were freed


def test_sampling_faster_than_100_ms_reads_gpm_over_at_least_100_ms(
    nvml: Any, open_backend: Any, clock: Clock
) -> None:
    fake = nvml([FakeGpu(UUID0)])
    backend = open_backend()
    clock.now += 1.0
    backend.sample()
    gets = fake.calls["nvmlGpmMetricsGet"]
    values = []
    for _ in range(10):
        clock.now += 0.0625  # a 62.5 ms sampling interval (exact in binary)
        values.append(backend.sample()[0].sm_active_ratio)
    assert values == [pytest.approx(0.83)] * 10  # the last good reading, never garbage
    assert fake.calls["nvmlGpmMetricsGet"] - gets == 5  # every other sample: 125 ms apart


def test_memory_used_is_v2_and_reserved_separate_with_v1_fallback(
    nvml: Any, open_backend: Any
) -> None:
    nvml()
    (g, _) = open_backend().sample()
    assert g.memory_used_bytes == 60 * 2**30 and g.memory_reserved_bytes == 512 * 2**20


def test_driver_without_memory_v2_reports_v1_used_and_no_reserved(
    nvml: Any, open_backend: Any
) -> None:
    fake = nvml(missing={"nvmlDeviceGetMemoryInfo_v2"})
    backend = open_backend()
    for _ in range(2):
        g, _ = backend.sample()
        assert g.memory_used_bytes == 60 * 2**30 + 512 * 2**20  # v1 counts reserved as used
        assert g.memory_reserved_bytes is None  # unknown, not 0
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 1 + 2 * 2  # v2 tried once, then v1 only


def test_deprecated_temperature_call_is_not_used(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0, temp_deprecated=True)])
    backend = open_backend()
    for _ in range(2):
        assert backend.sample()[0].temperature_celsius == 64
    assert fake.calls["nvmlDeviceGetTemperature"] == 0
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 2


def test_old_driver_without_temperature_v_falls_back_once(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0)], missing={"nvmlDeviceGetTemperatureV"})
    backend = open_backend()
    for _ in range(3):
        assert backend.sample()[0].temperature_celsius == 64
    assert fake.calls["nvmlDeviceGetTemperatureV"] == 1


def test_deprecated_everywhere_is_absent_not_an_error(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0, temp_deprecated=True)], missing={"nvmlDeviceGetTemperatureV"})
    fake.gpus[0].errors["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_DEPRECATED
    backend = open_backend()
    for _ in range(2):
        (g,) = backend.sample()
        assert g.up and g.temperature_celsius is None and g.power_watts is None
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # DEPRECATED: not asked again


def test_only_supported_clock_event_reasons_are_exported(nvml: Any, open_backend: Any) -> None:
    fake = nvml([FakeGpu(UUID0, clock_supported=0x1 | 0x4 | 0x8 | 0x80)])
    backend = open_backend()
    (g,) = backend.sample()
    assert by_name(g) == {
        "gpu_idle": False,
        "sw_power_cap": True,
        "hw_slowdown": False,
        "hw_power_brake_slowdown": False,
    }  # sync_boost is active in the raw mask but unsupported here: absent
    backend.sample()
    assert fake.calls["nvmlDeviceGetSupportedClocksEventReasons"] == 1


def test_newer_reasons_are_exported_where_supported(nvml: Any, open_backend: Any) -> None:
    nvml([FakeGpu(UUID0, clock_supported=0x7FF, clock_mask=0x200), FakeGpu(UUID1)])
    g0, g1 = open_backend().sample()
    assert len(by_name(g0)) == 11 and by_name(g0)["board_limit"]
    assert not by_name(g0)["reliability"] and not by_name(g0)["sw_power_cap"]
    assert "board_limit" not in by_name(g1)  # a GPU that does not support it: absent


def test_unknown_supported_mask_exports_every_known_reason(nvml: Any, open_backend: Any) -> None:
    nvml(
        [FakeGpu(UUID0)],
        missing={
            "nvmlDeviceGetSupportedClocksEventReasons",
            "nvmlDeviceGetSupportedClocksThrottleReasons",
        },
    )
    (g,) = open_backend().sample()
    assert len(by_name(g)) == 9 and by_name(g)["sync_boost"]


def test_busy_seconds_integrate_every_sample(nvml: Any, open_backend: Any, clock: Clock) -> None:
    fake = nvml([FakeGpu(UUID0)])
    backend = open_backend()
    backend.sample()
    # a bursty load: busy one second in three; a 15 s scrape sees one of the gauge values,
    # the counter's increase sees all of them
    for i in range(15):
        fake.gpus[0].util_gpu = 100 if i % 3 == 0 else 0
        clock.now += 1.0
        (g,) = backend.sample()
    assert g.utilization_ratio == 0.0
    assert g.busy_seconds_total == pytest.approx(5.0)
    fake.gpus[0].errors["nvmlDeviceGetUtilizationRates"] = pynvml.NVML_ERROR_TIMEOUT
    clock.now += 10.0
    assert backend.sample()[0].busy_seconds_total == pytest.approx(5.0)  # held, not guessed
    del fake.gpus[0].errors["nvmlDeviceGetUtilizationRates"]
    fake.gpus[0].util_gpu = 100
    clock.now += 1.0
    backend.sample()
    clock.now += 1.0
    assert backend.sample()[0].busy_seconds_total == pytest.approx(6.0)  # the gap not counted


def test_xid_watcher_rebuilds_its_event_set_after_a_wait_error(
    nvml: Any, open_backend: Any
) -> None:
    fake = nvml()
    backend = open_backend(watch_xid=True, event_timeout_ms=20)
    fake.events.put((0, 13))
    assert wait_for(lambda: backend.sample()[0].xid_errors_total == ((13, 1),))
    fake.break_event_set()  # every wait on this set now fails with UNKNOWN
    assert wait_for(lambda: fake.event_sets_created >= 2)
    fake.events.put((1, 48))
    assert wait_for(lambda: backend.sample()[1].xid_errors_total == ((48, 1),))
    assert backend.xid_watched == (0, 1)
