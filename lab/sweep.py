"""What lab runners killed with SIGKILL left on this host, removed when a runner starts.

A runner undoes everything it set up on a normal end, an exception, SIGTERM, SIGHUP and
SIGINT, and its faults' processes die with it (lab.faults.dies_with_runner). No trap sees
a SIGKILL of the runner itself: its tiers stay mounted on their loop devices, its cgroups
stay, and so do its run directory and any process still in those cgroups or working in
that directory. Every such part carries the runner's pid in its name:

- `gpufeed-lab-<pid>-*`: a single-node run's directory (tiers mounted under it, their loop
  devices' images, a capacity tier's FUSE mount) and every lab job cgroup (lab.host);
- `gfl<pid><letter>*`: a multi-node run's directory and network namespaces.

`sweep()` removes the parts of runners whose pid is no longer alive, and only those:
another engineer's lab may be running on the same host, and its pid is alive. (A dead
runner's pid that the kernel has given to a new process looks alive: its parts are left
for a later sweep, never taken from someone.) Order: processes first (they hold mounts and
cgroups), then mounts deepest first, loop devices, mounts that backed them (FUSE), network
namespaces, cgroups deepest first, and the run directories once nothing is mounted in them.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
# the runner's pid in each kind of name
SINGLE = re.compile(r"gpufeed-lab-(\d+)-")
MULTI = re.compile(r"\bgfl(\d+)[a-z](?=n\d|br|-|$)")


def runner_pid(name: str) -> int | None:
    """The pid of the runner a name belongs to, or None for a name no runner makes."""
    m = SINGLE.search(name) or MULTI.search(name)
    return int(m.group(1)) if m else None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _dead(name: str) -> bool:
    pid = runner_pid(name)
    return pid is not None and pid != os.getpid() and not alive(pid)


def _run(*argv: str) -> bool:
    return subprocess.run(argv, capture_output=True).returncode == 0


def _mounts() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount on this host (/proc/mounts' octal
    escapes decoded)."""
    out = []
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2:
            mnt = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
            out.append((mnt, fields[2]))
    return out


def _loop_devices() -> list[tuple[str, str]]:
    """(device, backing file) of every attached loop device."""
    out = []
    for d in Path("/sys/block").glob("loop*"):
        with contextlib.suppress(OSError):
            backing = (d / "loop" / "backing_file").read_text().strip()
            out.append((f"/dev/{d.name}", backing))
    return out


def _cgroup_tops() -> list[Path]:
    """Top-level lab cgroups in every hierarchy (v1: one per controller; v2: the root)."""
    if not CGROUP_ROOT.exists():
        return []
    roots = [CGROUP_ROOT, *(p for p in CGROUP_ROOT.iterdir() if p.is_dir())]
    seen: set[Path] = set()
    out = []
    for root in roots:
        for top in root.glob("gpufeed-lab-*"):
            real = top.resolve()  # cpu and cpuacct may be one hierarchy under two names
            if real not in seen and top.is_dir():
                seen.add(real)
                out.append(top)
    return out


def _cgroup_tree(top: Path) -> list[Path]:
    """`top` and every cgroup below it, deepest first."""
    found = [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def _pids_in(cgroups: Iterable[Path]) -> set[int]:
    pids: set[int] = set()
    for d in cgroups:
        with contextlib.suppress(OSError, ValueError):
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
    return pids


def _pids_naming(tags: set[str]) -> set[int]:
    """Processes whose command line names one of `tags` (a dead runner's agent, workload
    or FUSE server working in its run directory)."""
    pids = set()
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, UnicodeDecodeError):
            continue
        if any(t in cmd for t in tags):
            pids.add(int(entry))
    return pids


def _netns_dead() -> list[str]:
    got = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    names = [line.split()[0] for line in got.stdout.splitlines() if line.strip()]
    return [n for n in names if MULTI.match(n) and _dead(n)]


def _tag(name: str) -> str:
    """The run's own prefix in a name: `gpufeed-lab-<pid>-<suffix>` or `gfl<pid><letter>`."""
    m = SINGLE.search(name)
    if m:
        rest = name[m.start() :].split("/")[0]
        return rest
    m = MULTI.search(name)
    assert m is not None
    return name[m.start() : m.end()]


def sweep(tmp: Path | None = None) -> list[str]:
    """Removes the parts that dead lab runners left; one line per part removed (or that
    could not be), e.g. "mount /tmp/gpufeed-lab-4242-x1/hot (runner 4242)"."""
    tmp = tmp or Path(tempfile.gettempdir())
    said: list[str] = []

    def say(what: str, name: str, ok: bool = True) -> None:
        said.append(f"{what} {name} (runner {runner_pid(name)}){'' if ok else ': FAILED'}")

    dirs = [p for p in tmp.glob("gpufeed-lab-*") if _dead(p.name)]
    dirs += [p for p in tmp.glob("gfl*") if MULTI.match(p.name) and _dead(p.name)]
    tops = [t for t in _cgroup_tops() if _dead(t.name)]
    netns = _netns_dead()
    tags = {str(d) for d in dirs} | {_tag(n) for n in netns}

    # processes: those in a dead runner's cgroups, and those working in its directory
    pids = _pids_in(c for t in tops for c in _cgroup_tree(t)) | _pids_naming(tags)
    for ns in netns:
        got = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids.update(int(x) for x in got.stdout.split() if x.isdigit())
    pids.discard(os.getpid())
    for pid in sorted(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            said.append(f"process {pid} (of a dead lab runner)")
    _wait_gone(pids)

    # a tier's file system first (deepest first), then its loop device, then the FUSE
    # mount that served the loop device's image (a capacity tier)
    inside = tuple(str(d) + "/" for d in dirs)
    mounts = [(m, fs) for m, fs in _mounts() if m.startswith(inside)]
    for fuse in (False, True):
        for mnt, fs in sorted(mounts, key=lambda x: len(x[0]), reverse=True):
            if fs.startswith("fuse") == fuse:
                say("mount", mnt, _unmount(mnt))
        if not fuse:
            for dev, backing in _loop_devices():
                if backing.startswith(inside):
                    say("loop device", f"{dev} ({backing})", _run("losetup", "-d", dev))
    for ns in netns:
        say("netns", ns, _run("ip", "netns", "del", ns))
    for top in tops:
        gone = [_rmdir(d) for d in _cgroup_tree(top)]
        say("cgroup", str(top), all(gone))
    mounted = [m for m, _ in _mounts()]
    for d in dirs:
        if any(m.startswith(str(d) + "/") for m in mounted):
            say("dir", str(d), ok=False)  # never delete through a mount
            continue
        shutil.rmtree(d, ignore_errors=True)
        say("dir", str(d), not d.exists())
    return said


def _unmount(mnt: str) -> bool:
    for _ in range(8):
        if _run("umount", mnt):
            return True
        time.sleep(0.25)
    return _run("umount", "-l", mnt)


def _rmdir(d: Path) -> bool:
    for _ in range(20):
        try:
            d.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            time.sleep(0.1)  # its processes still leaving
    return False


def _wait_gone(pids: set[int], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return
        time.sleep(0.05)
