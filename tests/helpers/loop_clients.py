"""COUNT clients that GET a path in a loop over keep-alive connections, as dashboards and
scripts polling /api/windows do:

    python loop_clients.py PORT PATH COUNT

Prints "ready" once every client has had one answer, and "requests=N" when stdin closes.
"""

from __future__ import annotations

import http.client
import sys
import threading


def loop(
    port: int,
    path: str,
    stop: threading.Event,
    started: threading.Barrier,
    counts: list[int],
    i: int,
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    first = True
    while not stop.is_set():
        try:
            conn.request("GET", path, headers={"Accept-Encoding": "gzip"})
            conn.getresponse().read()
        except OSError:
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            continue
        counts[i] += 1
        if first:
            first = False
            started.wait()
    conn.close()


def main(port: int, path: str, count: int) -> None:
    stop = threading.Event()
    started = threading.Barrier(count + 1)
    counts = [0] * count
    threads = [
        threading.Thread(target=loop, args=(port, path, stop, started, counts, i), daemon=True)
        for i in range(count)
    ]
    for t in threads:
        t.start()
    started.wait()
    print("ready", flush=True)
    sys.stdin.read()
    stop.set()
    for t in threads:
        t.join(10)
    print(f"requests={sum(counts)}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
