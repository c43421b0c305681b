"""One configured model, four ways in: ``compare``, ``batch``, and the service's two routes
(``POST /v1/fanout``, ``POST /v1/chat/completions``) send the upstream the same body.

The model is ``mock/echo-request``, whose answer is the JSON body it received: each
surface's answer text is what it sent.  The model has ``tools`` and a ``tool_choice``
(in its ``params``): every surface sends both (the service once sent the choice without
the tools, and the server wrote the call as text).  A request's own ``tools`` win on
the service, as a prompt's do in a batch.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from fanout.cli.batch import BatchOptions, run_batch
from fanout.cli.compare import CompareOptions, run_compare
from fanout.config import load_config
from fanout.serve import open_service, serve_app
from tests.helpers import fanout_mock

KEY = "sk-same-request-41ab"
PROMPT = "Which river is longest?"
TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "look a fact up",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}},
                   "required": ["q"]}}}]
CHOICE = {"type": "function", "function": {"name": "lookup"}}
OWN_TOOLS = [{"type": "function", "function": {"name": "mine", "parameters": {
    "type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def mock() -> Iterator[str]:
    """``fanout mock --key KEY``: its base URL."""
    with fanout_mock("--key", KEY) as base_url:
        yield base_url


@pytest.fixture
def config(mock: str, tmp_path: Path) -> str:
    path = tmp_path / "tooled.toml"
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    path.write_text(
        f'[endpoint]\nbase_url = "{mock}"\napi_key_env = "SAME_KEY"\n'
        "[deadlines]\ntotal = 30\n"
        '[[models]]\nname = "tooled"\nid = "mock/echo-request"\n'
        f"tools = {json.dumps(str(tools))}\n"
        'params = { tool_choice = { type = "function", function = { name = "lookup" } }, '
        "temperature = 0.25 }\n")
    return str(path)


ENVIRON = {"SAME_KEY": KEY}


def via_compare(config: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    status = run_compare(CompareOptions(prompt=PROMPT, models=("tooled",), config=config,
                                        json=True), stdout=out, stderr=err, environ=ENVIRON)
    assert status == 0, err.getvalue()
    (result,) = [r for r in map(json.loads, out.getvalue().splitlines())
                 if r["type"] == "result"]
    sent: dict[str, Any] = json.loads(result["text"])
    return sent


def via_batch(config: str, tmp_path: Path, prompt: dict[str, Any] | None = None
              ) -> dict[str, Any]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps(prompt or {"id": "p", "prompt": PROMPT}) + "\n")
    output = tmp_path / "results.jsonl"
    out, err = io.StringIO(), io.StringIO()
    status = run_batch(BatchOptions(prompts=str(prompts), output=str(output),
                                    models=("tooled",), config=config),
                       stdout=out, stderr=err, environ=ENVIRON)
    assert status == 0, err.getvalue()
    (record,) = [json.loads(line) for line in output.read_text().splitlines()]
    sent: dict[str, Any] = json.loads(record["text"])
    return sent


def via_service(config: str, **extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """What ``POST /v1/fanout`` and ``POST /v1/chat/completions`` sent (``extra``: more
    of the request body, such as its own ``tools``)."""
    loaded = load_config(config, environ=ENVIRON)
    endpoint = loaded.endpoint(ENVIRON)
    assert endpoint is not None
    messages = [{"role": "user", "content": PROMPT}]

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with open_service(loaded, endpoint) as service, trio.open_nursery() as nursery:
            url = await nursery.start(serve_app, service, "127.0.0.1", 0)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                with trio.fail_after(30):
                    fanned = await client.post("/v1/fanout", json={
                        "messages": messages, "models": ["tooled"], **extra})
                    passed = await client.post("/v1/chat/completions", json={
                        "messages": messages, "model": "tooled", **extra})
            nursery.cancel_scope.cancel()
        assert fanned.status_code == 200 and passed.status_code == 200, (fanned.text,
                                                                          passed.text)
        (result,) = fanned.json()["results"]
        return (json.loads(result["text"]),
                json.loads(passed.json()["choices"][0]["message"]["content"]))

    return trio.run(main)


def test_compare_batch_and_both_routes_send_the_same_body_tools_and_tool_choice(
        config: str, tmp_path: Path) -> None:
    compared = via_compare(config)
    batched = via_batch(config, tmp_path)
    fanned, passed = via_service(config)
    assert compared["tools"] == TOOLS and compared["tool_choice"] == CHOICE
    assert compared["temperature"] == 0.25 and compared["model"] == "mock/echo-request"
    # The same body, byte for byte once sorted, from every surface.
    assert batched == compared
    assert fanned == compared
    assert passed == compared
    assert KEY not in json.dumps([compared, batched, fanned, passed])
    # A request's own tools win on both routes, as a prompt's do in a batch; the model's
    # params (its tool_choice) stay under the request's.
    fanned, passed = via_service(config, tools=OWN_TOOLS, temperature=0.5)
    (tmp_path / "own").mkdir()
    batched = via_batch(config, tmp_path / "own", {"id": "p", "prompt": PROMPT,
                                                   "tools": OWN_TOOLS,
                                                   "params": {"temperature": 0.5}})
    assert fanned["tools"] == passed["tools"] == OWN_TOOLS
    assert fanned["tool_choice"] == CHOICE  # the model's params stay under the request's
    assert fanned["temperature"] == 0.5
    assert fanned == passed == batched
