"""`fanout batch` at 10,000 streams: streams/s, client CPU per stream, peak memory.

    .venv/bin/python bench/batch.py [--prompts 2500] [--concurrency 200] [--rounds 3]

Starts ``fanout mock`` in its own process (cadence 0, 64 tokens a stream) and
runs prompts x 4 models (mock/fast, mock/slow, mock/reasoning, mock/tools:
text, reasoning and tool calls) through each client in turn, each client in a
fresh process so its peak memory is its own:

  fanout batch   run_batch(): validation, resume check, adaptive caps, the
                 fan-out, one results line written and flushed per stream,
                 fsync every second, the summary
  openai script  what one writes by hand: AsyncOpenAI + asyncio.Semaphore,
                 content and tool-call arguments accumulated per choice,
                 json.dumps + flush per stream (no resume, no metrics, no
                 validation, no fsync)

Rows run round-robin; medians over --rounds, and the ratio is the median of
each round's ratio.  CPU is the client process's user+system time while it
ran the batch (imports excluded); peak memory is its maximum RSS when the
batch ended (imports included: about 35 MB for fanout, 58 MB with openai).
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import json
import resource
import statistics
import subprocess
import tempfile
import time
from typing import Any

MODELS = {"fast": "mock/fast", "slow": "mock/slow", "reasoning": "mock/reasoning",
          "tools": "mock/tools"}
HEADERS = {"x-fanout-cadence": "0", "x-fanout-tokens": "64"}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_inputs(folder: Path, base_url: str, prompts: int, concurrency: int) -> None:
    with (folder / "prompts.jsonl").open("w") as file:
        for i in range(prompts):
            file.write(json.dumps({"id": f"p{i}", "prompt": f"Benchmark question {i}?"}) + "\n")
    models = "".join(f'[[models]]\nname = "{name}"\nid = "{model}"\n\n'
                     for name, model in MODELS.items())
    headers = ", ".join(f'"{k}" = "{v}"' for k, v in HEADERS.items())
    (folder / "bench.toml").write_text(
        f'[endpoint]\nbase_url = "{base_url}"\nheaders = {{ {headers} }}\n\n'
        f"[concurrency]\nmax = {concurrency}\nper_model = {concurrency}\n\n{models}")


def client_fanout(folder: Path, concurrency: int) -> dict[str, Any]:
    import io

    from fanout.cli.batch import BatchOptions, run_batch

    output = folder / "fanout.jsonl"
    output.unlink(missing_ok=True)
    start_cpu, start = cpu_seconds(), time.perf_counter()
    status = run_batch(BatchOptions(prompts=str(folder / "prompts.jsonl"), output=str(output),
                                    config=str(folder / "bench.toml"), concurrency=concurrency),
                       stdout=io.StringIO(), stderr=io.StringIO(), environ={})
    wall, cpu, peak = time.perf_counter() - start, cpu_seconds() - start_cpu, peak_mb()
    return {"wall": wall, "cpu": cpu, "peak_mb": peak, **count(output), "status": status}


def count(output: Path) -> dict[str, int]:
    """Streams and completed ones in a results file (after the peak was taken)."""
    streams = completed = 0
    with output.open("rb") as file:
        for line in file:
            record = json.loads(line)
            streams += 1
            if "outcome" in record:  # fanout's results
                completed += record["outcome"] == "completed"
            else:  # the script's
                completed += record["ok"] is True
    return {"streams": streams, "completed": completed}


def client_openai(folder: Path, concurrency: int) -> dict[str, Any]:
    import asyncio

    import httpx
    import openai

    base_url = json.loads((folder / "base_url.json").read_text())
    prompts = [json.loads(line) for line in (folder / "prompts.jsonl").read_text().splitlines()]
    output = folder / "openai.jsonl"

    async def main() -> int:
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600)) as http:
            client = openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", http_client=http)
            gate = asyncio.Semaphore(concurrency)
            with output.open("w") as results:
                async def one(prompt: dict[str, Any], name: str, model: str) -> bool:
                    async with gate:
                        text: dict[int, list[str]] = {}
                        tools: dict[tuple[int, int], list[str]] = {}
                        finish: dict[int, str | None] = {}
                        usage = None
                        try:
                            stream = await client.chat.completions.create(
                                model=model, stream=True,
                                messages=[{"role": "user", "content": prompt["prompt"]}],
                                stream_options={"include_usage": True}, extra_headers=HEADERS)
                            async for chunk in stream:
                                if chunk.usage is not None:
                                    usage = chunk.usage.model_dump()
                                for choice in chunk.choices:
                                    delta = choice.delta
                                    if delta.content:
                                        text.setdefault(choice.index, []).append(delta.content)
                                    for call in delta.tool_calls or ():
                                        arguments = call.function.arguments if call.function \
                                            else None
                                        tools.setdefault((choice.index, call.index),
                                                         []).append(arguments or "")
                                    if choice.finish_reason:
                                        finish[choice.index] = choice.finish_reason
                            ok, error = True, None
                        except Exception as exc:  # what a script would do
                            ok, error = False, repr(exc)
                        record = {"id": prompt["id"], "model": name, "ok": ok, "error": error,
                                  "text": "".join(text.get(0, [])), "finish": finish.get(0),
                                  "tools": {f"{c}.{t}": "".join(a) for (c, t), a in tools.items()},
                                  "usage": usage}
                        results.write(json.dumps(record) + "\n")
                        results.flush()
                        return ok

                outcomes = await asyncio.gather(*(one(p, name, model) for p in prompts
                                                  for name, model in MODELS.items()))
        return sum(outcomes)

    start_cpu, start = cpu_seconds(), time.perf_counter()
    asyncio.run(main())
    wall, cpu, peak = time.perf_counter() - start, cpu_seconds() - start_cpu, peak_mb()
    return {"wall": wall, "cpu": cpu, "peak_mb": peak, **count(output), "status": 0}


def run_client(name: str, folder: Path, concurrency: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--client", name, "--folder", str(folder),
                          "--concurrency", str(concurrency)],
                         capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2500)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-openai", action="store_true", help="only fanout batch")
    parser.add_argument("--client", choices=("fanout", "openai"), help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        run = client_fanout if args.client == "fanout" else client_openai
        print(json.dumps(run(args.folder, args.concurrency)))
        return

    server = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            write_inputs(folder, base_url, args.prompts, args.concurrency)
            (folder / "base_url.json").write_text(json.dumps(base_url))
            streams = args.prompts * len(MODELS)
            print(f"fanout mock at {base_url}; {streams:,} streams ({args.prompts:,} prompts x "
                  f"{len(MODELS)} models), 64 tokens each, cadence 0, {args.concurrency} in "
                  "flight; 2 cores shared with the server process")
            samples: dict[str, list[dict[str, Any]]] = {"fanout batch": [], "openai script": []}
            for round_ in range(args.rounds):
                for name, client in (("fanout batch", "fanout"), ("openai script", "openai")):
                    if args.skip_openai and client == "openai":
                        continue
                    result = run_client(client, folder, args.concurrency)
                    samples[name].append(result)
                    print(f"  round {round_ + 1} {name}: {result['streams']:,} streams, "
                          f"{result['completed']:,} completed, {result['wall']:.1f} s, "
                          f"{result['cpu'] / result['streams'] * 1e3:.2f} ms CPU/stream, "
                          f"peak {result['peak_mb']:.0f} MB", file=sys.stderr)
        print()
        print("| client | streams/s | CPU ms/stream | peak MB | completed | CPU vs openai | "
              "streams/s vs openai |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        peer = samples["openai script"] or samples["fanout batch"]
        for name, runs in samples.items():
            if not runs:
                continue
            rate = statistics.median(r["streams"] / r["wall"] for r in runs)
            cpu = statistics.median(r["cpu"] / r["streams"] * 1e3 for r in runs)
            peak = statistics.median(r["peak_mb"] for r in runs)
            completed = min(r["completed"] for r in runs)
            cpu_ratio = statistics.median((r["cpu"] / r["streams"]) / (p["cpu"] / p["streams"])
                                          for r, p in zip(runs, peer, strict=True))
            rate_ratio = statistics.median((r["streams"] / r["wall"]) / (p["streams"] / p["wall"])
                                           for r, p in zip(runs, peer, strict=True))
            print(f"| {name} | {rate:,.0f} | {cpu:.2f} | {peak:.0f} | {completed:,} of "
                  f"{runs[0]['streams']:,} | {cpu_ratio:.2f}x | {rate_ratio:.2f}x |")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
