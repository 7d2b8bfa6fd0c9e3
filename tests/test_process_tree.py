"""The live descendants of a job's processes (gpufeed.jobs.process_tree), on fixture /proc
trees built per case (both ways the kernel may tell children) and on this host's real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufeed.jobs.process_tree import MAX_PROCESSES_PER_JOB, ProcessTree, parse_children


def stat_line(pid: int, ppid: int, comm: str = "python") -> str:
    rest = ["S", str(ppid), str(pid), str(pid)] + ["0"] * 15 + ["1000"]
    return f"{pid} ({comm}) {' '.join(rest)}\n"


def make_proc(root: Path, parents: dict[int, int], per_thread: bool) -> Path:
    """A /proc tree where `parents` maps each pid to its parent; the children files are
    written on the process's main thread when `per_thread`, as the kernel lists them."""
    for pid, ppid in parents.items():
        task = root / str(pid) / "task" / str(pid)
        task.mkdir(parents=True)
        (root / str(pid) / "stat").write_text(stat_line(pid, ppid, "pt_data_worker) x"))
        if per_thread:
            kids = [str(c) for c, p in parents.items() if p == pid]
            (task / "children").write_text(" ".join(kids) + (" " if kids else ""))
    return root


@pytest.mark.parametrize(
    ("text", "expected"),
    [("", []), ("12 13 ", [12, 13]), ("7", [7]), ("12 x 13\n", [12, 13])],
)
def test_parse_children(text: str, expected: list[int]) -> None:
    assert parse_children(text) == expected


# main 100 -> workers 101, 102; 102 -> 103 (a worker's own child); 200 is another job's
FAMILY = {100: 1, 101: 100, 102: 100, 103: 102, 200: 1, 201: 200}


@pytest.mark.parametrize("per_thread", [True, False], ids=["children-file", "stat-scan"])
def test_a_job_gets_its_workers_and_theirs_not_another_jobs(
    tmp_path: Path, per_thread: bool
) -> None:
    tree = ProcessTree(make_proc(tmp_path, FAMILY, per_thread))
    got = tree.expand({"a": [100], "b": [200]})
    assert got["a"][0] == 100 and sorted(got["a"]) == [100, 101, 102, 103]
    assert sorted(got["b"]) == [200, 201]


def test_a_known_pid_that_is_also_a_descendant_is_listed_once(tmp_path: Path) -> None:
    tree = ProcessTree(make_proc(tmp_path, FAMILY, per_thread=True))
    assert sorted(tree.with_descendants([100, 102])) == [100, 101, 102, 103]
    assert tree.with_descendants([]) == []


def test_a_stat_scan_is_reused_until_it_is_due(tmp_path: Path) -> None:
    now = [0.0]
    proc = make_proc(tmp_path, {100: 1, 101: 100}, per_thread=False)
    tree = ProcessTree(proc, rescan_seconds=10.0, clock=lambda: now[0])
    assert sorted(tree.with_descendants([100])) == [100, 101]
    make_proc(proc, {102: 100}, per_thread=False)  # a worker forked since
    now[0] = 9.0
    assert sorted(tree.with_descendants([100])) == [100, 101]
    now[0] = 10.0
    assert sorted(tree.with_descendants([100])) == [100, 101, 102]


def test_one_tick_walks_once_for_every_collector_that_asks(tmp_path: Path) -> None:
    now = [0.0]
    proc = make_proc(tmp_path, {100: 1, 101: 100}, per_thread=True)
    tree = ProcessTree(proc, clock=lambda: now[0])
    assert sorted(tree.expand({"a": [100]})["a"]) == [100, 101]
    make_proc(proc, {102: 100}, per_thread=True)  # forked since; 100's children file is old
    (proc / "100" / "task" / "100" / "children").write_text("101 102 ")
    now[0] = 0.3  # the next collector of the same tick
    assert sorted(tree.expand({"a": [100]})["a"]) == [100, 101]
    assert sorted(tree.expand({"a": [100], "b": [200]})["a"]) == [100, 101, 102]  # other jobs
    now[0] = 1.0  # the next tick walks again
    assert sorted(tree.expand({"a": [100]})["a"]) == [100, 101, 102]


def test_a_fork_bomb_is_cut_at_the_cap(tmp_path: Path) -> None:
    n = MAX_PROCESSES_PER_JOB + 50
    (tmp_path / "1" / "task" / "1").mkdir(parents=True)
    (tmp_path / "1" / "task" / "1" / "children").write_text(" ".join(map(str, range(2, n))))
    assert len(ProcessTree(tmp_path).with_descendants([1])) == MAX_PROCESSES_PER_JOB


def test_a_gone_probe_gives_only_the_known_pids(tmp_path: Path) -> None:
    assert ProcessTree(tmp_path).with_descendants([4242]) == [4242]


def test_real_children_are_found_on_this_hosts_proc() -> None:
    """A real parent with two real children and a grandchild, through whichever way this
    kernel tells children (the per-thread children file or the stat scan)."""
    code = (
        "import os, subprocess, sys, time\n"
        "kids = [subprocess.Popen([sys.executable, '-c', "
        '\'import subprocess,sys,time; subprocess.Popen(["sleep", "30"]); time.sleep(30)\'])'
        " for _ in range(2)]\n"
        "print(' '.join(str(k.pid) for k in kids), flush=True)\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        kids = [int(p) for p in parent.stdout.readline().split()]
        deadline = time.monotonic() + 10.0
        while True:
            found = ProcessTree(Path("/proc")).with_descendants([parent.pid])
            if len(found) >= 5 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert found[0] == parent.pid
        assert set(kids) <= set(found)
        assert len(found) == 5, found  # parent, 2 children, 2 grandchildren
        assert os.getpid() not in found
    finally:
        parent.kill()
        parent.wait()
        subprocess.run(["pkill", "-P", str(parent.pid)], check=False)
