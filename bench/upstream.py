"""How much one embedded-upstream process serves: events/s and concurrent streams.

    .venv/bin/python bench/upstream.py [--streams 3000] [--seconds 10]

Starts ``fanout mock`` in its own process and drives it from this one with a
lean raw-socket trio client (no HTTP library: the client must not be the
bottleneck).  Two measurements:

  throughput   --connections keep-alive connections loop requests of ~200
               events at cadence 0 for --seconds; events/s and the server
               process's own CPU time per event (from /proc).
  concurrency  --streams streams opened at once, ~203 events each, cadence 0
               (the shape of bench/fanout.py): completed, errors, the peak
               number open at once, events/s.
  paced        --streams streams at once, --events events each --cadence
               seconds apart (a realistic token rate): completed, errors, and
               how late they finished against the ideal duration.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import json
import os
import statistics
import subprocess
import time
from urllib.parse import urlsplit

import trio

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime + stime


def request_bytes(host: str, port: int, model: str, tokens: int, cadence: float) -> bytes:
    body = json.dumps({"model": model, "stream": True, "seed": 1,
                       "messages": [{"role": "user", "content": "benchmark"}]}).encode()
    return (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"X-Fanout-Tokens: {tokens}\r\nX-Fanout-Cadence: {cadence}\r\n\r\n").encode() + body


class ChunkedCounter:
    """Reads one chunked response; counts SSE events (blank lines) in its body."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.state = "head"  # head -> (size -> data -> crlf)* -> done
        self.remaining = 0
        self.events = 0
        self.last = 0
        self.status = 0

    @property
    def done(self) -> bool:
        return self.state == "done"

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while self.buffer and self.state != "done":
            if self.state == "head":
                end = self.buffer.find(b"\r\n\r\n")
                if end < 0:
                    return
                self.status = int(self.buffer[9:12])
                del self.buffer[: end + 4]
                self.state = "size"
            elif self.state == "size":
                end = self.buffer.find(b"\r\n")
                if end < 0:
                    return
                self.remaining = int(self.buffer[:end].split(b";")[0], 16)
                del self.buffer[: end + 2]
                self.state = "data" if self.remaining else "done"
            elif self.state == "data":
                payload = bytes(self.buffer[: self.remaining])
                del self.buffer[: len(payload)]
                self.remaining -= len(payload)
                self.events += payload.count(b"\n\n") + (self.last == 10 and payload[0] == 10)
                self.last = payload[-1]
                if not self.remaining:
                    self.state = "crlf"
            else:  # the CRLF after a chunk's data
                if len(self.buffer) < 2:
                    return
                del self.buffer[:2]
                self.state = "size"


async def one_response(stream: trio.SocketStream, request: bytes) -> int:
    await stream.send_all(request)
    counter = ChunkedCounter()
    while not counter.done:
        data = await stream.receive_some(262144)
        if not data:
            raise ConnectionError("closed mid-response")
        counter.feed(data)
    if counter.status != 200:
        raise ConnectionError(f"status {counter.status}")
    return counter.events


async def throughput(host: str, port: int, pid: int, connections: int, seconds: float
                     ) -> dict[str, float]:
    request = request_bytes(host, port, "mock/fast", 200, 0)
    totals = {"events": 0, "responses": 0, "errors": 0}

    async def worker() -> None:
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            while True:
                try:
                    # Await first, then add: `x += await f()` reads x before the
                    # await and loses the other tasks' updates.
                    events = await one_response(stream, request)
                    totals["events"] += events
                    totals["responses"] += 1
                except (ConnectionError, trio.BrokenResourceError):
                    totals["errors"] += 1
                    return

    cpu_before = cpu_seconds(pid)
    start = time.perf_counter()
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery:
            for _ in range(connections):
                nursery.start_soon(worker)
    elapsed = time.perf_counter() - start
    server_cpu = cpu_seconds(pid) - cpu_before
    return {"events/s": totals["events"] / elapsed, "responses/s": totals["responses"] / elapsed,
            "server CPU us/event": server_cpu / max(1, totals["events"]) * 1e6,
            "errors": totals["errors"], "events": totals["events"]}


async def concurrency(host: str, port: int, pid: int, streams: int, events: int,
                      cadence: float) -> dict[str, float]:
    request = request_bytes(host, port, "mock/fast", events, cadence)
    state = {"open": 0, "peak": 0, "done": 0, "errors": 0, "events": 0}
    durations: list[float] = []

    async def one() -> None:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError:
            state["errors"] += 1
            return
        async with stream:
            started = time.perf_counter()
            state["open"] += 1
            state["peak"] = max(state["peak"], state["open"])
            try:
                events = await one_response(stream, request)
                state["events"] += events
                state["done"] += 1
            except (ConnectionError, trio.BrokenResourceError):
                state["errors"] += 1
            finally:
                state["open"] -= 1
                durations.append(time.perf_counter() - started)

    cpu_before = cpu_seconds(pid)
    client_before = time.process_time()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one)
    elapsed = time.perf_counter() - start
    server_busy = (cpu_seconds(pid) - cpu_before) / elapsed
    client_busy = (time.process_time() - client_before) / elapsed
    ideal = (events + 2) * cadence
    return {"streams": streams, "completed": state["done"], "errors": state["errors"],
            "peak open at once": state["peak"], "events/s": state["events"] / elapsed,
            "ideal s": ideal, "median stream s": statistics.median(durations),
            "slowest stream s": max(durations),
            "server cores busy": server_busy, "client cores busy": client_busy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=3000)
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--cadence", type=float, default=0.1)
    args = parser.parse_args()

    server = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        url = urlsplit(server.stdout.readline().strip())
        host, port = url.hostname or "127.0.0.1", url.port or 80
        print(f"fanout mock pid {server.pid} at {host}:{port}; python {sys.version.split()[0]}; "
              f"{os.cpu_count()} cores (server and client share them)")
        result = trio.run(throughput, host, port, server.pid, args.connections, args.seconds)
        print(f"\nthroughput: {args.connections} keep-alive connections, ~203 events a "
              f"response, cadence 0, {args.seconds:g} s")
        for name, value in result.items():
            print(f"  {name:22} {value:,.1f}")
        result = trio.run(concurrency, host, port, server.pid, args.streams, 200, 0.0)
        print(f"\nconcurrency: {args.streams} streams at once, ~203 events each, cadence 0")
        for name, value in result.items():
            print(f"  {name:22} {value:,.2f}")
        result = trio.run(concurrency, host, port, server.pid, args.streams, args.events,
                          args.cadence)
        print(f"\npaced: {args.streams} streams at once, {args.events} events each, "
              f"{args.cadence * 1000:g} ms apart")
        for name, value in result.items():
            print(f"  {name:22} {value:,.2f}")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
