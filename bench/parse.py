"""Parsing throughput: fanout's sans-I/O core against the openai SDK, same bytes, same run.

    .venv/bin/python bench/parse.py [--mb 20] [--repeat 3]

Builds a deterministic body of chat-completion chunks (~200 bytes each: ~90 %
content deltas of 1-8 characters, ~10 % tool-call argument fragments, a
usage chunk, [DONE]), cuts it into 16 KiB reads, and times, median of
--repeat runs each:

  fanout            parse_stream(reads): SSE + chunks + accumulation -> StreamResult
  fanout (stdlib)   the same with FANOUT_JSON's stdlib backend
  sdk bare          openai._streaming.SSEDecoder().iter_bytes + json.loads per event
  sdk accumulate    OpenAI client over httpx.MockTransport + ChatCompletionStreamState
  json floor        json.loads (and orjson.loads) over the event payloads alone

and prints events/s, MB/s and each row's ratio against fanout.  Needs the
bench extra: pip install -e '.[bench]'.
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import json
import random
import statistics
import string
import time
from collections.abc import Callable
from typing import Any

import httpx
import orjson

import fanout
from fanout.core import _json

READ_SIZE = 16 * 1024
WORDS = (
    "the", "of", "and", "a", "to", "in", "is", "was", "it", "for", "on", "that", "with", "as",
    "model", "stream", "token", "parse", "event", "chunk", "delta", "river", "mountain",
    "café", "naïve", "東京", "雨", "☀", "👍",
)


def build_body(target_bytes: int, seed: int = 20261129) -> tuple[bytes, str, int]:
    """Return (body, expected first-choice text, number of SSE events)."""
    rng = random.Random(seed)
    head = {"id": "chatcmpl-BENCH0123456789abcdef", "object": "chat.completion.chunk",
            "created": 1795978800, "model": "gpt-4o-mini-2024-07-18"}
    frames: list[bytes] = []
    text: list[str] = []
    size = 0
    tool_index = -1
    tool_args = ""

    def emit(choice: dict[str, Any], **extra: Any) -> None:
        nonlocal size
        frame = b"data: " + json.dumps({**head, "choices": [choice], **extra},
                                       ensure_ascii=False, separators=(",", ":")).encode()
        frame += b"\n\n"
        frames.append(frame)
        size += len(frame)

    emit({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
          "finish_reason": None})
    while size < target_bytes:
        if rng.random() < 0.9:
            piece = rng.choice(WORDS)
            piece = (" " + piece)[: rng.randint(1, 8)] if rng.random() < 0.8 else piece[:8]
            text.append(piece)
            emit({"index": 0, "delta": {"content": piece}, "logprobs": None,
                  "finish_reason": None})
            continue
        if not tool_args:  # open the next tool call
            tool_index += 1
            tool_args = json.dumps({"city": rng.choice(WORDS), "days": rng.randint(1, 9),
                                    "note": "".join(rng.choices(string.ascii_letters, k=60))})
            emit({"index": 0, "delta": {"tool_calls": [{
                "index": tool_index, "id": f"call_{tool_index:06d}", "type": "function",
                "function": {"name": "get_weather", "arguments": ""}}]},
                "logprobs": None, "finish_reason": None})
            continue
        cut = rng.randint(1, 8)
        fragment, tool_args = tool_args[:cut], tool_args[cut:]
        emit({"index": 0, "delta": {"tool_calls": [{
            "index": tool_index, "function": {"arguments": fragment}}]},
            "logprobs": None, "finish_reason": None})
    emit({"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"})
    frames.append(b"data: " + json.dumps({**head, "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": len(frames), "total_tokens": len(frames) + 12,
    }}).encode() + b"\n\n")
    frames.append(b"data: [DONE]\n\n")
    return b"".join(frames), "".join(text), len(frames)


def reads_of(body: bytes) -> list[bytes]:
    return [body[i : i + READ_SIZE] for i in range(0, len(body), READ_SIZE)]


def run_fanout(reads: list[bytes]) -> str:
    result = fanout.parse_stream(reads)
    assert result.outcome is fanout.Outcome.COMPLETED, result.outcome
    return result.text


def run_fanout_stdlib(reads: list[bytes]) -> str:
    saved = _json.loads
    _json.loads = _json.loads_stdlib
    try:
        return run_fanout(reads)
    finally:
        _json.loads = saved


def run_sdk_bare(reads: list[bytes]) -> str:
    from openai._streaming import SSEDecoder

    text: list[str] = []
    for sse in SSEDecoder().iter_bytes(iter(reads)):
        if sse.data.startswith("[DONE]"):
            break
        chunk = json.loads(sse.data)
        for choice in chunk["choices"]:
            content = choice["delta"].get("content")
            if content:
                text.append(content)
    return "".join(text)


def run_sdk_accumulate(reads: list[bytes]) -> str:
    import openai
    from openai.lib.streaming.chat import ChatCompletionStreamState

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              content=iter(reads))

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        client = openai.OpenAI(base_url="http://relay.invalid/v1", api_key="bench",
                               http_client=http, max_retries=0)
        state: ChatCompletionStreamState[Any] = ChatCompletionStreamState()
        stream = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}], stream=True)
        for chunk in stream:
            state.handle_chunk(chunk)
        final = state.get_final_completion()
    return final.choices[0].message.content or ""


def payloads_of(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().split("\n")
            if line.startswith("data: ") and line != "data: [DONE]"]


def json_floor(loads: Callable[[str], Any], payloads: list[str]) -> None:
    # Results are dropped at once, as a streaming parser drops them: keeping
    # 90k dicts alive would bill the floor for cyclic-GC passes over them.
    for payload in payloads:
        loads(payload)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=20.0, help="body size in MB (default 20)")
    parser.add_argument("--repeat", type=int, default=5,
                        help="rounds; each row's median and min are reported (default 5)")
    parser.add_argument("--skip-accumulate", action="store_true",
                        help="leave out the SDK accumulating path (minutes at 20 MB)")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (the table reports medians)")

    body, expected_text, events = build_body(int(args.mb * 1_000_000))
    reads = reads_of(body)
    payloads = payloads_of(body)
    mb = len(body) / 1_000_000
    print(f"body: {mb:.1f} MB, {events:,} events ({len(body) // events} bytes each), "
          f"{len(reads):,} reads of 16 KiB; python {sys.version.split()[0]}, "
          f"openai {_openai_version()}, fanout json backend: {_json.BACKEND}")

    fanout_row = "fanout parse_stream"
    bare_row = "openai SSEDecoder + json.loads"
    accumulate_row = "openai stream + ChatCompletionStreamState"
    rows: list[tuple[str, Callable[[], object], bool]] = [
        (fanout_row, lambda: run_fanout(reads), True),
        ("fanout parse_stream, FANOUT_JSON=stdlib", lambda: run_fanout_stdlib(reads), True),
        (bare_row, lambda: run_sdk_bare(reads), True),
        ("floor: json.loads per payload", lambda: json_floor(json.loads, payloads), False),
        ("floor: orjson.loads per payload", lambda: json_floor(orjson.loads, payloads), False),
    ]
    # The machine's timing noise is large, so rows run round-robin: each
    # round runs every row once and every row meets the same noise.
    times: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for round_number in range(args.repeat):
        for name, fn, returns_text in rows:
            start = time.perf_counter()
            value = fn()
            times[name].append(time.perf_counter() - start)
            if returns_text and round_number == 0:
                assert value == expected_text, f"{name} produced the wrong text"
        print(f"  round {round_number + 1}/{args.repeat} done", file=sys.stderr)
    if not args.skip_accumulate:
        # Minutes a run at 20 MB (it slows down as the stream grows): 3 runs.
        for round_number in range(3):
            start = time.perf_counter()
            value = run_sdk_accumulate(reads)
            times.setdefault(accumulate_row, []).append(time.perf_counter() - start)
            assert value == expected_text, f"{accumulate_row} produced the wrong text"
            print(f"  {accumulate_row}: run {round_number + 1}/3 done", file=sys.stderr)

    medians = {name: statistics.median(t) for name, t in times.items()}
    minimums = {name: min(t) for name, t in times.items()}
    base, base_min = medians[fanout_row], minimums[fanout_row]
    print()
    print("| path | median s | min s | µs/event | events/s | MB/s | vs fanout (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.3f} | {minimums[name]:.3f} | "
              f"{seconds / events * 1e6:.2f} | {events / seconds:,.0f} | {mb / seconds:.1f} | "
              f"{seconds / base:.2f}x |")
    print()
    print(f"fanout vs the SDK's bare SSEDecoder + json.loads: {medians[bare_row] / base:.2f}x "
          f"faster on medians, {minimums[bare_row] / base_min:.2f}x on minimums (target >= 2x)")
    if accumulate_row in medians:
        print(f"fanout vs the SDK's accumulating path: {medians[accumulate_row] / base:.0f}x "
              f"faster on medians, {minimums[accumulate_row] / base_min:.0f}x on minimums "
              "(target >= 40x)")


def _openai_version() -> str:
    import openai

    return openai.__version__


if __name__ == "__main__":
    main()
