"""The real-GPU truth check, driven by bench/gpu-smoke.sh (which starts the agent on NVML).

Runs six phases on the GPU that torch calls cuda:0, about 100 s in all, while three witnesses
record: the agent's /metrics (scraped every 0.25 s), `nvidia-smi --query-gpu ... -lms 500`,
and a raw NVML reader in its own process (bench/gpu_raw_reader.py). Then bench/gpu_truth.py
judges each phase; every line is PASS, FAIL, SKIP (or INFO) with its numbers.

Phases (bench/gpu_truth.PHASES says what each proves): idle; dense bf16 matmuls; one-thread
kernels back to back (`torch.cuda._sleep`, a <<<1,1>>> spin kernel); pinned host->device then
device->host copies of counted bytes, with idle gaps around them so the counters settle;
a 32 GiB allocation held for a while.

Writes into --out: truth.txt (the verdicts, with the GPU, driver and date), agent.jsonl,
nvidia-smi.csv, nvml.jsonl, phases.json (bench/gpu-smoke.sh adds agent.log).

Exit status: 0 all PASS or SKIP, 1 a FAIL, 2 this machine cannot run the check.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.gpu_truth import (
    GIB,
    MIB,
    PHASES,
    AgentPoint,
    Phase,
    RawPoint,
    Recording,
    SmiPoint,
    evaluate,
    exit_status,
)

HERE = Path(__file__).resolve().parent

# agent family (sample name) -> short name used by gpu_truth
FAMILIES = {
    "gpufeed_gpu_utilization_ratio": "utilization",
    "gpufeed_gpu_busy_seconds_total": "busy_seconds",
    "gpufeed_gpu_sm_active_ratio": "sm_active",
    "gpufeed_gpu_sm_occupancy_ratio": "sm_occupancy",
    "gpufeed_gpu_tensor_active_ratio": "tensor_active",
    "gpufeed_gpu_dram_bandwidth_utilization_ratio": "dram_bandwidth",
    "gpufeed_gpu_memory_bandwidth_utilization_ratio": "memory_time_fraction",
    "gpufeed_gpu_memory_used_bytes": "memory_used_bytes",
    "gpufeed_gpu_memory_reserved_bytes": "memory_reserved_bytes",
    "gpufeed_gpu_memory_total_bytes": "memory_total_bytes",
    "gpufeed_gpu_power_watts": "power_watts",
    "gpufeed_gpu_energy_joules_total": "energy_joules",
    "gpufeed_gpu_sm_clock_hertz": "sm_clock_hertz",
    "gpufeed_gpu_temperature_celsius": "temperature_celsius",
    "gpufeed_gpu_pcie_transmit_bytes_total": "pcie_transmit_bytes",
    "gpufeed_gpu_pcie_receive_bytes_total": "pcie_receive_bytes",
}

# nvidia-smi query field -> (short name, factor to base units); reserved is dropped if this
# nvidia-smi does not know it.
SMI_FIELDS = (
    ("utilization.gpu", "utilization", 0.01),
    ("power.draw", "power_watts", 1.0),
    ("clocks.sm", "sm_clock_hertz", 1e6),
    ("memory.used", "memory_used_bytes", float(MIB)),
    ("memory.total", "memory_total_bytes", float(MIB)),
    ("memory.reserved", "memory_reserved_bytes", float(MIB)),
)


def parse_page(text: str, uuid: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("gpufeed_") or (uuid not in line and "collector=" not in line):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name in FAMILIES and f'uuid="{uuid}"' in name_labels:
            out[FAMILIES[name]] = float(value)
        elif name == "gpufeed_collector_duration_seconds" and 'collector="gpu"' in name_labels:
            out["collector_seconds"] = float(value)
    return out


class Witnesses:
    """The scraper thread, nvidia-smi, and the raw NVML reader process."""

    def __init__(self, url: str, uuid: str, out: Path) -> None:
        self.url, self.uuid, self.out = url, uuid, out
        self.agent: list[AgentPoint] = []
        self.smi: list[SmiPoint] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.procs: list[subprocess.Popen[Any]] = []

    def start(self, seconds: float) -> None:
        raw = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "gpu_raw_reader.py"),
                "--uuid",
                self.uuid,
                "--out",
                str(self.out / "nvml.jsonl"),
                "--seconds",
                str(seconds),
            ]
        )
        self.procs.append(raw)
        fields = [f for f in SMI_FIELDS if _smi_accepts(self.uuid, f[0])]
        smi = subprocess.Popen(
            [
                "nvidia-smi",
                "-i",
                self.uuid,
                "--format=csv,noheader,nounits",
                "-lms",
                "500",
                "--query-gpu=" + ",".join(f[0] for f in fields),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self.procs.append(smi)
        for target, args in ((self._scrape, ()), (self._read_smi, (smi, fields))):
            th = threading.Thread(target=target, args=args, daemon=True)
            th.start()
            self.threads.append(th)

    def _scrape(self) -> None:
        with open(self.out / "agent.jsonl", "w", encoding="utf-8") as f:
            while not self.stop.is_set():
                t = time.time()
                try:
                    with urllib.request.urlopen(self.url, timeout=5) as resp:
                        values = parse_page(resp.read().decode(), self.uuid)
                    self.agent.append(AgentPoint(t, values))
                    f.write(json.dumps({"t": t, **values}) + "\n")
                except OSError as exc:
                    self.errors.append(f"{time.strftime('%H:%M:%S')} scrape failed: {exc}")
                self.stop.wait(max(0.0, 0.25 - (time.time() - t)))

    def _read_smi(self, proc: subprocess.Popen[str], fields: list[tuple[str, str, float]]) -> None:
        assert proc.stdout is not None
        with open(self.out / "nvidia-smi.csv", "w", encoding="utf-8") as f:
            f.write("t," + ",".join(q for q, _, _ in fields) + "\n")
            for line in proc.stdout:
                t = time.time()
                f.write(f"{t:.3f},{line.strip()}\n")
                values: dict[str, float] = {}
                for (_, key, factor), cell in zip(fields, line.split(","), strict=False):
                    try:
                        values[key] = float(cell) * factor
                    except ValueError:
                        continue  # [N/A]
                self.smi.append(SmiPoint(t, values))

    def finish(self) -> list[RawPoint]:
        self.stop.set()
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        for th in self.threads:
            th.join(timeout=10)
        return read_raw(self.out / "nvml.jsonl")


def _smi_accepts(uuid: str, field: str) -> bool:
    got = subprocess.run(
        ["nvidia-smi", "-i", uuid, "--format=csv,noheader,nounits", f"--query-gpu={field}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return got.returncode == 0


def read_raw(path: Path) -> list[RawPoint]:
    out: list[RawPoint] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("kind") in ("fields", "state"):
            values = {k: float(v) for k, v in d.items() if k not in ("t", "kind")}
            out.append(RawPoint(float(d["t"]), d["kind"], values))
    return out


def load_recording(out: Path) -> Recording:
    """A recording from the files a run wrote (for --replay: judge it again)."""
    phases = [Phase(**p) for p in json.loads((out / "phases.json").read_text())]
    agent = []
    for line in (out / "agent.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        t = float(d.pop("t"))
        agent.append(AgentPoint(t, {k: float(v) for k, v in d.items()}))
    smi: list[SmiPoint] = []
    rows = (out / "nvidia-smi.csv").read_text(encoding="utf-8").splitlines()
    by_query = {q: (key, factor) for q, key, factor in SMI_FIELDS}
    columns = [by_query[q] for q in rows[0].split(",")[1:]]
    for row in rows[1:]:
        cells = row.split(",")
        values: dict[str, float] = {}
        for (key, factor), cell in zip(columns, cells[1:], strict=False):
            try:
                values[key] = float(cell) * factor
            except ValueError:
                continue
        smi.append(SmiPoint(float(cells[0]), values))
    raw = read_raw(out / "nvml.jsonl")
    return Recording(phases, agent, smi, raw, raw_facts(out / "nvml.jsonl"))


def raw_facts(path: Path) -> dict[str, object]:
    if not path.exists():
        return {}
    first = path.read_text(encoding="utf-8").split("\n", 1)[0]
    try:
        d = json.loads(first)
    except ValueError:
        return {}
    return d if d.get("kind") == "facts" else {}


# -- the load -------------------------------------------------------------------------------


class Load:
    def __init__(self) -> None:
        import torch

        self.torch = torch
        self.dev = torch.device("cuda:0")
        n = 8192
        self.a = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device=self.dev, dtype=torch.bfloat16)
        _ = self.a @ self.b  # cuBLAS set up before the idle phase
        self.host = torch.empty(GIB, dtype=torch.uint8, pin_memory=True)
        self.host.fill_(7)
        self.device_buf = torch.empty(GIB, dtype=torch.uint8, device=self.dev)
        torch.cuda.synchronize()

    def idle(self, seconds: float) -> Phase:
        start = time.time()
        time.sleep(seconds)
        return Phase("idle", start, time.time())

    def matmul(self, seconds: float) -> Phase:
        start = time.time()
        while time.time() - start < seconds:
            for _ in range(20):
                self.a @ self.b
            self.torch.cuda.synchronize()
        return Phase("matmul", start, time.time())

    def spin(self, seconds: float) -> Phase:
        # one thread, one block: the GPU is "busy" while 131 of 132 SMs idle
        start = time.time()
        while time.time() - start < seconds:
            for _ in range(10):
                self.torch.cuda._sleep(20_000_000)
            self.torch.cuda.synchronize()
        return Phase("spin", start, time.time())

    def copy(self, direction: str, seconds: float) -> Phase:
        src, dst = (
            (self.host, self.device_buf) if direction == "h2d" else (self.device_buf, self.host)
        )
        self.torch.cuda.synchronize()
        start = time.time()
        copies = 0
        while time.time() - start < seconds:
            for _ in range(4):
                dst.copy_(src, non_blocking=True)
            self.torch.cuda.synchronize()
            copies += 4
        end = time.time()
        return Phase(direction, start, end, bytes_moved=float(copies * src.numel()))

    def alloc(self, size_bytes: int, seconds: float) -> Phase:
        start = time.time()
        big = self.torch.empty(size_bytes, dtype=self.torch.uint8, device=self.dev)
        big.fill_(1)
        self.torch.cuda.synchronize()
        time.sleep(seconds)
        end = time.time()
        del big
        self.torch.cuda.empty_cache()
        return Phase("alloc", start, end, allocated_bytes=float(size_bytes))


def nvml_uuid_of_cuda0() -> str:
    """The NVML UUID of torch's cuda:0 (CUDA_VISIBLE_DEVICES may reorder indices)."""
    import torch

    u = str(torch.cuda.get_device_properties(0).uuid)
    return u if u.startswith("GPU-") else f"GPU-{u}"


def run(args: argparse.Namespace) -> int:
    try:
        import torch
    except ImportError:
        print(
            "gpu-smoke: PyTorch is not installed; the load needs torch with CUDA", file=sys.stderr
        )
        return 2
    if not torch.cuda.is_available():
        print("gpu-smoke: torch.cuda.is_available() is False", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    uuid = nvml_uuid_of_cuda0()
    print(f"gpu-smoke: load on cuda:0 = {torch.cuda.get_device_name(0)} ({uuid})", flush=True)
    load = Load()
    s = args.scale
    witnesses = Witnesses(args.url, uuid, out)
    witnesses.start(seconds=200 * s + 60)
    time.sleep(2.0)  # the witnesses' first readings
    gap = 4.0
    phases = [load.idle(12 * s)]
    for step in (
        lambda: load.matmul(30 * s),
        lambda: load.spin(15 * s),
        lambda: load.copy("h2d", 6 * s),
        lambda: load.copy("d2h", 6 * s),
        lambda: load.alloc(int(args.alloc_gib * GIB), 10 * s),
    ):
        phases.append(step())
        print(f"gpu-smoke: phase {phases[-1].name} done", flush=True)
        time.sleep(gap)
    raw = witnesses.finish()
    facts = raw_facts(out / "nvml.jsonl")
    rec = Recording(phases, witnesses.agent, witnesses.smi, raw, facts)
    lines = evaluate(rec)
    header = [
        f"# gpufeed GPU truth check, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        f"# GPU: {facts.get('name')} {uuid}; driver {facts.get('driver')}; "
        f"CUDA driver {facts.get('cuda_driver_version')}; torch {torch.__version__}",
        f"# agent scrapes: {len(witnesses.agent)} (failed {len(witnesses.errors)}); "
        f"nvidia-smi lines: {len(witnesses.smi)}; raw NVML readings: {len(raw)}",
        f"# agent PCIe source: {pcie_source(Path(args.agent_log)) if args.agent_log else '?'}",
        *[f"# phase {p.name}: {PHASES[p.name]}" for p in phases],
        *[f"# fact {k}: {v}" for k, v in facts.items() if k not in ("t", "kind")],
    ]
    for p in phases:
        if p.bytes_moved:
            header.append(
                f"# {p.name}: {p.bytes_moved / GIB:.0f} GiB in {p.end_seconds - p.start_seconds:.2f} s"
                f" = {p.bytes_moved / (p.end_seconds - p.start_seconds) / 1e9:.1f} GB/s"
            )
    coll = [
        a.values["collector_seconds"] for a in witnesses.agent if "collector_seconds" in a.values
    ]
    if coll:
        coll.sort()
        header.append(
            f"# agent gpu collector duration: median {coll[len(coll) // 2] * 1000:.2f} ms"
        )
    text = "\n".join(header + [str(line) for line in lines]) + "\n"
    (out / "truth.txt").write_text(text, encoding="utf-8")
    (out / "phases.json").write_text(json.dumps([asdict(p) for p in phases], indent=1))
    print(text, end="")
    for e in witnesses.errors[:5]:
        print(e, file=sys.stderr)
    if len(witnesses.agent) < 10:
        print("gpu-smoke: the agent answered too few scrapes to judge", file=sys.stderr)
        return 2
    return exit_status(lines)


def pcie_source(log: Path) -> str:
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "?"
    for line in text.splitlines():
        if "PCIe byte counters from" in line:
            return line.rsplit("from", 1)[1].strip()
    return "none logged"


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--url", help="the agent's /metrics URL")
    ap.add_argument(
        "--replay",
        metavar="DIR",
        help="judge the files an earlier run wrote into DIR again (no GPU needed)",
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-smoke-out"))
    ap.add_argument("--agent-log", default="", help="the agent's log (for its PCIe source)")
    ap.add_argument("--scale", type=float, default=1.0, help="phase lengths x this")
    ap.add_argument("--alloc-gib", type=float, default=32.0)
    args = ap.parse_args()
    if args.replay:
        lines = evaluate(load_recording(Path(args.replay)))
        print("\n".join(str(line) for line in lines))
        return exit_status(lines)
    if not args.url:
        ap.error("--url is required (or --replay DIR)")
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
