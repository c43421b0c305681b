"""`fanout serve`: the service process's CPU per relayed event and its peak RSS, against
the library engine alone doing the same work.

    .venv/bin/python bench/serve.py [--clients 10 100 500] [--fanouts 400] [--tokens 50]
                                    [--offered 8000] [--saturate 100] [--rounds 3]

Three kinds of process, each its own (2 cores here, shared by all of them):

  upstream   ``fanout mock`` (one write per event, as real servers send them), started
             once; each row's config sets its cadence: the paced rows offer the same
             --offered events/s whatever the concurrency (10 clients: 5 ms between a
             stream's events, 500: 250 ms), so a request lasts long enough for 500 of
             them to run at once (the service's /v1/status is polled to show it); the
             last row, cadence 0, is as fast as the processes go: the events/s one
             service process sustains
  service    ``fanout serve`` (``python -m fanout serve``: the command as users run
             it, with its garbage collector set by ``fanout.tune_gc()``) on a
             config of 4 embedded models (mock/fast, mock/slow, mock/reasoning,
             mock/tools: text, reasoning and tool calls), a fresh process for every
             row (warmed up by one request), so its peak RSS is that row's
  clients    a third process: C concurrent clients over bare trio sockets (nothing
             parsed but a count), each POSTing /v1/fanout with the 4 models,
             stream: true, one request after another, max(--fanouts, 2 x C)
             requests in all

and, as the peer, the engine alone in a fresh process of its own (the collector
set the same way): C concurrent
tasks, each running ``open_fanout`` over the same 4 models one after another
(as many fan-outs in all, one shared client sized as the service sizes its
own), every event consumed.

Reported per row: the service's CPU (user + system of its process, from
/proc, while the clients ran) per relayed event (every SSE event it sent:
the records and the opening and summary ones), its peak RSS (VmHWM), the
events/s it relayed; the engine's CPU per event (its own process time, imports
excluded) and peak RSS.  Rows run round-robin; medians over --rounds; the
ratio is the median of each round's ratio (service / engine, measured in the
same round).
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Any

import httpx

MODELS = {"fast": "mock/fast", "slow": "mock/slow", "reasoning": "mock/reasoning",
          "tools": "mock/tools"}
TICKS = os.sysconf("SC_CLK_TCK")


def headers(tokens: int, cadence: float) -> dict[str, str]:
    return {"x-fanout-cadence": f"{cadence:g}", "x-fanout-fragment": "event",
            "x-fanout-tokens": str(tokens)}


def write_config(path: Path, base_url: str, tokens: int, clients: int, cadence: float) -> None:
    models = "".join(f'[[models]]\nname = "{name}"\nid = "{model}"\n\n'
                     for name, model in MODELS.items())
    fields = ", ".join(f'"{k}" = "{v}"' for k, v in headers(tokens, cadence).items())
    path.write_text(f'[endpoint]\nbase_url = "{base_url}"\nheaders = {{ {fields} }}\n\n'
                    f"[serve]\nmax_fanouts = {max(clients, 1) + 8}\nmax_streams = 4\n\n"
                    f"{models}")


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


# -- the clients' process ------------------------------------------------------------


def clients_main(url: str, clients: int, fanouts: int) -> None:
    import trio

    host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
    body = json.dumps({"messages": [{"role": "user", "content": "benchmark"}],
                       "models": list(MODELS), "stream": True}).encode()
    request = (f"POST /v1/fanout HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
               f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body
    totals = {"events": 0, "errors": 0, "responses": 0}
    failures: dict[str, int] = {}
    left = [fanouts]

    async def one() -> None:
        received = bytearray()
        try:
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(request)
                while True:
                    data = await stream.receive_some(262144)
                    if not data:
                        break
                    received += data
        except OSError as exc:  # trio's BrokenResourceError is not one
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
        except trio.BrokenResourceError as exc:
            name = type(exc.__cause__).__name__
            failures[name] = failures.get(name, 0) + 1
        if received[:12] != b"HTTP/1.1 200":
            status = bytes(received[:12]).decode(errors="replace") or "no response"
            failures[status] = failures.get(status, 0) + 1
        events = received.count(b"\nevent: ")
        # The body's end, before the chunked framing's last chunk: [DONE], after 4 results.
        complete = b"data: [DONE]\n\n" in received[-64:] and received.count(
            b"\nevent: result") == len(MODELS)
        totals["events"] += events + 1  # [DONE] is an event too
        totals["errors"] += not complete
        totals["responses"] += 1

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await one()

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(client)

    start = time.perf_counter()
    trio.run(main)
    print(json.dumps({**totals, "failures": failures, "wall": time.perf_counter() - start}))


# -- the engine's process ------------------------------------------------------------


def engine_main(base_url: str, clients: int, fanouts: int, tokens: int, cadence: float
                ) -> None:
    import trio

    import fanout

    fanout.tune_gc()  # as the service's process has it: `fanout serve` sets it at its start
    endpoint = fanout.Endpoint(base_url, None, headers(tokens, cadence))
    messages = [{"role": "user", "content": "benchmark"}]
    totals = {"events": 0, "errors": 0}
    left = [fanouts]

    async def main() -> None:
        async with fanout.make_client((max(clients, 1) + 8) * 4) as http:

            async def client() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    requests = [fanout.StreamRequest(name, model, messages)
                                for name, model in MODELS.items()]
                    async with fanout.open_fanout(endpoint, requests, client=http) as fan:
                        async for _ in fan.events:
                            totals["events"] += 1
                    totals["errors"] += sum(r.outcome is not fanout.Outcome.COMPLETED
                                            for r in fan.results.values())

            async with trio.open_nursery() as nursery:
                for _ in range(clients):
                    nursery.start_soon(client)

    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime
    start = time.perf_counter()
    trio.run(main)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts at its parent's high-water mark
    # (Linux keeps it across vfork and exec), VmHWM is this process's own.
    print(json.dumps({**totals, "wall": time.perf_counter() - start,
                      "cpu": usage.ru_utime + usage.ru_stime - cpu,
                      "peak_mb": peak_rss_mb(os.getpid())}))


# -- the orchestra -------------------------------------------------------------------


def run_json(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                          timeout=1200, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure_service(folder: Path, base_url: str, clients: int, fanouts: int,
                    tokens: int, cadence: float) -> dict[str, Any]:
    config = folder / f"serve-{clients}.toml"
    write_config(config, base_url, tokens, clients, cadence)
    service = subprocess.Popen([sys.executable, "-m", "fanout", "serve", "--config",
                                str(config), "--port", "0"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert service.stdout is not None
        url = service.stdout.readline().strip()
        run_json("--clients-of", url, "1", "4")  # warm up: imports, first connections
        cpu = process_cpu(service.pid)
        run = subprocess.Popen([sys.executable, __file__, "--clients-of", url, str(clients),
                                str(fanouts)], stdout=subprocess.PIPE, text=True)
        most = 0
        with httpx.Client(base_url=url, timeout=10) as http:
            while run.poll() is None:  # how many fan-outs really ran at once
                most = max(most, http.get("/v1/status").json()["running"]["fanouts"])
                time.sleep(0.05)
        out, _ = run.communicate(timeout=60)
        got = json.loads(out.strip().splitlines()[-1])
        got["cpu"] = process_cpu(service.pid) - cpu
        got["peak_mb"] = peak_rss_mb(service.pid)
        got["most_running"] = most
    finally:
        service.send_signal(signal.SIGTERM)
        service.communicate(timeout=30)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--fanouts", type=int, default=400,
                        help="requests (fan-outs of 4 streams) per row, at least 2 per client "
                             "(so every client has more to send while the others run)")
    parser.add_argument("--tokens", type=int, default=50, help="tokens per stream")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients-of", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--offered", type=float, default=8000,
                        help="events/s the paced rows ask of the upstream (the cadence is "
                             "set so: streams / offered seconds between events)")
    parser.add_argument("--saturate", type=int, default=100,
                        help="clients of the last row, at cadence 0: the events/s sustained")
    parser.add_argument("--engine-of", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.clients_of:
        url, clients, fanouts = args.clients_of
        clients_main(url, int(clients), int(fanouts))
        return
    if args.engine_of:
        base_url, clients, fanouts, tokens, cadence = args.engine_of
        engine_main(base_url, int(clients), int(fanouts), int(tokens), float(cadence))
        return

    mock = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert mock.stdout is not None
    base_url = mock.stdout.readline().strip()
    plan = [(clients, len(MODELS) * clients / args.offered) for clients in args.clients]
    if args.saturate:
        plan.append((args.saturate, 0.0))
    rows: dict[tuple[int, float], list[dict[str, Any]]] = {row: [] for row in plan}
    try:
        with tempfile.TemporaryDirectory() as folder:
            for round_number in range(args.rounds):
                for clients, cadence in plan:
                    fanouts = max(args.fanouts, 2 * clients)
                    service = measure_service(Path(folder), base_url, clients, fanouts,
                                              args.tokens, cadence)
                    engine = run_json("--engine-of", base_url, str(clients), str(fanouts),
                                      str(args.tokens), str(cadence))
                    rows[clients, cadence].append({"service": service, "engine": engine})
                    s_us = service["cpu"] / service["events"] * 1e6
                    e_us = engine["cpu"] / engine["events"] * 1e6
                    print(f"round {round_number + 1} · {clients} clients, cadence "
                          f"{cadence:g} s: service "
                          f"{s_us:.1f} µs/event, {service['peak_mb']:.0f} MB, "
                          f"{service['events'] / service['wall']:,.0f} events/s, "
                          f"{service['errors']} errors {service['failures'] or ''}; "
                          f"engine {e_us:.1f} µs/event, "
                          f"{engine['peak_mb']:.0f} MB, {engine['errors']} errors",
                          file=sys.stderr, flush=True)
    finally:
        mock.terminate()
        mock.communicate(timeout=10)

    print(f"\n{len(MODELS)} models a request, {args.tokens} tokens a stream, "
          f"max({args.fanouts}, 2 x clients) requests a row, medians of {args.rounds} rounds\n")
    print("| concurrent requests | cadence | fan-outs running at most | service CPU µs/event | "
          "engine CPU µs/event | service / engine | service peak RSS | engine peak RSS | "
          "service events/s | engine events/s | errors |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (clients, cadence), measured in rows.items():
        def median(side: str, key: str, measured: list[dict[str, Any]] = measured) -> float:
            return statistics.median(m[side][key] for m in measured)

        def per_event(side: str, measured: list[dict[str, Any]] = measured) -> list[float]:
            return [m[side]["cpu"] / m[side]["events"] * 1e6 for m in measured]

        ratio = statistics.median(s / e for s, e in zip(per_event("service"),
                                                        per_event("engine"), strict=True))
        rate = statistics.median(m["service"]["events"] / m["service"]["wall"]
                                 for m in measured)
        engine_rate = statistics.median(m["engine"]["events"] / m["engine"]["wall"]
                                        for m in measured)
        errors = sum(m["service"]["errors"] + m["engine"]["errors"] for m in measured)
        most = max(m["service"]["most_running"] for m in measured)
        print(f"| {clients:,} | {cadence * 1000:.0f} ms | {most:,} | "
              f"{statistics.median(per_event('service')):.1f} | "
              f"{statistics.median(per_event('engine')):.1f} | {ratio:.2f}x | "
              f"{median('service', 'peak_mb'):.0f} MB | {median('engine', 'peak_mb'):.0f} MB | "
              f"{rate:,.0f} | {engine_rate:,.0f} | {errors} |")
    print("\ntarget: service <= 1.5x the engine per event")


if __name__ == "__main__":
    main()
