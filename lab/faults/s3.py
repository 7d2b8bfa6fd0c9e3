"""An S3 endpoint that is slow or throttles: a small real HTTP proxy in front of an S3 server.

`S3Proxy` forwards every request to the S3 server behind it (moto's, in the lab and the
tests), after `delay_s`, and answers every `throttle_every`-th request itself with what S3
answers when it sheds load: HTTP 503, error code SlowDown. Both can change while it runs,
which makes it a fault: `s3_slow` (settings: delay_ms, throttle_every) sets them at start
and puts the proxy back to a plain pass-through at stop. Listens on 127.0.0.1, port 0.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from lab.scenario import Fault

if TYPE_CHECKING:
    from lab.faults import FaultContext

SLOW_DOWN_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "content-length"}
)


class S3Proxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.delay_s = 0.0
        self.throttle_every = 0  # 0: never
        self.requests = 0
        self.throttled = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None, "start() first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> S3Proxy:
        proxy = self

        class Handler(_Forward):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def admit(self) -> bool:
        """Counts one request; False when it is one to throttle."""
        with self._lock:
            self.requests += 1
            every = self.throttle_every
            if every and self.requests % every == 0:
                self.throttled += 1
                return False
            return True


class _Forward(BaseHTTPRequestHandler):
    owner: S3Proxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the test's output

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _handle(self) -> None:
        body = self._body()
        p = self.owner
        if p.delay_s > 0:
            time.sleep(p.delay_s)
        if not p.admit():
            self._answer(503, [("Content-Type", "application/xml")], SLOW_DOWN_BODY)
            return
        conn = http.client.HTTPConnection(*p.upstream, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            if self.command == "HEAD":
                kept.append(("Content-Length", resp.getheader("Content-Length") or "0"))
            self._answer(resp.status, kept, data)
        finally:
            conn.close()

    def _answer(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle


class SlowS3:
    """The `s3_slow` fault: the lab's S3 proxy slowed (delay_ms) and/or throttling
    (throttle_every) from start to stop."""

    def __init__(self, fault: Fault, ctx: FaultContext) -> None:
        if ctx.s3 is None or ctx.s3.proxy is None:
            raise ValueError(f"fault {fault.kind} needs the scenario's `{S3_TIER}` tier")
        self.proxy = ctx.s3.proxy
        self.delay_s = float(fault.param("delay_ms", 200)) / 1000.0
        self.throttle_every = int(fault.param("throttle_every", 0))

    def prepare(self) -> None:
        pass

    def start(self) -> None:
        self.proxy.delay_s = self.delay_s
        self.proxy.throttle_every = self.throttle_every

    def stop(self) -> None:
        self.proxy.delay_s = 0.0
        self.proxy.throttle_every = 0


S3_TIER = "s3"  # the scenario tier that is a bucket, not a loop-mounted filesystem
BUCKET = "gpufeed-lab"
# Credentials the lab's S3 server accepts (moto checks none); what the workload's boto3
# needs to sign its requests, and no checksum framing on uploads (plain bodies to proxy).
CLIENT_ENV = {
    "AWS_ACCESS_KEY_ID": "gpufeed-lab",
    "AWS_SECRET_ACCESS_KEY": "gpufeed-lab",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
}


def quiet_s3_server() -> None:
    """moto's server logs one line per request through werkzeug: thousands per run."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)


class LabS3:
    """The lab's object store: moto's real S3 server (HTTP, 127.0.0.1, port 0) in a thread
    of the runner, a bucket, and the S3Proxy in front of it that the workload reads through
    (the `s3_slow` fault's handle). close() stops both; the data lives in memory only."""

    def __init__(self) -> None:
        self.server: Any = None
        self.proxy: S3Proxy | None = None

    def open(self) -> LabS3:
        from moto.server import ThreadedMotoServer

        quiet_s3_server()
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.proxy = S3Proxy(host, port).start()
        self._client().create_bucket(Bucket=BUCKET)
        return self

    def _client(self) -> Any:
        import boto3

        assert self.server is not None
        host, port = self.server.get_host_and_port()
        return boto3.client(
            "s3",
            endpoint_url=f"http://{host}:{port}",
            aws_access_key_id=CLIENT_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CLIENT_ENV["AWS_SECRET_ACCESS_KEY"],
            region_name=CLIENT_ENV["AWS_DEFAULT_REGION"],
        )

    def write_data(self, prefix: str, samples: int, sample_kib: int) -> str:
        """Uploads `samples` random objects under `prefix`; the s3:// URL the workload reads."""
        import os

        c = self._client()
        for i in range(samples):
            c.put_object(
                Bucket=BUCKET, Key=f"{prefix}/{i:05d}.bin", Body=os.urandom(sample_kib << 10)
            )
        return f"s3://{BUCKET}/{prefix}"

    @property
    def endpoint_url(self) -> str:
        assert self.proxy is not None
        return self.proxy.endpoint_url

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
            self.proxy = None
        if self.server is not None:
            self.server.stop()
            self.server = None
