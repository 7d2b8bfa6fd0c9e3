"""Fuzzing the agent's SDK decoder: whatever arrives, it returns a message or a reason."""

from __future__ import annotations

import math
import unicodedata

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufeed import sdk
from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import JobTable

label = st.text(
    alphabet=st.characters(min_codepoint=0x20, exclude_categories=("Cs", "Cc", "Cf", "Zl", "Zp")),
    min_size=1,
    max_size=16,  # at most 4 bytes a character: within the 64-byte name limit
).filter(lambda s: s.strip() != "")
seconds = st.floats(min_value=0.0, max_value=wire.MAX_EVENT_SECONDS, allow_nan=False)


@st.composite
def messages(draw: st.DrawFn) -> wire.Message:
    kind = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 7, wire.KIND_EXIT]))
    job_id, name = draw(label), draw(label)
    if kind == wire.KIND_STEP:
        return wire.Message(
            kind,
            job_id,
            name,
            seconds=draw(seconds),
            compute_seconds=draw(seconds),
            steps=draw(st.integers(0, wire.MAX_STEPS_PER_EVENT)),
        )
    if kind == wire.KIND_PHASE:
        return wire.Message(
            kind,
            job_id,
            name,
            phase=draw(st.sampled_from(wire.RANK_PHASES)),
            seconds=draw(seconds),
        )
    if kind == wire.KIND_CHECKPOINT:
        nbytes = draw(st.none() | st.integers(0, wire.MAX_CHECKPOINT_BYTES))
        return wire.Message(kind, job_id, name, seconds=draw(seconds), checkpoint_bytes=nbytes)
    if kind == wire.KIND_EPOCH:
        return wire.Message(kind, job_id, name, seconds=draw(seconds))
    if kind == wire.KIND_IO:
        io_bytes = st.integers(0, wire.MAX_IO_BYTES)
        return wire.Message(
            kind, job_id, name, read_bytes=draw(io_bytes), written_bytes=draw(io_bytes)
        )
    if kind == wire.KIND_RANK:
        world = draw(st.integers(1, wire.MAX_WORLD_SIZE))
        return wire.Message(
            kind,
            job_id,
            name,
            rank=draw(st.integers(0, world - 1)),
            local_rank=draw(st.none() | st.integers(0, world - 1)),
            world_size=world,
        )
    if kind == wire.KIND_EXIT:
        return wire.Message(
            kind,
            job_id,
            name,
            exit_pid=draw(st.integers(1, wire.MAX_PID)),
            exit_status=draw(st.integers(0, wire.MAX_EXIT_STATUS)),
        )
    return wire.Message(kind, job_id, name)


def _check(result: wire.Message | str) -> None:
    if isinstance(result, str):
        assert result in wire.DROP_REASONS
        return
    assert 1 <= result.kind <= wire.KIND_EXIT
    assert 0 <= result.read_bytes <= wire.MAX_IO_BYTES
    assert 0 <= result.written_bytes <= wire.MAX_IO_BYTES
    assert 0 < len(result.job_id.encode()) <= wire.MAX_JOB_ID_BYTES
    assert 0 < len(result.name.encode()) <= wire.MAX_NAME_BYTES
    for x in (result.seconds, result.compute_seconds):
        assert math.isfinite(x) and 0 <= x <= wire.MAX_EVENT_SECONDS
    assert result.phase == "" or result.phase in wire.RANK_PHASES
    if result.kind == wire.KIND_RANK:
        assert 0 <= result.rank < result.world_size <= wire.MAX_WORLD_SIZE
        assert result.local_rank is None or 0 <= result.local_rank < result.world_size
    for text in (result.job_id, result.name):
        assert not {unicodedata.category(c) for c in text} & wire.REFUSED_CATEGORIES
    # whatever decodes must also be safe to add into the job table
    table = JobTable(max_jobs=2, grace_seconds=1, pid_alive=lambda p: False)
    assert table.apply(result, 0, 0.0) is None
    # and from a process the agent sees, after it said its rank (the per-rank sums)
    rank = wire.Message(wire.KIND_RANK, result.job_id, result.name, rank=1, world_size=2)
    assert table.apply(rank, 4242, 0.0) is None
    assert table.apply(result, 4242, 0.0) is None
    table.families({4242: {"GPU-x"}})


def _check_all(result: list[wire.Message] | str) -> None:
    if isinstance(result, str):
        _check(result)
        return
    assert result
    for msg in result:
        _check(msg)


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=600))
def test_random_bytes_never_raise(data: bytes) -> None:
    _check_all(wire.decode_datagram(data))


@settings(max_examples=600, deadline=None)
@given(
    st.lists(messages(), min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), min_size=1, max_size=4),
    st.integers(0, 8),
)
def test_mutated_valid_datagrams_never_raise(
    msgs: list[wire.Message], flips: list[tuple[int, int]], cut: int
) -> None:
    data = bytearray(b"".join(wire.encode(m) for m in msgs))
    for pos, byte in flips:
        data[pos % len(data)] = byte
    _check_all(wire.decode_datagram(bytes(data[: len(data) - cut])))


@settings(max_examples=300, deadline=None)
@given(st.lists(messages(), min_size=1, max_size=5))
def test_valid_datagrams_round_trip(msgs: list[wire.Message]) -> None:
    assert wire.decode_datagram(b"".join(wire.encode(m) for m in msgs)) == msgs


def test_oversized_datagram_is_refused() -> None:
    one = wire.encode(wire.Message(wire.KIND_EPOCH, "j", "n", seconds=1.0))
    fits = one * (wire.MAX_DATAGRAM_BYTES // len(one))
    assert isinstance(wire.decode_datagram(fits), list)
    assert wire.decode_datagram(fits + one) == wire.REASON_SIZE


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(wire.RANK_PHASES),
    seconds,
    st.text(min_size=1, max_size=200).filter(lambda s: s.strip() != ""),
)
def test_what_the_sdk_sends_decodes(phase: str, secs: float, name: str) -> None:
    """The SDK's own encoder (a separate copy of the format) against the agent's decoder."""
    job = sdk.Job(name, socket="/nonexistent/gpufeed.sock")
    lens, suffix = job._lens, job._suffix
    raw = sdk.HEADER.pack(
        sdk.MAGIC,
        sdk.WIRE_VERSION,
        sdk.KIND_PHASE,
        sdk.RANK_PHASES.index(phase),
        0,
        *lens,
        secs,
        0,
        0,
    )
    decoded = wire.decode_datagram(raw + suffix)
    assert isinstance(decoded, list), decoded  # the SDK makes any name label-safe
    (got,) = decoded
    assert (got.phase, got.seconds) == (phase, secs)
    assert len(got.name.encode()) <= wire.MAX_NAME_BYTES
