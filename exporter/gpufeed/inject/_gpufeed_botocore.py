"""The patch `gpufeed run` applies to botocore: every S3 request, reported through the SDK.

botocore is what boto3 runs on, and aiobotocore (s3fs, fsspec's s3://) subclasses its
Session and emits the same events, so one patch covers the three. It adds three handlers
to each new `botocore.session.Session` (every client a session makes copies its handlers):

- before-parameter-build.s3: the request's Bucket, Key and body size, kept in the call's
  context;
- request-created.s3: when an attempt starts (again for every retry), and its URL;
- response-received.s3: when it ended, how (ok, throttled: HTTP 503 SlowDown or 429 or a
  throttling error code, failed: any other error status or no answer) and the bytes:
  Content-Length of a GetObject answer, the body of a PutObject/UploadPart.

Each attempt is one request (a throttled one that botocore retries is two), timed from
the request's creation to the response's headers: what S3 calls first-byte latency. The
body of a GetObject is read later, by the program, and its time is not in it.

A request is reported against its location: the bucket, the key's folder and the
endpoint (gpufeed.storage.objects); the agent maps that to a tier. Handlers never raise:
a failure here is written once to stderr and the request goes on untouched.
"""

from __future__ import annotations

import functools
import sys
import time
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

READ_OPERATIONS = frozenset({"GetObject"})
WRITE_OPERATIONS = frozenset({"PutObject", "UploadPart"})
THROTTLE_STATUSES = frozenset({429, 503})
THROTTLE_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
)
OUTCOME_OK, OUTCOME_FAILED, OUTCOME_THROTTLED = 0, 1, 2  # the SDK's OBJECT_OUTCOMES order
_CTX = "gpufeed.s3"  # the call's context key: [bucket, key, endpoint url, start, bytes sent]
_UNIQUE = "gpufeed-s3-"
_warned = False  # one line per process is enough: the same failure repeats per request


def patch_botocore_session(module: ModuleType) -> None:
    """Wraps Session.__init__ so that every session (and its clients) reports S3 requests."""
    session_class = module.Session
    if getattr(session_class, "_gpufeed_patched", False):
        return
    original = session_class.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            self.register("before-parameter-build.s3", _on_params, unique_id=_UNIQUE + "p")
            self.register("request-created.s3", _on_request, unique_id=_UNIQUE + "r")
            self.register("response-received.s3", _on_response, unique_id=_UNIQUE + "a")
        except Exception as exc:
            _warn_once(exc)

    session_class.__init__ = __init__
    session_class._gpufeed_patched = True


def _on_params(params: Any = None, context: Any = None, **_: Any) -> None:
    try:
        if isinstance(context, dict) and isinstance(params, dict):
            bucket = params.get("Bucket")
            if isinstance(bucket, str) and bucket:
                key = params.get("Key")
                sent = _body_bytes(params.get("Body"))  # the payload, not its framing
                context[_CTX] = [bucket, key if isinstance(key, str) else "", "", 0.0, sent]
    except Exception as exc:
        _warn_once(exc)


def _on_request(request: Any = None, **_: Any) -> None:
    try:
        state = request.context.get(_CTX)
        if state is None:
            return
        parts = urlsplit(request.url)
        host = parts.netloc
        if host.startswith(state[0] + "."):  # virtual-hosted style: the bucket is no endpoint
            host = host[len(state[0]) + 1 :]
        state[2] = f"{parts.scheme}://{host}"
        state[3] = time.perf_counter()
    except Exception as exc:
        _warn_once(exc)


def _on_response(
    response_dict: Any = None,
    parsed_response: Any = None,
    context: Any = None,
    exception: Any = None,
    event_name: str = "",
    **_: Any,
) -> None:
    try:
        state = context.get(_CTX) if isinstance(context, dict) else None
        if state is None or not state[3]:
            return
        seconds = time.perf_counter() - state[3]
        state[3] = 0.0
        operation_name = event_name.rsplit(".", 1)[-1]
        if operation_name in READ_OPERATIONS:
            operation = "read"
        elif operation_name in WRITE_OPERATIONS:
            operation = "write"
        else:
            operation = "metadata"
        outcome = _outcome(response_dict, parsed_response, exception)
        nbytes = 0
        if outcome == OUTCOME_OK and operation == "read":
            length = response_dict.get("headers", {}).get("content-length")
            nbytes = int(length) if length is not None else 0
        elif outcome == OUTCOME_OK and operation == "write":
            nbytes = state[4]
        import _gpufeed_torch  # type: ignore[import-not-found]  # next to this file: its Job

        job = _gpufeed_torch.job()
        location = _gpufeed_torch._sdk().object_location(state[0], state[1], state[2])
        job.add_object_request(location, operation, outcome, 1, seconds, nbytes)
    except Exception as exc:
        _warn_once(exc)


def _outcome(response_dict: Any, parsed: Any, exception: Any) -> int:
    if exception is not None or not isinstance(response_dict, dict):
        return OUTCOME_FAILED
    status = response_dict.get("status_code")
    code = ""
    if isinstance(parsed, dict) and isinstance(parsed.get("Error"), dict):
        code = str(parsed["Error"].get("Code", ""))
    if status in THROTTLE_STATUSES or code in THROTTLE_CODES:
        return OUTCOME_THROTTLED
    if not isinstance(status, int) or status >= 400:
        return OUTCOME_FAILED
    return OUTCOME_OK


def _body_bytes(body: Any) -> int:
    """Bytes of a request body: bytes, or a seekable file from its position to its end."""
    if body is None:
        return 0
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    if isinstance(body, str):
        return len(body.encode())
    try:
        pos = body.tell()
        end = body.seek(0, 2)
        body.seek(pos)
        return max(int(end) - int(pos), 0)
    except Exception:
        return 0


def _warn_once(exc: BaseException) -> None:
    global _warned
    if _warned:
        return
    _warned = True
    try:  # noqa: SIM105 (never raise into the program)
        sys.stderr.write(f"gpufeed: S3 requests not reported: {exc!r}\n")
    except Exception:
        pass
