"""Runs one multi-node scenario: N "nodes" on this host, one DDP job across them, faults on
one node, and what every node's agent said, saved under the results directory.

Per node: a network namespace (lab/multinode/fabric.py), its own loop-mounted tiers, its own
agent (`gpufeed agent` inside the namespace, under a UTS namespace whose hostname is
`node-<i>`, so that its default instance is `node-<i>:<port>` with the port it bound),
its own SDK socket and config, and its rank under `gpufeed run` in a cgroup of its own.

Everything made is undone on the way out, in reverse order, also when the run fails or the
harness gets SIGTERM/SIGINT/SIGHUP (the caller turns those into exceptions): each undo step
is registered the moment the thing it undoes exists.

What lands in `<results>/<scenario>/`:
  run.json              the schedule as applied (unix times), nodes, exit codes, windows
  node-<i>/windows.jsonl  the agent's windows log      node-<i>/api-windows.json  /api/windows
  node-<i>/trace.om       the agent's --record trace    node-<i>/metrics.prom     last /metrics
  node-<i>/steps.jsonl    the rank's own step timings   node-<i>/agent.log, rank.log
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.host import JobCgroup, LoopTier
from lab.multinode import live, procs
from lab.multinode.fabric import Fabric, NodeLink
from lab.multinode.report import read_steps
from lab.multinode.scenario import Fault, Plan

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "lab" / "multinode" / "ddp_train.py"
MASTER_PORT = 29500  # inside node 0's own namespace: no other process on the host can hold it
START_TIMEOUT_S = 180.0  # torch's import and the rendezvous on a loaded 2-core host
COLLECTIVE_TIMEOUT_S = 60.0
TAIL_S = 5.0  # the agents sample the job's end before they are asked


@dataclass
class Node:
    index: int
    link: NodeLink
    work: Path
    out: Path
    tiers: dict[str, LoopTier]
    cgroup: JobCgroup
    agent: subprocess.Popen[bytes] | None = None
    port: int = 0
    rank: subprocess.Popen[bytes] | None = None

    @property
    def instance(self) -> str:
        return f"node-{self.index}:{self.port}"


@dataclass
class Run:
    plan: Plan
    out: Path
    prefix: str
    job_id: str
    undo: contextlib.ExitStack
    nodes: list[Node] = field(default_factory=list)
    fabric: Fabric | None = None
    events: list[dict[str, Any]] = field(default_factory=list)
    t0: float = 0.0
    live_fleet: bool = False  # also Prometheus + `gpufeed fleet` on every agent (live.py)

    def log(self, what: str, **more: Any) -> None:
        entry = {
            "t": time.time(),
            "t_rel_s": round(time.time() - self.t0, 2) if self.t0 else None,
            "event": what,
            **more,
        }
        self.events.append(entry)
        print(f"[{self.plan.name}] {what} {more or ''}", file=sys.stderr, flush=True)


def run_prefix() -> str:
    """`gfl<pid><letter>`: unique on this host, short enough for interface names (15)."""
    return f"gfl{os.getpid()}{secrets.choice('abcdefghijklmnopqrstuvwxyz')}"


def run_scenario(plan: Plan, results: Path, live_fleet: bool = False) -> dict[str, Any]:
    """Runs `plan`; returns (and writes as run.json) what happened and what the agents said
    (with `live_fleet`, also what the fleet service said as it went: lab/multinode/live.py)."""
    out = results / plan.name
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    prefix = run_prefix()
    began = time.monotonic()
    # letters and digits only: what a Slurm job directory (job_<id>) may hold
    job_id = f"lab{os.getpid()}x{secrets.token_hex(3)}"
    summary: dict[str, Any] = {
        "scenario": plan.name,
        "prefix": prefix,
        "harness_pid": os.getpid(),
        "job_id": job_id,
        "agent_correlator": dict(plan.agent_correlator),
    }
    try:
        with contextlib.ExitStack() as undo:
            work = Path(tempfile.mkdtemp(prefix=f"{prefix}-"))
            undo.callback(shutil.rmtree, work, True)
            run = Run(plan, out, prefix, job_id, undo)
            run.live_fleet = live_fleet
            try:
                _setup(run, work)
                _start_job(run)
                _schedule(run)
                time.sleep(TAIL_S)
                _collect(run, summary)
                summary["ok"] = True
            except BaseException as exc:
                summary["ok"] = False
                summary["error"] = f"{type(exc).__name__}: {exc}"
                raise
            finally:
                summary["events"] = run.events
                summary["t0"] = run.t0
                summary["nodes"] = [_node_summary(n) for n in run.nodes]
    finally:
        # written after the cleanup, so that the wall time holds it too
        summary["wall_s"] = round(time.monotonic() - began, 1)
        (out / "run.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return summary


def _setup(run: Run, work: Path) -> None:
    sc = run.plan.scenario
    run.fabric = Fabric(run.prefix, sc.nodes, run.undo.callback)
    for link in run.fabric.links:
        i = link.index
        nwork, nout = work / f"n{i}", run.out / f"node-{i}"
        nwork.mkdir()
        nout.mkdir()
        tiers = {}
        for spec in sc.tiers:
            tier = tiers[spec.name] = LoopTier(spec.name, nwork, spec.size_mib)
            run.undo.callback(tier.close)  # safe after a half-finished open
            tier.open()
        data = tiers[sc.workload.data_tier].mnt / "data"
        write_dataset(data, sc.workload.samples, sc.workload.sample_kib)
        # A Slurm-shaped job cgroup per node (the same job id: one job across the nodes)
        cg = JobCgroup(run.job_id)
        run.undo.callback(cg.close)
        cg.open([t.dev for t in tiers.values()])
        node = Node(i, link, nwork, nout, tiers, cg)
        run.nodes.append(node)
        _start_agent(run, node)
    if run.live_fleet:
        targets = [(f"{n.link.address}:{n.port}", n.instance) for n in run.nodes]
        correlator = dict(run.plan.agent_correlator)
        live.start(run.fabric.bridge_ns, run.out / "fleet", targets, correlator, run.undo.callback)
        run.log("fleet service ready")
    run.log("nodes ready", instances=[n.instance for n in run.nodes])


def _agent_config(run: Run, node: Node) -> dict[str, Any]:
    return {
        "interval_seconds": 1,
        "tiers": {name: [str(t.mnt)] for name, t in node.tiers.items()},
        "correlator": {
            "windows_log": str(node.out / "windows.jsonl"),
            **dict(run.plan.agent_correlator),
        },
        "sdk": {"socket_path": str(node.work / "sdk.sock")},
        "network": {"include_virtual": True},  # the node's link is a veth
    }


def _start_agent(run: Run, node: Node) -> None:
    cfg = node.work / "agent.yaml"
    cfg.write_text(yaml.safe_dump(_agent_config(run, node)))
    argv = [
        sys.executable,
        "-m",
        "gpufeed",
        "agent",
        "--config",
        str(cfg),
        "--web.listen-address",
        "0.0.0.0:0",  # the namespace's own addresses: its loopback and the node's link
        "--record",
        str(node.out / "trace.om"),
        "--gpu.backend",
        "off",
    ]
    cmd = node_argv(node.link.netns, f"node-{node.index}", node.cgroup.views(), argv)
    with open(node.out / "agent.log", "wb") as log:
        node.agent = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    agent = node.agent
    run.undo.callback(procs.stop, agent)
    node.port = procs.wait_port(agent)


def node_argv(
    netns: str, hostname: str, views: list[tuple[Path, Path]], argv: list[str]
) -> list[str]:
    """argv run as a node's agent runs: in the node's network namespace with a sysfs of its
    own (its /sys/class/net shows its eth0, as `ip netns exec` gives it) but, unlike `ip
    netns exec`, with the host's cgroup tree kept under /sys/fs/cgroup, and in each
    hierarchy the node's own top cgroup bind-mounted over the root (`views`: JobCgroup.
    views()), so that it sees its own jobs' cgroups (job_cpu's CPU throttling, job_io's
    bytes) and no other node's, as on a real node: every node's job has the same id, and
    with the whole tree in view each agent read whichever node's cgroup came first in
    directory order. A UTS namespace gives it its hostname."""
    own_view = "".join(
        f" && mount --bind {shlex.quote(str(top))} {shlex.quote(str(root))}" for top, root in views
    )
    return [
        "nsenter",
        f"--net=/run/netns/{netns}",
        "unshare",
        "--uts",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        'd=$(mktemp -d) && mount --rbind /sys/fs/cgroup "$d" && mount -t sysfs sysfs /sys'
        ' && mount --move "$d" /sys/fs/cgroup && rmdir "$d"' + own_view + ' && hostname "$0"'
        ' && exec "$@"',
        hostname,
        *argv,
    ]


def _rank_env(run: Run, node: Node) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            # one job id on every node, as a launcher gives it (torchrun --rdzv-id)
            "GPUFEED_JOB_ID": run.job_id,
            "TORCHELASTIC_RUN_ID": run.job_id,
            "MASTER_ADDR": run.nodes[0].link.address,
            "MASTER_PORT": str(MASTER_PORT),
            "RANK": str(node.index),
            "WORLD_SIZE": str(len(run.nodes)),
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "GLOO_SOCKET_IFNAME": "eth0",  # not whatever the host name resolves to
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def _start_job(run: Run) -> None:
    w = run.plan.scenario.workload
    for node in run.nodes:
        train = [
            sys.executable,
            str(TRAIN),
            "--data",
            str(node.tiers[w.data_tier].mnt / "data"),
            "--sample-bytes",
            str(w.sample_kib * 1024),
            "--batch-size",
            str(w.batch_size),
            "--workers",
            str(w.num_workers),
            "--preprocess-ms",
            str(w.preprocess_ms),
            "--hidden",
            str(run.plan.hidden),
            "--device-seconds",
            str(w.device_seconds_per_step),
            "--duration-s",
            str(run.plan.scenario.duration_s),
            "--timeout-s",
            str(COLLECTIVE_TIMEOUT_S),
            "--steps-out",
            str(node.out / "steps.jsonl"),
        ]
        # Into the cgroup first: under `ip netns exec` /sys is the namespace's own, without
        # the cgroup mounts. Membership survives the exec into the namespace.
        cmd = node.cgroup.enter_argv(
            [
                "ip",
                "netns",
                "exec",
                node.link.netns,
                sys.executable,
                "-m",
                "gpufeed",
                "run",
                "--socket",
                str(node.work / "sdk.sock"),
                "--name",
                "ddp-lab",
                "--",
                *train,
            ]
        )
        with open(node.out / "rank.log", "wb") as log:
            node.rank = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=_rank_env(run, node)
            )
        run.undo.callback(procs.stop, node.rank)
    # the job's first step on every rank is time zero of the fault schedule
    deadline = time.monotonic() + START_TIMEOUT_S
    while not all(_steps(n) for n in run.nodes):
        for n in run.nodes:
            assert n.rank is not None
            if n.rank.poll() is not None:
                raise RuntimeError(
                    f"rank {n.index} exited with {n.rank.returncode} before its first step "
                    f"(see {n.out / 'rank.log'})"
                )
        if time.monotonic() > deadline:
            raise RuntimeError(f"the job took no step within {START_TIMEOUT_S:g} s")
        time.sleep(0.2)
    run.t0 = time.time()
    run.log("job training", job_id=run.job_id)


def _steps(node: Node) -> list[dict[str, Any]]:
    return read_steps(node.out / "steps.jsonl")


def _trainer_pid(node: Node) -> int:
    """The training process: the one child of the rank's `gpufeed run`."""
    assert node.rank is not None
    kids = Path(f"/proc/{node.rank.pid}/task/{node.rank.pid}/children").read_text().split()
    if len(kids) != 1:
        raise RuntimeError(f"rank {node.index}: expected one training process, found {kids}")
    return int(kids[0])


def _apply(run: Run, fault: Fault) -> Callable[[], None] | None:
    """Applies `fault`; returns the step that lifts it (None: nothing to lift)."""
    node = run.nodes[fault.node]
    if fault.kind == "link_rate_limit":
        assert run.fabric is not None
        # burst: a few MTU-sized packets; latency bounds the queue so TCP sees the rate
        return run.fabric.limit_rate(fault.node, fault.param("rate"), "16kb", "400ms")
    if fault.kind == "blkio_read_limit":
        tier = node.tiers[fault.param("tier")]
        node.cgroup.set_read_limit(tier.dev, fault.param("bytes_per_s"))
        return functools.partial(node.cgroup.set_read_limit, tier.dev, None)
    if fault.kind == "cpu_quota":
        node.cgroup.set_cpu_quota(fault.param("cpus"))
        return functools.partial(node.cgroup.set_cpu_quota, None)
    pid = _trainer_pid(node)
    if fault.kind == "rank_stop":
        os.kill(pid, signal.SIGSTOP)
        return lambda: _signal_quietly(pid, signal.SIGCONT)
    os.kill(pid, signal.SIGKILL)  # rank_kill
    return None


def _signal_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _once(step: Callable[[], None]) -> Callable[[], None]:
    done: list[bool] = []

    def go() -> None:
        if not done:
            done.append(True)
            step()

    return go


def _schedule(run: Run) -> None:
    """Applies and lifts the faults at their times, then waits for the job to end."""
    sc = run.plan.scenario
    todo: list[tuple[float, str, Fault]] = []
    for f in run.plan.faults:
        todo.append((f.start_s, "apply", f))
        if f.kind != "rank_kill":  # a killed rank stays dead; stop_s only ends its interval
            todo.append((f.stop_s, "lift", f))
    todo.sort(key=lambda e: (e[0], e[1] == "apply"))
    lifts: dict[int, Callable[[], None]] = {}
    for at, what, fault in todo:
        _sleep_until(run, run.t0 + at)
        key = id(fault)
        if what == "apply":
            lift = _apply(run, fault)
            if lift is not None:
                lifts[key] = _once(lift)
                run.undo.callback(lifts[key])  # lifted on the way out if the run fails
        elif key in lifts:
            lifts[key]()
        run.log(f"fault {what}", kind=fault.kind, node=fault.node, at_s=at)
    deadline = run.t0 + sc.duration_s + COLLECTIVE_TIMEOUT_S + 60
    while any(n.rank is not None and n.rank.poll() is None for n in run.nodes):
        if time.time() > deadline:
            raise RuntimeError("the job did not end in time")
        time.sleep(0.5)
    run.log("job ended", exit_codes=[n.rank.returncode for n in run.nodes if n.rank])
    # A killed rank's interval runs to its stop_s: what the agents say of the loss after
    # the job went down is the fault's aftermath, recorded until then.
    _sleep_until(
        run, run.t0 + max((f.stop_s for f in run.plan.faults if f.kind == "rank_kill"), default=0.0)
    )


def _sleep_until(run: Run, when: float) -> None:
    while (left := when - time.time()) > 0:
        time.sleep(min(left, 0.5))


def _collect(run: Run, summary: dict[str, Any]) -> None:
    """What every agent says now, then a clean stop (which finishes its trace and log)."""
    said: list[dict[str, Any]] = []
    for node in run.nodes:
        base = f"http://127.0.0.1:{node.port}"
        windows = procs.fetch(node.link.netns, base + "/api/windows?limit=1000")
        (node.out / "api-windows.json").write_bytes(windows)
        (node.out / "metrics.prom").write_bytes(procs.fetch(node.link.netns, base + "/metrics"))
        said.append({"instance": node.instance, **json.loads(windows)})
    summary["collected_at"] = time.time()
    for node in run.nodes:
        if node.agent is not None:
            procs.stop(node.agent)
    summary["windows"] = said


def _node_summary(node: Node) -> dict[str, Any]:
    return {
        "index": node.index,
        "instance": node.instance,
        "netns": node.link.netns,
        "address": node.link.address,
        "tiers": {t.name: {"loop": t.loop, "device": t.dev} for t in node.tiers.values()},
        "cgroups": [str(d) for d in node.cgroup.dirs],
        "cgroup_tops": [str(d) for d in node.cgroup.tops],
        "rank_exit": node.rank.returncode if node.rank is not None else None,
        "steps": len(_steps(node)),
    }


def write_dataset(directory: Path, samples: int, sample_kib: int) -> None:
    """One file of random bytes per sample, synced to the tier's device."""
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(samples):
        (directory / f"{i:05d}.bin").write_bytes(os.urandom(sample_kib << 10))
    os.sync()
