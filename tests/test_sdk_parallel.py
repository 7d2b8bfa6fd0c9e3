"""Parallelism coordinates (issue 24): each rank's data-parallel rank, pipeline stage and
tensor/context/expert-parallel ranks, from the SDK (declared, Megatron's parallel state, a
torch DeviceMesh, `gpufeed run --parallel-sizes`) over the real socket into
gpufeed_job_rank_info's `<dim>_rank` labels; the wire message and its bounds."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from types import ModuleType

import pytest

from gpufeed import sdk, vocabulary
from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import JobTable
from gpufeed.jobs.sdk_server import SdkServer
from gpufeed.model import iter_samples
from gpufeed.run_cli import instrumented_env
from test_run_cli import EXPORTER
from test_run_cli import run as run_cli_main
from test_sdk import (
    SlowIterable,
    server,  # noqa: F401 (the real SDK server, a fixture)
    wait_value,
)
from test_sdk_ranks import LAUNCHER_VARS
from test_sdk_wire_compat import old_wire  # noqa: F401 (the 0.2.0 decoder, a fixture)


def _rank_info(srv: SdkServer, job_id: str, rank: str, timeout: float = 5.0) -> dict[str, str]:
    """The labels of the rank's gpufeed_job_rank_info once it carries coordinates."""
    deadline = time.monotonic() + timeout
    while True:
        for s in iter_samples(srv.families()):
            labels = dict(s.labels)
            if s.name != "gpufeed_job_rank_info" or labels.get("job_id") != job_id:
                continue
            if labels.get("rank") == rank and "pp_rank" in labels:
                return labels
        if time.monotonic() > deadline:
            raise AssertionError(f"no coordinates for rank {rank} of {job_id}")
        time.sleep(0.01)


def _launch(monkeypatch: pytest.MonkeyPatch, job_id: str, rank: int, world: int) -> None:
    for var in (*LAUNCHER_VARS, sdk.PARALLEL_SIZES_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GPUFEED_JOB_ID", job_id)
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", str(world))


def test_the_sdk_and_the_agent_share_the_dimensions() -> None:
    assert sdk.PARALLEL_DIMENSIONS == vocabulary.PARALLEL_DIMENSIONS
    assert sdk.KIND_PARALLEL == wire.KIND_PARALLEL
    assert sdk.MAX_PARALLEL_SIZE == wire.MAX_PARALLEL_SIZE


def test_declared_coordinates_reach_rank_info(
    server: SdkServer,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _launch(monkeypatch, "par", 45, 64)
    job = sdk.Job("par", socket=server.socket_path)
    job.set_parallel(dp=(3, 4), pp=(2, 4), tp=(1, 4))
    for _ in job.track(SlowIterable(3, 0.001)):
        pass
    job.close()
    wait_value(server, "gpufeed_job_rank_steps_total", 3, job_id="par", rank="45")
    got = _rank_info(server, "par", "45")
    assert (got["dp_rank"], got["pp_rank"], got["tp_rank"]) == ("3", "2", "1")
    assert "cp_rank" not in got and "ep_rank" not in got  # not said: absent, not 0


def test_sizes_from_gpufeed_run_give_each_rank_its_coordinates(
    server: SdkServer,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpufeed run --parallel-sizes tp=4,pp=4` on a 64-rank world: rank 45 is tensor rank
    1, data-parallel rank 3 (of the 4 the world leaves), stage 2 (Megatron's order)."""
    _launch(monkeypatch, "sized", 45, 64)
    env = instrumented_env({}, server.socket_path, parallel_sizes="tp=4,pp=4")
    monkeypatch.setenv(sdk.PARALLEL_SIZES_ENV, env[sdk.PARALLEL_SIZES_ENV])
    job = sdk.Job("sized", socket=server.socket_path)
    for _ in job.track(SlowIterable(2, 0.001)):
        pass
    job.close()
    got = _rank_info(server, "sized", "45")
    assert (got["tp_rank"], got["dp_rank"], got["pp_rank"]) == ("1", "3", "2")
    assert job.parallel == {"tp": (1, 4), "dp": (3, 4), "pp": (2, 4)}


@pytest.mark.parametrize(
    ("text", "rank", "world", "want"),
    [
        ("tp=2,pp=2", 5, 8, {"tp": (1, 2), "dp": (0, 2), "pp": (1, 2)}),
        ("tp=2,cp=2,pp=2", 7, 16, {"tp": (1, 2), "cp": (1, 2), "dp": (1, 2), "pp": (0, 2)}),
        ("tp=2,dp=2,pp=2", 3, 8, {"tp": (1, 2), "dp": (1, 2), "pp": (0, 2)}),
        ("tp=3,pp=2", 0, 8, None),  # does not divide the world
        ("tp=2,dp=3,pp=2", 0, 8, None),  # does not make the world
        ("tp=two", 0, 8, None),
        ("zz=2", 0, 8, None),
        ("", 0, 8, None),
    ],
)
def test_sizes_from_the_environment(
    text: str, rank: int, world: int, want: dict[str, tuple[int, int]] | None
) -> None:
    assert sdk.environ_parallel({sdk.PARALLEL_SIZES_ENV: text}, rank, world) == want


def test_megatron_parallel_state_is_read_only_where_the_program_imported_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Duck-typed: a module that answers Megatron's parallel_state calls, put where the
    program's import would put it; the SDK never imports Megatron itself."""
    assert "megatron.core.parallel_state" not in sys.modules
    assert sdk.megatron_parallel() is None
    ps = types.ModuleType("megatron.core.parallel_state")
    ready = {"on": False}
    ps.model_parallel_is_initialized = lambda: ready["on"]  # type: ignore[attr-defined]
    for name, (i, n) in {
        "data_parallel": (2, 4),
        "pipeline_model_parallel": (3, 4),
        "tensor_model_parallel": (0, 4),
    }.items():
        setattr(ps, f"get_{name}_rank", lambda i=i: i)
        setattr(ps, f"get_{name}_world_size", lambda n=n: n)
    monkeypatch.setitem(sys.modules, "megatron.core.parallel_state", ps)
    assert sdk.megatron_parallel() is None  # imported, not initialised yet
    ready["on"] = True
    # context and expert parallel missing (an older Megatron): left out
    assert sdk.megatron_parallel() == {"dp": (2, 4), "pp": (3, 4), "tp": (0, 4)}


def test_a_device_mesh_gives_its_named_dimensions(tmp_path: Path) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("pp", "dp_shard", "tp"))
        assert sdk.mesh_parallel(mesh) == {"pp": (0, 1), "dp": (0, 1), "tp": (0, 1)}
        job = sdk.Job("mesh", socket="/nonexistent/s")
        job.set_parallel_from_mesh(mesh)
        assert job.parallel == {"pp": (0, 1), "dp": (0, 1), "tp": (0, 1)}
    finally:
        dist.destroy_process_group()
    with pytest.raises(ValueError, match="no named dimension"):
        sdk.Job("mesh", socket="/nonexistent/s").set_parallel_from_mesh(object())


@pytest.mark.parametrize(
    ("dims", "words"),
    [
        ({"zz": (0, 2)}, "unknown dimension"),
        ({"pp": (4, 4)}, "need 0 <= index < size"),
        ({"pp": (0, sdk.MAX_PARALLEL_SIZE + 1)}, "need 0 <= index < size"),
        ({"pp": 3}, "is not (index, size)"),
        ({"pp": (1.0, 4)}, "is not (index, size)"),
    ],
)
def test_set_parallel_refuses_what_is_no_coordinate(dims: dict[str, object], words: str) -> None:
    with pytest.raises(ValueError, match=words.replace("(", r"\(").replace(")", r"\)")):
        sdk.Job("x", socket="/nonexistent/s").set_parallel(**dims)  # type: ignore[arg-type]


def _parallel(phase: int, a: float, b: float, n: int = 0) -> bytes:
    head = wire.HEADER.pack(wire.MAGIC, 1, wire.KIND_PARALLEL, phase, 0, 1, 1, a, b, n)
    return head + b"jx"


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (_parallel(1, 3.0, 4.0), ("pp", 3, 4)),
        (_parallel(4, 0.0, 8.0), ("ep", 0, 8)),
        (_parallel(5, 0.0, 8.0), wire.REASON_PHASE),
        (_parallel(0, 4.0, 4.0), wire.REASON_SCHEMA),
        (_parallel(0, -1.0, 4.0), wire.REASON_SCHEMA),
        (_parallel(0, 0.5, 4.0), wire.REASON_SCHEMA),
        (_parallel(0, 0.0, float(wire.MAX_PARALLEL_SIZE + 1)), wire.REASON_SCHEMA),
        (_parallel(0, 0.0, 4.0, n=1), wire.REASON_SCHEMA),
        (_parallel(0, float("nan"), 4.0), wire.REASON_SCHEMA),
    ],
)
def test_the_decoder_bounds_a_coordinate(data: bytes, want: object) -> None:
    got = wire.decode_datagram(data)
    if isinstance(want, str):
        assert got == want
        return
    assert isinstance(got, list) and len(got) == 1
    m = got[0]
    assert (m.phase, m.parallel_index, m.parallel_size) == want
    assert wire.decode_datagram(wire.encode(m)) == [m]


def test_a_coordinate_without_a_rank_is_nobodys() -> None:
    table = JobTable(max_jobs=4, grace_seconds=5, pid_alive=lambda p: True)
    coord = wire.Message(
        wire.KIND_PARALLEL, "j", "t", phase="pp", parallel_index=1, parallel_size=2
    )
    assert table.apply(coord, 101, 0.0) is None  # before its RANK: dropped quietly
    table.apply(wire.Message(wire.KIND_RANK, "j", "t", rank=0, world_size=2), 101, 0.0)
    infos = [dict(s.labels) for s in iter_samples(table.families()) if s.name.endswith("rank_info")]
    assert infos and "pp_rank" not in infos[0]
    table.apply(coord, 101, 1.0)
    infos = [dict(s.labels) for s in iter_samples(table.families()) if s.name.endswith("rank_info")]
    assert infos[0]["pp_rank"] == "1"


SIZES_PROBE = (
    "import os, sys; sys.path.insert(0, sys.argv[1]); from gpufeed import sdk; "
    "print(sdk.environ_parallel(os.environ, 45, 64))"
)


def test_gpufeed_run_hands_its_sizes_to_every_rank(tmp_path: Path) -> None:
    out = run_cli_main(
        ["--parallel-sizes", "tp=4,pp=4", "--", sys.executable, "-c", SIZES_PROBE, str(EXPORTER)],
        tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'tp': (1, 4), 'dp': (3, 4), 'pp': (2, 4)}"


@pytest.mark.parametrize(
    ("sizes", "words"),
    [
        ("tp=4,zz=2", "'zz=2' is not DIM=SIZE with DIM one of tp, cp, dp, pp"),
        ("tp=0", "tp='0': need a whole number from 1 to 65536"),
        ("tp=4,tp=2", "tp given twice"),
    ],
)
def test_gpufeed_run_refuses_sizes_it_cannot_use(tmp_path: Path, sizes: str, words: str) -> None:
    out = run_cli_main(["--parallel-sizes", sizes, "--", sys.executable, "-c", "pass"], tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip() == f"gpufeed run: --parallel-sizes: {words}"


def test_an_older_agent_refuses_only_the_coordinates_datagram(
    old_wire: ModuleType,  # noqa: F811 (the fixture imported above)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What today's SDK sends for a rank with coordinates, captured from its socket calls:
    the 0.2.0 decoder refuses the PARALLEL datagram (as `schema`) and nothing with it,
    the steps decode as they always did."""
    _launch(monkeypatch, "old", 3, 8)
    job = sdk.Job("old", socket="/nonexistent/s")
    sent: list[bytes] = []
    monkeypatch.setattr(job, "_send_status", lambda d: sent.append(d) or 0)
    job.set_parallel(dp=(1, 2), pp=(1, 2), tp=(1, 2))
    for _ in job.track(SlowIterable(2, 0.001)):
        pass
    job._flush()
    today = [wire.decode_datagram(d) for d in sent]
    kinds = [{m.kind for m in got} for got in today if isinstance(got, list)]
    assert {wire.KIND_PARALLEL} in kinds and len(kinds) == len(sent)
    old = [old_wire.decode_datagram(d) for d in sent]
    parallel = [o for o, k in zip(old, kinds, strict=True) if k == {wire.KIND_PARALLEL}]
    assert parallel and all(o == "schema" for o in parallel)
    steps = [o for o, k in zip(old, kinds, strict=True) if wire.KIND_STEP in k]
    assert steps and all(isinstance(o, list) for o in steps)


MESH_PROGRAM = r"""
import os, sys
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.utils.data import DataLoader

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("pp", "dp_shard", "tp"))
init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))  # a smaller mesh tells less
for batch in DataLoader(list(range(6)), batch_size=2):
    pass
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_gpufeed_run_reads_a_torchtitan_style_mesh(tmp_path: Path) -> None:
    """Under `gpufeed run`, a program's init_device_mesh with named dimensions reports
    the rank's coordinates with no code of ours in it (real torch, gloo, the real server)."""
    # run_cli_main gives `gpufeed run` the socket tmp_path / "s"
    srv = SdkServer(
        str(tmp_path / "s"), max_jobs=8, max_messages_per_second=10000, grace_seconds=60
    )
    srv.start()
    try:
        out = run_cli_main(
            ["--job-id", "mesh", "--", sys.executable, "-c", MESH_PROGRAM, str(tmp_path / "st")],
            tmp_path,
            RANK="0",
            WORLD_SIZE="1",
        )
        assert out.returncode == 0, out.stderr
        got = _rank_info(srv, "mesh", "0", timeout=10.0)
    finally:
        srv.stop()
    assert (got["pp_rank"], got["dp_rank"], got["tp_rank"]) == ("0", "0", "0")
