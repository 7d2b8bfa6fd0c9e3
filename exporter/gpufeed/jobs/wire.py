"""The agent's decoder for SDK datagrams (format v1, described in gpufeed/sdk.py).

Format v1 only grows: a new kind or phase index is sent by the SDK in a datagram of its own
(an agent that predates it refuses just that datagram), and every older datagram decodes
as it always did (tests/test_sdk_wire_compat.py).

A datagram holds one or more messages back to back (the SDK sends a whole flush in one).
Everything that arrives on the socket is untrusted: `decode_datagram` either returns the
messages, every field of each in range, or the name of the first rule the datagram broke
(the `reason` label of gpufeed_sdk_messages_dropped_total); one bad message spoils the whole
datagram, since what follows it cannot be trusted to be framed right. It never raises.
"""

from __future__ import annotations

import math
import struct
import unicodedata
from dataclasses import dataclass
from typing import Final

from gpufeed.serving.endpoints import url_problem
from gpufeed.storage.objects import parse_s3_url
from gpufeed.vocabulary import PARALLEL_DIMENSIONS

WIRE_VERSION: Final = 1
MAGIC: Final = b"gf"
KIND_STEP: Final = 1
KIND_PHASE: Final = 2
KIND_CHECKPOINT: Final = 3
KIND_EPOCH: Final = 4
KIND_CLOSE: Final = 5
# Added in 0.2.0 (an older agent drops it as `schema`; the SDK sends it in a datagram of
# its own so that nothing else is lost with it): a process's own /proc/self/io at close.
KIND_IO: Final = 6
# Added in 0.3.0 (issue 13), sent by the SDK in a datagram of its own (an older agent drops
# that one as `schema`): the rank the sending process is in its job. The agent keys per-rank
# sums by the sender's pid (SO_PASSCRED), so it follows the pid, not the datagram.
KIND_RANK: Final = 7
# Added in 0.3.0 (issue 16), in a datagram of its own: requests the process made to storage
# the agent cannot see (an object store): phase = OBJECT_OPERATIONS index * 3 +
# OBJECT_OUTCOMES index, a = seconds the requests took, b = bytes, n = requests; the
# location (gpufeed.storage.objects) follows the name, its length in `reserved`.
KIND_OBJECT: Final = 8
OBJECT_OPERATIONS: Final = ("read", "write", "metadata")
OBJECT_OUTCOMES: Final = ("ok", "error", "throttled")
MAX_LOCATION_BYTES: Final = 255
MAX_OBJECT_REQUESTS: Final = 1_000_000
_TIER_NAME = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")
# Added in 0.3.0 (issue 17), sent at once in a datagram of its own: a model load begins
# (phase 0) or ends (phase 1); a = seconds, b = the file's device (st_dev, -1 unknown),
# n = bytes (-1 unknown). The agent maps the device to the storage tier it belongs to.
KIND_LOAD: Final = 9
LOAD_STAGES: Final = ("begin", "end")
# Added in 0.3.0 (issue 17), sent in a datagram of its own: the job serves requests (an
# inference server). Phase 0 declares it, with the URL of the serving stack's metrics after
# the name (its length in `reserved`; 0: no URL), plain http on loopback only
# (gpufeed.serving.endpoints); phase 1 reports the demand itself: a = requests waiting,
# b = requests running (-1: not known), whole numbers.
KIND_SERVING: Final = 10
SERVING_STAGES: Final = ("declare", "demand")
# Added in 0.3.0 (issue 13), sent by `gpufeed run` (not a process of the job: the parent of
# its command) in a datagram of its own once its command has ended: n = the command's pid,
# a = its exit status as a shell gives it (0-255; 128 + N: killed by signal N). The SDK in
# a killed process cannot say it was killed; its parent can.
KIND_EXIT: Final = 11
MAX_EXIT_STATUS: Final = 255
# Added in 0.3.0 (issue 24), sent by the SDK in a datagram of its own right after RANK's (an
# older agent drops that one as `schema`): one of the sending rank's parallelism
# coordinates, phase = its dimension's index in PARALLEL_DIMENSIONS, a = the rank's index
# in it, b = the dimension's size (whole numbers, 0 <= a < b <= MAX_PARALLEL_SIZE), n = 0.
KIND_PARALLEL: Final = 12
MAX_PARALLEL_SIZE: Final = 1 << 16
MAX_PID: Final = 1 << 22  # the kernel's pid_max limit (PID_MAX_LIMIT)
MAX_SERVING_REQUESTS: Final = 1 << 32
PHASES: Final = ("compute", "data_wait", "checkpoint", "communication", "startup", "eval", "other")
# Time inside torch.distributed collectives and barriers: a per-rank phase only, overlapping
# the job phase it happens in (mostly compute), so it is in no per-job family. PHASE index
# len(PHASES); added in 0.3.0 and sent in the same datagram of its own as RANK.
COLLECTIVE_WAIT: Final = "collective_wait"
RANK_PHASES: Final = (*PHASES, COLLECTIVE_WAIT)
HEADER: Final = struct.Struct("<2sBBBBBBddq")
MAX_JOB_ID_BYTES: Final = 128
MAX_NAME_BYTES: Final = 64
MAX_MESSAGE_BYTES: Final = HEADER.size + MAX_JOB_ID_BYTES + MAX_NAME_BYTES + MAX_LOCATION_BYTES
MAX_DATAGRAM_BYTES: Final = 8192

# The longest duration one event may carry; anything longer is a broken clock or a forgery.
MAX_EVENT_SECONDS: Final = 30 * 86400.0
MAX_STEPS_PER_EVENT: Final = 1_000_000
MAX_CHECKPOINT_BYTES: Final = 1 << 50  # 1 PiB
MAX_IO_BYTES: Final = 1 << 50  # an IO report's counters, carried exactly in f64 (< 2**53)
# The largest world a RANK message may claim (ranks 0..MAX_WORLD_SIZE-1): beyond any real job.
MAX_WORLD_SIZE: Final = 1 << 24
MAX_DEVICE: Final = 1 << 52  # a LOAD's device number (a dev_t), carried exactly in f64

# Unicode categories refused in a job id or name: control (Cc), format (Cf: the invisible
# U+200B and U+FEFF, the bidirectional overrides U+202E...), line and paragraph separators
# (Zl, Zp). They garble logs and label values, and make two different jobs look alike.
REFUSED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Zl", "Zp"})

# Reasons for dropping a datagram, as exported; decode returns the first five, the server
# the other three.
REASON_SIZE: Final = "size"
REASON_VERSION: Final = "version"
REASON_SCHEMA: Final = "schema"
REASON_PHASE: Final = "phase"
REASON_NAME_LENGTH: Final = "name_length"
REASON_CHARACTERS: Final = "characters"
REASON_MAX_JOBS: Final = "max_jobs"
REASON_RATE: Final = "rate"
DROP_REASONS: Final = (
    REASON_SIZE,
    REASON_VERSION,
    REASON_SCHEMA,
    REASON_PHASE,
    REASON_NAME_LENGTH,
    REASON_CHARACTERS,
    REASON_MAX_JOBS,
    REASON_RATE,
)


@dataclass(frozen=True, slots=True)
class Message:
    kind: int
    job_id: str
    name: str
    phase: str = ""  # PHASE only
    seconds: float = 0.0  # PHASE, CHECKPOINT, EPOCH: the duration; STEP: data_wait seconds
    compute_seconds: float = 0.0  # STEP only
    steps: int = 0  # STEP only
    checkpoint_bytes: int | None = None  # CHECKPOINT only; None = not reported
    read_bytes: int = 0  # IO only: the process's read_bytes
    written_bytes: int = 0  # IO only: the process's write_bytes
    rank: int = 0  # RANK only: the global rank
    local_rank: int | None = None  # RANK only: the rank on its node; None = not known
    world_size: int = 0  # RANK only: ranks in the whole job
    # OBJECT only: where the requests went, what they were, how they ended, how many
    location: str = ""
    operation: str = ""
    outcome: str = ""
    requests: int = 0
    object_bytes: int = 0
    device: int | None = None  # LOAD only: the file's st_dev; None = not known
    load_bytes: int | None = None  # LOAD only: bytes loaded; None = not known
    # SERVING demand only (the declaration's URL is in `location`)
    requests_waiting: float | None = None
    requests_running: float | None = None
    # EXIT only: the ended command's pid and exit status
    exit_pid: int = 0
    exit_status: int | None = None
    # PARALLEL only (the dimension is in `phase`): the rank's index in it, and its size
    parallel_index: int = 0
    parallel_size: int = 0


def decode_datagram(data: bytes) -> list[Message] | str:
    """The datagram's validated messages, or the drop reason."""
    if len(data) < HEADER.size or len(data) > MAX_DATAGRAM_BYTES:
        return REASON_SIZE
    out: list[Message] = []
    offset = 0
    # a packed datagram repeats the same id and name: check each distinct one once
    texts: dict[bytes, str | None] = {}
    while offset < len(data):
        got = _decode_one(data, offset, texts)
        if isinstance(got, str):
            return got
        msg, offset = got
        out.append(msg)
    return out


def _decode_one(
    data: bytes, offset: int, texts: dict[bytes, str | None]
) -> tuple[Message, int] | str:
    if len(data) - offset < HEADER.size:
        return REASON_SIZE
    head = HEADER.unpack_from(data, offset)
    magic, version, kind, phase, reserved, id_len, name_len, a, b, n = head
    if magic != MAGIC:
        return REASON_SCHEMA
    if version != WIRE_VERSION:
        return REASON_VERSION
    if not KIND_STEP <= kind <= KIND_PARALLEL:
        return REASON_SCHEMA
    if (reserved != 0 and kind not in (KIND_OBJECT, KIND_SERVING)) or (
        kind == KIND_OBJECT and reserved == 0
    ):
        return REASON_SCHEMA
    if not 0 < id_len <= MAX_JOB_ID_BYTES or not 0 < name_len <= MAX_NAME_BYTES:
        return REASON_NAME_LENGTH
    start = offset + HEADER.size
    end = start + id_len + name_len
    if end + reserved > len(data):
        return REASON_SIZE
    job_id = _cached_text(data[start : start + id_len], texts)
    name = _cached_text(data[start + id_len : end], texts)
    if job_id is None or name is None:
        return REASON_SCHEMA
    if not job_id or not name:
        return REASON_CHARACTERS
    if kind == KIND_OBJECT:
        obj = _object_message(phase, a, b, n, job_id, name, data[end : end + reserved])
        return obj if isinstance(obj, str) else (obj, end + reserved)
    if kind == KIND_SERVING:
        srv = _serving_message(phase, a, b, n, job_id, name, data[end : end + reserved])
        return srv if isinstance(srv, str) else (srv, end + reserved)
    msg = _message(kind, phase, a, b, n, job_id, name)
    return msg if isinstance(msg, str) else (msg, end)


def _object_message(
    phase: int, a: float, b: float, n: int, job_id: str, name: str, raw: bytes
) -> Message | str:
    """OBJECT: see KIND_OBJECT; the location is a tier name or `s3://BUCKET/FOLDER/`
    followed by one space and the endpoint's URL (printable ASCII)."""
    if phase >= len(OBJECT_OPERATIONS) * len(OBJECT_OUTCOMES):
        return REASON_PHASE
    if not (_duration_ok(a) and _byte_count_ok(b) and 0 <= n <= MAX_OBJECT_REQUESTS):
        return REASON_SCHEMA
    location = valid_location(raw)
    if location is None:
        return REASON_SCHEMA
    op, outcome = divmod(phase, len(OBJECT_OUTCOMES))
    return Message(
        KIND_OBJECT,
        job_id,
        name,
        seconds=a,
        location=location,
        operation=OBJECT_OPERATIONS[op],
        outcome=OBJECT_OUTCOMES[outcome],
        requests=n,
        object_bytes=int(b),
    )


def _serving_message(
    phase: int, a: float, b: float, n: int, job_id: str, name: str, raw: bytes
) -> Message | str:
    """SERVING: see KIND_SERVING."""
    if phase >= len(SERVING_STAGES):
        return REASON_PHASE
    if n != 0:
        return REASON_SCHEMA
    if phase == 0:
        if a != 0.0 or b != 0.0:
            return REASON_SCHEMA
        url = raw.decode("ascii") if raw.isascii() else "\x00"
        if raw and url_problem(url, loopback_only=True) is not None:
            return REASON_SCHEMA
        return Message(KIND_SERVING, job_id, name, phase="declare", location=url)
    if raw or not _count_ok(a) or not (b == -1.0 or _count_ok(b)):
        return REASON_SCHEMA
    running = None if b < 0 else b
    return Message(
        KIND_SERVING, job_id, name, phase="demand", requests_waiting=a, requests_running=running
    )


def _count_ok(x: float) -> bool:
    return math.isfinite(x) and x.is_integer() and 0.0 <= x <= MAX_SERVING_REQUESTS


def valid_location(raw: bytes) -> str | None:
    """The location text, or None where it is neither a tier name nor an s3:// location."""
    if not raw or len(raw) > MAX_LOCATION_BYTES or not all(0x20 <= c < 0x7F for c in raw):
        return None
    text = raw.decode("ascii")
    url, sep, endpoint = text.partition(" ")
    if url.startswith("s3://"):
        ok = not isinstance(parse_s3_url(url), str)
        return text if ok and " " not in endpoint and (endpoint or not sep) else None
    return text if set(text) <= _TIER_NAME and len(text) <= MAX_NAME_BYTES else None


def _message(
    kind: int, phase: int, a: float, b: float, n: int, job_id: str, name: str
) -> Message | str:
    if kind == KIND_IO:
        if phase != 0:
            return REASON_PHASE
        if n != 0 or not (_byte_count_ok(a) and _byte_count_ok(b)):
            return REASON_SCHEMA
        return Message(kind, job_id, name, read_bytes=int(a), written_bytes=int(b))
    if kind == KIND_RANK:
        return _rank_message(phase, a, b, n, job_id, name)
    if kind == KIND_PARALLEL:
        return _parallel_message(phase, a, b, n, job_id, name)
    if kind == KIND_LOAD:
        return _load_message(phase, a, b, n, job_id, name)
    if kind == KIND_EXIT:
        return _exit_message(phase, a, b, n, job_id, name)
    if not (_duration_ok(a) and _duration_ok(b)):
        return REASON_SCHEMA
    if kind == KIND_PHASE:
        if phase >= len(RANK_PHASES):
            return REASON_PHASE
        if b != 0.0 or n != 0:
            return REASON_SCHEMA
        return Message(kind, job_id, name, phase=RANK_PHASES[phase], seconds=a)
    if phase != 0:
        return REASON_PHASE
    if kind == KIND_STEP:
        if not 0 <= n <= MAX_STEPS_PER_EVENT:
            return REASON_SCHEMA
        return Message(kind, job_id, name, seconds=a, compute_seconds=b, steps=n)
    if b != 0.0:
        return REASON_SCHEMA
    if kind == KIND_CHECKPOINT:
        if not -1 <= n <= MAX_CHECKPOINT_BYTES:
            return REASON_SCHEMA
        return Message(kind, job_id, name, seconds=a, checkpoint_bytes=None if n < 0 else n)
    if n != 0 or (kind == KIND_CLOSE and a != 0.0):
        return REASON_SCHEMA
    return Message(kind, job_id, name, seconds=a)


def _rank_message(phase: int, a: float, b: float, n: int, job_id: str, name: str) -> Message | str:
    """RANK: n = rank, a = local rank (-1: not known), b = world size; whole numbers with
    0 <= rank < world size <= MAX_WORLD_SIZE and -1 <= local rank < world size."""
    if phase != 0:
        return REASON_PHASE
    if not (math.isfinite(a) and a.is_integer() and math.isfinite(b) and b.is_integer()):
        return REASON_SCHEMA
    if not (0 <= n < b <= MAX_WORLD_SIZE and -1 <= a < b):
        return REASON_SCHEMA
    local = None if a < 0 else int(a)
    return Message(KIND_RANK, job_id, name, rank=n, local_rank=local, world_size=int(b))


def _parallel_message(
    phase: int, a: float, b: float, n: int, job_id: str, name: str
) -> Message | str:
    """PARALLEL: phase = dimension index, a = index, b = size; 0 <= a < b <=
    MAX_PARALLEL_SIZE, whole numbers, n = 0."""
    if phase >= len(PARALLEL_DIMENSIONS):
        return REASON_PHASE
    if n != 0 or not all(math.isfinite(x) and x.is_integer() for x in (a, b)):
        return REASON_SCHEMA
    if not 0 <= a < b <= MAX_PARALLEL_SIZE:
        return REASON_SCHEMA
    return Message(
        KIND_PARALLEL,
        job_id,
        name,
        phase=PARALLEL_DIMENSIONS[phase],
        parallel_index=int(a),
        parallel_size=int(b),
    )


def _exit_message(phase: int, a: float, b: float, n: int, job_id: str, name: str) -> Message | str:
    """EXIT: n = pid (1..MAX_PID), a = exit status (a whole number 0..MAX_EXIT_STATUS)."""
    if phase != 0:
        return REASON_PHASE
    if b != 0.0 or not 0 < n <= MAX_PID:
        return REASON_SCHEMA
    if not (math.isfinite(a) and a.is_integer() and 0 <= a <= MAX_EXIT_STATUS):
        return REASON_SCHEMA
    return Message(KIND_EXIT, job_id, name, exit_pid=n, exit_status=int(a))


def _load_message(phase: int, a: float, b: float, n: int, job_id: str, name: str) -> Message | str:
    """LOAD: phase 0 begin / 1 end, a = seconds (0 at the begin), b = device or -1, n = bytes
    or -1."""
    if phase >= len(LOAD_STAGES):
        return REASON_PHASE
    if not _duration_ok(a) or (phase == 0 and a != 0.0):
        return REASON_SCHEMA
    if not (math.isfinite(b) and b.is_integer() and -1 <= b < MAX_DEVICE):
        return REASON_SCHEMA
    if not -1 <= n <= MAX_IO_BYTES:
        return REASON_SCHEMA
    return Message(
        KIND_LOAD,
        job_id,
        name,
        phase=LOAD_STAGES[phase],
        seconds=a,
        device=None if b < 0 else int(b),
        load_bytes=None if n < 0 else n,
    )


def encode(msg: Message) -> bytes:
    """One message's bytes (tests and tools; the SDK has its own copy of this); a datagram
    is one or more of these concatenated."""
    job_id, name = msg.job_id.encode(), msg.name.encode()
    phase = RANK_PHASES.index(msg.phase) if msg.kind == KIND_PHASE else 0
    if msg.kind == KIND_LOAD:
        phase = LOAD_STAGES.index(msg.phase)
        a, b = msg.seconds, float(-1 if msg.device is None else msg.device)
        n = -1 if msg.load_bytes is None else msg.load_bytes
    elif msg.kind == KIND_STEP:
        a, b, n = msg.seconds, msg.compute_seconds, msg.steps
    elif msg.kind == KIND_CHECKPOINT:
        a, b = msg.seconds, 0.0
        n = -1 if msg.checkpoint_bytes is None else msg.checkpoint_bytes
    elif msg.kind == KIND_IO:
        a, b, n = float(msg.read_bytes), float(msg.written_bytes), 0
    elif msg.kind == KIND_RANK:
        local = -1 if msg.local_rank is None else msg.local_rank
        a, b, n = float(local), float(msg.world_size), msg.rank
    elif msg.kind == KIND_OBJECT:
        a, b, n = msg.seconds, float(msg.object_bytes), msg.requests
        phase = OBJECT_OPERATIONS.index(msg.operation) * len(OBJECT_OUTCOMES)
        phase += OBJECT_OUTCOMES.index(msg.outcome)
    elif msg.kind == KIND_EXIT:
        a, b, n = float(msg.exit_status or 0), 0.0, msg.exit_pid
    elif msg.kind == KIND_PARALLEL:
        phase = PARALLEL_DIMENSIONS.index(msg.phase)
        a, b, n = float(msg.parallel_index), float(msg.parallel_size), 0
    elif msg.kind == KIND_SERVING:
        phase, n = SERVING_STAGES.index(msg.phase), 0
        a = msg.requests_waiting or 0.0
        b = -1.0 if msg.requests_running is None and phase == 1 else msg.requests_running or 0.0
    else:
        a, b, n = msg.seconds, 0.0, 0
    located = msg.kind in (KIND_OBJECT, KIND_SERVING)
    location = msg.location.encode() if located else b""
    head = HEADER.pack(
        MAGIC, WIRE_VERSION, msg.kind, phase, len(location), len(job_id), len(name), a, b, n
    )
    return head + job_id + name + location


def _duration_ok(x: float) -> bool:
    return math.isfinite(x) and 0.0 <= x <= MAX_EVENT_SECONDS


def _byte_count_ok(x: float) -> bool:
    return math.isfinite(x) and x.is_integer() and 0.0 <= x <= MAX_IO_BYTES


def _cached_text(raw: bytes, texts: dict[bytes, str | None]) -> str | None:
    if raw not in texts:
        texts[raw] = label_text(raw)
    return texts[raw]


def label_text(raw: bytes) -> str | None:
    """The text of a job id or name: None if it is not UTF-8 or is blank (schema), "" if
    it holds a character of REFUSED_CATEGORIES (reason `characters`)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if text.isascii():
        if not text.isprintable():  # ASCII controls (Cc); no per-character lookup
            return ""
    elif any(unicodedata.category(c) in REFUSED_CATEGORIES for c in text):
        return ""
    return text if text.strip() else None
