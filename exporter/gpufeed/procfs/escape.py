"""The kernel's octal escaping of paths in mountinfo and mountstats (`seq_escape`)."""

from __future__ import annotations

import re

_OCTAL = re.compile(r"\\([0-7]{3})")


def unescape_octal(field: str) -> str:
    r"""Turns `\040` (space), `\011` (tab), `\012` (newline) and `\134` (backslash) back."""
    if "\\" not in field:
        return field
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def label_text(path: str) -> str:
    """A path read with errors="surrogateescape", made fit for a label value.

    Paths keep their raw bytes (as surrogates) so that statvfs() finds them, but a label must
    be valid UTF-8: one surrogate would make the whole /metrics page fail to encode. Bytes
    that are not UTF-8 become U+FFFD in the label only.
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return path
