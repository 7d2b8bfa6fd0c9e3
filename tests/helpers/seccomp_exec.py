"""Runs a command under a seccomp allow-list, as systemd's SystemCallFilter= would, and
without writable-executable memory, as its MemoryDenyWriteExecute= would.

Usage (with the system python3, which has Debian's python3-seccomp):
    python3 seccomp_exec.py ALLOWED_SYSCALLS_FILE COMMAND [ARG...]
Every system call not in the file fails with EPERM (SystemCallErrorNumber=EPERM); the filter
stays in force across exec, so COMMAND and all it starts run under it. W^X is the kernel's
PR_SET_MDWE (Linux 6.3 and newer, what systemd 257 and newer use); an older kernel refuses
it, and the wrapper then fails rather than check less than it says.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys

import seccomp  # type: ignore[import-not-found]

PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1


def main() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise SystemExit(f"seccomp_exec: PR_SET_MDWE: {os.strerror(ctypes.get_errno())}")
    with open(sys.argv[1], encoding="ascii") as f:
        names = f.read().split()
    flt = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno.EPERM))
    unknown = []
    for name in names:
        try:
            flt.add_rule(seccomp.ALLOW, name)
        except (RuntimeError, ValueError):
            unknown.append(name)  # a call this libseccomp or architecture does not have
    if unknown:
        print(f"seccomp_exec: not on this architecture: {' '.join(unknown)}", file=sys.stderr)
    flt.load()
    os.execv(sys.argv[2], sys.argv[2:])


if __name__ == "__main__":
    main()
