"""The dialects page (docs/dialects.md) tells the truth: their Python snippets, config errors, curl
example and `fanout compare --json` records, run as written against the embedded upstream (no
key, no network), print what the page shows; what they say of bodies, headers, refused
parameters, retries, routes and the benchmark's bodies is what the code does."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fanout import ConfigError, Endpoint, RetryPolicy, StreamRequest
from fanout.bodies import DEFAULT_MAX_TOKENS, REFUSED, build_body
from fanout.config import parse_config

from .docs import ROOT, page

DIALECTS = page("dialects.md")
UPSTREAM = page("mock.md")
BENCHMARKS = page("benchmarks.md")


def _flat(text: str) -> str:
    """``text`` with its line breaks and runs of spaces as single spaces (prose wraps)."""
    return " ".join(text.split())


def _block(text: str, after: str, language: str = "") -> str:
    """The first fenced block of ``language`` after ``after``."""
    match = re.compile(rf"```{language}\n(.*?)```", re.S).search(text, text.index(after))
    assert match is not None, after
    return match.group(1)


def _after(text: str, code: str) -> str:
    """The fenced block right after the block holding ``code``: what it prints."""
    return _block(text[text.index(code) + len(code) + len("```"):], "```")


def _fanout(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fanout.cli.main", *argv], cwd=cwd,
                          env={**os.environ, "COLUMNS": "80"}, capture_output=True, text=True,
                          timeout=120)


def _python(code: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_library_example_prints_one_result_per_dialect(tmp_path: Path) -> None:
    after = "In the library, `Endpoint(..., api=...)`"
    code = _block(DIALECTS, after, "python")
    shown = _after(DIALECTS, code)
    assert _python(code, tmp_path) == shown


def test_the_parse_stream_example_prints_what_the_readme_shows(tmp_path: Path) -> None:
    code = _block(DIALECTS, "## What is read", "python")
    shown = _after(DIALECTS, code)
    assert _python(code, tmp_path) == shown


def test_the_refused_parameter_config_errors_are_the_real_ones() -> None:
    embedded = '[endpoint]\nbase_url = "embedded"\n'
    configs = [
        embedded + '[[models]]\nname = "b"\nid = "mock/fast"\napi = "anthropic"\n'
                   'params = { n = 2 }\n',
        embedded + 'api = "responses"\n[[models]]\nname = "c"\nid = "mock/fast"\n'
                   'params = { seed = 1 }\n',
        embedded + 'api = "antropic"\n[[models]]\nname = "c"\nid = "mock/fast"\n',
    ]
    for text in configs:
        with pytest.raises(ConfigError) as caught:
            parse_config(text, "fanout.toml")
        assert f"fanout compare: {caught.value}\n" in DIALECTS


def test_the_refused_parameters_listed_are_fanout_bodies_refused() -> None:
    paragraph = DIALECTS[DIALECTS.index("**Refused parameters.**"):]
    responses = paragraph[paragraph.index("for `responses`,"):paragraph.index("(and `input`")]
    anthropic = paragraph[paragraph.index("for `anthropic`,"):
                          paragraph.index("(`fanout.bodies.REFUSED`")]
    for api, listed in (("responses", responses), ("anthropic", anthropic)):
        names = set(re.findall(r"`(\w+)`", listed)) - {api}
        assert names == set(REFUSED[api]), api
    # `input` is what fanout writes for a Responses request: refused too.
    with pytest.raises(ValueError, match="'input'"):
        build_body("responses", "m", [], {"input": []}, None)


def test_the_refused_parameter_library_error_is_the_real_one() -> None:
    with pytest.raises(ValueError) as caught:
        StreamRequest("s", "m", [{"role": "user", "content": "hi"}], {"n": 2}, api="anthropic")
    assert f"(`{caught.value}`)" in _flat(DIALECTS)


def test_a_batch_prompt_with_a_refused_parameter_is_a_bad_line(tmp_path: Path) -> None:
    (tmp_path / "fanout.toml").write_text((ROOT / "config/default.toml").read_text())
    (tmp_path / "prompts.jsonl").write_text('{"id": "a", "prompt": "hi"}\n'
                                            '{"id": "b", "prompt": "hi", "params": {"n": 2}}\n')
    done = _fanout("batch", "prompts.jsonl", "-m", "writer-anthropic", "-o", "r.jsonl",
                   cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    shown = re.search(r"\(`(prompts\.jsonl:2: cannot be sent: [^`]*)\(\.\.\.\)`",
                      _flat(DIALECTS))
    assert shown is not None
    assert f"fanout batch: {shown.group(1)}(" in done.stderr
    assert not (tmp_path / "r.jsonl").exists()  # nothing was sent


def test_what_is_sent_is_what_build_body_builds() -> None:
    table = DIALECTS[DIALECTS.index("## What is sent"):DIALECTS.index("Any other parameter")]
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "system", "content": "Be kind."},
                {"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "get_weather",
                                             "parameters": {"type": "object"}}}
    named = {"type": "function", "function": {"name": "get_weather"}}
    anthropic = build_body("anthropic", "m", messages, {"stop": "END", "user": "u1",
                                                        "parallel_tool_calls": False,
                                                        "tool_choice": "required"}, [tool])
    assert f"**required by the API, so {DEFAULT_MAX_TOKENS} " in _flat(table)
    assert anthropic["max_tokens"] == DEFAULT_MAX_TOKENS == 4096
    assert anthropic["system"] == "Be brief.\n\nBe kind."
    assert anthropic["stop_sequences"] == ["END"]
    assert anthropic["metadata"] == {"user_id": "u1"}
    assert anthropic["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert anthropic["tools"] == [{"name": "get_weather", "input_schema": {"type": "object"}}]
    assert "stream_options" not in anthropic and anthropic["stream"] is True
    for choice, shaped in (("auto", {"type": "auto"}), ("none", {"type": "none"}),
                           (named, {"type": "tool", "name": "get_weather"})):
        assert build_body("anthropic", "m", messages, {"tool_choice": choice},
                          None)["tool_choice"] == shaped
    responses = build_body("responses", "m", messages, {
        "max_tokens": 10, "reasoning_effort": "low", "tool_choice": named,
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": "n", "schema": {}, "strict": True}}}, [tool])
    assert responses["instructions"] == "Be brief.\n\nBe kind."
    assert responses["input"] == [{"type": "message", "role": "user", "content": "hi"}]
    assert responses["max_output_tokens"] == 10 and "max_tokens" not in responses
    assert responses["reasoning"] == {"effort": "low"}
    assert responses["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert responses["text"] == {"format": {"type": "json_schema", "name": "n", "schema": {},
                                            "strict": True}}
    assert responses["tools"] == [{"type": "function", "name": "get_weather",
                                   "parameters": {"type": "object"}, "strict": False}]
    assert "stream_options" not in responses and responses["stream"] is True
    chat = build_body("chat", "m", messages, {"max_tokens": 10}, None)
    assert chat["stream_options"] == {"include_usage": True} and chat["max_tokens"] == 10
    # The key's header: Bearer for chat and responses, x-api-key (never Authorization) and
    # anthropic-version for anthropic.
    endpoint = Endpoint("http://relay.test/v1", api_key="sk-test")
    assert endpoint.auth_headers("chat") == endpoint.auth_headers("responses") == {
        "authorization": "Bearer sk-test"}
    assert endpoint.auth_headers("anthropic") == {"anthropic-version": "2023-06-01",
                                                  "x-api-key": "sk-test"}
    assert ("`x-api-key: <key>` (never `Authorization`), and `anthropic-version: 2023-06-01`"
            in table)
    for api, path in (("chat", "/chat/completions"), ("responses", "/responses"),
                      ("anthropic", "/messages")):
        assert endpoint.url(api) == "http://relay.test/v1" + path
        assert f"`{{base_url}}{path}`" in table


def test_the_retry_statuses_are_the_default_ones() -> None:
    shown = re.search(r"default `statuses` \(([\d, ]+)\)", _flat(DIALECTS))
    assert shown is not None
    assert {int(s) for s in shown.group(1).split(", ")} == set(RetryPolicy().statuses)


def _abridged(line: str) -> dict[str, Any]:
    """A record line of the page, its ``...`` left out: ``{"a": 1, ...}`` is ``{"a": 1}``."""
    return dict(json.loads(line.replace(", ...}", "}")))


def _agrees(shown: Any, real: Any, key: str = "") -> bool:
    """``real`` says what the abridged ``shown`` says (a string cut at ``...`` by its
    prefix; the backoff ``wait`` is random: any number)."""
    if key == "wait":
        return isinstance(real, float)
    if isinstance(shown, dict):
        return isinstance(real, dict) and all(
            name in real and _agrees(value, real[name], name) for name, value in shown.items())
    if isinstance(shown, str) and "..." in shown:
        return isinstance(real, str) and real.startswith(shown[:shown.index("...")])
    return bool(shown == real)


def test_the_retry_records_are_the_real_ones(tmp_path: Path) -> None:
    block = DIALECTS[DIALECTS.index("$ fanout compare hi --json"):]
    block = block[:block.index("```")]
    command, *lines = block.splitlines()
    argv = command[2:command.index("#")].split()
    assert argv[:2] == ["fanout", "compare"]
    (tmp_path / "fanout.toml").write_text((ROOT / "config/default.toml").read_text())
    done = _fanout(*argv[1:], cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr  # flaky-anthropic was cut
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 4
    for line in lines:
        shown = _abridged(line)
        assert any(_agrees(shown, record) for record in records), line


@pytest.fixture(scope="module")
def mock_url() -> Iterator[str]:
    process = subprocess.Popen([sys.executable, "-m", "fanout.cli.main", "mock", "--port", "0",
                                "--key", "sk-x"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip().removesuffix("/v1")
    finally:
        process.terminate()
        process.communicate(timeout=15)


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl here")
def test_the_curl_of_v1_messages_prints_what_the_readme_shows(mock_url: str) -> None:
    start = UPSTREAM.index("curl -N http://127.0.0.1:8000/v1/messages")
    curl = UPSTREAM[start:UPSTREAM.index("```", start)].replace("\\\n", "")
    out = subprocess.run(["bash", "-c", curl.replace("http://127.0.0.1:8000", mock_url)],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    shown = _block(UPSTREAM[start:], "```\nevent:")
    assert out == shown + "\n"  # the block cannot end in its blank line
    names = re.findall(r"^event: (\S+)$", out, re.M)
    assert names == ["message_start", "ping", "content_block_start"] + [
        "content_block_delta"] * 4 + ["content_block_stop", "message_delta", "message_stop"]


def test_the_upstream_checks_requests_as_the_readme_says(mock_url: str) -> None:
    bearer = {"authorization": "Bearer sk-x"}
    anthropic = {"x-api-key": "sk-x", "anthropic-version": "2023-06-01"}
    user = [{"role": "user", "content": "hi"}]

    def error(path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
        response = httpx.post(f"{mock_url}/v1{path}", json=body, headers=headers, timeout=30)
        return response.status_code, str(response.json()["error"]["message"])

    said = [
        error("/responses", {"model": "mock/fast", "messages": user}, bearer),
        error("/messages", {"model": "mock/fast", "messages": user}, anthropic),
        error("/messages", {"model": "mock/fast", "max_tokens": 3, "n": 2, "messages": user},
              anthropic),
        error("/messages", {"model": "mock/fast", "max_tokens": 3, "messages": user}, bearer),
    ]
    assert said == [(400, "Unknown parameter: 'messages'."),
                    (400, "max_tokens: Field required"),
                    (400, "n: Extra inputs are not permitted"),
                    (401, "invalid x-api-key")]
    for _, message in said:
        assert message in _flat(UPSTREAM), message
    status, message = error("/messages", {"model": "fault/huge-event", "max_tokens": 3,
                                          "messages": user}, anthropic)
    assert status == 404 and "/v1/chat/completions only" in message


def test_the_chat_only_models_are_the_ones_listed(tmp_path: Path) -> None:
    listing = _fanout("mock", "--list", cwd=tmp_path).stdout
    # an entry's description wraps onto lines indented under it
    entries = re.sub(r"\n {27}", " ", listing).splitlines()
    chat_only = {line.split()[0] for line in entries
                 if line.endswith("[/v1/chat/completions only]")}
    sentence = _flat(UPSTREAM)
    sentence = sentence[sentence.index("naming the route):"):]
    sentence = sentence[:sentence.index(". ")]
    listed = set(re.findall(r"`(fault/[\w-]+)`", sentence))
    assert "the `slot/*` models" in sentence
    assert chat_only == listed | {name for name in chat_only if name.startswith("slot/")}
    assert {name for name in chat_only if name.startswith("slot/")} == {
        "slot/clean", "slot/broken", "slot/relay", "slot/litellm", "slot/litellm-error", "slot/judge"}
    assert len(chat_only) == 16 and "all but the sixteen whose bytes are chat's own" in _flat(
        UPSTREAM)


def test_the_default_config_has_the_dialect_models_the_readme_names() -> None:
    config = parse_config((ROOT / "config/default.toml").read_text(), "default.toml")
    api = {model.name: model.api or "chat" for model in config.models}
    assert config.compare == ("writer", "thinker", "tools", "smollm2")
    assert [api[name] for name in config.compare] == [
        "chat", "responses", "anthropic", "chat"]
    for name in ("thinker-chat", "tools-chat"):
        assert api[name] == "chat"
    for name in ("writer-responses", "tools-responses", "flaky-responses"):
        assert api[name] == "responses"
    for name in ("writer-anthropic", "thinker-anthropic", "flaky-anthropic",
                 "overloaded-anthropic"):
        assert api[name] == "anthropic"
    for name in api:
        if "-" in name and name.rsplit("-", 1)[1] in ("chat", "responses", "anthropic"):
            assert f"`{name}`" in DIALECTS, name


def _bench_parse() -> Any:
    spec = importlib.util.spec_from_file_location("bench_parse", ROOT / "bench/parse.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_bodies_are_the_ones_described() -> None:
    bench = _bench_parse()
    for api, megabytes in (("responses", "21.0"), ("anthropic", "20.0")):
        body, _, events = bench.build_dialect_body(api, 20_000_000)
        heading = (f"| {api} ({len(body) / 1e6:.1f} MB, {events:,} events of "
                   f"{len(body) // events} bytes) |")
        assert heading in BENCHMARKS and f"({megabytes} MB" in heading, heading
    source = (ROOT / "bench/parse.py").read_text()
    assert '"--dialects", default="responses,anthropic"' in source
    assert '"--skip-chat"' in source
    assert "(`--dialects responses,anthropic`, the default; `--skip-chat`" in _flat(BENCHMARKS)


def _example_body() -> bytes:
    """The Anthropic body of the page's parse_stream example, cut before message_stop."""
    code = _block(DIALECTS, "## What is read", "python")
    scope: dict[str, Any] = {}
    exec(code[:code.index("cut = ")], scope)
    body = scope["body"]
    assert isinstance(body, bytes)
    return body


def test_the_end_of_stream_rules_and_the_wrong_api_say_what_the_readme_says() -> None:
    from fanout import parse_stream

    flat = _flat(DIALECTS)
    wrong = parse_stream([_example_body()], api="chat")
    assert wrong.outcome.value == "truncated"
    assert f"the Anthropic body above read with `api=\"chat\"`: `{wrong.reason}`" in flat
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    created = b'data: {"type":"response.created","response":{"id":"r"}}\n\n'
    ping = b'event: ping\ndata: {"type":"ping"}\n\n'
    for api, event in (("chat", chunk), ("responses", created), ("anthropic", ping)):
        reason = parse_stream([event * 12], api=api).reason
        assert f"| `{api}` |" in flat and f"`{reason}`" in flat, reason
    stop = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    start = _example_body().split(b"\n\n")[0] + b"\n\n"
    no_reason = parse_stream([start + stop], api="anthropic")
    assert no_reason.outcome.value == "truncated"
    assert f"(`message_stop` without one: `{no_reason.reason}`)" in flat
    # A [DONE] a relay appends completes nothing and is counted.
    appended = parse_stream([created + b"data: [DONE]\n\n"], api="responses")
    assert appended.outcome.value == "truncated" and appended.ignored_events == 1


def test_an_error_event_after_content_ends_the_stream_error_with_its_text() -> None:
    import trio

    from fanout import run_fanout
    from fanout.upstream import open_upstream

    shown = re.search(r"\(`fault/error-event` through either dialect: `([^`]+)`\)",
                      _flat(DIALECTS))
    assert shown is not None
    question = [{"role": "user", "content": "hi"}]

    async def main() -> None:
        async with open_upstream() as upstream:
            for api in ("responses", "anthropic"):
                results = await run_fanout(Endpoint(upstream.base_url, api=api), [
                    StreamRequest("s", "fault/error-event", question)])
                result = results["s"]
                assert result.outcome.value == "error" and result.reason == shown.group(1)
                assert result.text and len(result.attempts) == 1  # kept, not retried

    trio.run(main)


def test_the_demo_summary_is_the_real_one_but_its_timings(tmp_path: Path) -> None:
    """`make demo`'s closing table: models, outcomes, finish reasons, token counts, characters
    and notes as docs/getting-started.md shows them (TTFT, tok/s, queue and time vary)."""
    top = page("getting-started.md")
    shown = _block(top, "and at the end every column in full, then:")
    done = subprocess.run([sys.executable, "-m", "fanout.cli.main", "compare",
                           "Tell me about rivers, in a few sentences.", "--config",
                           str(ROOT / "config/default.toml")], cwd=tmp_path,
                          env={**os.environ, "COLUMNS": "110"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr

    def rows(text: str) -> list[tuple[str, ...]]:
        found = []
        for line in text.splitlines():
            cells = line.split()
            if cells and cells[0] in ("writer", "thinker", "tools", "smollm2") and len(cells) > 9:
                # model, outcome, finish, in, out, chars; then the note after the time
                found.append((*cells[:3], *cells[5:8], " ".join(cells[10:])))
        return found

    assert rows(done.stdout) == rows(shown) and len(rows(shown)) == 4
    for header in ("thinker  responses: mock/reasoning:0.05", "tools  anthropic: mock/tools:0.08",
                   "writer  mock/slow"):
        assert f"== {header}  done" in done.stdout and header in top
