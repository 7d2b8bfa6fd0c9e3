"""A small serving-style HTTP server: requests queue behind one worker, and /metrics tells
the queue in vLLM's names (vllm:num_requests_waiting, vllm:num_requests_running,
vllm:kv_cache_usage_perc, vllm:request_success_total), the way vLLM's own server does.

    python serving_server.py [SECONDS_PER_REQUEST]

Binds 127.0.0.1 port 0 (tests read the port back, tests/procports.py). POST /v1/completions
is admitted at once and answered when the worker has served it: each takes
SECONDS_PER_REQUEST (default 30) of the one worker, so the requests after the first wait.
A real process with a real queue, for tests/test_serving_real.py; no GPU, no model.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Engine:
    """One worker serving a FIFO queue, one request at a time."""

    def __init__(self, seconds_per_request: float) -> None:
        self.seconds = seconds_per_request
        self.lock = threading.Condition()
        self.waiting = 0
        self.running = 0
        self.done = 0
        self.turn = 0  # tickets: served in arrival order
        self.next_ticket = 0

    def serve(self) -> None:
        with self.lock:
            ticket = self.next_ticket
            self.next_ticket += 1
            self.waiting += 1
            while self.running or ticket != self.turn:
                self.lock.wait()
            self.waiting -= 1
            self.running = 1
        threading.Event().wait(self.seconds)  # the "GPU" works on it
        with self.lock:
            self.running = 0
            self.done += 1
            self.turn += 1
            self.lock.notify_all()

    def metrics(self) -> bytes:
        with self.lock:
            w, r, d = self.waiting, self.running, self.done
        model = 'model_name="tiny-test"'
        return (
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f"vllm:num_requests_running{{{model}}} {r}.0\n"
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
            "# TYPE vllm:num_requests_waiting gauge\n"
            f"vllm:num_requests_waiting{{{model}}} {w}.0\n"
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f"vllm:kv_cache_usage_perc{{{model}}} {0.02 + 0.1 * r}\n"
            "# HELP vllm:request_success_total Count of successfully processed requests.\n"
            "# TYPE vllm:request_success_total counter\n"
            f'vllm:request_success_total{{finished_reason="stop",{model}}} {d}.0\n'
        ).encode()


def main(argv: list[str]) -> int:
    engine = Engine(float(argv[1]) if len(argv) > 1 else 30.0)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/metrics":
                self.send_error(404)
                return
            body = engine.metrics()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            engine.serve()
            body = b'{"choices": [{"text": "ok"}]}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    with contextlib.suppress(KeyboardInterrupt):
        srv.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
