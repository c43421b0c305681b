"""Client CPU per event: fanout end to end against a bare httpx loop and the openai SDK.

    .venv/bin/python bench/fanout.py [--streams 100 1000 3000] [--tokens 200] [--repeat 1]

Starts ``fanout mock`` in its own process (cadence 0, one write per event,
as real servers send them: see the captures' recv.tsv) and, for each N,
opens N concurrent streams of ~200 events with three clients in turn:

  fanout     open_fanout(), every event consumed from the channel
  httpx      a bare read loop over the same client (make_client) that only
             counts bytes: the floor of any httpx-based client
  httpx+parse  the same loop feeding a fanout StreamParser per stream: what
             fanout adds beyond parsing is the difference to the fanout row
  openai     AsyncOpenAI (its own httpx client, limits raised to N) and
             asyncio.gather, iterating the chunks: what most users would pick

and reports this process's CPU time (time.process_time) per SSE event,
events/s of wall time, and errors.  Every client sends the same body.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# This file is named fanout.py: keep its folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import httpx
import trio

import fanout

MESSAGES = [{"role": "user", "content": "benchmark"}]
HEADERS = {"x-fanout-fragment": "event", "x-fanout-cadence": "0"}


def body(index: int) -> dict[str, Any]:
    return {"model": "mock/fast", "messages": MESSAGES, "stream": True, "seed": index,
            "stream_options": {"include_usage": True}}


async def run_fanout(base_url: str, streams: int, tokens: int) -> tuple[int, int]:
    endpoint = fanout.Endpoint(base_url, "sk-bench", {**HEADERS, "x-fanout-tokens": str(tokens)})
    requests = [fanout.StreamRequest(f"s{i}", "mock/fast", MESSAGES, {"seed": i})
                for i in range(streams)]
    consumed = 0
    async with fanout.open_fanout(endpoint, requests, max_concurrency=streams) as fan:
        async for _ in fan.events:
            consumed += 1
    errors = sum(r.outcome is not fanout.Outcome.COMPLETED for r in fan.results.values())
    return sum(r.events for r in fan.results.values()), errors


async def run_httpx(base_url: str, streams: int, tokens: int, parse: bool = False
                    ) -> tuple[int, int]:
    headers = {**HEADERS, "x-fanout-tokens": str(tokens), "authorization": "Bearer sk-bench",
               "accept": "text/event-stream", "accept-encoding": "identity"}
    received = 0
    errors = 0

    async def one(client: httpx.AsyncClient, index: int) -> None:
        nonlocal received, errors
        parser = fanout.StreamParser() if parse else None
        try:
            async with client.stream("POST", f"{base_url}/chat/completions", json=body(index),
                                     headers=headers) as response:
                async for data in response.aiter_bytes():
                    received += len(data)
                    if parser is not None:
                        parser.feed(data)
        except httpx.HTTPError:
            errors += 1
        if parser is not None and parser.result().outcome is not fanout.Outcome.COMPLETED:
            errors += 1

    async with fanout.make_client(streams) as client, trio.open_nursery() as nursery:
        for index in range(streams):
            nursery.start_soon(one, client, index)
    return -received, errors  # bytes, not events: the caller supplies the event count


def run_openai(base_url: str, streams: int, tokens: int) -> tuple[int, int]:
    import openai

    async def main() -> tuple[int, int]:
        limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600)) as http:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", http_client=http,
                                        max_retries=0)

            async def one(index: int) -> int:
                stream = await client.chat.completions.create(
                    model="mock/fast", messages=MESSAGES,  # type: ignore[arg-type]
                    stream=True, seed=index,
                    stream_options={"include_usage": True},
                    extra_headers={**HEADERS, "x-fanout-tokens": str(tokens)})
                chunks = 0
                async for _ in stream:
                    chunks += 1
                return chunks + 1  # [DONE] is an event too

            outcomes = await asyncio.gather(*(one(i) for i in range(streams)),
                                            return_exceptions=True)
        errors = sum(isinstance(o, BaseException) for o in outcomes)
        return sum(o for o in outcomes if isinstance(o, int)), errors

    return asyncio.run(main())


def measure(name: str, fn: Any, *args: Any) -> dict[str, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    events, errors = fn(*args)
    return {"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
            "events": events, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[100, 1000, 3000])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--skip-openai", action="store_true")
    args = parser.parse_args()

    server = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        import openai

        print(f"fanout mock at {base_url}; python {sys.version.split()[0]}, "
              f"trio {trio.__version__}, httpx {httpx.__version__}, openai {openai.__version__};"
              " 2 cores shared with the server process")
        rows = []
        for streams in args.streams:
            samples: dict[str, list[dict[str, float]]] = {
                "fanout": [], "httpx": [], "httpx+parse": [], "openai": []}
            for _ in range(args.repeat):
                samples["fanout"].append(measure("fanout", trio.run, run_fanout, base_url,
                                                 streams, args.tokens))
                samples["httpx"].append(measure("httpx", trio.run, run_httpx, base_url, streams,
                                                args.tokens))
                samples["httpx+parse"].append(measure("httpx+parse", trio.run, run_httpx,
                                                      base_url, streams, args.tokens, True))
                if not args.skip_openai:
                    samples["openai"].append(measure("openai", run_openai, base_url, streams,
                                                     args.tokens))
            events = samples["fanout"][0]["events"]

            def per_event(run: dict[str, float], events: float = events) -> float:
                return run["cpu"] / (run["events"] if run["events"] > 0 else events) * 1e6

            for name, runs in samples.items():
                if not runs:
                    continue
                cpu = statistics.median(per_event(r) for r in runs)
                rate = statistics.median((r["events"] if r["events"] > 0 else events) / r["wall"]
                                         for r in runs)
                # Ratios within each round (the rows of a round run back to back),
                # then their median: the machine's slow drifts cancel out.
                ratios = {peer: statistics.median(per_event(r) / per_event(p)
                                                  for r, p in zip(runs, samples[peer],
                                                                  strict=False))
                          for peer in ("httpx", "openai") if samples[peer]}
                rows.append((streams, name, cpu, rate, max(r["errors"] for r in runs), ratios))
                print(f"  N={streams} {name}: {cpu:.1f} µs CPU/event over {len(runs)} rounds",
                      file=sys.stderr)
        print()
        print("| streams | client | CPU µs/event | events/s | errors | vs bare httpx | vs openai |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        for streams, name, cpu, rate, errors, ratios in rows:
            versus = [f"{ratios[peer]:.2f}x" if peer in ratios else "-"
                      for peer in ("httpx", "openai")]
            print(f"| {streams:,} | {name} | {cpu:.1f} | {rate:,.0f} | {int(errors)} | "
                  f"{versus[0]} | {versus[1]} |")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
