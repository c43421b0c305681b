"""compare, batch and serve, unchanged, on the default config's models of all three dialects.

As a user runs them: subprocesses, the checkout's ``config/default.toml``
(the embedded upstream: no key, no network).  Each dialect's mock models
complete; each dialect's fault model ends truncated; Anthropic's overloaded
error before content is retried to completion.  Config mistakes about
dialects are one-line errors, exit 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fanout import Endpoint, Outcome, StreamRequest, ToolCallDelta, open_fanout
from fanout.records import event_record
from fanout.upstream import RunningUpstream

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "config" / "default.toml")
FANOUT = [sys.executable, "-m", "fanout.cli.main"]
COMPLETING = ["writer", "writer-responses", "writer-anthropic", "thinker", "thinker-chat",
              "thinker-anthropic", "tools", "tools-chat", "tools-responses",
              "overloaded-anthropic"]
CUT = ["flaky", "flaky-responses", "flaky-anthropic"]


def fanout(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FANOUT, *args], capture_output=True, text=True, timeout=90,
                          cwd=cwd)


def by_stream(lines: str) -> dict[str, dict[str, Any]]:
    records = [json.loads(line) for line in lines.splitlines() if line.strip()]
    return {r["stream"]: r for r in records if r["type"] == "result"}


def test_the_demo_compares_across_dialects() -> None:
    config = fanout("compare", "hi", "--json", "--config", CONFIG)
    assert config.returncode == 0, config.stderr
    results = by_stream(config.stdout)
    assert set(results) == {"writer", "thinker", "tools", "smollm2"}
    assert {r["outcome"] for r in results.values()} == {"completed"}
    thinker = results["thinker"]["choices"][0]
    assert thinker["reasoning"] and thinker["native_finish_reason"] == "max_output_tokens"
    tools = results["tools"]["choices"][0]
    assert tools["finish_reason"] == "tool_calls" and tools["native_finish_reason"] == "tool_use"
    assert [c["name"] for c in tools["tool_calls"]] == ["get_weather", "get_time"]


def test_compare_json_on_every_dialect() -> None:
    models = [arg for name in [*COMPLETING, *CUT] for arg in ("-m", name)]
    run = fanout("compare", "Tell me about rivers.", "--json", "--config", CONFIG, *models)
    assert run.returncode == 1  # the cut ones did not complete
    results = by_stream(run.stdout)
    assert {name: r["outcome"] for name, r in results.items()} == {
        **dict.fromkeys(COMPLETING, "completed"), **dict.fromkeys(CUT, "truncated")}
    for name in CUT:
        assert results[name]["text"]  # the partial answer is kept
    assert "message_stop" in results["flaky-anthropic"]["reason"]
    assert "response.completed" in results["flaky-responses"]["reason"]
    # the same mock model, the same answer, whichever dialect carried it
    writers = {results[n]["text"] for n in ("writer", "writer-responses", "writer-anthropic")}
    assert len(writers) == 1
    overloaded = results["overloaded-anthropic"]
    assert [a["status"] for a in overloaded["attempts"]] == [200, 200]
    assert overloaded["attempts"][0]["error"]["type"] == "overloaded_error"


def test_batch_on_every_dialect_and_its_resume(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "rivers"}\n'
                       '{"id": 2, "prompt": "lakes", "system": "Be brief.", '
                       '"params": {"max_tokens": 20}}\n')
    results = tmp_path / "results.jsonl"
    models = [arg for name in [*COMPLETING, "flaky-anthropic", "flaky-responses"]
              for arg in ("-m", name)]
    first = fanout("batch", str(prompts), "-o", str(results), "--config", CONFIG, *models)
    assert first.returncode == 1, first.stderr  # the flaky ones
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    latest = {(r["id"], r["model"]): r for r in lines}
    assert len(latest) == 2 * (len(COMPLETING) + 2)
    for (_, model), record in latest.items():
        expected = "truncated" if model.startswith("flaky") else "completed"
        assert record["outcome"] == expected, (model, record["reason"])
    short = latest[(2, "writer-anthropic")]
    assert short["finish_reason"] == "length" and short["choices"][0][
        "native_finish_reason"] == "max_tokens"
    # content keys differ by dialect: the same prompt to another API is another request
    keys = {latest[(1, name)]["content_key"] for name in ("writer", "writer-responses",
                                                          "writer-anthropic")}
    assert len(keys) == 3
    assert {latest[(1, name)]["api"] for name in ("writer", "writer-responses",
                                                   "writer-anthropic")} == {
        "chat", "responses", "anthropic"}  # each record says which API answered it
    again = fanout("batch", str(prompts), "-o", str(results), "--config", CONFIG, *models)
    redone = [json.loads(line) for line in results.read_text().splitlines()][len(lines):]
    assert again.returncode == 1
    assert {r["model"] for r in redone} == {"flaky-anthropic", "flaky-responses"}


def test_batch_refuses_a_prompt_the_dialect_cannot_carry(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": 1, "prompt": "a"}\n{"id": 2, "prompt": "b", '
                       '"params": {"n": 2}}\n')
    results = tmp_path / "results.jsonl"
    run = fanout("batch", str(prompts), "-o", str(results), "--config", CONFIG,
                 "-m", "writer", "-m", "writer-anthropic")
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        f"fanout batch: {prompts}:2: cannot be sent: model 'writer-anthropic': the anthropic "
        "API has no parameter 'n' (one answer per request: run more samples instead)",
        f"fanout batch: {prompts}: 1 bad line; nothing was sent"]
    assert not results.exists() or results.read_text() == ""


@pytest.fixture
def serving() -> Iterator[str]:
    process = subprocess.Popen([*FANOUT, "serve", "--config", CONFIG, "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=ROOT)
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        process.terminate()
        _, err = process.communicate(timeout=15)
        assert "Traceback" not in err


def test_serve_fanout_on_every_dialect(serving: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "models": [*COMPLETING, *CUT]}
    with httpx.Client(base_url=serving, timeout=60) as client:
        answer = client.post("/v1/fanout", json=body)
        streamed = []
        with client.stream("POST", "/v1/fanout", json={**body, "stream": True,
                                                         "models": ["writer-anthropic",
                                                                    "thinker"]}
                           ) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    streamed.append(json.loads(line[6:]))
        relayed = client.post("/v1/chat/completions", json={
            "model": "writer-anthropic", "messages": [{"role": "user", "content": "hi"}]})
        refused = client.post("/v1/chat/completions", json={
            "model": "writer-anthropic", "n": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert answer.status_code == 200
    outcomes = {r["stream"]: r["outcome"] for r in answer.json()["results"]}
    assert outcomes == {**dict.fromkeys(COMPLETING, "completed"),
                        **dict.fromkeys(CUT, "truncated")}
    results = {r["stream"]: r for r in streamed if r["type"] == "result"}
    assert {k: r["outcome"] for k, r in results.items()} == {
        "writer-anthropic": "completed", "thinker": "completed"}
    assert any(r["type"] == "reasoning" for r in streamed)
    # the chat pass-through answers in chat whatever dialect the model speaks upstream
    assert relayed.status_code == 200
    message = relayed.json()["choices"][0]
    assert message["message"]["content"] and message["finish_reason"] == "stop"
    assert refused.status_code == 400
    assert "the anthropic API has no parameter 'n'" in refused.json()["error"]["message"]


# ---------------------------------------------------------------- config errors

@pytest.mark.parametrize(("toml", "line"), [
    ('[endpoint]\nbase_url = "embedded"\napi = "antropic"\n',
     "[endpoint] api: must be one of 'chat', 'responses', 'anthropic', not 'antropic' "
     "(did you mean 'anthropic'?)"),
    ('[[models]]\nname = "a"\nid = "mock/fast"\napi = 3\n',
     "[[models]] #1 (a) api: must be one of 'chat', 'responses', 'anthropic', not 3"),
    ('[[models]]\nname = "b"\nid = "mock/fast"\napi = "anthropic"\nparams = { n = 2 }\n',
     "[[models]] #1 (b) params: 'n' is not a parameter of api \"anthropic\" (one answer per "
     "request: run more samples instead)"),
    ('[endpoint]\napi = "responses"\n[[models]]\nname = "c"\nid = "m"\n'
     'params = { seed = 1 }\n',
     "[[models]] #1 (c) params: 'seed' is not a parameter of api \"responses\" (the Responses "
     "API has no seed, from [endpoint] api)"),
    ('[[models]]\nname = "d"\nid = "m"\napi = "anthropic"\n'
     'params = { presence_penalty = 0.1 }\n',
     "[[models]] #1 (d) params: 'presence_penalty' is not a parameter of api \"anthropic\" "
     "(the Messages API has no presence penalty)"),
    ('[endpoint]\nheaders = { "x-api-key" = "sk-in-a-file" }\n',
     "[endpoint] headers: must not carry x-api-key: the key never goes in a config file; "
     "name its variable in api_key_env"),
])
def test_dialect_config_errors_are_one_line(tmp_path: Path, toml: str, line: str) -> None:
    path = tmp_path / "fanout.toml"
    path.write_text(toml)
    run = fanout("compare", "hi", "--config", str(path))
    assert run.returncode == 2
    assert run.stderr == f"fanout compare: {path}: {line}\n"
    assert "sk-in-a-file" not in run.stderr


def test_a_model_api_wins_over_the_endpoint_api(tmp_path: Path) -> None:
    from fanout.config import parse_config

    config = parse_config('[endpoint]\nbase_url = "https://relay.example/v1"\n'
                          'api = "anthropic"\n'
                          '[[models]]\nname = "a"\nid = "claude"\n'
                          '[[models]]\nname = "b"\nid = "gpt"\napi = "responses"\n')
    assert [m.api for m in config.models] == ["anthropic", "responses"]
    endpoint = config.endpoint({"OPENAI_API_KEY": "sk-test"})
    assert endpoint is not None and endpoint.api == "anthropic"
    assert config.model("b").api == "responses"


# ---------------------------------------------------------------- one call, many blocks

@pytest.mark.parametrize("api", ["anthropic", "responses"])
async def test_a_tool_call_split_over_blocks_is_one_call_through_the_engine(
        upstream: RunningUpstream, api: str) -> None:
    """LiteLLM's bridge splits each call into blocks (items) repeating its id, one per
    fragment (``fault/split-tool-call``): through ``open_fanout``, one call each, its
    arguments the fragments in order, parsed; the events name two tool indexes."""
    from tests.net.test_dialects_real import TOOLS, USER, raw

    _, sent = await raw(upstream, "fault/split-tool-call", api, tools=True)
    parts = [b for _, b in sent if isinstance(b, dict) and (
        b.get("type") == "content_block_start" or b.get("type") == "response.output_item.added")]
    ids = [p["content_block"]["id"] if api == "anthropic" else p["item"]["call_id"]
           for p in parts]
    assert len(set(ids)) == 2 and len(ids) > 6  # two calls, each in several parts
    fragments: dict[str, str] = dict.fromkeys(ids, "")
    current = ""
    for _, b in sent:
        if not isinstance(b, dict):
            continue
        if b in parts:
            current = ids[parts.index(b)]
        elif b.get("type") == "content_block_delta":
            fragments[current] += b["delta"]["partial_json"]
        elif b.get("type") == "response.function_call_arguments.delta":
            fragments[current] += b["delta"]
    request = StreamRequest("s", "fault/split-tool-call", USER, api=api, tools=TOOLS)
    deltas: list[dict[str, Any]] = []
    with trio.fail_after(15):
        async with open_fanout(Endpoint(upstream.base_url), [request]) as fan:
            async for event in fan.events:
                if isinstance(event, ToolCallDelta):
                    deltas.append(event_record(event))
    result = fan.results["s"]
    assert result.outcome is Outcome.COMPLETED
    assert (result.skipped_frames, result.ignored_events) == (0, 0)
    calls = result.choices[0].tool_calls
    assert [(c.index, c.id, c.arguments) for c in calls] == [
        (n, call_id, fragments[call_id]) for n, call_id in enumerate(fragments)]
    assert all(c.parse_error is None and c.parsed == json.loads(c.arguments) for c in calls)
    assert {d["tool_index"] for d in deltas} == {0, 1}
    assert [d["id"] for d in deltas if d["id"]] == list(fragments)  # each announced once
    assert result.choices[0].finish_reason == "tool_calls"
