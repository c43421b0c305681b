"""Client CPU per event and peak memory per stream: fanout against an aiohttp + orjson
loop, a bare httpx loop and the openai SDK.

    .venv/bin/python bench/fanout.py [--streams 1000 3000 10000] [--tokens 200] [--rounds 3]
                                     [--clients fanout fanout+gc aiohttp aiohttp+gc httpx openai]
                                     [--openai-max 3000]

Starts ``fanout mock`` in its own process (cadence 0, one write per event, as
real servers send them: see the captures' recv.tsv) and, for each N, opens N
concurrent streams of ``--tokens`` tokens (plus role, finish, usage and
``[DONE]`` events) with each client, every client in a fresh process of its
own (its CPU and memory are its own), the clients in turn within a round and
the rounds alternating their order:

  fanout   open_fanout(), every event consumed from the channel (results kept,
           as the engine keeps them)
  aiohttp  aiohttp.ClientSession under asyncio, a hand split of the body on
           blank lines and orjson.loads of every data payload: the lean
           hand-written client
  httpx    a bare read loop over fanout's own client (make_client) that only
           counts bytes: the floor of any httpx-based client
  openai   AsyncOpenAI as users run it (its own default transport, no client
           handed in, max_retries=0) and asyncio.gather, iterating the chunks

and ``fanout+gc`` and ``aiohttp+gc``: the same two with the garbage collector set
as ``fanout.tune_gc()`` sets it (the ``fanout`` command does at its start): what
was imported frozen, the young generation collected after 50,000 new objects.
Each is also compared with its peer under the same setting.

Reported per client: CPU time of its process (time.process_time, imports and
the server excluded) per SSE event; peak memory per stream, (VmHWM at the end
- VmRSS before the streams opened) / N; events/s of wall time; errors (streams
that did not complete).  Ratios are taken within each round (the clients of a
round run back to back), then their median: the machine's drift cancels out.
The process raises its own open-files limit (10,000 streams need ~10,000
descriptors in the client and as many in the server).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# This file is named fanout.py: keep its folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

MESSAGES = [{"role": "user", "content": "benchmark"}]
HEADERS = {"x-fanout-fragment": "event", "x-fanout-cadence": "0"}
CLIENTS = ("fanout", "fanout+gc", "aiohttp", "aiohttp+gc", "httpx", "openai")
#: ``fanout.tune_gc()``'s young threshold (the parent checks they agree).
TUNED_YOUNG = 50_000
PEERS = ("aiohttp", "aiohttp+gc", "openai")


def raise_open_files() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def body(index: int) -> dict[str, Any]:
    return {"model": "mock/fast", "messages": MESSAGES, "stream": True, "seed": index,
            "stream_options": {"include_usage": True}}


def request_headers(tokens: int) -> dict[str, str]:
    return {**HEADERS, "x-fanout-tokens": str(tokens), "authorization": "Bearer sk-bench",
            "accept": "text/event-stream", "accept-encoding": "identity",
            "content-type": "application/json"}


# -- the clients (each runs in a process of its own) ---------------------------------


def run_fanout(base_url: str, streams: int, tokens: int) -> tuple[int, int]:
    import trio

    import fanout

    async def main() -> tuple[int, int]:
        endpoint = fanout.Endpoint(base_url, "sk-bench",
                                   {**HEADERS, "x-fanout-tokens": str(tokens)})
        requests = [fanout.StreamRequest(f"s{i}", "mock/fast", MESSAGES, {"seed": i})
                    for i in range(streams)]
        async with fanout.open_fanout(endpoint, requests, max_concurrency=streams) as fan:
            async for _ in fan.events:
                pass
        errors = sum(r.outcome is not fanout.Outcome.COMPLETED for r in fan.results.values())
        return sum(r.events for r in fan.results.values()), errors

    return trio.run(main)


def run_aiohttp(base_url: str, streams: int, tokens: int) -> tuple[int, int]:
    import asyncio

    import aiohttp
    import orjson

    async def main() -> tuple[int, int]:
        headers = request_headers(tokens)
        connector = aiohttp.TCPConnector(limit=streams, limit_per_host=streams)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=60)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

            async def one(index: int) -> int:
                events = 0
                done = False
                buffer = b""
                async with session.post(f"{base_url}/chat/completions",
                                        data=orjson.dumps(body(index)),
                                        headers=headers) as response:
                    response.raise_for_status()
                    async for data in response.content.iter_any():
                        buffer += data
                        *frames, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
                        for frame in frames:
                            for line in frame.split(b"\n"):
                                if line.startswith(b"data:"):
                                    payload = line[5:].strip()
                                    events += 1
                                    if payload == b"[DONE]":
                                        done = True
                                    else:
                                        orjson.loads(payload)
                if not done:
                    raise RuntimeError("no [DONE]")
                return events

            outcomes = await asyncio.gather(*(one(i) for i in range(streams)),
                                            return_exceptions=True)
        errors = sum(isinstance(o, BaseException) for o in outcomes)
        return sum(o for o in outcomes if isinstance(o, int)), errors

    return asyncio.run(main())


def run_httpx(base_url: str, streams: int, tokens: int) -> tuple[int, int]:
    import httpx
    import trio

    import fanout

    async def main() -> tuple[int, int]:
        headers = request_headers(tokens)
        received = errors = 0

        async def one(client: httpx.AsyncClient, index: int) -> None:
            nonlocal received, errors
            try:
                async with client.stream("POST", f"{base_url}/chat/completions",
                                         json=body(index), headers=headers) as response:
                    async for data in response.aiter_raw():
                        received += len(data)
            except httpx.HTTPError:
                errors += 1

        async with fanout.make_client(streams) as client, trio.open_nursery() as nursery:
            for index in range(streams):
                nursery.start_soon(one, client, index)
        return -received, errors  # bytes, not events: the parent supplies the event count

    return trio.run(main)


def run_openai(base_url: str, streams: int, tokens: int) -> tuple[int, int]:
    import asyncio

    import openai

    async def main() -> tuple[int, int]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0)

        async def one(index: int) -> int:
            stream = await client.chat.completions.create(
                model="mock/fast", messages=MESSAGES,  # type: ignore[arg-type]
                stream=True, seed=index, stream_options={"include_usage": True},
                extra_headers={**HEADERS, "x-fanout-tokens": str(tokens)})
            chunks = 0
            async for _ in stream:
                chunks += 1
            return chunks + 1  # [DONE] is an event too

        async with client:
            outcomes = await asyncio.gather(*(one(i) for i in range(streams)),
                                            return_exceptions=True)
        errors = sum(isinstance(o, BaseException) for o in outcomes)
        return sum(o for o in outcomes if isinstance(o, int)), errors

    return asyncio.run(main())


RUNNERS = {"fanout": run_fanout, "fanout+gc": run_fanout, "aiohttp": run_aiohttp,
           "aiohttp+gc": run_aiohttp, "httpx": run_httpx, "openai": run_openai}


def child(name: str, base_url: str, streams: int, tokens: int) -> None:
    raise_open_files()
    runner = RUNNERS[name]
    # Imports first, so neither their CPU nor their memory counts.
    if name.startswith("fanout"):
        import trio  # noqa: F401

        import fanout
        if name == "fanout+gc":
            fanout.tune_gc()
    elif name.startswith("aiohttp"):
        import aiohttp  # noqa: F401
        import orjson  # noqa: F401
    elif name == "httpx":
        import httpx  # noqa: F401
        if name == "aiohttp+gc":  # what fanout.tune_gc() does, without importing fanout
            import gc

            gc.freeze()
            gc.set_threshold(TUNED_YOUNG, *gc.get_threshold()[1:])
    else:
        import openai  # noqa: F401
    rss = status_kb("VmRSS")
    cpu, wall = time.process_time(), time.perf_counter()
    events, errors = runner(base_url, streams, tokens)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu": cpu, "wall": wall, "events": events, "errors": errors,
                      "kb_per_stream": (status_kb("VmHWM") - rss) / streams}))


# -- the parent -------------------------------------------------------------------------


def measure(name: str, base_url: str, streams: int, tokens: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", name, base_url, str(streams),
                           str(tokens)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{name} at {streams} streams failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        name, base_url, streams, tokens = sys.argv[2:6]
        child(name, base_url, int(streams), int(tokens))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, nargs="+", default=[1000, 3000, 10000])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians are reported)")
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument("--openai-max", type=int, default=3000,
                        help="run the openai SDK only up to this many streams (it costs "
                             "~5x the others' CPU)")
    args = parser.parse_args()
    raise_open_files()  # the server inherits it

    import aiohttp
    import httpx
    import openai
    import trio

    from fanout._gc import YOUNG_THRESHOLD
    assert TUNED_YOUNG == YOUNG_THRESHOLD, "bench/fanout.py's TUNED_YOUNG is out of date"

    server = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        print(f"fanout mock at {base_url}; python {sys.version.split()[0]}, "
              f"trio {trio.__version__}, httpx {httpx.__version__}, aiohttp "
              f"{aiohttp.__version__}, openai {openai.__version__}; 2 cores shared with the "
              "server process", flush=True)
        rows = []
        for streams in args.streams:
            clients = [c for c in args.clients if c != "openai" or streams <= args.openai_max]
            samples: dict[str, list[dict[str, float]]] = {c: [] for c in clients}
            for round_ in range(args.rounds):
                order = clients if round_ % 2 == 0 else clients[::-1]
                for name in order:
                    run = measure(name, base_url, streams, args.tokens)
                    samples[name].append(run)
                    print(f"  N={streams} round {round_ + 1} {name}: "
                          f"{run['cpu']:.1f} s CPU, {run['kb_per_stream']:.1f} KB/stream, "
                          f"{run['errors']} errors", file=sys.stderr, flush=True)
            counted = [r["events"] for runs in samples.values() for r in runs if r["events"] > 0]
            events = max(counted) if counted else 1

            def per_event(run: dict[str, float], events: float = events) -> float:
                return run["cpu"] / (run["events"] if run["events"] > 0 else events) * 1e6

            for name, runs in samples.items():
                cpu = statistics.median(per_event(r) for r in runs)
                kb = statistics.median(r["kb_per_stream"] for r in runs)
                rate = statistics.median((r["events"] if r["events"] > 0 else events) / r["wall"]
                                         for r in runs)
                ratios = {peer: statistics.median(per_event(r) / per_event(p)
                                                  for r, p in zip(runs, samples[peer],
                                                                  strict=False))
                          for peer in PEERS if peer in samples}
                rows.append((streams, name, cpu, kb, rate, max(r["errors"] for r in runs),
                             ratios))
        print()
        print("| streams | client | CPU µs/event | peak KB/stream | events/s | errors | "
              + " | ".join(f"vs {peer}" for peer in PEERS) + " |")
        print("|---:|---|---:|---:|---:|---:|" + "---:|" * len(PEERS))
        for streams, name, cpu, kb, rate, errors, ratios in rows:
            versus = [f"{ratios[peer]:.2f}x" if peer in ratios else "-" for peer in PEERS]
            print(f"| {streams:,} | {name} | {cpu:.1f} | {kb:.1f} | {rate:,.0f} | {int(errors)} | "
                  + " | ".join(versus) + " |")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
