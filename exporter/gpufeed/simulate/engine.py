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
from gpufeed.simulate.phases import JobContext, JobLoad, Noise, job_load
from gpufeed.simulate.scenario import (
    CLOCK_EVENT_REASONS,
    PHASES,
    JobSpec,
    PhaseSpec,
    Scenario,
    TierSpec,
)
from gpufeed.vocabulary import Cause

_MASK = (1 << 64) - 1
_MISS = 1.0 - L.SIMULATED_CACHE_HIT_RATIO  # storage bytes per byte read
_REASON_INDEX = {r: i for i, r in enumerate(CLOCK_EVENT_REASONS)}
# The ground truth of a phase: its cause (phases are named after them); compute is healthy.
CAUSE_OF_PHASE: dict[str, str | None] = {
    p: None if p == "compute" else Cause(p).value for p in PHASES
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
            if tier.object_store:
                continue  # no boot draws: the other tiers' values do not depend on it
            r_ops = (
                uptime * boot.uniform(0.02, 0.2) * tier.read_bytes_per_second / tier.request_bytes
            )
            w_ops = (
                uptime * boot.uniform(0.01, 0.1) * tier.write_bytes_per_second / tier.request_bytes
            )
            cum[lay.tc(t, L.T_READS)] = r_ops
            cum[lay.tc(t, L.T_WRITES)] = w_ops
            cum[lay.tc(t, L.T_READ_B)] = r_ops * tier.request_bytes
            cum[lay.tc(t, L.T_REQUESTED_B)] = cum[lay.tc(t, L.T_READ_B)] / _MISS
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
        """Gauges, counter increments, temperatures and epoch marks of cell `st.k`."""
        s = self.scenario
        k = st.k
        tau = k * self.res * self.pace
        noise = Noise(mix(self.seed, 1, k))
        c = _Cell(self.layout, s, noise)
        jobs = [self._job_now(j, tau) for j in range(len(s.jobs))]
        events = self._events_now(tau)
        epochs = list(st.last_epoch_end)
        for e, _, ep in events:  # another tenant drives a tier to its ceiling
            ev = s.events[e]
            if ev.kind == "busy_tier":
                t = self._tier_index[ev.tier]
                c.tier_read[t] = s.tiers[t].read_bytes_per_second * (0.6 + 0.4 * ep[0])
                c.tier_write[t] = s.tiers[t].write_bytes_per_second * 0.3 * ep[1]
                c.tier_latency[t] = max(c.tier_latency[t], 2.5 + 3 * ep[2])
                c.tier_saturated[t] = True
        for j, now in enumerate(jobs):
            if now.present and now.phase is not None:
                self._add_job(c, st, j, now, events, epochs)
        temps = self._gpus(c, st, jobs)
        self._tiers(c, st)
        self._ports(c)
        self._host(c)
        return c.gauges, c.incs, temps, epochs

    def _add_job(
        self,
        c: _Cell,
        st: _State,
        j: int,
        now: _JobNow,
        events: list[tuple[int, float, list[float]]],
        epochs: list[float],
    ) -> None:
        s, lay, noise, dt = self.scenario, self.layout, c.noise, self.res
        job, ph = s.jobs[j], now.phase
        assert ph is not None
        ctx = JobContext(job, ph, now.params, now.t_in_phase, s.node, s.tiers,
                         self._tier_index, c.tier_read, self._working_set[j], noise)  # fmt: skip
        a = job_load(ctx)
        step_tau = dt * self.pace
        if ph.phase == "startup":
            epochs[j] = (st.k + 1) * dt  # the first epoch is timed from training start
        if ph.phase == "gpu_error":
            c.up[a.lost_gpu] = False
            if now.t_in_phase < step_tau:  # the XID is seen once, when the GPU falls off
                c.incs[lay.gc(a.lost_gpu, L.C_XID79)] = 1.0
        if ph.phase == "checkpointing" and now.t_in_phase + step_tau >= ph.seconds - 1e-9:
            self._observe(c.incs, j, lay.j_ckpt_hist, L.CHECKPOINT_BUCKETS_SECONDS,
                          ph.seconds / self.pace)  # fmt: skip
        # confounders on this job: a short dip, thermal throttling at full load
        thermal: dict[int, str] = {}
        for e, _, ep in events:
            ev = s.events[e]
            if ev.kind == "dip" and ev.job_id == job.job_id and ph.phase == "compute":
                a.util, a.util_sd, a.step_fraction = 0.15 + 0.25 * ep[0], 0.03, 0.0
                a.sdk = dict.fromkeys(L.SDK_PHASES, 0.0)
                a.sdk["eval"] = 1.0
            elif ev.kind == "thermal" and ph.phase == "compute":
                for g in ev.gpus or (job.gpus if ev.job_id == job.job_id else ()):
                    thermal[g] = ev.reason
        for t, mult in a.tier_latency.items():
            c.tier_latency[t] = max(c.tier_latency[t], mult)
        for t in a.saturated:
            c.tier_saturated[t] = True
        multi = len(job.gpus) > 1
        for g in job.gpus:
            u = a.util + noise.gauss(0, a.util_sd) if a.util_sd else a.util
            c.util[g] = min(a.util_max, max(0.0, u))
            c.sm_scale[g] = a.sm_fraction
            clock = a.clock_fraction
            c.clock[g] = clock * (0.985 + noise.gauss(0, 0.006)) if a.util > 0.05 else clock
            c.reason[g] = a.reason
            if g in thermal:
                c.clock[g] *= 0.82 + 0.08 * now.params[6]
                c.reason[g] = thermal[g]
            c.held[g] = True
            c.memory[g] = a.memory_fraction
            c.nvlink[g] = a.nvlink_fraction * (1 + noise.gauss(0, 0.03)) if multi else 0.0
            c.pcie_rx[g] = a.pcie_rx_per_gpu * (1 + noise.gauss(0, 0.05)) + 2e8
            c.pcie_tx[g] = a.pcie_tx_per_gpu * (1 + noise.gauss(0, 0.05)) + 1e8
        if self._ib_ports:  # the job's rails: one InfiniBand port per GPU pair
            rails = {self._ib_ports[(g // 2) % len(self._ib_ports)] for g in job.gpus}
            for r in sorted(rails):
                c.port_fraction[r] += a.rail_fraction * (1 + noise.gauss(0, 0.02))
                wait = a.transmit_wait * (1 + noise.gauss(0, 0.1))
                c.port_wait[r] = max(c.port_wait[r], wait)
        for t, rate in a.reads:
            rate = max(0.0, rate)
            c.tier_read[t] += rate
            c.incs[lay.jc(j, lay.j_tier_read + t)] += rate * dt
            c.incs[lay.jc(j, lay.j_cache + L.J_CACHE_FETCHED)] += rate * dt
            c.incs[lay.jc(j, lay.j_cache + L.J_CACHE_REQUESTED)] += rate * dt / _MISS
            if ph.phase == "startup" and job.sdk:  # the weights' load, as `gpufeed run` times it
                c.incs[lay.jc(j, lay.j_load_seconds + t)] += dt
                c.incs[lay.jc(j, lay.j_load_bytes + t)] += rate * dt
                c.gauges[lay.jg(j, t)] = (
                    self._working_set[j] * len(job.gpus) * s.node.gpu_memory_bytes
                )
        for t, rate in a.writes:
            c.tier_write[t] += rate
            c.incs[lay.jc(j, lay.j_tier_write + t)] += rate * dt
        if job.sdk:
            self._sdk(c, st, j, a, epochs)
        if job.serving:
            self._serving(c, j, ph.phase, now.params)
        # the job's cgroup has a CPU quota that never binds here: a simulated input
        # pipeline starves on the host's CPUs (preprocessing), not on its own limit
        used = (a.cpu_user + a.cpu_system) * dt
        c.incs[lay.jc(j, lay.j_cpu + L.J_CPU_USAGE)] += used
        c.incs[lay.jc(j, lay.j_cpu + L.J_CPU_PERIODS)] += L.JOB_CPU_PERIODS_PER_SECOND * dt
        # its threads wait for a CPU the share of their runnable time that the host's CPU
        # pressure says tasks wait (saturated CPUs: most of it)
        waiting = min(a.cpu_pressure, 0.95)
        c.incs[lay.jc(j, lay.j_cpu + L.J_CPU_RUNNING)] += used
        c.incs[lay.jc(j, lay.j_cpu + L.J_CPU_WAITING)] += used * waiting / (1.0 - waiting)
        c.incs[lay.jc(j, lay.j_cpu + L.J_CPU_PRESSURE)] += a.cpu_pressure * dt
        c.cpu["user"] += a.cpu_user * (1 + noise.gauss(0, 0.03))
        c.cpu["system"] += a.cpu_system * (1 + noise.gauss(0, 0.03))
        c.cpu["iowait"] += a.cpu_iowait * (1 + noise.gauss(0, 0.05))
        c.cpu["softirq"] += a.cpu_softirq
        c.psi_cpu = max(c.psi_cpu, a.cpu_pressure)
        c.psi_io = max(c.psi_io, a.io_pressure)
        c.psi_io_full = max(c.psi_io_full, a.io_pressure_full)
        c.host_memory_used += len(job.gpus) * 24 * 2**30

    def _serving(self, c: _Cell, j: int, phase: str, params: list[float]) -> None:
        """A serving job's queue, from its phase's draws (no noise of its own): busy
        serving keeps a few requests waiting, a stall many; low demand leaves the queue
        empty. Its endpoint answers once the server runs (not while it starts up, nor
        after a failure)."""
        lay, dt = self.layout, self.res
        if phase in ("startup", "gpu_error", "idle"):
            return  # loading its weights, or gone: its endpoint does not answer
        if phase == "compute":
            waiting, running, kv, rate = 2 + 10 * params[3], 24 + 8 * params[4], 0.5, 40.0
        elif phase == "low_demand":
            waiting, running, kv, rate = 0.0, float(round(2 * params[4])), 0.05, 0.5
        else:  # a stalled server: requests pile up in its queue
            waiting, running, kv, rate = 20 + 30 * params[3], 8 + 8 * params[4], 0.9, 5.0
        c.gauges[lay.sg(j, L.S_UP)] = 1.0
        c.gauges[lay.sg(j, L.S_WAITING)] = float(round(waiting))
        c.gauges[lay.sg(j, L.S_RUNNING)] = float(round(running))
        c.gauges[lay.sg(j, L.S_KV)] = kv + 0.3 * params[5]
        c.incs[lay.jc(j, lay.j_served)] += rate * dt * self.pace

    def _sdk(self, c: _Cell, st: _State, j: int, a: JobLoad, epochs: list[float]) -> None:
        """What the job's SDK reports: phase seconds, steps, checkpoint bytes, epochs."""
        lay, dt, job = self.layout, self.res, self.scenario.jobs[j]
        for i, name in enumerate(L.SDK_PHASES):
            if a.sdk[name]:
                c.incs[lay.jc(j, lay.j_phase + i)] += (
                    a.sdk[name] * dt * (1 + c.noise.gauss(0, 0.01))
                )
        c.incs[lay.jc(j, lay.j_ckpt_bytes)] += a.checkpoint_bytes_per_second * dt
        # the timeline runs `pace` times faster, and so does the job's progress
        steps = job.steps_per_second * a.step_fraction * dt * self.pace
        before = st.cum[lay.jc(j, lay.j_steps)]
        c.incs[lay.jc(j, lay.j_steps)] += steps
        spe = job.steps_per_epoch
        if steps and (before + steps) // spe > before // spe:
            t_end = (st.k + 1) * dt
            self._observe(c.incs, j, lay.j_epoch_hist, L.EPOCH_BUCKETS_SECONDS, t_end - epochs[j])
            epochs[j] = t_end

    def _gpus(self, c: _Cell, st: _State, jobs: list[_JobNow]) -> list[float]:
        n, lay, dt, noise = self.scenario.node, self.layout, self.res, c.noise
        gauges, incs = c.gauges, c.incs
        temps = list(st.temps)
        idle_w, limit = n.gpu_idle_power_watts, n.gpu_power_limit_watts
        alpha = 1 - math.exp(-dt / 30.0)  # temperature follows power with a 30 s lag
        for g in range(n.gpus):
            base = lay.gg(g, 0)
            held, u = c.held[g], c.util[g]
            gauges[base + L.G_UP] = 1.0 if c.up[g] else 0.0
            gauges[base + L.G_UTIL] = u
            gauges[base + L.G_SMACT] = min(1.0, u * (0.62 + 0.2 * noise.random()) * c.sm_scale[g])
            gauges[base + L.G_MEMBW] = min(1.0, u * (0.5 + 0.15 * noise.random()))
            # GPM's other ratios follow SM activity and memory traffic; derived, so that the
            # noise stream (and every scenario's values) stays what it was
            gauges[base + L.G_OCCUPANCY] = 0.55 * gauges[base + L.G_SMACT]
            gauges[base + L.G_TENSOR] = 0.8 * gauges[base + L.G_SMACT]
            gauges[base + L.G_DRAM] = 0.7 * gauges[base + L.G_MEMBW]
            mem_frac = c.memory[g] if held else 0.006
            gauges[base + L.G_MEMUSED] = round(n.gpu_memory_bytes * mem_frac / 2**20) * 2**20
            if c.reason[g] == "sw_power_cap":
                power = limit * (0.97 + 0.03 * noise.random())
            elif u > 0.01 or held:
                power = idle_w + (limit - idle_w) * min(1.0, 0.08 + 0.85 * u * c.clock[g])
            else:
                power = idle_w
            power *= 1 + noise.gauss(0, 0.015)
            gauges[base + L.G_POWER] = power
            hot = 14.0 if "thermal" in c.reason[g] else 0.0
            temps[g] += (30.0 + 48.0 * power / limit + hot - temps[g]) * alpha
            gauges[base + L.G_TEMP] = round(temps[g])
            if (u < 0.05 and not held) or u < 0.02:  # nothing runs: idle clocks
                clk = 0.17 * n.gpu_max_sm_clock_hertz
                reason = c.reason[g] or "gpu_idle"
            else:
                clk = c.clock[g] * n.gpu_max_sm_clock_hertz
                reason = c.reason[g]
            gauges[base + L.G_CLOCK] = round(clk / 15e6) * 15e6  # 15 MHz steps, as NVML reports
            if reason:
                gauges[base + L.G_REASONS + _REASON_INDEX[reason]] = 1.0
            gc = lay.gc(g, 0)
            incs[gc + L.C_ENERGY] = power * dt
            incs[gc + L.C_BUSY] = u * dt
            incs[gc + L.C_PCIE_RX] = (c.pcie_rx[g] if held else 5e6) * dt
            incs[gc + L.C_PCIE_TX] = (c.pcie_tx[g] if held else 2e6) * dt
            nv = c.nvlink[g] * n.nvlink_bytes_per_second * dt
            incs[gc + L.C_NVL_TX] = nv
            incs[gc + L.C_NVL_RX] = nv * (1 + noise.gauss(0, 0.01))
        return temps

    def _tiers(self, c: _Cell, st: _State) -> None:
        lay, dt, noise = self.layout, self.res, c.noise
        for t, tier in enumerate(self.scenario.tiers):
            if tier.object_store:
                self._object_tier(c, t, tier)
                continue
            rnd = noise.random
            read = min(c.tier_read[t], tier.read_bytes_per_second * (0.985 + 0.015 * rnd()))
            write = min(c.tier_write[t], tier.write_bytes_per_second * (0.985 + 0.015 * rnd()))
            c.tier_read[t], c.tier_write[t] = read, write
            load = min(1.0, read / tier.read_bytes_per_second + write / tier.write_bytes_per_second)
            r_ops = read / tier.request_bytes
            w_ops = write / tier.request_bytes
            slow = c.tier_latency[t] * (1 + 0.3 * load) * math.exp(noise.gauss(0, 0.12))
            r_lat = tier.read_latency_seconds * slow
            w_lat = tier.write_latency_seconds * slow
            queue = r_ops * r_lat + w_ops * w_lat  # Little's law: in flight = rate x latency
            base = lay.tc(t, 0)
            incs = c.incs
            incs[base + L.T_READ_B] = read * dt
            incs[base + L.T_REQUESTED_B] = read * dt / _MISS
            incs[base + L.T_WRITE_B] = write * dt
            incs[base + L.T_READS] = r_ops * dt
            incs[base + L.T_WRITES] = w_ops * dt
            incs[base + L.T_READ_T] = r_ops * r_lat * dt
            incs[base + L.T_WRITE_T] = w_ops * w_lat * dt
            if tier.device is not None:  # block devices count busy time; NFS does not
                busy = 1 - math.exp(-queue)
                if c.tier_saturated[t]:
                    busy = max(busy, 0.97 + 0.028 * rnd())
                incs[base + L.T_IO_T] = busy * dt
                incs[base + L.T_IO_W] = queue * dt
            # free space: checkpoints pile up, a retention job deletes old ones
            kept = 0.5 * st.cum[base + L.T_WRITE_B]
            window = 0.1 * tier.capacity_bytes
            c.gauges[lay.g_tier_free + t] = tier.capacity_bytes * tier.free_ratio - kept % window

    def _object_tier(self, c: _Cell, t: int, tier: TierSpec) -> None:
        """An object-storage tier: whole-object requests at its latency (slower under load
        or a busy_tier event), no busy time or queue; no noise drawn (see TierSpec)."""
        read = min(c.tier_read[t], tier.read_bytes_per_second)
        write = min(c.tier_write[t], tier.write_bytes_per_second)
        load = min(1.0, read / tier.read_bytes_per_second + write / tier.write_bytes_per_second)
        slow = c.tier_latency[t] * (1 + 0.3 * load)
        r_ops, w_ops = read / tier.request_bytes, write / tier.request_bytes
        base, incs, dt = self.layout.tc(t, 0), c.incs, self.res
        incs[base + L.T_READ_B] = read * dt
        incs[base + L.T_WRITE_B] = write * dt
        incs[base + L.T_READS] = r_ops * dt
        incs[base + L.T_WRITES] = w_ops * dt
        incs[base + L.T_READ_T] = r_ops * tier.read_latency_seconds * slow * dt
        incs[base + L.T_WRITE_T] = w_ops * tier.write_latency_seconds * slow * dt

    def _ports(self, c: _Cell) -> None:
        s, lay, dt, noise = self.scenario, self.layout, self.res, c.noise
        # NFS traffic crosses the ethernet ports
        nfs = [t for t, tier in enumerate(s.tiers) if tier.device is None and not tier.object_store]
        nfs_read = sum(c.tier_read[t] for t in nfs)
        nfs_write = sum(c.tier_write[t] for t in nfs)
        for pi, port in enumerate(s.ports):
            base = lay.pc(pi, 0)
            # what the port carries: its speed, or a shaper's rate below it
            speed = min(port.speed_bytes_per_second, port.shaped_rate_bytes_per_second or math.inf)
            frac = min(0.99, c.port_fraction[pi])
            rx = frac * speed * (1 + noise.gauss(0, 0.01))
            tx = frac * speed * (1 + noise.gauss(0, 0.01))
            if pi in self._eth_ports:
                rx += nfs_read / len(self._eth_ports)
                tx += nfs_write / len(self._eth_ports)
            c.incs[base + L.P_RX] = min(rx, speed) * dt
            c.incs[base + L.P_TX] = min(tx, speed) * dt
            if port.counts_transmit_wait:
                c.incs[base + L.P_WAIT] = min(1.0, c.port_wait[pi]) * dt

    def _host(self, c: _Cell) -> None:
        n, lay, dt, noise = self.scenario.node, self.layout, self.res, c.noise
        cpus = float(n.cpus)
        cpu = c.cpu
        busy = sum(cpu.values())
        if busy > cpus * 0.995:  # demand beyond the machine: scaled down, nothing idle
            scale = cpus * (0.99 + 0.005 * noise.random()) / busy
            cpu = {m: v * scale for m, v in cpu.items()}
            busy = sum(cpu.values())
        cpu["idle"] = cpus - busy
        for i, mode in enumerate(L.CPU_MODES):
            c.incs[lay.hc(L.H_CPU + i)] = max(0.0, cpu[mode]) * dt
        some = (c.psi_cpu, c.psi_io, noise.uniform(0.0005, 0.002))
        full = (c.psi_io_full, noise.uniform(0.0001, 0.0005))
        for i, v in enumerate(some):
            c.incs[lay.hc(L.H_SOME + i)] = min(1.0, v * (1 + noise.gauss(0, 0.05))) * dt
        for i, v in enumerate(full):
            c.incs[lay.hc(L.H_FULL + i)] = min(1.0, v * (1 + noise.gauss(0, 0.05))) * dt
        avail = n.memory_bytes * (0.86 - 0.02 * noise.random()) - c.host_memory_used
        c.gauges[lay.g_mem_available] = round(max(n.memory_bytes * 0.02, avail) / 4096) * 4096

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


class _Cell:
    """Scratch space of one cell: what every job adds up to, before it becomes values."""

    def __init__(self, lay: L.Layout, s: Scenario, noise: Noise) -> None:
        n = s.node.gpus
        u = noise.uniform
        self.noise = noise
        self.gauges = [0.0] * lay.n_gauges
        self.incs = [0.0] * lay.n_counters
        # every tier carries some traffic of other tenants
        # (an object-storage tier's at its mean: it draws no noise, see TierSpec)
        self.tier_read = [
            t.background_read_bytes_per_second * (1.0 if t.object_store else u(0.6, 1.4))
            for t in s.tiers
        ]
        self.tier_write = [
            t.background_write_bytes_per_second * (1.0 if t.object_store else u(0.6, 1.4))
            for t in s.tiers
        ]
        self.tier_latency = [1.0] * len(s.tiers)
        self.tier_saturated = [False] * len(s.tiers)
        self.cpu = {"user": 0.8, "system": 0.4, "iowait": 0.02, "irq": 0.05, "softirq": 0.1,
                    "steal": 0.0, "nice": 0.02}  # fmt: skip
        self.psi_cpu = u(0.005, 0.03)
        self.psi_io = u(0.002, 0.015)
        self.psi_io_full = self.psi_io * u(0.2, 0.5)
        self.port_fraction = [u(0.002, 0.01) for _ in s.ports]
        self.port_wait = [u(0.0005, 0.004) for _ in s.ports]
        self.host_memory_used = 0.0
        self.up = [True] * n
        self.held = [False] * n
        self.util = [0.0] * n
        self.sm_scale = [1.0] * n  # SM activity per unit of utilization (a phase's)
        self.clock = [1.0] * n
        self.reason = [""] * n
        self.memory = [0.0] * n
        self.nvlink = [0.0] * n
        self.pcie_rx = [0.0] * n
        self.pcie_tx = [0.0] * n


def _lost_gpu(job: JobSpec, ph: PhaseSpec) -> int:
    return ph.gpu if ph.gpu >= 0 else job.gpus[-1]
