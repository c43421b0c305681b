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

and prints events/s, MB/s and each row's ratio against fanout.

Then a table per stream dialect (--dialects responses,anthropic; "" for none):
the same mix as Responses events (`response.output_text.delta`, function-call
argument deltas keyed by item, `response.completed` with usage) and as
Anthropic Messages events (`content_block_delta` text and `input_json_delta`
in their blocks, `message_delta`, `message_stop`), each with `event:` lines as
the vendors send them, against that vendor's SDK on the same bytes:

  fanout            parse_stream(reads, api=...)
  sdk bare          the SDK's own SSEDecoder().iter_bytes + json.loads per event
  sdk accumulate    the SDK client over httpx2.MockTransport: openai's
                    responses.stream().get_final_response(), anthropic's
                    messages.stream().get_final_message()

Needs the bench extra: pip install -e '.[bench]' (and anthropic for its rows).
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


def _dialect_frame(kind: str, payload: dict[str, Any]) -> bytes:
    return (f"event: {kind}\ndata: ".encode()
            + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")


def build_dialect_body(api: str, target_bytes: int, seed: int = 20261201
                       ) -> tuple[bytes, str, int]:
    """A Responses or Anthropic body of ~target_bytes: (body, expected text, events).

    The same mix as the chat body: ~90 % text deltas of 1-8 characters, ~10 %
    tool-call argument fragments, one tool call per block or output item.
    """
    rng = random.Random(seed)
    frames: list[bytes] = []
    text: list[str] = []
    size = 0
    sequence = 0

    def emit(kind: str, payload: dict[str, Any]) -> None:
        nonlocal size, sequence
        if api == "responses":
            payload = {"type": kind, **payload, "sequence_number": sequence}
            sequence += 1
        else:
            payload = {"type": kind, **payload}
        frame = _dialect_frame(kind, payload)
        frames.append(frame)
        size += len(frame)

    usage = {"input_tokens": 12, "output_tokens": 0}
    if api == "responses":
        head = {"id": "resp_BENCH0123456789abcdef", "object": "response",
                "created_at": 1795978800, "model": "gpt-5-mini", "status": "in_progress",
                "output": [], "usage": None}
        emit("response.created", {"response": head})
        emit("response.output_item.added", {"output_index": 0, "item": {
            "id": "msg_BENCH0", "type": "message", "role": "assistant", "content": [],
            "status": "in_progress"}})
        emit("response.content_part.added", {"item_id": "msg_BENCH0", "output_index": 0,
                                             "content_index": 0, "part": {
                                                 "type": "output_text", "text": "",
                                                 "annotations": []}})
    else:
        emit("message_start", {"message": {
            "id": "msg_BENCH0123456789abcdef", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {**usage, "output_tokens": 1}}})
        emit("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
    position = 0  # the output item or content block of the open tool call
    tool_args = ""
    calls: list[dict[str, Any]] = []  # Responses: the function-call items, whole
    while size < target_bytes:
        if rng.random() < 0.9:
            piece = rng.choice(WORDS)
            piece = (" " + piece)[: rng.randint(1, 8)] if rng.random() < 0.8 else piece[:8]
            text.append(piece)
            if api == "responses":
                emit("response.output_text.delta", {"item_id": "msg_BENCH0", "output_index": 0,
                                                    "content_index": 0, "delta": piece,
                                                    "logprobs": []})
            else:
                emit("content_block_delta", {"index": 0, "delta": {"type": "text_delta",
                                                                   "text": piece}})
            continue
        if not tool_args:  # open the next tool call
            position += 1
            tool_args = json.dumps({"city": rng.choice(WORDS), "days": rng.randint(1, 9),
                                    "note": "".join(rng.choices(string.ascii_letters, k=60))})
            if api == "responses":
                item = {"id": f"fc_{position:06d}", "type": "function_call",
                        "call_id": f"call_{position:06d}", "name": "get_weather",
                        "arguments": "", "status": "in_progress"}
                emit("response.output_item.added", {"output_index": position, "item": item})
                calls.append({**item, "arguments": tool_args, "status": "completed"})
            else:
                emit("content_block_start", {"index": position, "content_block": {
                    "type": "tool_use", "id": f"toolu_{position:06d}", "name": "get_weather",
                    "input": {}}})
            continue
        cut = rng.randint(1, 8)
        fragment, tool_args = tool_args[:cut], tool_args[cut:]
        if api == "responses":
            emit("response.function_call_arguments.delta", {
                "item_id": f"fc_{position:06d}", "output_index": position, "delta": fragment})
        else:
            emit("content_block_delta", {"index": position, "delta": {
                "type": "input_json_delta", "partial_json": fragment}})
    usage["output_tokens"] = len(frames)
    if api == "responses":
        # The terminal event repeats the output whole (the SDK builds its result from it).
        output: list[dict[str, Any]] = [{
            "id": "msg_BENCH0", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": "".join(text), "annotations": []}]},
            *calls]
        for number, item in enumerate(output):
            emit("response.output_item.done", {"output_index": number, "item": item})
        emit("response.completed", {"response": {
            **head, "status": "completed", "output": output,
            "usage": {**usage, "total_tokens": usage["input_tokens"] + usage["output_tokens"]}}})
    else:
        emit("message_delta", {"delta": {"stop_reason": "tool_use", "stop_sequence": None},
                               "usage": {"output_tokens": usage["output_tokens"]}})
        emit("message_stop", {})
    return b"".join(frames), "".join(text), len(frames)


def run_fanout_dialect(api: str, reads: list[bytes]) -> str:
    result = fanout.parse_stream(reads, api=api)
    assert result.outcome is fanout.Outcome.COMPLETED, (result.outcome, result.reason)
    return result.text


def run_sdk_bare_dialect(api: str, reads: list[bytes]) -> str:
    if api == "responses":
        from openai._streaming import SSEDecoder
    else:
        from anthropic._streaming import SSEDecoder  # type: ignore[no-redef]
    text: list[str] = []
    for sse in SSEDecoder().iter_bytes(iter(reads)):
        event = json.loads(sse.data)
        if api == "responses":
            if event["type"] == "response.output_text.delta":
                text.append(event["delta"])
        elif event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
            text.append(event["delta"]["text"])
    return "".join(text)


def run_sdk_accumulate_dialect(api: str, reads: list[bytes]) -> str:
    import httpx2  # the HTTP client of both SDKs' current releases

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"},
                               content=iter(reads))

    with httpx2.Client(transport=httpx2.MockTransport(handler)) as http:
        if api == "responses":
            import openai

            client = openai.OpenAI(base_url="http://relay.invalid/v1", api_key="bench",
                                   http_client=http, max_retries=0)
            with client.responses.stream(model="gpt-5-mini", input="hi") as stream:
                return stream.get_final_response().output_text
        import anthropic

        messages = anthropic.Anthropic(base_url="http://relay.invalid", api_key="bench",
                                       http_client=http, max_retries=0)
        with messages.messages.stream(model="claude-sonnet-4-5", max_tokens=64000,
                                      messages=[{"role": "user", "content": "hi"}]) as stream:
            final = stream.get_final_message()
        return "".join(block.text for block in final.content if block.type == "text")


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
    parser.add_argument("--dialects", default="responses,anthropic",
                        help="the other stream dialects to time (comma-separated; '' for none)")
    parser.add_argument("--skip-chat", action="store_true", help="leave out the chat table")
    args = parser.parse_args()
    if args.repeat < 3:
        parser.error("--repeat must be at least 3 (the table reports medians)")

    dialects = [d for d in args.dialects.split(",") if d]
    for api in dialects:
        if api not in ("responses", "anthropic"):
            parser.error(f"--dialects: unknown dialect {api!r} (responses, anthropic)")
    if not args.skip_chat:
        chat_table(args)
    for api in dialects:
        dialect_table(api, args)


def _time_rows(rows: list[tuple[str, Callable[[], object], bool]], repeat: int,
               expected_text: str) -> dict[str, list[float]]:
    # The machine's timing noise is large, so rows run round-robin: each
    # round runs every row once and every row meets the same noise.
    times: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for round_number in range(repeat):
        for name, fn, returns_text in rows:
            start = time.perf_counter()
            value = fn()
            times[name].append(time.perf_counter() - start)
            if returns_text and round_number == 0:
                assert value == expected_text, f"{name} produced the wrong text"
        print(f"  round {round_number + 1}/{repeat} done", file=sys.stderr)
    return times


def _print_table(times: dict[str, list[float]], base_row: str, events: int, mb: float) -> None:
    medians = {name: statistics.median(t) for name, t in times.items()}
    minimums = {name: min(t) for name, t in times.items()}
    base = medians[base_row]
    print()
    print("| path | median s | min s | µs/event | events/s | MB/s | vs fanout (median) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, seconds in medians.items():
        print(f"| {name} | {seconds:.3f} | {minimums[name]:.3f} | "
              f"{seconds / events * 1e6:.2f} | {events / seconds:,.0f} | {mb / seconds:.1f} | "
              f"{seconds / base:.2f}x |")
    print()


def dialect_table(api: str, args: argparse.Namespace) -> None:
    """One dialect's rows: fanout, the SDK's bare decoding + JSON, its accumulation."""
    body, expected_text, events = build_dialect_body(api, int(args.mb * 1_000_000))
    reads = reads_of(body)
    mb = len(body) / 1_000_000
    sdk = "openai" if api == "responses" else "anthropic"
    print()
    print(f"## {api}: {mb:.1f} MB, {events:,} events ({len(body) // events} bytes each), "
          f"{sdk} {_version(sdk)}")
    fanout_row = f"fanout parse_stream(api={api!r})"
    bare_row = f"{sdk} SSEDecoder + json.loads"
    accumulate_row = (f"{sdk} responses.stream() final response" if api == "responses"
                      else f"{sdk} messages.stream() final message")
    rows: list[tuple[str, Callable[[], object], bool]] = [
        (fanout_row, lambda: run_fanout_dialect(api, reads), True),
        (f"fanout parse_stream(api={api!r}), FANOUT_JSON=stdlib",
         lambda: _stdlib(lambda: run_fanout_dialect(api, reads)), True),
        (bare_row, lambda: run_sdk_bare_dialect(api, reads), True),
    ]
    times = _time_rows(rows, args.repeat, expected_text)
    if not args.skip_accumulate:
        for round_number in range(3):
            start = time.perf_counter()
            value = run_sdk_accumulate_dialect(api, reads)
            times.setdefault(accumulate_row, []).append(time.perf_counter() - start)
            assert value == expected_text, f"{accumulate_row} produced the wrong text"
            print(f"  {accumulate_row}: run {round_number + 1}/3 done", file=sys.stderr)
    _print_table(times, fanout_row, events, mb)
    medians = {name: statistics.median(t) for name, t in times.items()}
    minimums = {name: min(t) for name, t in times.items()}
    print(f"{api}: fanout vs {sdk}'s bare SSEDecoder + json.loads: "
          f"{medians[bare_row] / medians[fanout_row]:.2f}x faster on medians, "
          f"{minimums[bare_row] / minimums[fanout_row]:.2f}x on minimums (target >= 2x)")
    if accumulate_row in medians:
        print(f"{api}: fanout vs {sdk}'s accumulating path: "
              f"{medians[accumulate_row] / medians[fanout_row]:.0f}x faster on medians, "
              f"{minimums[accumulate_row] / minimums[fanout_row]:.0f}x on minimums")


def _stdlib(fn: Callable[[], str]) -> str:
    saved = _json.loads
    _json.loads = _json.loads_stdlib
    try:
        return fn()
    finally:
        _json.loads = saved


def _version(name: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(name)


def chat_table(args: argparse.Namespace) -> None:
    """The chat-completions rows."""
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
