"""The netlink message frame both readers share: the header, the 4-byte alignment, and the
split of a run of messages (one or more recv() buffers) into (type, body) pairs."""

from __future__ import annotations

import struct

NLMSG_HDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300


def align(n: int) -> int:
    return (n + 3) & ~3


def request(msg_type: int, seq: int, body: bytes) -> bytes:
    """A dump request of `msg_type` carrying `body`."""
    flags = NLM_F_REQUEST | NLM_F_DUMP
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(body), msg_type, flags, seq, 0) + body


def split_messages(data: bytes) -> tuple[list[tuple[int, bytes]], bool]:
    """(type, body) of each message before NLMSG_DONE, and whether NLMSG_DONE came.
    Raises ValueError where a message's length overruns the data (a message cut short)."""
    out: list[tuple[int, bytes]] = []
    off = 0
    while off + NLMSG_HDR.size <= len(data):
        length, mtype, _flags, _seq, _pid = NLMSG_HDR.unpack_from(data, off)
        if length < NLMSG_HDR.size or off + length > len(data):
            raise ValueError(f"message of {length} bytes at offset {off} overruns: cut short")
        if mtype == NLMSG_DONE:
            return out, True
        out.append((mtype, data[off + NLMSG_HDR.size : off + length]))
        off += align(length)
    return out, False


def error_code(body: bytes) -> int:
    """The errno of an NLMSG_ERROR body (0: an acknowledgement, not an error)."""
    return -int(struct.unpack_from("=i", body)[0]) if len(body) >= 4 else 0
