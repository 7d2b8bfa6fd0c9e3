"""`gpufeed run -- COMMAND ...`: runs a program with zero-code PyTorch instrumentation.

The command runs with gpufeed/inject/ first on PYTHONPATH (its sitecustomize patches torch
when the program imports it), GPUFEED_SOCKET, GPUFEED_JOB_NAME and GPUFEED_RUN_ID set, and
every process it starts inherits them: torchrun's ranks, mpirun's, a shell script's pythons.
GPUFEED_RUN_ID is new for every run, so two runs of the same program are two jobs, each
with the program's name as its name. A job that spans nodes needs one id on all of them:
the scheduler's, torchrun's --rdzv-id, or --job-id (GPUFEED_JOB_ID), which win over the
per-run id. See docs/jobs.md for coverage.

`--serving` declares the job an inference server (docs/serving.md), from this process, so
that it works for servers that are not Python (tritonserver, text-generation-launcher):
`--serving-metrics URL` names its stack's Prometheus endpoint on this host for the agent
to scrape. The declaration is sent again every 10 s while the command runs.

Runnable on its own as `python -m gpufeed.run_cli [--socket P] [--name N] -- COMMAND ...`.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from gpufeed.config import DEFAULT_SDK_SOCKET
from gpufeed.jobs.identity import read_proc_stat, run_job_id
from gpufeed.serving.endpoints import url_problem

INJECT_DIR = Path(__file__).resolve().parent / "inject"
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def instrumented_env(
    base: Mapping[str, str],
    socket_path: str | None = None,
    name: str | None = None,
    run_id: str | None = None,
    job_id: str | None = None,
    parallel_sizes: str | None = None,
) -> dict[str, str]:
    """The environment a command runs in under `gpufeed run`: `run_id` new for this run,
    `job_id` the one the user gave (else GPUFEED_JOB_ID stays as the environment has it),
    `parallel_sizes` the job's parallelism ("tp=4,pp=4": each rank's SDK derives its
    coordinates from its global rank)."""
    env = dict(base)
    inject = str(INJECT_DIR)
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != inject]
    env["PYTHONPATH"] = os.pathsep.join([inject, *rest])
    env["GPUFEED_SOCKET"] = socket_path or env.get("GPUFEED_SOCKET") or DEFAULT_SDK_SOCKET
    if name:
        env["GPUFEED_JOB_NAME"] = name
    if run_id:
        env["GPUFEED_RUN_ID"] = run_id  # replaces an outer run's: a nested run is a run
    if job_id:
        env["GPUFEED_JOB_ID"] = job_id
    if parallel_sizes:
        env["GPUFEED_PARALLEL_SIZES"] = parallel_sizes
    return env


def agent_unreachable(socket_path: str) -> str | None:
    """Why no agent can be reached on the SDK socket (a short reason), or None if one listens.

    Connecting a datagram socket sends nothing; it fails unless a socket is bound there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sock.connect(socket_path)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.EACCES, errno.EPERM):
            reason += "; the user needs to be in the agent's group"
        return reason
    finally:
        sock.close()
    return None


SERVING_RESEND_SECONDS = 10.0


def run_command(
    command: Sequence[str],
    socket_path: str | None = None,
    name: str | None = None,
    job_id: str | None = None,
    serving_metrics: str | None = None,
    serving: bool = False,
    parallel_sizes: str | None = None,
) -> int:
    """Runs `command` instrumented, forwarding signals; returns its exit status the way a
    shell would (128 + N for a command killed by signal N)."""
    if not command:
        raise ValueError("gpufeed run needs a command after --")
    me = os.getpid()
    env = instrumented_env(
        os.environ,
        socket_path,
        name or Path(command[0]).name,
        run_job_id(read_proc_stat(Path("/proc"), me), me),
        job_id,
        parallel_sizes,
    )
    # Said once, here, rather than by every rank; the program runs all the same and its
    # SDK connects by itself if an agent starts later.
    unreachable = agent_unreachable(env["GPUFEED_SOCKET"])
    if unreachable is not None:
        print(
            f"gpufeed run: no gpufeed agent listens on {env['GPUFEED_SOCKET']} "
            f"({unreachable}); the job runs without reporting until one does",
            file=sys.stderr,
        )
    try:
        proc = subprocess.Popen(list(command), env=env)
    except OSError as exc:
        print(f"gpufeed run: cannot run {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126

    def forward(signum: int, _frame: FrameType | None) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in _FORWARDED}
    try:
        code = _wait_serving(proc, env, serving_metrics) if serving else proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    status = 128 - code if code < 0 else code
    _report_exit(env, proc.pid, status)
    return status


def _report_exit(env: Mapping[str, str], pid: int, status: int) -> None:
    """Tells the agent how the command ended: a rank killed by a signal cannot say so
    itself, and without this the agent only sees its pid gone (docs/jobs.md, lost ranks)."""
    from gpufeed.sdk import report_exit, resolve_job_id

    name = env["GPUFEED_JOB_NAME"]
    report_exit(name, resolve_job_id(name, env), pid, status & 0xFF, env["GPUFEED_SOCKET"])


def _wait_serving(
    proc: subprocess.Popen[bytes], env: Mapping[str, str], metrics_url: str | None
) -> int:
    """Waits for the command while declaring its job a serving job, again every
    SERVING_RESEND_SECONDS (an agent that restarted learns it back)."""
    from gpufeed.sdk import Job, resolve_job_id

    name = env["GPUFEED_JOB_NAME"]
    # the id the command's own processes resolve (its environment, not this process's)
    job = Job(
        name,
        env["GPUFEED_SOCKET"],
        serving=True,
        metrics_url=metrics_url,
        job_id=resolve_job_id(name, env),
    )
    try:
        while True:
            try:
                return proc.wait(timeout=SERVING_RESEND_SECONDS)
            except subprocess.TimeoutExpired:
                job.declare_serving()
    finally:
        job.close()


def _func(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        print("gpufeed run: give a command after --", file=sys.stderr)
        return 2
    for flag, given in (("--name", args.name), ("--job-id", args.job_id)):
        if given is not None and not given.strip():
            print(f"gpufeed run: {flag} must not be blank", file=sys.stderr)
            return 2
    if args.serving_metrics is not None:
        problem = url_problem(args.serving_metrics, loopback_only=True)
        if problem is not None:
            print(f"gpufeed run: --serving-metrics: {problem}", file=sys.stderr)
            return 2
    if args.parallel_sizes is not None:
        from gpufeed.sdk import parse_parallel_sizes

        sizes = parse_parallel_sizes(args.parallel_sizes)
        if isinstance(sizes, str):
            print(f"gpufeed run: --parallel-sizes: {sizes}", file=sys.stderr)
            return 2
    serving = args.serving or args.serving_metrics is not None
    return run_command(
        command,
        args.socket,
        args.name,
        args.job_id,
        args.serving_metrics,
        serving,
        args.parallel_sizes,
    )


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--socket",
        metavar="PATH",
        help="the agent's SDK socket (default: $GPUFEED_SOCKET, else " + DEFAULT_SDK_SOCKET + ")",
    )
    p.add_argument(
        "--name",
        help="the job's name (the `name` label; sets GPUFEED_JOB_NAME; default: the "
        "command's name)",
    )
    p.add_argument(
        "--job-id",
        metavar="ID",
        help="the job's id, the same on every node of a multi-node job (sets "
        "GPUFEED_JOB_ID; a scheduler's id wins over it); default: the scheduler's, else "
        "$GPUFEED_JOB_ID, else torchrun's --rdzv-id, else one new for this run",
    )
    p.add_argument(
        "--serving",
        action="store_true",
        help="the command is an inference server: its GPUs idle for lack of requests are "
        "low_demand, not a stall (docs/serving.md)",
    )
    p.add_argument(
        "--serving-metrics",
        metavar="URL",
        help="its serving stack's Prometheus endpoint on this host (vLLM, Triton, TGI), "
        "e.g. http://127.0.0.1:8000/metrics; implies --serving",
    )
    p.add_argument(
        "--parallel-sizes",
        metavar="DIM=N,...",
        help="the job's parallelism, e.g. tp=4,pp=4 (dimensions tp, cp, dp, pp; dp is what "
        "the world leaves unless given): each rank reports its data-parallel rank, "
        "pipeline stage and tensor/context-parallel ranks, derived from its global rank in "
        "Megatron's default order (sets GPUFEED_PARALLEL_SIZES; the program's own "
        "Megatron state or Job.set_parallel win over it)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    p.set_defaults(func=_func)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a PyTorch program with zero-code job instrumentation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_arguments(p)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpufeed run", description=__doc__)
    _add_arguments(p)
    args = p.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
