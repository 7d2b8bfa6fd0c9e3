"""Fuzzing the agent's SDK decoder: whatever arrives, it returns a message or a reason."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpufeed import sdk
from gpufeed.jobs import wire
from gpufeed.jobs.aggregate import JobTable

label = st.text(
    alphabet=st.characters(min_codepoint=0x20, exclude_categories=("Cs", "Cc")),
    min_size=1,
    max_size=30,
).filter(lambda s: s.strip() != "")
seconds = st.floats(min_value=0.0, max_value=wire.MAX_EVENT_SECONDS, allow_nan=False)


@st.composite
def messages(draw: st.DrawFn) -> wire.Message:
    kind = draw(st.sampled_from([1, 2, 3, 4, 5]))
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
            kind, job_id, name, phase=draw(st.sampled_from(wire.PHASES)), seconds=draw(seconds)
        )
    if kind == wire.KIND_CHECKPOINT:
        nbytes = draw(st.none() | st.integers(0, wire.MAX_CHECKPOINT_BYTES))
        return wire.Message(kind, job_id, name, seconds=draw(seconds), checkpoint_bytes=nbytes)
    if kind == wire.KIND_EPOCH:
        return wire.Message(kind, job_id, name, seconds=draw(seconds))
    return wire.Message(kind, job_id, name)


def _check(result: wire.Message | str) -> None:
    if isinstance(result, str):
        assert result in wire.DROP_REASONS
        return
    assert 1 <= result.kind <= 5
    assert 0 < len(result.job_id.encode()) <= wire.MAX_JOB_ID_BYTES
    assert 0 < len(result.name.encode()) <= wire.MAX_NAME_BYTES
    for x in (result.seconds, result.compute_seconds):
        assert math.isfinite(x) and 0 <= x <= wire.MAX_EVENT_SECONDS
    assert result.phase == "" or result.phase in wire.PHASES
    # whatever decodes must also be safe to add into the job table
    table = JobTable(max_jobs=2, grace_seconds=1, pid_alive=lambda p: False)
    assert table.apply(result, 0, 0.0) is None
    table.families()


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=wire.MAX_DATAGRAM_BYTES + 40))
def test_random_bytes_never_raise(data: bytes) -> None:
    _check(wire.decode(data))


@settings(max_examples=600, deadline=None)
@given(
    messages(),
    st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_mutated_valid_datagrams_never_raise(
    msg: wire.Message, flips: list[tuple[int, int]]
) -> None:
    data = bytearray(wire.encode(msg))
    for pos, byte in flips:
        data[pos % len(data)] = byte
    _check(wire.decode(bytes(data)))


@settings(max_examples=300, deadline=None)
@given(messages())
def test_valid_messages_round_trip(msg: wire.Message) -> None:
    assert wire.decode(wire.encode(msg)) == msg


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(wire.PHASES),
    seconds,
    st.text(min_size=1, max_size=200).filter(lambda s: s.strip() != ""),
)
def test_what_the_sdk_sends_decodes(phase: str, secs: float, name: str) -> None:
    """The SDK's own encoder (a separate copy of the format) against the agent's decoder."""
    job = sdk.Job(name, socket="/nonexistent/gpufeed.sock")
    lens, suffix = job._lens, job._suffix
    raw = sdk.HEADER.pack(
        sdk.MAGIC, sdk.WIRE_VERSION, sdk.KIND_PHASE, sdk.PHASES.index(phase), 0, *lens, secs, 0, 0
    )
    got = wire.decode(raw + suffix)
    assert isinstance(got, wire.Message), got  # the SDK makes any name label-safe
    assert (got.phase, got.seconds) == (phase, secs)
    assert len(got.name.encode()) <= wire.MAX_NAME_BYTES
