"""The simulated node's physics: a pure function of elapsed time, the scenario and a seed.

Time is cut into cells of `resolution_seconds` of elapsed (wall) time. For each cell the
engine looks up what every job is doing (its phase, at scenario time = elapsed x pace),
derives every gauge and every counter's rate from that and from a per-cell random stream,
and integrates the counters. A reading at time t is the gauges of t's cell and the counters
integrated up to t, so counters never decrease, and rates seen by Prometheus are physical
(bytes per wall second) at any pace: pace compresses the scenario's timeline, it does not
inflate rates.

Because cell k's values depend only on (seed, k, the state after cell k-1), the same seed
and the same query times give byte-identical output, whatever the order of queries.
"""

from __future__ import annotations

import math
import random
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from gpufeed.simulate import layout as L
from gpufeed.simulate.scenario import CLOCK_EVENT_REASONS, JobSpec, PhaseSpec, Scenario

_MASK = (1 << 64) - 1
_REASON_INDEX = {r: i for i, r in enumerate(CLOCK_EVENT_REASONS)}
CAUSE_OF_PHASE = {
    "compute": None,
    "startup": "startup",
    "data_loading": "data_loading",
    "preprocessing": "preprocessing",
    "checkpointing": "checkpointing",
    "network": "network",
    "throttling": "throttling",
    "gpu_error": "gpu_error",
    "idle": "idle",
}


def mix(*parts: int) -> int:
    """A stable 64-bit hash of integers (FNV-1a style); never Python's salted hash()."""
    h = 0xCBF29CE484222325
    for p in parts:
        h = ((h ^ (p & _MASK)) * 0x100000001B3) & _MASK
        h ^= h >> 29
    return h


@dataclass(frozen=True, slots=True)
class Truth:
    """What is really going on with one GPU: the label the correlator should find.

    `cause` is a contract cause (`data_loading`, ..., `idle`, `gpu_error`) or None when the
    GPU is healthy; `confounder` names a healthy-but-alarming event (`busy_tier`,
    `short_dip`, `thermal_full_util`) that must not open a window.
    """

    cause: str | None
    job_id: str
    phase: str
    guise: str = ""
    confounder: str = ""


@dataclass(slots=True)
class _JobNow:
    """What one job does during one cell (scenario-time lookups resolved)."""

    present: bool
    phase: PhaseSpec | None
    instance: int
    t_in_phase: float  # scenario seconds since the phase began
    params: list[float]  # per phase-instance random draws in [0, 1)


@dataclass(slots=True)
class _State:
    k: int  # the next cell to integrate
    cum: list[float]
    temps: list[float]
    last_epoch_end: list[float]
    gauges: list[float]  # gauges of cell k-1 (the latest computed)
    incs: list[float]  # increments of cell k-1


class Engine:
    """Computes cells on demand and remembers recent ones; thread-safe."""

    HISTORY_CELLS = 64  # enough for collectors reading the same instant a little apart

    def __init__(
        self, scenario: Scenario, seed: int, *, pace: float = 1.0, resolution_seconds: float = 1.0
    ) -> None:
        if pace <= 0:
            raise ValueError("pace must be positive")
        if resolution_seconds <= 0:
            raise ValueError("resolution_seconds must be positive")
        self.scenario = scenario
        self.seed = seed
        self.pace = pace
        self.res = resolution_seconds
        self.layout = L.Layout(scenario)
        self._lock = threading.Lock()
        s = scenario
        self._tier_index = {t.name: i for i, t in enumerate(s.tiers)}
        self._ib_ports = [i for i, p in enumerate(s.ports) if p.fabric != "ethernet"]
        self._eth_ports = [i for i, p in enumerate(s.ports) if p.fabric == "ethernet"]
        self._starts: list[list[float]] = []
        for job in s.jobs:
            acc, starts = 0.0, []
            for ph in job.phases:
                starts.append(acc)
                acc += ph.seconds
            self._starts.append(starts)
        self._cycle = s.cycle_seconds
        self._periods = [job.period_seconds for job in s.jobs]
        self._job_of_gpu = [-1] * s.node.gpus
        for j, job in enumerate(s.jobs):
            for g in job.gpus:
                self._job_of_gpu[g] = j
        # a job's working set on its GPUs, fixed per job and seed
        self._working_set = [
            random.Random(mix(seed, 7, j)).uniform(0.62, 0.9) for j in range(len(s.jobs))
        ]
        self._params: dict[tuple[int, int], list[float]] = {}
        self._history: deque[_State] = deque(maxlen=self.HISTORY_CELLS)
        self._history.append(self._initial())

    # ---- schedule lookups (scenario time) -------------------------------------------------

    def _job_now(self, j: int, tau: float) -> _JobNow:
        job = self.scenario.jobs[j]
        period = self._periods[j]
        if not self.scenario.repeat and tau >= period:
            return _JobNow(False, None, -1, 0.0, [])
        cycle, t = divmod(tau, period)
        i = bisect_right(self._starts[j], t) - 1
        ph = job.phases[i]
        inst = int(cycle) * len(job.phases) + i
        params = self._params.get((j, inst))
        if params is None:
            if len(self._params) > 4096:
                self._params.clear()
            rng = random.Random(mix(self.seed, 2, j, inst))
            params = self._params[(j, inst)] = [rng.random() for _ in range(8)]
        return _JobNow(ph.phase != "idle", ph, inst, t - self._starts[j][i], params)

    def _events_now(self, tau: float) -> list[tuple[int, float, list[float]]]:
        out: list[tuple[int, float, list[float]]] = []
        if not self.scenario.repeat and tau >= self._cycle:
            return out
        cycle, t = divmod(tau, self._cycle)
        for e, ev in enumerate(self.scenario.events):
            if ev.at_seconds <= t < ev.at_seconds + ev.seconds:
                rng = random.Random(mix(self.seed, 3, e, int(cycle)))
                out.append((e, t - ev.at_seconds, [rng.random() for _ in range(4)]))
        return out

    # ---- ground truth ----------------------------------------------------------------------

    def ground_truth(self, elapsed_seconds: float) -> dict[int, Truth]:
        """The true state of every GPU at an elapsed time (not a metric; for labelling)."""
        k = max(0, int(elapsed_seconds // self.res))
        tau = k * self.res * self.pace
        jobs = [self._job_now(j, tau) for j in range(len(self.scenario.jobs))]
        events = self._events_now(tau)
        out: dict[int, Truth] = {}
        for g in range(self.scenario.node.gpus):
            j = self._job_of_gpu[g]
            if j < 0 or not jobs[j].present:
                out[g] = Truth("idle", "", "idle")
                continue
            now = jobs[j]
            ph = now.phase
            assert ph is not None
            job_id = self.scenario.jobs[j].job_id
            confounder = ""
            if ph.phase == "compute":
                for e, _, _ in events:
                    ev = self.scenario.events[e]
                    if ev.kind == "dip" and ev.job_id == job_id:
                        confounder = "short_dip"
                    elif ev.kind == "thermal" and (ev.job_id == job_id or g in ev.gpus):
                        confounder = confounder or "thermal_full_util"
                    elif ev.kind == "busy_tier":
                        confounder = confounder or "busy_tier"
            out[g] = Truth(CAUSE_OF_PHASE[ph.phase], job_id, ph.phase, ph.guise, confounder)
        return out

    # ---- integration -----------------------------------------------------------------------

    def _initial(self) -> _State:
        lay = self.layout
        n = self.scenario.node
        cum = [0.0] * lay.n_counters
        boot = random.Random(mix(self.seed, 5))
        # counters start where a node up for a while would be, not at zero
        uptime = boot.uniform(2e5, 4e6)
        for g in range(lay.n_gpus):
            cum[lay.gc(g, L.C_ENERGY)] = uptime * n.gpu_idle_power_watts * boot.uniform(1.5, 4)
            cum[lay.gc(g, L.C_PCIE_TX)] = uptime * boot.uniform(1e8, 1e9)
            cum[lay.gc(g, L.C_PCIE_RX)] = uptime * boot.uniform(1e8, 2e9)
            cum[lay.gc(g, L.C_NVL_TX)] = uptime * boot.uniform(1e9, 2e10)
            cum[lay.gc(g, L.C_NVL_RX)] = cum[lay.gc(g, L.C_NVL_TX)] * boot.uniform(0.98, 1.02)
        for t, tier in enumerate(self.scenario.tiers):
            r_ops = (
                uptime * boot.uniform(0.02, 0.2) * tier.read_bytes_per_second / tier.request_bytes
            )
            w_ops = (
                uptime * boot.uniform(0.01, 0.1) * tier.write_bytes_per_second / tier.request_bytes
            )
            cum[lay.tc(t, L.T_READS)] = r_ops
            cum[lay.tc(t, L.T_WRITES)] = w_ops
            cum[lay.tc(t, L.T_READ_B)] = r_ops * tier.request_bytes
            cum[lay.tc(t, L.T_WRITE_B)] = w_ops * tier.request_bytes
            cum[lay.tc(t, L.T_READ_T)] = r_ops * tier.read_latency_seconds * 1.3
            cum[lay.tc(t, L.T_WRITE_T)] = w_ops * tier.write_latency_seconds * 1.3
            cum[lay.tc(t, L.T_IO_W)] = cum[lay.tc(t, L.T_READ_T)] + cum[lay.tc(t, L.T_WRITE_T)]
            cum[lay.tc(t, L.T_IO_T)] = cum[lay.tc(t, L.T_IO_W)] * 0.7
        for p, port in enumerate(self.scenario.ports):
            cum[lay.pc(p, L.P_RX)] = uptime * port.speed_bytes_per_second * boot.uniform(0.02, 0.2)
            cum[lay.pc(p, L.P_TX)] = uptime * port.speed_bytes_per_second * boot.uniform(0.02, 0.2)
            if port.counts_transmit_wait:
                cum[lay.pc(p, L.P_WAIT)] = uptime * boot.uniform(1e-3, 1e-2)
        cpus = n.cpus
        shares = (0.18, 0.04, 0.01, 0.76, 0.001, 0.008, 0.0, 0.001)
        for i, share in enumerate(shares):
            cum[lay.hc(L.H_CPU + i)] = uptime * cpus * share
        for i in range(len(L.PRESSURE_SOME)):
            cum[lay.hc(L.H_SOME + i)] = uptime * boot.uniform(0.005, 0.03)
        for i in range(len(L.PRESSURE_FULL)):
            cum[lay.hc(L.H_FULL + i)] = uptime * boot.uniform(0.001, 0.01)
        temps = [32.0 + boot.uniform(-2, 2) for _ in range(lay.n_gpus)]
        return _State(0, cum, temps, [0.0] * lay.n_jobs, [], [])

    def _advance(self, st: _State) -> _State:
        gauges, incs, temps, epochs = self._cell(st)
        cum = [c + d for c, d in zip(st.cum, incs, strict=True)]
        return _State(st.k + 1, cum, temps, epochs, gauges, incs)

    def _state_after(self, k: int) -> _State:
        """The state once cells 0..k have been integrated (so gauges/incs are cell k's)."""
        hist = self._history
        if k + 1 < hist[0].k:  # older than the history: replay from the start, deterministic
            hist.clear()
            hist.append(self._initial())
        if k + 1 <= hist[-1].k:
            return hist[k + 1 - hist[0].k]
        st = hist[-1]
        while st.k <= k:
            st = self._advance(st)
            hist.append(st)
        return st

    def values_at(self, elapsed_seconds: float) -> tuple[list[float], list[float], int]:
        """(gauges, counters, cell) at an elapsed time; counters are interpolated in-cell."""
        t = max(0.0, elapsed_seconds)
        k = int(t // self.res)
        with self._lock:
            st = self._state_after(k)
        frac = (t - k * self.res) / self.res
        ev = self.layout.event_counter
        # st.cum is the total after cell k; go back by the part of cell k not yet elapsed
        counters = [
            c if e else c - (1.0 - frac) * d for c, d, e in zip(st.cum, st.incs, ev, strict=True)
        ]
        return st.gauges, counters, k

    def iter_cells(self, count: int) -> Iterator[tuple[list[float], list[float]]]:
        """Gauges and counters at the start of each of the first `count` cells (trace path)."""
        st = self._initial()
        for _ in range(count):
            nxt = self._advance(st)
            yield nxt.gauges, st.cum
            st = nxt

    def presence(self, k: int) -> tuple[list[bool], list[bool]]:
        """(gpu up, job present) during cell k."""
        tau = k * self.res * self.pace
        jobs = [self._job_now(j, tau) for j in range(len(self.scenario.jobs))]
        up = [True] * self.scenario.node.gpus
        for j, now in enumerate(jobs):
            if now.present and now.phase is not None and now.phase.phase == "gpu_error":
                up[_lost_gpu(self.scenario.jobs[j], now.phase)] = False
        return up, [now.present for now in jobs]

    # ---- one cell of physics ---------------------------------------------------------------

    def _cell(self, st: _State) -> tuple[list[float], list[float], list[float], list[float]]:
        s, lay, n = self.scenario, self.layout, self.scenario.node
        k, dt = st.k, self.res
        tau = k * dt * self.pace
        step_tau = dt * self.pace
        rng = random.Random(mix(self.seed, 1, k))
        unif, rnd = rng.uniform, rng.random

        def gauss(mu: float, sd: float) -> float:
            # a sum of three uniforms: close enough to normal for noise, and 10x cheaper
            return mu + sd * 2.0 * (rnd() + rnd() + rnd() - 1.5)

        gauges = [0.0] * lay.n_gauges
        incs = [0.0] * lay.n_counters
        jobs = [self._job_now(j, tau) for j in range(len(s.jobs))]
        events = self._events_now(tau)
        epochs = list(st.last_epoch_end)

        n_tiers = len(s.tiers)
        tier_read = [t.background_read_bytes_per_second * unif(0.6, 1.4) for t in s.tiers]
        tier_write = [t.background_write_bytes_per_second * unif(0.6, 1.4) for t in s.tiers]
        tier_lat_mult = [1.0] * n_tiers
        tier_saturated = [False] * n_tiers
        cpu = {"user": 0.8, "system": 0.4, "iowait": 0.02, "irq": 0.05, "softirq": 0.1,
               "steal": 0.0, "nice": 0.02}  # fmt: skip
        psi_cpu = unif(0.005, 0.03)
        psi_io = unif(0.002, 0.015)
        psi_io_full = psi_io * unif(0.2, 0.5)
        port_frac = [unif(0.002, 0.01) for _ in s.ports]
        port_wait = [unif(0.0005, 0.004) for _ in s.ports]
        mem_used_host = 0.0

        # busy-tier confounder: another tenant drives a tier to its ceiling
        for e, _, ep in events:
            ev = s.events[e]
            if ev.kind == "busy_tier":
                t = self._tier_index[ev.tier]
                tier_read[t] = s.tiers[t].read_bytes_per_second * (0.6 + 0.4 * ep[0])
                tier_write[t] = s.tiers[t].write_bytes_per_second * 0.3 * ep[1]
                tier_lat_mult[t] = max(tier_lat_mult[t], 2.5 + 3 * ep[2])
                tier_saturated[t] = True

        gpu_util = [0.0] * n.gpus
        gpu_clock = [1.0] * n.gpus
        gpu_reason: list[str] = [""] * n.gpus
        gpu_mem = [0.0] * n.gpus
        gpu_nvl = [0.0] * n.gpus
        gpu_pcie_rx = [0.0] * n.gpus
        gpu_pcie_tx = [0.0] * n.gpus
        gpu_up = [True] * n.gpus
        gpu_power_cap = [False] * n.gpus
        xid_gpu = -1

        for j, now in enumerate(jobs):
            job = s.jobs[j]
            if not now.present or now.phase is None:
                continue
            ph, p = now.phase, now.params
            ng = len(job.gpus)
            phase = ph.phase
            data_t = self._tier_index[job.data_tier]
            ckpt_t = self._tier_index[job.checkpoint_tier]
            dtier = s.tiers[data_t]
            healthy_read = job.data_read_bytes_per_second or min(
                3e9, 0.25 * dtier.read_bytes_per_second
            )
            # phase-level (per instance) level of utilization and how noisy it is
            util, sd, hi = 0.0, 0.0, 0.72
            sdk = dict.fromkeys(L.SDK_PHASES, 0.0)
            ib, wait, nvl = unif(0.25, 0.4), unif(0.001, 0.006), unif(0.12, 0.2)
            reads: list[tuple[int, float]] = []
            writes: list[tuple[int, float]] = []
            clock, reason = 1.0, ""
            mem = self._working_set[j]
            rx = tx = 0.0  # PCIe per GPU
            u_cpu, s_cpu, w_cpu, si_cpu = 1.5 * ng, 0.3 * ng, 0.02 * ng, 0.05 * ng
            if phase == "compute":
                util, sd, hi = 0.93 + 0.045 * p[0], 0.015, 1.0
                sdk.update(compute=0.9, data_wait=0.03, communication=0.05, other=0.02)
            elif phase == "startup":
                util, sd = 0.06 * p[0], 0.02
                frac = min(1.0, now.t_in_phase / max(1.0, 0.6 * ph.seconds))
                mem = 0.03 + (mem - 0.03) * frac
                src = self._tier_index[ph.tier] if ph.tier else ckpt_t
                rate = s.tiers[src].read_bytes_per_second * (0.45 + 0.3 * p[1])
                reads.append((src, rate))
                rx = min(n.pcie_bytes_per_second * 0.8, rate / ng)
                sdk["startup"] = 1.0
                ib, nvl = 0.005, 0.002
                u_cpu, s_cpu, w_cpu = 1.0 * ng, 0.5 * ng, 0.5 * ng
                epochs[j] = (k + 1) * dt  # the first epoch is timed from training start
            elif phase == "data_loading":
                src = self._tier_index[ph.tier] if ph.tier else data_t
                tier = s.tiers[src]
                util, sd = 0.08 + 0.3 * p[0], 0.05
                if ph.guise == "contended":
                    rate = tier.read_bytes_per_second * (0.02 + 0.08 * p[1])
                    tier_lat_mult[src] = max(tier_lat_mult[src], 10 + 30 * p[2])
                else:
                    rate = max(
                        0.0, tier.read_bytes_per_second * (0.97 + 0.03 * p[1]) - tier_read[src]
                    )
                    tier_lat_mult[src] = max(tier_lat_mult[src], 3 + 5 * p[2])
                    tier_saturated[src] = True
                reads.append((src, rate))
                rx = rate / ng
                wd = 0.65 + 0.2 * p[3]
                sdk.update(data_wait=wd, compute=(1 - wd) * 0.8, communication=(1 - wd) * 0.2)
                ib, nvl = 0.02 + 0.03 * p[4], 0.02
                u_cpu, s_cpu, w_cpu = 0.6 * ng, 0.3 * ng, (1.5 + 1.5 * p[5]) * ng + 2
                psi_io = max(psi_io, 0.25 + 0.35 * p[6])
                psi_io_full = max(psi_io_full, psi_io * (0.35 + 0.25 * p[7]))
            elif phase == "preprocessing":
                util, sd = 0.15 + 0.3 * p[0], 0.04
                reads.append((data_t, healthy_read * util / 0.95))
                wd = 0.55 + 0.25 * p[1]
                sdk.update(data_wait=wd, compute=(1 - wd) * 0.85, communication=(1 - wd) * 0.15)
                ib, nvl = 0.05, 0.03
                u_cpu = n.cpus * (0.93 + 0.05 * p[2])
                s_cpu = n.cpus * 0.03
                psi_cpu = max(psi_cpu, 0.45 + 0.4 * p[3])
            elif phase == "checkpointing":
                dst = self._tier_index[ph.tier] if ph.tier else ckpt_t
                util, sd = 0.04 * p[0], 0.01
                rate = s.tiers[dst].write_bytes_per_second * (0.85 + 0.12 * p[1])
                writes.append((dst, rate))
                tier_lat_mult[dst] = max(tier_lat_mult[dst], 2 + 3 * p[2])
                # device-to-host copy of the state first, then the GPUs just wait
                tx = rate / ng * (3.0 if now.t_in_phase < 0.3 * ph.seconds else 0.2)
                sdk.update(checkpoint=0.97, other=0.03)
                ib, nvl = 0.01, 0.005
                u_cpu, s_cpu, w_cpu = 0.5 * ng, 1.0 * ng, 0.8 * ng
                psi_io = max(psi_io, 0.08 + 0.17 * p[3])
                psi_io_full = max(psi_io_full, psi_io * 0.3)
                if now.t_in_phase + step_tau >= ph.seconds - 1e-9:
                    self._observe(incs, j, lay.j_ckpt_hist, L.CHECKPOINT_BUCKETS_SECONDS,
                                  ph.seconds / self.pace)  # fmt: skip
                incs[lay.jc(j, lay.j_ckpt_bytes)] += rate * dt * job.sdk
            elif phase == "network":
                util, sd = 0.3 + 0.3 * p[0], 0.04
                cm = 0.45 + 0.25 * p[1]
                sdk.update(communication=cm, compute=1 - cm)
                if ph.guise == "congested":
                    ib, wait, nvl = 0.04 + 0.11 * p[2], 0.35 + 0.5 * p[3], 0.04
                else:
                    ib, wait, nvl = 0.93 + 0.055 * p[2], 0.02 + 0.06 * p[3], 0.85 + 0.1 * p[4]
                reads.append((data_t, healthy_read * util / 0.95))
                u_cpu, s_cpu, si_cpu = 1.0 * ng, 0.4 * ng, 0.3 * ng
            elif phase == "throttling":
                util, sd = 0.45 + 0.23 * p[0], 0.03
                clock = 0.3 + 0.2 * p[1]
                reason = ph.reason or "hw_slowdown"
                sdk.update(compute=0.9, communication=0.08, data_wait=0.02)
                reads.append((data_t, healthy_read * util / 0.95))
                ib, nvl = ib * util, nvl * util
            elif phase == "gpu_error":
                lost = _lost_gpu(job, ph)
                gpu_up[lost] = False
                if now.t_in_phase < step_tau:
                    xid_gpu = lost
                util, sd = 0.0, 0.0
                ib, wait, nvl = 0.0, 0.0, 0.0
                u_cpu, s_cpu, w_cpu = 0.1 * ng, 0.05 * ng, 0.0
            # short dips and thermal events on this job (confounders)
            dip = False
            thermal_gpus: dict[int, str] = {}
            for e, _, ep in events:
                ev = s.events[e]
                if ev.kind == "dip" and ev.job_id == job.job_id and phase == "compute":
                    dip = True
                    util, sd = 0.15 + 0.25 * ep[0], 0.03
                    sdk = dict.fromkeys(L.SDK_PHASES, 0.0)
                    sdk["eval"] = 1.0
                if ev.kind == "thermal":
                    for g in ev.gpus or (job.gpus if ev.job_id == job.job_id else ()):
                        thermal_gpus[g] = ev.reason
            step_mult = util / 0.95 if phase in ("compute", "data_loading", "preprocessing",
                                                   "network", "throttling") else 0.0  # fmt: skip
            if dip:
                step_mult = 0.0
            if phase == "compute" and not dip:
                reads.append((data_t, healthy_read * (1 + gauss(0, 0.08))))
                rx = healthy_read / ng
            for g in job.gpus:
                u = util + gauss(0, sd) if sd else util
                gpu_util[g] = min(hi, max(0.0, u))
                gpu_clock[g] = clock * (0.985 + gauss(0, 0.006)) if util > 0.05 else clock
                gpu_reason[g] = reason
                if g in thermal_gpus and phase == "compute":
                    gpu_clock[g] *= 0.82 + 0.08 * p[6]
                    gpu_reason[g] = thermal_gpus[g]
                gpu_power_cap[g] = reason == "sw_power_cap"
                gpu_mem[g] = mem
                gpu_nvl[g] = 0.0 if ng == 1 else nvl * (1 + gauss(0, 0.03))
                gpu_pcie_rx[g] = rx * (1 + gauss(0, 0.05)) + 2e8
                gpu_pcie_tx[g] = tx * (1 + gauss(0, 0.05)) + 1e8
            # the job's rails (one InfiniBand port per GPU pair)
            if self._ib_ports:
                rails = {self._ib_ports[(g // 2) % len(self._ib_ports)] for g in job.gpus}
                for r in rails:
                    port_frac[r] += ib * (1 + gauss(0, 0.02))
                    port_wait[r] = max(port_wait[r], wait * (1 + gauss(0, 0.1)))
            for t, rate in reads:
                rate = max(0.0, rate)
                tier_read[t] += rate
                incs[lay.jc(j, lay.j_tier_read + t)] += rate * dt
            for t, rate in writes:
                tier_write[t] += rate
                incs[lay.jc(j, lay.j_tier_write + t)] += rate * dt
            if job.sdk:
                for i, name in enumerate(L.SDK_PHASES):
                    if sdk[name]:
                        incs[lay.jc(j, lay.j_phase + i)] += sdk[name] * dt * (1 + gauss(0, 0.01))
                steps_before = st.cum[lay.jc(j, lay.j_steps)]
                steps = job.steps_per_second * step_mult * dt * self.pace
                incs[lay.jc(j, lay.j_steps)] += steps
                spe = job.steps_per_epoch
                if steps and (steps_before + steps) // spe > steps_before // spe:
                    t_end = (k + 1) * dt
                    self._observe(incs, j, lay.j_epoch_hist, L.EPOCH_BUCKETS_SECONDS,
                                  t_end - epochs[j])  # fmt: skip
                    epochs[j] = t_end
            cpu["user"] += u_cpu * (1 + gauss(0, 0.03))
            cpu["system"] += s_cpu * (1 + gauss(0, 0.03))
            cpu["iowait"] += w_cpu * (1 + gauss(0, 0.05))
            cpu["softirq"] += si_cpu
            mem_used_host += ng * 24 * 2**30

        # ---- GPUs ---------------------------------------------------------------------
        temps = list(st.temps)
        idle_w, limit = n.gpu_idle_power_watts, n.gpu_power_limit_watts
        alpha = 1 - math.exp(-dt / 30.0)
        for g in range(n.gpus):
            base = lay.gg(g, 0)
            held = self._job_of_gpu[g] >= 0 and jobs[self._job_of_gpu[g]].present
            u = gpu_util[g]
            gauges[base + L.G_UP] = 1.0 if gpu_up[g] else 0.0
            gauges[base + L.G_UTIL] = u
            gauges[base + L.G_SMACT] = min(1.0, u * (0.62 + 0.2 * rng.random()))
            gauges[base + L.G_MEMBW] = min(1.0, u * (0.5 + 0.15 * rng.random()))
            mem_frac = gpu_mem[g] if held else 0.006
            gauges[base + L.G_MEMUSED] = round(n.gpu_memory_bytes * mem_frac / 2**20) * 2**20
            if gpu_power_cap[g]:
                power = limit * (0.97 + 0.03 * rng.random())
            elif u > 0.01 or held:
                power = idle_w + (limit - idle_w) * min(1.0, 0.08 + 0.85 * u * gpu_clock[g])
            else:
                power = idle_w
            power *= 1 + gauss(0, 0.015)
            gauges[base + L.G_POWER] = power
            target = 30.0 + 48.0 * power / limit + (14.0 if "thermal" in gpu_reason[g] else 0.0)
            temps[g] += (target - temps[g]) * alpha
            gauges[base + L.G_TEMP] = round(temps[g])
            if (u < 0.05 and not held) or u < 0.02:
                clk = 0.17 * n.gpu_max_sm_clock_hertz
                reason_now = gpu_reason[g] or "gpu_idle"
            else:
                clk = gpu_clock[g] * n.gpu_max_sm_clock_hertz
                reason_now = gpu_reason[g]
            gauges[base + L.G_CLOCK] = round(clk / 15e6) * 15e6  # 15 MHz steps, as NVML reports
            if reason_now:
                gauges[base + L.G_REASONS + _REASON_INDEX[reason_now]] = 1.0
            c = lay.gc(g, 0)
            incs[c + L.C_ENERGY] = power * dt
            incs[c + L.C_PCIE_RX] = gpu_pcie_rx[g] * dt if held else 5e6 * dt
            incs[c + L.C_PCIE_TX] = gpu_pcie_tx[g] * dt if held else 2e6 * dt
            nv = gpu_nvl[g] * n.nvlink_bytes_per_second * dt
            incs[c + L.C_NVL_TX] = nv
            incs[c + L.C_NVL_RX] = nv * (1 + gauss(0, 0.01))
            if g == xid_gpu:
                incs[c + L.C_XID79] = 1.0

        # ---- storage tiers --------------------------------------------------------------
        for t, tier in enumerate(s.tiers):
            read = min(tier_read[t], tier.read_bytes_per_second * (0.985 + 0.015 * rng.random()))
            write = min(tier_write[t], tier.write_bytes_per_second * (0.985 + 0.015 * rng.random()))
            load = read / tier.read_bytes_per_second + write / tier.write_bytes_per_second
            r_ops = read / tier.request_bytes
            w_ops = write / tier.request_bytes
            lat_n = math.exp(gauss(0, 0.12))
            r_lat = (
                tier.read_latency_seconds * tier_lat_mult[t] * (1 + 0.3 * min(1.0, load)) * lat_n
            )
            w_lat = (
                tier.write_latency_seconds * tier_lat_mult[t] * (1 + 0.3 * min(1.0, load)) * lat_n
            )
            queue = r_ops * r_lat + w_ops * w_lat
            c = lay.tc(t, 0)
            incs[c + L.T_READ_B] = read * dt
            incs[c + L.T_WRITE_B] = write * dt
            incs[c + L.T_READS] = r_ops * dt
            incs[c + L.T_WRITES] = w_ops * dt
            incs[c + L.T_READ_T] = r_ops * r_lat * dt
            incs[c + L.T_WRITE_T] = w_ops * w_lat * dt
            if tier.device is not None:
                busy = 1 - math.exp(-queue)
                if tier_saturated[t]:
                    busy = max(busy, 0.97 + 0.028 * rng.random())
                incs[c + L.T_IO_T] = busy * dt
                incs[c + L.T_IO_W] = queue * dt
            # free space: checkpoints pile up, a retention job deletes old ones
            kept = 0.5 * st.cum[c + L.T_WRITE_B]
            window = 0.1 * tier.capacity_bytes
            gauges[lay.g_tier_free + t] = tier.capacity_bytes * tier.free_ratio - kept % window

        # ---- network ports ------------------------------------------------------------
        nfs_read = sum(
            min(tier_read[t], x.read_bytes_per_second)
            for t, x in enumerate(s.tiers)
            if x.device is None
        )
        nfs_write = sum(min(tier_write[t], x.write_bytes_per_second) for t, x in enumerate(s.tiers) if x.device is None)  # fmt: skip
        for pi, port in enumerate(s.ports):
            c = lay.pc(pi, 0)
            speed = port.speed_bytes_per_second
            frac = min(0.99, port_frac[pi])
            rxb = frac * speed * (1 + gauss(0, 0.01))
            txb = frac * speed * (1 + gauss(0, 0.01))
            if pi in self._eth_ports:
                share = 1.0 / len(self._eth_ports)
                rxb += nfs_read * share
                txb += nfs_write * share
            incs[c + L.P_RX] = min(rxb, speed) * dt
            incs[c + L.P_TX] = min(txb, speed) * dt
            if port.counts_transmit_wait:
                incs[c + L.P_WAIT] = min(1.0, port_wait[pi]) * dt

        # ---- host -----------------------------------------------------------------------
        cpus = float(n.cpus)
        busy_total = sum(cpu.values())
        if busy_total > cpus * 0.995:  # demand beyond the machine: scale, nothing is idle
            scale = cpus * (0.99 + 0.005 * rng.random()) / busy_total
            cpu = {m: v * scale for m, v in cpu.items()}
            busy_total = sum(cpu.values())
        cpu["idle"] = cpus - busy_total
        for i, mode in enumerate(L.CPU_MODES):
            incs[lay.hc(L.H_CPU + i)] = max(0.0, cpu[mode]) * dt
        some = (psi_cpu, psi_io, unif(0.0005, 0.002))
        full = (psi_io_full, unif(0.0001, 0.0005))
        for i, v in enumerate(some):
            incs[lay.hc(L.H_SOME + i)] = min(1.0, v * (1 + gauss(0, 0.05))) * dt
        for i, v in enumerate(full):
            incs[lay.hc(L.H_FULL + i)] = min(1.0, v * (1 + gauss(0, 0.05))) * dt
        avail = n.memory_bytes * 0.86 - mem_used_host - n.memory_bytes * 0.02 * rng.random()
        gauges[lay.g_mem_available] = round(max(n.memory_bytes * 0.02, avail) / 4096) * 4096
        return gauges, incs, temps, epochs

    def _observe(
        self, incs: list[float], j: int, base: int, buckets: tuple[float, ...], value: float
    ) -> None:
        lay = self.layout
        for i, le in enumerate(buckets):
            if value <= le:
                incs[lay.jc(j, base + i)] += 1
        nb = len(buckets)
        incs[lay.jc(j, base + nb)] += 1  # +Inf
        incs[lay.jc(j, base + nb + 1)] += value  # sum
        incs[lay.jc(j, base + nb + 2)] += 1  # count


def _lost_gpu(job: JobSpec, ph: PhaseSpec) -> int:
    return ph.gpu if ph.gpu >= 0 else job.gpus[-1]
