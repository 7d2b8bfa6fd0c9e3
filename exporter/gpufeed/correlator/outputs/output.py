"""Writing analysis results so that a partial result is never passed off as complete.

Output to a file goes to a temporary file in the same directory, renamed into place only
after every window was written; on standard output the windows are written only after the
whole input was read without error.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import IO

from gpufeed.correlator.engine.window import Window
from gpufeed.correlator.outputs.table import format_table


def render(windows: Sequence[Window], fmt: str) -> str:
    if fmt == "table":
        return format_table(windows)
    return "".join(json.dumps(w.to_json(), sort_keys=False) + "\n" for w in windows)


def write_result(windows: Sequence[Window], fmt: str, output: str | None) -> None:
    text = render(windows, fmt)
    with open_result(output) as f:
        f.write(text)


@contextmanager
def open_result(output: str | None) -> Iterator[IO[str]]:
    """Standard output, or a temporary file beside `output` that replaces it (fsynced) only
    when the block completes; on an exception the temporary file goes and `output` is
    untouched."""
    if not output or output == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    d = os.path.dirname(os.path.abspath(output))
    fd, tmp = tempfile.mkstemp(prefix=".gpufeed-analyze-", dir=d)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, output)
    except BaseException:
        os.unlink(tmp)
        raise
