"""What this host must offer the multi-node lab, and what a run may leave behind on it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from lab.host import CGROUP_ROOT, cgroup_mode

TOOLS = ("ip", "tc", "unshare", "hostname", "losetup", "mkfs.ext4", "mount", "umount")


def host_problem() -> str | None:
    """Why this host cannot run the lab (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, loop mounts, cgroups, tc)"
    lacking = [t for t in TOOLS if shutil.which(t) is None]
    if lacking:
        return f"missing tools: {', '.join(lacking)} (Debian: iproute2, util-linux, e2fsprogs)"
    if not cgroup_mode():
        return "needs cgroup v1 blkio and cpu hierarchies, or v2 with io and cpu"
    return None


def leftovers(prefix: str, harness_pid: int) -> list[str]:
    """Everything on this host that carries the run's prefix (namespaces, links, mounts, loop
    devices, processes, the run directory) or is a job cgroup of the harness (lab.host's
    `gpufeed-lab-<pid>-*`). Empty after a clean exit."""
    found: list[str] = []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    found += [f"netns {line.split()[0]}" for line in ns.stdout.splitlines() if prefix in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False)
    found += [
        f"link {line.split(':')[1].strip()}" for line in links.stdout.splitlines() if prefix in line
    ]
    found += [
        f"mount {line.split()[1]}"
        for line in Path("/proc/mounts").read_text().splitlines()
        if prefix in line
    ]
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False)
    found += [f"loop {line.split(':')[0]}" for line in loops.stdout.splitlines() if prefix in line]
    for root in [CGROUP_ROOT, *CGROUP_ROOT.iterdir()] if CGROUP_ROOT.exists() else []:
        found += [f"cgroup {d}" for d in root.glob(f"gpufeed-lab-{harness_pid}-*")]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if prefix in cmd:
            found.append(f"process {pid}: {cmd[:120]}")
    found += [f"dir {p}" for p in Path(tempfile.gettempdir()).glob(f"{prefix}-*")]
    return found
