"""The real-GPU truth check's own logic, on the CPU: the verdicts (bench/gpu_truth.py) on
recordings made up to look like a healthy GPU and like the bugs the check exists to catch,
the agent-page parser on a page the real GPU collector renders from the fake NVML, and the raw
NVML reader's calls against the fake."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pynvml
import pytest

from bench import gpu_raw_reader, gpu_smoke
from bench.gpu_truth import (
    GIB,
    MIB,
    AgentPoint,
    Limits,
    Phase,
    RawPoint,
    Recording,
    SmiPoint,
    evaluate,
)
from conftest import ROOT, agent_env
from gpufeed.collectors.gpu import gpu_families
from gpufeed.exposition import render_text
from gpufeed.gpu.nvml import NvmlBackend
from nvml_fake import FakeGpu, FakeNvml

UUID = "GPU-00000000-1111-2222-3333-444444444444"
COPIED = 40 * GIB


def healthy(
    scale_util: float = 1.0,
    pcie_swap: bool = False,
    power_bias: float = 1.0,
    sm_echoes_util: bool = False,
) -> Recording:
    """Two scrapes a second over six phases of a healthy H200, with the chosen defect."""
    phases = [
        Phase("idle", 0, 12),
        Phase("matmul", 16, 46),
        Phase("spin", 50, 65),
        Phase("h2d", 69, 75, bytes_moved=COPIED),
        Phase("d2h", 79, 85, bytes_moved=COPIED),
        Phase("alloc", 89, 99, allocated_bytes=32 * GIB),
    ]
    agent, smi, raw = [], [], []
    busy = energy = rx = tx = 0.0
    field_rx = field_tx = 2**40  # a 64-bit counter well past 2^32
    t = 0.0
    while t < 104:
        ph = next((p.name for p in phases if p.start_seconds <= t < p.end_seconds), "gap")
        util = {"matmul": 1.0, "spin": 1.0}.get(ph, 0.0)
        sm = {"matmul": 0.93, "spin": 0.0076}.get(ph, 0.0)
        if sm_echoes_util:
            sm = util
        power = {"matmul": 690.0, "spin": 160.0}.get(ph, 75.0)
        used = 600 * MIB + (32 * GIB if ph == "alloc" else 0)
        dt = 0.5
        busy += util * dt
        energy += power * dt
        rate = COPIED / 6 * dt
        if ph == "h2d":
            rx += rate
            field_rx += rate
        if ph == "d2h":
            tx += rate
            field_tx += rate
        pr, pt = (tx, rx) if pcie_swap else (rx, tx)
        agent.append(
            AgentPoint(
                t,
                {
                    "utilization": util * scale_util,
                    "sm_active": sm,
                    "busy_seconds": busy,
                    "power_watts": power * power_bias,
                    "energy_joules": energy,
                    "sm_clock_hertz": 1.98e9,
                    "memory_used_bytes": used,
                    "memory_reserved_bytes": 512 * MIB,
                    "pcie_receive_bytes": pr,
                    "pcie_transmit_bytes": pt,
                },
            )
        )
        smi.append(
            SmiPoint(
                t,
                {
                    "utilization": util,
                    "power_watts": power,
                    "sm_clock_hertz": 1.98e9,
                    "memory_used_bytes": used,
                    "memory_reserved_bytes": 512 * MIB,
                },
            )
        )
        raw.append(RawPoint(t, "fields", {"tx": field_tx, "rx": field_rx}))
        t += dt
    return Recording(phases, agent, smi, raw)


def verdicts(rec: Recording) -> dict[str, str]:
    return {line.name: line.verdict for line in evaluate(rec)}


def test_a_healthy_gpu_passes_every_check() -> None:
    got = verdicts(healthy())
    failed = {k: v for k, v in got.items() if v == "FAIL"}
    assert not failed
    for name in (
        "idle.utilization",
        "matmul.utilization",
        "matmul.power_vs_nvidia_smi",
        "matmul.energy_rate_vs_power",
        "matmul.busy_seconds_rate",
        "spin.sm_active",
        "h2d.agent_vs_copied",
        "d2h.agent_vs_copied",
        "h2d.direction",
        "h2d.agent_vs_nvml_field",
        "alloc.used_rise",
        "alloc.used_vs_nvidia_smi",
    ):
        assert got[name] == "PASS", name


@pytest.mark.parametrize(
    ("defect", "fails"),
    [
        ({"scale_util": 0.01}, "matmul.utilization"),  # x100 scale bug
        ({"pcie_swap": True}, "h2d.agent_vs_copied"),  # directions swapped
        ({"pcie_swap": True}, "d2h.direction"),
        ({"power_bias": 1.08}, "matmul.power_vs_nvidia_smi"),
        ({"sm_echoes_util": True}, "spin.sm_active"),  # SM activity that echoes utilization
    ],
)
def test_each_defect_fails_its_check(defect: dict[str, Any], fails: str) -> None:
    assert verdicts(healthy(**defect))[fails] == "FAIL"


def test_32_bit_field_wraps_are_undone_and_named() -> None:
    rec = healthy()
    wrapped = [
        RawPoint(p.t_seconds, p.kind, {k: v % 2**32 for k, v in p.values.items()}) for p in rec.raw
    ]
    lines = {
        line.name: line for line in evaluate(Recording(rec.phases, rec.agent, rec.smi, wrapped))
    }
    assert lines["h2d.agent_vs_nvml_field"].verdict == "PASS"
    assert "32 bits" in lines["h2d.nvml_field_bytes"].detail
    assert "wrap(s) seen" in lines["pcie.field_width"].detail


def test_a_missing_witness_is_skip_not_pass() -> None:
    rec = healthy()
    rec.smi.clear()
    got = verdicts(rec)
    assert got["matmul.power_vs_nvidia_smi"] == "SKIP"
    assert got["idle.utilization"] == "SKIP"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeNvml]:
    def make(gpus: list[FakeGpu]) -> FakeNvml:
        f = FakeNvml(gpus)
        f.install(monkeypatch.setattr)
        return f

    return make


def test_agent_page_parser_reads_what_the_collector_renders(fake: Any) -> None:
    fake([FakeGpu(UUID), FakeGpu("GPU-other")])
    backend = NvmlBackend(watch_xid=False)
    try:
        backend.sample()
        time.sleep(0.12)  # GPM's first interval (>= 100 ms), which the PCIe counters wait for
        page = render_text(gpu_families(backend.sample(), "nvml")).decode()
    finally:
        backend.close()
    values = gpu_smoke.parse_page(page, UUID)
    assert values["utilization"] == pytest.approx(0.97)
    assert values["memory_used_bytes"] == 60 * 2**30
    assert values["memory_reserved_bytes"] == 512 * 2**20
    assert values["energy_joules"] == pytest.approx(9_876_543.21)
    assert "pcie_receive_bytes" in values and "busy_seconds" in values
    assert set(values) <= set(gpu_smoke.FAMILIES.values()) | {"collector_seconds"}


def test_raw_reader_calls_work_against_the_fake(fake: Any) -> None:
    fake([FakeGpu(UUID)])
    nv = pynvml
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByUUID(UUID)
    facts = gpu_raw_reader.facts(nv, h)
    assert facts["temperature_v"] == 64 and facts["gpm_supported"] is True
    gpm = gpu_raw_reader.Gpm(nv, h)
    state = gpu_raw_reader.state(nv, h, gpm)
    assert state["used_v1"] - state["used_v2"] == state["reserved_v2"] == 512 * 2**20
    assert state["utilization"] == pytest.approx(0.97) and "gpm_sm_active" in state
    nv.nvmlShutdown()


H200_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gpu-truth-h200")


def test_the_recorded_h200_run_passes_and_shows_what_it_measured() -> None:
    """The files the check wrote on a real H200 (driver 580.159.04), judged again."""
    lines = {line.name: line for line in evaluate(gpu_smoke.load_recording(Path(H200_RUN)))}
    failed = [str(line) for line in lines.values() if line.verdict == "FAIL"]
    assert not failed
    assert lines["spin.sm_active"].verdict == "PASS"
    assert "32 bits: 177 wrap(s) seen" in lines["pcie.field_width"].detail
    # payload only (no room for PCIe headers) is what the hardware does NOT count
    strict = evaluate(gpu_smoke.load_recording(Path(H200_RUN)), Limits(pcie_overhead_max=0.05))
    assert {line.name for line in strict if line.verdict == "FAIL"} == {
        "h2d.agent_vs_copied",
        "d2h.agent_vs_copied",
    }


# bench/gpu-smoke.sh's way to its agent, on a simulated agent: started in the background by a
# shell on port 0, its port read from its own sockets by `python tests/procports.py PID`.
SHELL_START = """
"$PY" -m gpufeed agent --simulate --web.listen-address 127.0.0.1:0 --config "$DIR/agent.yaml" \\
  --sdk.socket "$DIR/sdk.sock" $EXTRA >"$DIR/agent.log" 2>&1 &
AGENT=$!
trap 'kill $AGENT 2>/dev/null; wait $AGENT 2>/dev/null' EXIT
PORT="$("$PY" tests/procports.py "$AGENT" 30)" || exit 3
echo "$AGENT $PORT"
for _ in $(seq 1 150); do  # 503 until the first sample, as in the script
  "$PY" -c "import sys, urllib.request as u; print(u.urlopen(sys.argv[1]).read().decode())" \\
    "http://127.0.0.1:$PORT/metrics" 2>/dev/null && exit 0
  sleep 0.2
done
exit 4
"""


def smoke_shell(tmp_path: Path, extra: str = "") -> subprocess.CompletedProcess[str]:
    (tmp_path / "agent.yaml").write_text(f"correlator:\n  windows_log: {tmp_path / 'w.jsonl'}\n")
    env = agent_env() | {"PY": sys.executable, "DIR": str(tmp_path), "EXTRA": extra}
    return subprocess.run(
        ["bash", "-c", SHELL_START], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90
    )


def test_the_smoke_scripts_agent_port_is_read_from_the_agent_itself(tmp_path: Path) -> None:
    script = (ROOT / "bench" / "gpu-smoke.sh").read_text()
    assert '--web.listen-address "127.0.0.1:0"' in script
    assert 'tests/procports.py "$AGENT"' in script and "bind((" not in script
    res = smoke_shell(tmp_path)
    assert res.returncode == 0, res.stderr + (tmp_path / "agent.log").read_text()
    head, _, page = res.stdout.partition("\n")
    pid, port = (int(x) for x in head.split())
    assert f"listening on http://127.0.0.1:{port}/metrics" in (tmp_path / "agent.log").read_text()
    assert 'gpufeed_gpu_info{backend="simulated"' in page, page[:300]
    assert pid > 0


def test_an_agent_that_exits_before_listening_is_one_line_not_a_port(tmp_path: Path) -> None:
    res = smoke_shell(tmp_path, extra="--no-such-flag")
    assert res.returncode == 3, res.stdout
    assert re.fullmatch(r"procports: pid \d+ exited before listening\n", res.stderr), res.stderr
