"""Parsing throughput: fanout's sans-I/O core against the openai SDK, same bytes, same run.

    .venv/bin/python bench/parse.py [--events 3000] [--measure auto|instructions|time]
    .venv/bin/python bench/parse.py --classic [--mb 20] [--repeat 3]

By default, the shape matrix: per body shape (chat: ordinary, tool-heavy, n=2,
multi-line data, CRLF, comments, big events; Responses and Anthropic:
ordinary, tool-heavy) and per read mode (16 KiB reads, one event per read),
the cost per event of

  fanout compiled   parse_stream(reads, api=...) on the core compiled with mypyc
                    (make core, or python build_core.py; the row is left out
                    when the checkout's core is not compiled)
  fanout pure       the same on the pure-Python core (a copy of the package
                    without the compiled modules, under --workdir)
  openai 2.54       its SSEDecoder().iter_bytes + json.loads per event, in a venv
                    under /tmp made with pip on first use (--openai2)
  openai 3.x        the same with the installed SDK (anthropic's for Anthropic)
  orjson floor      orjson.loads per event payload (bytes), nothing else

in instructions counted by valgrind's callgrind when it is installed
(deterministic: other jobs on the machine do not skew it; only the measured
loop is counted, each row in its own process, after a warm-up run), else in
time.  Each SDK row is printed with its cost / fanout's (the goal: >= 2x), the
floor with fanout's / its (the goal: <= 2x).

--classic: the timed tables of one ~20 MB body per dialect:

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
import os
import random
import statistics
import string
import subprocess
import time
from collections.abc import Callable
from typing import Any

if "--worker" not in sys.argv:  # a worker may run in another venv (openai 2.x, no fanout)
    import httpx
    import orjson

    import fanout
    import fanout.core
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


def build_dialect_body(api: str, target_bytes: int, seed: int = 20261201, *,
                       events: int = 0, tool_share: float = 0.1) -> tuple[bytes, str, int]:
    """A Responses or Anthropic body of ~target_bytes: (body, expected text, events).

    The same mix as the chat body: ~90 % text deltas of 1-8 characters, ~10 %
    tool-call argument fragments (``tool_share``), one tool call per block or output
    item; with ``events``, about that many events whatever their size.
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
    while len(frames) < events if events else size < target_bytes:
        if rng.random() < 1 - tool_share:
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


# -- the shape matrix: every body shape, 16 KiB reads and one event per read ----------------

CHAT_SHAPES = ("ordinary", "tool-heavy", "n=2", "multi-line", "crlf", "comments", "big")
DIALECT_SHAPES = ("ordinary", "tool-heavy")
_HEAD = {"id": "chatcmpl-BENCH0123456789abcdef", "object": "chat.completion.chunk",
         "created": 1795978800, "model": "gpt-4o-mini-2024-07-18"}


def _piece(rng: random.Random) -> str:
    piece = rng.choice(WORDS)
    return (" " + piece)[: rng.randint(1, 8)] if rng.random() < 0.8 else piece[:8]


def chat_shape(shape: str, events: int, seed: int = 20261129) -> tuple[list[bytes], str]:
    """One chat body of ``shape`` as its event frames (one read each in that mode), and
    the first choice's expected text.  ``events`` is about the number of chunks."""
    rng = random.Random(seed)
    chunks: list[dict[str, Any]] = []
    text: list[str] = []
    tool_share = {"tool-heavy": 0.9}.get(shape, 0.1)
    choices = 2 if shape == "n=2" else 1
    if shape == "big":
        events = max(events // 100, 20)  # ~20 KB each: a backfill, a long reasoning dump
    for index in range(choices):
        chunks.append({**_HEAD, "choices": [{"index": index, "delta": {
            "role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]})
    tool_index = [-1] * choices
    tool_args = [""] * choices
    for number in range(events):
        index = number % choices
        if shape == "big":
            piece = "".join(_piece(rng) for _ in range(4000))
        elif rng.random() >= tool_share:
            piece = _piece(rng)
        else:
            piece = ""
        if piece:
            if index == 0:
                text.append(piece)
            delta: dict[str, Any] = {"content": piece}
        elif not tool_args[index]:  # open the next tool call
            tool_index[index] += 1
            tool_args[index] = json.dumps({
                "city": rng.choice(WORDS), "days": rng.randint(1, 9),
                "note": "".join(rng.choices(string.ascii_letters, k=60))})
            delta = {"tool_calls": [{
                "index": tool_index[index], "id": f"call_{index}_{tool_index[index]:06d}",
                "type": "function", "function": {"name": "get_weather", "arguments": ""}}]}
        else:
            cut = rng.randint(1, 8)
            fragment, tool_args[index] = tool_args[index][:cut], tool_args[index][cut:]
            delta = {"tool_calls": [{"index": tool_index[index],
                                     "function": {"arguments": fragment}}]}
        chunks.append({**_HEAD, "choices": [{"index": index, "delta": delta, "logprobs": None,
                                             "finish_reason": None}]})
    for index in range(choices):
        chunks.append({**_HEAD, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                             "finish_reason": "stop"}]})
    chunks.append({**_HEAD, "choices": [], "usage": {
        "prompt_tokens": 12, "completion_tokens": len(chunks),
        "total_tokens": len(chunks) + 12}})
    end = b"\r\n" if shape == "crlf" else b"\n"
    frames = []
    for number, chunk in enumerate(chunks):
        payload = json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode()
        if shape == "multi-line":  # the JSON cut over three `data:` lines, joined with \n
            first, second = payload.index(b',"created"'), payload.index(b',"choices"')
            lines = [payload[: first + 1], payload[first + 1 : second + 1],
                     payload[second + 1 :]]
        else:
            lines = [payload]
        frame = b"".join(b"data: " + line + end for line in lines) + end
        if shape == "comments" and number % 3 == 0:  # OpenRouter's keep-alives
            frame = b": OPENROUTER PROCESSING" + end + end + frame
        frames.append(frame)
    frames.append(b"data: [DONE]" + end + end)
    return frames, "".join(text)


def dialect_shape(api: str, shape: str, events: int, seed: int = 20261201
                  ) -> tuple[list[bytes], str]:
    """A Responses or Anthropic body as its event frames, and its expected text."""
    body, text, _ = build_dialect_body(api, 0, seed, events=events,
                                       tool_share=0.9 if shape == "tool-heavy" else 0.1)
    frames = [frame + b"\n\n" for frame in body.split(b"\n\n") if frame]
    return frames, text


def matrix_cells(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (api, shape, read mode) cell: its reads on disk, its event count."""
    cells: list[dict[str, Any]] = []
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    plan: list[tuple[str, str]] = [("chat", shape) for shape in CHAT_SHAPES
                                   if shape in args.shapes]
    plan += [(api, shape) for api in args.dialects.split(",") if api
             for shape in DIALECT_SHAPES if shape in args.shapes]
    for api, shape in plan:
        if api == "chat":
            frames, text = chat_shape(shape, args.events)
        else:
            frames, text = dialect_shape(api, shape, args.events)
        body = b"".join(frames)
        path = work / f"{api}-{shape}.body"
        path.write_bytes(body)
        payloads = len([f for f in frames if b"data:" in f])
        for mode in ("16k", "event"):
            cuts = ([min(i + READ_SIZE, len(body)) for i in range(0, len(body), READ_SIZE)]
                    if mode == "16k" else _ends(frames))
            cells.append({"api": api, "shape": shape, "mode": mode, "body": str(path),
                          "cuts": cuts, "text": text, "events": payloads,
                          "bytes": len(body)})
    return cells


def _ends(frames: list[bytes]) -> list[int]:
    ends, at = [], 0
    for frame in frames:
        at += len(frame)
        ends.append(at)
    return ends


def _reads(cell: dict[str, Any]) -> list[bytes]:
    body = Path(cell["body"]).read_bytes()
    reads, start = [], 0
    for end in cell["cuts"]:
        reads.append(body[start:end])
        start = end
    return reads


def _payloads(reads: list[bytes]) -> list[bytes]:
    """The events' data, bytes, as a byte-level decoder would hand them over."""
    body = b"".join(reads).replace(b"\r\n", b"\n")
    out = []
    for block in body.split(b"\n\n"):
        data = [line[6:] for line in block.split(b"\n") if line.startswith(b"data: ")]
        if data and data != [b"[DONE]"]:
            out.append(b"\n".join(data))
    return out


def _workload(impl: str, cell: dict[str, Any]) -> Callable[[], object]:
    """The loop one row runs over one cell's reads."""
    reads = _reads(cell)
    api = cell["api"]
    if impl == "fanout":
        import fanout as fanout_module
        import fanout.core

        expected = os.environ["FANOUT_BENCH_CORE"]  # the row measures the core it names
        assert fanout.core.COMPILED is (expected == "compiled"), (expected, fanout.__file__)

        def run_fanout_cell() -> object:
            result = fanout_module.parse_stream(reads, api=api)
            assert result.outcome is fanout_module.Outcome.COMPLETED, result.reason
            assert result.text == cell["text"], "fanout produced the wrong text"
            return result

        return run_fanout_cell
    if impl == "floor":
        import orjson as orjson_module

        payloads = _payloads(reads)
        loads = orjson_module.loads

        def run_floor() -> object:
            for payload in payloads:
                loads(payload)
            return None

        return run_floor
    if impl == "openai":
        from openai._streaming import SSEDecoder
    else:
        from anthropic._streaming import SSEDecoder  # type: ignore[no-redef]
    loads = json.loads

    def run_sdk() -> object:
        for sse in SSEDecoder().iter_bytes(iter(reads)):
            if sse.data.startswith("[DONE]"):
                if api == "chat":
                    break
                continue
            loads(sse.data)
        return None

    return run_sdk


def worker(impl: str, cells_file: str, measure: str, repeat: int) -> None:
    """Run ``impl`` over every cell: under callgrind, one counted call per cell
    (inside functools.reduce, which --toggle-collect counts and --dump-after
    dumps); else timed, printing each cell's per-round seconds as JSON lines."""
    import functools

    cells = json.loads(Path(cells_file).read_text())
    for cell in cells:
        run = _workload(impl, cell)
        run()  # warm: imports, caches, the interpreter's specialisation
        if measure == "instructions":
            functools.reduce(lambda acc, _: run(), [0], None)
        else:
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                run()
                times.append(time.perf_counter() - start)
            print(json.dumps(times), flush=True)


def _sdk_rows(api: str, openai2: str | None) -> list[tuple[str, str, str]]:
    """(row name, python, impl) of the SDK rows for ``api``."""
    import importlib.metadata

    here = sys.executable
    if api == "anthropic":
        return [(f"anthropic {importlib.metadata.version('anthropic')} SSEDecoder + json.loads",
                 here, "anthropic")]
    rows = []
    if openai2:
        version = subprocess.run([openai2, "-c", "import openai; print(openai.__version__)"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        rows.append((f"openai {version} SSEDecoder + json.loads", openai2, "openai"))
    rows.append((f"openai {importlib.metadata.version('openai')} SSEDecoder + json.loads",
                 here, "openai"))
    return rows


def _ensure_openai2(path: str) -> str | None:
    """The python of a venv under /tmp with openai 2.54 (created on first use)."""
    if not path:
        return None
    python = Path(path) / "bin" / "python"
    if not python.exists():
        print(f"creating {path} with openai==2.54.* (the last 2.x SSEDecoder) ...",
              file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", path], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "openai==2.54.*",
                        "orjson"], check=True)
    return str(python)


def _pure_copy(work: Path) -> str:
    """A copy of the package without its compiled modules: put first on PYTHONPATH, it
    runs the pure-Python core."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    pure = work / "pure"
    shutil.rmtree(pure, ignore_errors=True)
    shutil.copytree(root / "fanout", pure / "fanout",
                    ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__"))
    return str(pure)


def _run_worker(python: str, impl: str, cells: list[dict[str, Any]], args: argparse.Namespace,
                core: str = "") -> list[float]:
    """Per cell: instructions per event (callgrind) or median seconds per event.  ``core``
    (fanout's rows): "compiled" runs the checkout, "pure" a copy without the compiled
    modules."""
    work = Path(args.workdir)
    tag = f"{impl}{core}-{abs(hash(python))}"
    cells_file = work / f"cells-{tag}.json"
    cells_file.write_text(json.dumps(cells))
    command = [python, str(Path(__file__).resolve()), "--worker", impl, str(cells_file),
               args.measure, str(args.repeat)]
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": _pure_copy(work) if core == "pure" else root,
           "FANOUT_BENCH_CORE": core}
    if args.measure == "instructions":
        out = work / f"cg-{tag}"
        for old in work.glob(out.name + "*"):
            old.unlink()
        subprocess.run(["valgrind", "--tool=callgrind", "--collect-atstart=no",
                        "--toggle-collect=functools_reduce", "--dump-after=functools_reduce",
                        f"--callgrind-out-file={out}", *command],
                       check=True, env=env, capture_output=True)
        totals = []
        for number in range(1, len(cells) + 1):
            text = Path(f"{out}.{number}").read_text()
            totals.append(int(text.split("\ntotals: ")[1].split()[0]))
        return [total / cell["events"] for total, cell in zip(totals, cells, strict=True)]
    done = subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    return [statistics.median(json.loads(line)) / cell["events"]
            for line, cell in zip(done.stdout.splitlines(), cells, strict=True)]


def matrix(args: argparse.Namespace) -> None:
    """The per-shape table: fanout, the SDKs' bare decoders + json.loads, the floor."""
    import shutil

    if args.measure == "auto":
        args.measure = "instructions" if shutil.which("valgrind") else "time"
    cells = matrix_cells(args)
    openai2 = _ensure_openai2(args.openai2)
    unit = "instructions/event" if args.measure == "instructions" else "µs/event"
    scale = 1.0 if args.measure == "instructions" else 1e6
    print(f"python {sys.version.split()[0]}; {unit} "
          + ("(callgrind Ir, the measured loop only)" if scale == 1.0 else
             f"(median of {args.repeat})")
          + "; ratios: the row's cost / fanout's (>1: fanout is faster)")
    cores = ["compiled", "pure"] if fanout.core.COMPILED else ["pure"]
    if not fanout.core.COMPILED:
        print("(the core is not compiled here: make core, or python build_core.py)")
    for api in dict.fromkeys(cell["api"] for cell in cells):
        api_cells = [cell for cell in cells if cell["api"] == api]
        rows: list[tuple[str, list[float]]] = []
        for core in cores:
            rows.append((f"fanout {core}",
                         _run_worker(sys.executable, "fanout", api_cells, args, core)))
            print(f"  {api}: fanout {core} done", file=sys.stderr)
        for name, python, impl in _sdk_rows(api, openai2):
            rows.append((name, _run_worker(python, impl, api_cells, args)))
            print(f"  {api}: {name} done", file=sys.stderr)
        rows.append(("floor: orjson.loads per payload",
                     _run_worker(sys.executable, "floor", api_cells, args)))
        _print_matrix(api, unit, scale, api_cells, rows, len(cores))


def _print_matrix(api: str, unit: str, scale: float, cells: list[dict[str, Any]],
                  rows: list[tuple[str, list[float]]], fanouts: int) -> None:
    """One line per (shape, read mode): each row's cost, the SDKs' as a multiple of
    each fanout row's (the goal: >= 2x), fanout's as a multiple of the floor's (<= 2x).
    The first ``fanouts`` rows are fanout's (compiled, pure)."""
    fanout_rows, sdk_rows, floor_row = rows[:fanouts], rows[fanouts:-1], rows[-1]
    short = [name.removeprefix("fanout ") for name, _ in fanout_rows]
    print()
    print(f"## {api}: {unit}")
    print()
    head = ["shape", "reads", "events (bytes each)", *(name for name, _ in fanout_rows)]
    for name, _ in sdk_rows:
        head += [name, *(f"÷ {core}" for core in short)]
    head += ["orjson floor", *(f"{core} ÷ floor" for core in short)]
    print("| " + " | ".join(head) + " |")
    print("|---|---|" + "---:|" * (len(head) - 2))

    def number(value: float) -> str:
        return f"{value * scale:,.0f}" if scale == 1.0 else f"{value * scale:.2f}"

    for at, cell in enumerate(cells):
        mine = [values[at] for _, values in fanout_rows]
        line = [cell["shape"], "16 KiB" if cell["mode"] == "16k" else "1 event",
                f"{cell['events']:,} ({cell['bytes'] // cell['events']:,})",
                *(number(value) for value in mine)]
        for _, values in sdk_rows:
            line += [number(values[at]), *(f"{values[at] / value:.2f}x" for value in mine)]
        line += [number(floor_row[1][at]),
                 *(f"{value / floor_row[1][at]:.2f}x" for value in mine)]
        print("| " + " | ".join(line) + " |")
    print()


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classic", action="store_true",
                        help="the timed tables of one 20 MB body per dialect (with --mb, "
                        "--skip-accumulate, --skip-chat) instead of the shape matrix")
    parser.add_argument("--measure", choices=("auto", "instructions", "time"), default="auto",
                        help="matrix: callgrind instructions (auto: when valgrind is "
                        "installed) or time")
    parser.add_argument("--events", type=int, default=3000,
                        help="matrix: events per body (default 3000; 'big' has 1/100)")
    parser.add_argument("--shapes", default=",".join(CHAT_SHAPES),
                        help="matrix: the body shapes (comma-separated; the dialects have "
                        "ordinary and tool-heavy)")
    parser.add_argument("--openai2", default="/tmp/fanout-bench-openai-2.54",
                        help="matrix: a venv with openai 2.54 (made with pip on first use; "
                        "'' to leave that row out)")
    parser.add_argument("--workdir", default="/tmp/fanout-bench-parse",
                        help="matrix: where the bodies and callgrind dumps go")
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
    args.shapes = [shape for shape in args.shapes.split(",") if shape]
    for shape in args.shapes:
        if shape not in CHAT_SHAPES:
            parser.error(f"--shapes: unknown shape {shape!r} ({', '.join(CHAT_SHAPES)})")
    if not args.classic:
        for api in [d for d in args.dialects.split(",") if d]:
            if api not in ("responses", "anthropic"):
                parser.error(f"--dialects: unknown dialect {api!r} (responses, anthropic)")
        if args.skip_chat:
            args.shapes = [s for s in args.shapes if s in DIALECT_SHAPES]
        matrix(args)
        return

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
