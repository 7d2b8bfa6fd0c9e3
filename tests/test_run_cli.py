"""`gpufeed run` without torch: environment, sitecustomize chaining, exit codes, signals."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed import run_cli

EXPORTER = Path(run_cli.__file__).parents[1]


def test_instrumented_env_puts_inject_first_and_keeps_the_rest() -> None:
    env = run_cli.instrumented_env({"PYTHONPATH": "/a:/b", "X": "1"}, "/s.sock", "job")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(run_cli.INJECT_DIR), "/a", "/b"]
    assert env["GPUFEED_SOCKET"] == "/s.sock"
    assert env["GPUFEED_JOB_NAME"] == "job"
    assert env["X"] == "1"
    again = run_cli.instrumented_env(env)  # nested `gpufeed run`: no duplicate entry
    assert again["PYTHONPATH"] == env["PYTHONPATH"]
    assert again["GPUFEED_SOCKET"] == "/s.sock"
    assert run_cli.instrumented_env({})["GPUFEED_SOCKET"] == "/run/gpufeed/sdk.sock"


def test_inject_dir_holds_what_the_package_data_ships() -> None:
    names = sorted(p.name for p in run_cli.INJECT_DIR.glob("*.py"))
    assert names == [
        "_gpufeed_botocore.py",
        "_gpufeed_hook.py",
        "_gpufeed_s3torch.py",
        "_gpufeed_torch.py",
        "sitecustomize.py",
    ]
    assert (run_cli.INJECT_DIR.parent / "sdk.py").is_file()


def run(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        "from gpufeed.run_cli import main; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(EXPORTER), "--socket", str(tmp_path / "s"), *args],
        env={"PATH": os.environ["PATH"], **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_agent_unreachable_tells_a_live_socket_from_a_missing_or_stale_one(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "s")
    assert run_cli.agent_unreachable(path) == os.strerror(errno.ENOENT)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as live:
        live.bind(path)
        assert run_cli.agent_unreachable(path) is None
    assert run_cli.agent_unreachable(path) == os.strerror(errno.ECONNREFUSED)  # stale file


JOB_ID_PROBE = (
    "import os, sys; sys.path.insert(0, sys.argv[1]); from gpufeed import sdk; "
    "print(sdk.resolve_job_id('x'), os.environ['GPUFEED_JOB_NAME'])"
)


def job_id_under_run(tmp_path: Path, *flags: str, **env: str) -> list[str]:
    """(job id the SDK resolves, job name) in a program under `gpufeed run`."""
    out = run([*flags, "--", sys.executable, "-c", JOB_ID_PROBE, str(EXPORTER)], tmp_path, **env)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_each_run_gets_its_own_job_id(tmp_path: Path) -> None:
    first, second = (job_id_under_run(tmp_path) for _ in range(2))
    ids = [first[0], second[0]]
    assert ids[0] != ids[1]
    assert all(i.startswith(("run", "pg")) for i in ids), ids
    assert first[1] == Path(sys.executable).name
    # a nested run is a run of its own: the outer run's id is replaced
    nested = job_id_under_run(tmp_path, GPUFEED_RUN_ID="outer")
    assert nested[0] not in ("outer", *ids)


@pytest.mark.parametrize(
    ("flags", "env", "want"),
    [
        # one id on every node: the user's, else torchrun's rendezvous id
        (["--job-id", "train-48121"], {}, "train-48121"),
        ([], {"GPUFEED_JOB_ID": "train-48121"}, "train-48121"),
        ([], {"TORCHELASTIC_RUN_ID": "rdzv-7"}, "rdzv-7"),
        ([], {"GPUFEED_JOB_ID": "mine", "TORCHELASTIC_RUN_ID": "rdzv-7"}, "mine"),
        (["--job-id", "flag"], {"GPUFEED_JOB_ID": "env"}, "flag"),
        # the scheduler's wins over all of them
        (["--job-id", "flag"], {"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "r"}, "4242"),
    ],
)
def test_a_multi_node_job_has_one_id_on_every_node(
    tmp_path: Path, flags: list[str], env: dict[str, str], want: str
) -> None:
    # two "nodes": two runs started apart (two processes, two per-run ids), one job id
    got = {job_id_under_run(tmp_path, *flags, **env)[0] for _ in range(2)}
    assert got == {want}


def test_torchruns_default_rendezvous_id_is_no_job_id(tmp_path: Path) -> None:
    # `none` is torchrun's default --rdzv-id, shared by unrelated jobs: the per-run id stands
    got = job_id_under_run(tmp_path, TORCHELASTIC_RUN_ID="none")[0]
    assert got.startswith(("run", "pg")), got


def test_a_blank_job_id_is_refused(tmp_path: Path) -> None:
    out = run(["--job-id", " ", "--", sys.executable, "-c", "pass"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == "gpufeed run: --job-id must not be blank"


def test_a_program_without_torch_is_untouched(tmp_path: Path) -> None:
    probe = (
        "import os, sys; print(os.environ['GPUFEED_SOCKET']); "
        "print(sorted(m for m in sys.modules if 'gpufeed' in m or m == 'torch'))"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as agent:
        agent.bind(str(tmp_path / "s"))  # an agent listens: nothing to say on stderr
        out = run(["--", sys.executable, "-c", probe], tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == str(tmp_path / "s")
    assert lines[1] == "['_gpufeed_hook']"  # the hook only; no SDK, no torch, no patches
    assert out.stderr == ""


def test_the_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    probe = "import os; print(os.environ.get('THEIRS_RAN'))"
    out = run(["--", sys.executable, "-c", probe], tmp_path, PYTHONPATH=str(theirs))
    assert out.stdout.strip() == "yes", out.stderr


def test_a_broken_sitecustomize_of_theirs_is_reported_not_fatal(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("raise RuntimeError('boom')\n")
    out = run(["--", sys.executable, "-c", "print('ran')"], tmp_path, PYTHONPATH=str(theirs))
    assert out.stdout.strip() == "ran"
    assert "boom" in out.stderr


def test_through_a_shell_script_launcher(tmp_path: Path) -> None:
    script = tmp_path / "launch.sh"
    script.write_text(
        f"#!/bin/sh\nexec {sys.executable} -c \"import sys; print('_gpufeed_hook' in sys.modules)\"\n"
    )
    script.chmod(0o755)
    out = run(["--", str(script)], tmp_path)
    assert out.stdout.strip() == "True", out.stderr


def test_exit_codes(tmp_path: Path) -> None:
    assert run(["--", sys.executable, "-c", "raise SystemExit(7)"], tmp_path).returncode == 7
    assert run(["--", str(tmp_path / "no-such-program")], tmp_path).returncode == 127
    assert run(["--"], tmp_path).returncode == 2
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert run(["--", sys.executable, "-c", kill], tmp_path).returncode == 128 + 9


def test_sigterm_is_forwarded_to_the_command(tmp_path: Path) -> None:
    marker = tmp_path / "got-term"
    child = (
        "import signal, sys, time, pathlib\n"
        f"def h(*_): pathlib.Path({str(marker)!r}).write_text('x'); sys.exit(3)\n"
        "signal.signal(signal.SIGTERM, h)\n"
        "print('ready', flush=True)\n"
        "time.sleep(30)\n"
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        "from gpufeed.run_cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(EXPORTER), "--", sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 3
    assert marker.exists()


def test_register_adds_the_run_subcommand() -> None:
    parser = argparse.ArgumentParser(prog="gpufeed")
    run_cli.register(parser.add_subparsers(dest="subcommand"))
    args = parser.parse_args(["run", "--name", "x", "--", "echo", "hi"])
    assert args.func is not None
    assert (args.name, args.command) == ("x", ["--", "echo", "hi"])


@pytest.mark.parametrize("argv", [["--", "true"], ["true"]])
def test_func_runs_the_command(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    args = parser.parse_args(["run", *argv])
    start = time.monotonic()
    assert args.func(args) == 0
    assert time.monotonic() - start < 30


def test_a_blank_name_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    run_cli.register(parser.add_subparsers())
    args = parser.parse_args(["run", "--name", " ", "--", "true"])
    assert args.func(args) == 2
    assert "--name must not be blank" in capsys.readouterr().err
