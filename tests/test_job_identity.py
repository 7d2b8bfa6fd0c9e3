from pathlib import Path

import pytest

from gpufeed.jobs.identity import (
    UNIFIED,
    JobIdentity,
    parse_cgroup,
    parse_proc_stat,
    read_job_identity,
)

FIXTURES = Path(__file__).parent / "fixtures"
CGROUP = FIXTURES / "cgroup"

# fixture file -> (scheduler, job id, job-level dir per hierarchy) or None for no scheduler job
CASES: list[tuple[str, tuple[str, str, dict[str, str]] | None]] = [
    (
        "slurm_v1.txt",
        (
            "slurm",
            "4242",
            {
                "pids": "/slurm/uid_1000/job_4242",
                "blkio": "/slurm/uid_1000/job_4242",
                "devices": "/slurm/uid_1000/job_4242",
                "memory": "/slurm/uid_1000/job_4242",
                "freezer": "/slurm/uid_1000/job_4242",
                "cpu,cpuacct": "/slurm/uid_1000/job_4242",
                "cpuset": "/slurm/uid_1000/job_4242",
            },
        ),
    ),
    (
        "slurm_v1_multi_slurmd.txt",
        (
            "slurm",
            "17",
            {
                "blkio": "/slurm_gpu-node-07/uid_0/job_17",
                "memory": "/slurm_gpu-node-07/uid_0/job_17",
            },
        ),
    ),
    (
        "slurm_v2.txt",
        ("slurm", "987654", {UNIFIED: "/system.slice/slurmstepd.scope/job_987654"}),
    ),
    (
        "slurm_v2_node_scope.txt",
        ("slurm", "31337", {UNIFIED: "/system.slice/gpu-node-07_slurmstepd.scope/job_31337"}),
    ),
    (
        "slurm_v2_sluid.txt",
        (
            "slurm",
            "s1J3K8X0Q6B2A",
            {UNIFIED: "/system.slice/slurmstepd.scope/job_s1J3K8X0Q6B2A"},
        ),
    ),
    (
        "k8s_systemd_burstable.txt",
        (
            "kubernetes",
            "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab",
            {
                UNIFIED: "/kubepods.slice/kubepods-burstable.slice/"
                "kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_0123456789ab.slice"
            },
        ),
    ),
    (
        "k8s_systemd_guaranteed_v1.txt",
        (
            "kubernetes",
            "0f9e8d7c-6b5a-4938-2716-fedcba987654",
            {
                k: "/kubepods.slice/kubepods-pod0f9e8d7c_6b5a_4938_2716_fedcba987654.slice"
                for k in ("blkio", "memory", "name=systemd")
            },
        ),
    ),
    (
        "k8s_cgroupfs_besteffort.txt",
        (
            "kubernetes",
            "4c3b2a19-0817-4f6e-a5d4-c3b2a1908f7e",
            {UNIFIED: "/kubepods/besteffort/pod4c3b2a19-0817-4f6e-a5d4-c3b2a1908f7e"},
        ),
    ),
    (
        "k8s_cgroupfs_static_pod_v1.txt",
        (
            "kubernetes",
            "6b1f0e2d3c4b5a69788796a5b4c3d2e1",
            {
                "blkio": "/kubepods/burstable/pod6b1f0e2d3c4b5a69788796a5b4c3d2e1",
                "memory": "/kubepods/burstable/pod6b1f0e2d3c4b5a69788796a5b4c3d2e1",
            },
        ),
    ),
    (
        "k8s_containerd_full_id.txt",
        (
            "kubernetes",
            "81e09ae0-12ec-4ec5-94b8-51cda7906370",
            {
                UNIFIED: "/kubepods.slice/kubepods-besteffort.slice/"
                "kubepods-besteffort-pod81e09ae0_12ec_4ec5_94b8_51cda7906370.slice"
            },
        ),
    ),
    (
        "k8s_cgroupfs_static_pod_full_id.txt",
        (
            "kubernetes",
            "33d556edd3ae8ef21980288cef77ae8b",
            {UNIFIED: "/kubepods/burstable/pod33d556edd3ae8ef21980288cef77ae8b"},
        ),
    ),
    (
        "k8s_crio_conmon.txt",
        (
            "kubernetes",
            "0b7632a2-a56e-4278-987a-22de18008dbe",
            {
                UNIFIED: "/kubepods.slice/kubepods-burstable.slice/"
                "kubepods-burstable-pod0b7632a2_a56e_4278_987a_22de18008dbe.slice"
            },
        ),
    ),
    ("plain_user_session.txt", None),
    ("plain_docker.txt", None),
    ("not_slurm_job_dir.txt", None),
    ("not_k8s_pod_dir.txt", None),
    ("garbage.txt", None),
]


@pytest.mark.parametrize(("fixture", "expected"), CASES, ids=[c[0] for c in CASES])
def test_parse_cgroup_fixtures(
    fixture: str, expected: tuple[str, str, dict[str, str]] | None
) -> None:
    got = parse_cgroup((CGROUP / fixture).read_text())
    if expected is None:
        assert got is None
        return
    assert got is not None
    scheduler, job_id, dirs = expected
    assert (got.scheduler, got.job_id) == (scheduler, job_id)
    assert dict(got.cgroup_dirs) == dirs


def test_every_fixture_is_in_the_table() -> None:
    assert sorted(p.name for p in CGROUP.iterdir()) == sorted(c[0] for c in CASES)


def test_cgroup_dir_finds_a_controller_in_a_joint_hierarchy() -> None:
    ident = parse_cgroup((CGROUP / "slurm_v1.txt").read_text())
    assert ident is not None
    assert ident.cgroup_dir("cpuacct") == "/slurm/uid_1000/job_4242"
    assert ident.cgroup_dir(UNIFIED) is None


def test_proc_stat_with_parentheses_and_spaces_in_comm() -> None:
    text = (FIXTURES / "procfs_jobs" / "300" / "stat").read_text()
    st = parse_proc_stat(text)
    assert st is not None
    assert (st.pid, st.comm, st.ppid, st.pgid, st.sid, st.start_ticks) == (
        300,
        "pt_main thread) (x",
        200,
        200,
        150,
        7100,
    )
    assert parse_proc_stat("12 (x) S 1") is None
    assert parse_proc_stat("garbage") is None


@pytest.mark.parametrize(
    ("pid", "expected"),
    [
        (100, JobIdentity("slurm", "987654")),
        (101, JobIdentity("kubernetes", "1a2b3c4d-5e6f-7a8b-9c0d-0123456789ab")),
        # a torchrun rank: same job as its launcher, the process group leader (start 7000)
        (300, JobIdentity("process", "pg200-7000")),
        (200, JobIdentity("process", "pg200-7000")),
        # group leader gone: the id is the group alone
        (301, JobIdentity("process", "pg999")),
        (555, None),  # no such process
    ],
)
def test_read_job_identity_on_fixture_procfs(pid: int, expected: JobIdentity | None) -> None:
    got = read_job_identity(FIXTURES / "procfs_jobs", pid)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.scheduler, got.job_id) == (expected.scheduler, expected.job_id)
