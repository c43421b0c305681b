"""Slow clients against ``fanout serve``: how many descriptors the server holds.

Starts ``fanout serve`` (embedded upstream, loopback, port 0) as a subprocess, opens
``--clients`` connections that each send one byte a second (of the request head, or
of a declared body after a whole head: ``--phase``), and prints the number of open
descriptors of the server process (``/proc/PID/fd``) every ``--every`` seconds, with
how many of the clients' connections the server has closed so far.  Stops itself
after ``--seconds``: the clients close, the server is stopped.

    python bench/slow_clients.py --phase head --clients 300 --seconds 30
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

CONFIG = """
[endpoint]
base_url = "embedded"

[[models]]
name = "fast"
id = "mock/fast"

[serve]
host = "127.0.0.1"
port = 0
"""

BODY = b'{"models": ["fast"], "messages": [{"role": "user", "content": "hi"}]}'
HEAD = (b"POST /v1/fanout HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(BODY)).encode() + b"\r\n\r\n")


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def client(port: int, phase: str, closed: list[int], stop: trio.Event) -> None:
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError:
        closed[1] += 1  # never connected
        return
    data = HEAD + BODY if phase == "body" else HEAD
    start = len(HEAD) if phase == "body" else 0
    async with stream:
        if start:
            await stream.send_all(data[:start])
        done = trio.Event()

        async def watch() -> None:
            first = b""
            try:
                while data := await stream.receive_some(65536):
                    first = first or data
                    if first.startswith(b"HTTP/1.1 408"):
                        closed[2] += 1
                        first = b" "
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            closed[0] += 1  # the server closed it (or answered and closed)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            for index in range(start, len(data)):
                with trio.move_on_after(1):
                    await done.wait()
                if done.is_set() or stop.is_set():
                    break
                try:
                    await stream.send_all(data[index:index + 1])
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
            with trio.move_on_after(0 if stop.is_set() else 1e9):
                await stop.wait()  # hold it open until the end unless closed
            nursery.cancel_scope.cancel()


async def main(args: argparse.Namespace, pid: int, port: int) -> None:
    closed = [0, 0, 0]  # closed by the server, never connected, 408s received
    stop = trio.Event()
    started = time.monotonic()
    print(f"{0:5.1f} s: server fds {descriptors(pid)} (before any client)", flush=True)
    async with trio.open_nursery() as nursery:
        for _ in range(args.clients):
            nursery.start_soon(client, port, args.phase, closed, stop)
        while (elapsed := time.monotonic() - started) < args.seconds:
            await trio.sleep(args.every)
            print(f"{elapsed + args.every:5.1f} s: server fds {descriptors(pid)}, "
                  f"connections the server closed {closed[0]} of {args.clients} "
                  f"({closed[2]} after a 408)"
                  + (f" ({closed[1]} never connected)" if closed[1] else ""), flush=True)
        stop.set()
        nursery.cancel_scope.cancel()


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--phase", choices=("head", "body"), default="head")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--every", type=float, default=5)
    parser.add_argument("--serve-table", default="",
                        help="extra [serve] lines, like 'head_timeout = 10'")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "fanout.toml"
        config.write_text(CONFIG + args.serve_table.replace("\\n", "\n") + "\n")
        server = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "serve",
                                   "--config", str(config)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            url = server.stdout.readline().strip()
            if not url:
                raise SystemExit(f"fanout serve did not start: {server.stderr.read()}")
            port = int(url.rstrip("/").rsplit(":", 1)[1])
            trio.run(main, args, server.pid, port)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    run()
