"""The patch `gpufeed run` applies to the PyTorch S3 connector (s3torchconnector).

The connector's requests run in its own Rust client (the AWS CRT), not through botocore, so
the botocore patch does not see them. Its Python `S3Client` is where every read starts:

- `_get_object_stream` (every GetObject, whole or ranged, of S3MapDataset,
  S3IterableDataset, S3Checkpoint and the DCP reader) returns a stream of chunks; it is
  wrapped so that each chunk's bytes, and the time the program waited for it, are reported
  as they arrive (the stream's first chunk is the request). The seconds of a connector read
  are thus the time the reader waited on the stream, first byte to last, not only to the
  response's headers as for botocore; its retries happen inside the CRT and only their time
  is seen.
- `head_object` (the size lookup before a sequential read) is a metadata request.

An exception is a failed request (throttled where the CRT's message names SlowDown, 503
or 429), re-raised untouched. Nothing here raises into the program.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

OUTCOME_OK, OUTCOME_FAILED, OUTCOME_THROTTLED = 0, 1, 2  # the SDK's OBJECT_OUTCOMES order
THROTTLE_WORDS = ("SlowDown", "503", "429", "Throttl")
_warned = False


def patch_s3_client(module: ModuleType) -> None:
    """Wraps S3Client._get_object_stream and S3Client.head_object of the connector."""
    cls = module.S3Client
    if getattr(cls, "_gpufeed_patched", False):
        return
    get_stream = cls._get_object_stream
    head = cls.head_object
    list_objects = cls.list_objects

    @functools.wraps(get_stream)
    def _get_object_stream(self: Any, bucket: str, key: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            stream = get_stream(self, bucket, key, *args, **kwargs)
        except Exception as exc:
            _report(self, bucket, key, "read", _failure(exc), 1, time.perf_counter() - t0, 0)
            raise
        try:
            return _TimedStream(stream, functools.partial(_report, self, bucket, key), t0)
        except Exception as exc:
            _warn_once(exc)
            return stream

    @functools.wraps(list_objects)
    def _list_objects(self: Any, bucket: str, prefix: str = "", *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            stream = list_objects(self, bucket, prefix, *args, **kwargs)
        except Exception as exc:
            _report(self, bucket, prefix, "metadata", _failure(exc), 1, time.perf_counter() - t0, 0)
            raise
        try:
            report = functools.partial(_report, self, bucket, prefix)
            return _TimedStream(stream, report, t0, "metadata", per_item=True)
        except Exception as exc:
            _warn_once(exc)
            return stream

    @functools.wraps(head)
    def head_object(self: Any, bucket: str, key: str, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            result = head(self, bucket, key, *args, **kwargs)
        except Exception as exc:
            _report(self, bucket, key, "metadata", _failure(exc), 1, time.perf_counter() - t0, 0)
            raise
        _report(self, bucket, key, "metadata", OUTCOME_OK, 1, time.perf_counter() - t0, 0)
        return result

    cls._get_object_stream = _get_object_stream
    cls.head_object = head_object
    cls.list_objects = _list_objects
    cls._gpufeed_patched = True


class _TimedStream:
    """A GetObjectStream that reports each chunk as it arrives (or a ListObjectStream, each
    page of which is a request: `per_item`); the rest is delegated."""

    def __init__(
        self,
        inner: Any,
        report: Callable[..., None],
        started: float,
        operation: str = "read",
        per_item: bool = False,
    ) -> None:
        self._inner = inner
        self._report = report
        self._waited = time.perf_counter() - started  # the call that opened the stream
        self._first = True
        self._operation = operation
        self._per_item = per_item

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        t0 = time.perf_counter()
        try:
            chunk = next(self._inner)
        except StopIteration:
            self._done(OUTCOME_OK, t0, 0, last=True)
            raise
        except Exception as exc:
            self._done(_failure(exc), t0, 0)
            raise
        self._done(OUTCOME_OK, t0, 0 if self._per_item else len(chunk))
        return chunk

    def _done(self, outcome: int, t0: float, nbytes: int, last: bool = False) -> None:
        seconds = self._waited + time.perf_counter() - t0
        self._waited = 0.0
        if outcome != OUTCOME_OK:
            requests = 1
        elif self._per_item:
            requests = 0 if last else 1
        else:
            requests = 1 if self._first else 0
        self._first = False
        self._report(self._operation, outcome, requests, seconds, nbytes)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _failure(exc: BaseException) -> int:
    text = str(exc)
    return OUTCOME_THROTTLED if any(w in text for w in THROTTLE_WORDS) else OUTCOME_FAILED


def _report(
    client: Any,
    bucket: str,
    key: str,
    operation: str,
    outcome: int,
    requests: int,
    seconds: float,
    nbytes: int,
) -> None:
    try:
        import _gpufeed_torch  # type: ignore[import-not-found]  # next to this file: its Job

        endpoint = getattr(client, "_endpoint", None) or (
            f"https://s3.{getattr(client, '_region', '')}.amazonaws.com"
        )
        location = _gpufeed_torch._sdk().object_location(bucket, key, endpoint)
        _gpufeed_torch.job().add_object_request(
            location, operation, outcome, requests, seconds, nbytes
        )
    except Exception as exc:
        _warn_once(exc)


def _warn_once(exc: BaseException) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    try:  # noqa: SIM105 (never raise into the program)
        sys.stderr.write(f"gpufeed: S3 connector reads not reported: {exc!r}\n")
    except Exception:
        pass
