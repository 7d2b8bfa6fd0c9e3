"""Object-storage tiers: `s3://BUCKET[/PREFIX]` tier entries, and which tier a request is in.

A tier in the config may hold S3 locations as well as mount points (docs/storage.md). The
agent cannot see a job's requests to an object store on any device: the job's own process
reports them (`gpufeed run`'s botocore patch, or the SDK's `Job.add_io`), naming where each
request went as a *location*, `s3://BUCKET/KEY-FOLDER ENDPOINT` (see `object_location`), and
the agent maps it to a tier here.

A PREFIX is a folder: `s3://data/imagenet` holds the keys under `imagenet/` (the way S3
consoles and s3fs show prefixes), so the process needs to send only a key's folder, and
the number of distinct locations a job reports stays that of its dataset's folders.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

S3_SCHEME = "s3://"
# S3's bucket naming rules (3-63 characters; lower-case letters, digits, dots, hyphens;
# beginning and ending with a letter or digit).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True, slots=True)
class ObjectTierEntry:
    """One `s3://BUCKET[/PREFIX]` entry of a tier; `endpoint` "" matches any endpoint."""

    bucket: str
    prefix: str  # "" (the whole bucket) or a folder ending in "/"
    endpoint: str  # normalised "host:port", or ""

    @property
    def url(self) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self.prefix}".rstrip("/")


def parse_s3_url(text: str) -> tuple[str, str] | str:
    """(bucket, prefix folder) of `s3://BUCKET[/PREFIX]`, or why it is not one."""
    if not text.startswith(S3_SCHEME):
        return f"expected s3://BUCKET[/PREFIX], got {text!r}"
    bucket, _, prefix = text[len(S3_SCHEME) :].partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        return (
            f"{bucket!r} is not an S3 bucket name (3-63 lower-case letters, digits, '.' "
            "and '-', starting and ending with a letter or digit)"
        )
    prefix = prefix.strip("/")
    if any(not part for part in prefix.split("/")) and prefix:
        return f"the prefix {prefix!r} has an empty folder ('//')"
    return bucket, f"{prefix}/" if prefix else ""


def normalise_endpoint(text: str) -> str | None:
    """`host:port` of an endpoint URL (http or https; the scheme's port where none is
    given), lower-case; None if it is not one."""
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        return None
    return f"{parts.hostname.lower()}:{port or _DEFAULT_PORTS[parts.scheme]}"


def object_location(bucket: str, key: str, endpoint_url: str) -> str:
    """The location a process reports for a request to `key` in `bucket` at `endpoint_url`:
    `s3://BUCKET/FOLDER/ ENDPOINT_URL` (the key's folder, not the key)."""
    folder = key.rsplit("/", 1)[0] + "/" if "/" in key else ""
    return f"{S3_SCHEME}{bucket}/{folder} {endpoint_url}".rstrip()


def resolve_location(location: str, entries: Sequence[tuple[str, ObjectTierEntry]]) -> str:
    """The tier of a reported location: the configured entry with the longest prefix that
    holds it (and whose endpoint, if it names one, is the request's); else `s3://BUCKET`,
    so that a job reading a bucket nobody configured still shows where its data came from.
    A location that is not an s3:// URL is the name of a tier (the SDK's `Job.add_io`)."""
    url, _, endpoint_url = location.partition(" ")
    got = parse_s3_url(url)
    if isinstance(got, str):
        return location
    bucket, folder = got
    endpoint = normalise_endpoint(endpoint_url) if endpoint_url else None
    best: tuple[int, str] | None = None
    for tier, e in entries:
        if e.bucket != bucket or not folder.startswith(e.prefix):
            continue
        if e.endpoint and e.endpoint != endpoint:
            continue
        rank = len(e.prefix) * 2 + (1 if e.endpoint else 0)
        if best is None or rank > best[0]:
            best = (rank, tier)
    return best[1] if best is not None else f"{S3_SCHEME}{bucket}"
