"""GPUDirect Storage statistics (/proc/driver/nvidia-fs/stats): the parser on fixtures built
from the documented format (tests/fixtures/nvidia_fs/README.md), and the collector: absent
(not zero) where the driver is not loaded, one clear error where the file is garbled."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from gpufeed.collectors.base import PartialCollectionError
from gpufeed.collectors.gds import GdsCollector
from gpufeed.correlator.engine.names import Feature as F
from gpufeed.hostpaths import HostPaths
from gpufeed.model import iter_samples
from gpufeed.procfs.nvidia_fs import MIB, GdsGpu, GdsOp, parse_nvidia_fs_stats
from test_correlator_cache import INST, run
from test_correlator_evidence import FAULT, in_fault

FIX = Path(__file__).parent / "fixtures" / "nvidia_fs"


@pytest.mark.parametrize(
    ("name", "reads", "writes", "gpus"),
    [
        (
            "guide-sample.txt",
            GdsOp(0, 0, 0, 0, 0, 0.0, 0.0),
            GdsOp(0, 0, 0, 0, 0, 0.0, 0.0),
            ("87e5c586-88ed-583b-df45-fcee0f1e7917", "029faa3b-cb0d-2718-259c-6dc650c636eb",
             "3ce1b8c4-01a2-4b5c-9d7e-0f1a2b3c4d5e"),
        ),
        (
            "io-enabled.txt",
            GdsOp(1200, 1198, 2, 1, 4800 * MIB, 41e-6, 2400.0 * MIB),
            GdsOp(300, 300, 0, 0, 600 * MIB, 95e-6, 150.0 * MIB),
            ("5a1f0c2e-7b3d-4e8f-9a6b-1c2d3e4f5a6b", "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"),
        ),
        (
            # IO stats disabled: no counts, bytes or latency (absent, not zero); errors stay
            "io-disabled.txt",
            GdsOp(None, None, 0, 0, None, None, None),
            GdsOp(None, None, 1, 0, None, None, None),
            (),
        ),
    ],
)  # fmt: skip
def test_parse(name: str, reads: GdsOp, writes: GdsOp, gpus: tuple[str, ...]) -> None:
    stats = parse_nvidia_fs_stats((FIX / name).read_text())
    assert stats.reads == reads
    assert stats.writes == writes
    assert tuple(g.uuid for g in stats.gpus) == gpus


def test_per_gpu_memory() -> None:
    stats = parse_nvidia_fs_stats((FIX / "io-enabled.txt").read_text())
    assert stats.gpus[1] == GdsGpu(
        "0000:3b:00.0", "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b", 128 * MIB, 64 * MIB
    )


def test_garbled_file_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=re.escape("no 'Reads : ... err=N' line")):
        parse_nvidia_fs_stats((FIX / "garbled.txt").read_text())


def _proc(tmp_path: Path, fixture: str | None) -> HostPaths:
    proc = tmp_path / "proc"
    proc.mkdir()
    if fixture is not None:
        (proc / "driver" / "nvidia-fs").mkdir(parents=True)
        shutil.copy(FIX / fixture, proc / "driver" / "nvidia-fs" / "stats")
    return HostPaths(procfs=proc)


def test_collector_exports_the_driver_io(tmp_path: Path) -> None:
    got = {
        (s.name, s.labels): s.value
        for s in iter_samples(GdsCollector(_proc(tmp_path, "io-enabled.txt")).collect())
    }
    assert got[("gpufeed_storage_gds_bytes_total", (("op", "read"),))] == 4800 * MIB
    assert got[("gpufeed_storage_gds_operations_total", (("op", "write"),))] == 300
    assert got[("gpufeed_storage_gds_errors_total", (("kind", "io"), ("op", "read")))] == 2
    assert got[("gpufeed_storage_gds_latency_seconds", (("op", "read"),))] == 41e-6
    bounce = (("pci_bus_id", "0000:3b:00.0"), ("uuid", "GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"))
    assert got[("gpufeed_storage_gds_gpu_bounce_buffer_bytes", bounce)] == 64 * MIB


def test_no_driver_no_families(tmp_path: Path) -> None:
    fams = GdsCollector(_proc(tmp_path, None)).collect()
    assert list(iter_samples(fams)) == []


def test_disabled_io_stats_leave_counts_out(tmp_path: Path) -> None:
    names = {
        s.name for s in iter_samples(GdsCollector(_proc(tmp_path, "io-disabled.txt")).collect())
    }
    assert names == {"gpufeed_storage_gds_errors_total"}


def test_garbled_file_fails_the_collector_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(PartialCollectionError, match="nvidia-fs/stats: no 'Reads"):
        GdsCollector(_proc(tmp_path, "garbled.txt")).collect()


# ---- the correlator: GDS reads explain a data stall ----------------------------------------
def _gds_reads(s: float) -> list[tuple[str, float | None]]:
    """GDS reads, s seconds into the trace: 500 a second at 40 us, and in the stall 2.5 ms
    with 3 failing a second."""
    failed = max(0.0, min(s, FAULT[1]) - FAULT[0]) * 3.0
    return [
        (f'gpufeed_storage_gds_operations_total{{op="read",{INST}}}', s * 500.0),
        (
            f'gpufeed_storage_gds_latency_seconds{{op="read",{INST}}}',
            2.5e-3 if in_fault(s) else 4e-5,
        ),
        (f'gpufeed_storage_gds_errors_total{{op="read",kind="io",{INST}}}', failed),
        (f'gpufeed_storage_gds_errors_total{{op="write",kind="io",{INST}}}', 0.0),
    ]


def test_a_data_stall_says_how_gpudirect_storage_reads_fare(tmp_path: Path) -> None:
    summary, ev = run(tmp_path, fault_hit=0.95, fault_evicted=0.0, extra_at=_gds_reads)
    assert 2.0e-3 < float(ev[F.GDS_READ_LATENCY_SECONDS]) <= 2.5e-3, ev
    assert 2.0 < float(ev[F.GDS_READ_ERRORS_PER_SECOND]) <= 3.0, ev
    assert "GPUDirect Storage" in summary, summary


def test_a_node_without_gds_reads_says_nothing_of_gds(tmp_path: Path) -> None:
    summary, ev = run(tmp_path, fault_hit=0.95, fault_evicted=0.0)
    assert not [k for k in ev if k.startswith("gds_")] and "GPUDirect" not in summary, ev
