"""Bad input is a 400 with an OpenAI-shaped error that names the field."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from fanout.serve.body import parse_chat, parse_fanout
from fanout.serve.errors import ApiError

from .helpers import Served, make_config

CONFIG = make_config()
LIMITS = CONFIG.serve
USER = [{"role": "user", "content": "hi"}]

FANOUT_CASES: list[tuple[dict[str, Any], str | None, str]] = [
    ({"messages": USER, "models": ["fast", "echo", "gtp-4o"]}, "models[2]",
     "models[2]: no model named 'gtp-4o' (did you mean 'gpt-4o'?)"),
    ({"messages": USER, "models": ["zzzzzz"]}, "models[0]",
     "models[0]: no model named 'zzzzzz' (known: fast, writer, long, long2, endless, echo, "
     "tools, short, flaky, broken, stalled, late, gpt-4o)"),
    ({"messages": USER, "models": ["fast", "fast"]}, "models[1]",
     "models[1]: 'fast' is asked for twice (samples asks for more than one answer)"),
    ({"messages": USER, "models": "fast"}, "models",
     "models: must be a non-empty array of model names, not 'fast'"),
    ({"messages": USER, "models": []}, "models",
     "models: must be a non-empty array of model names, not an array"),
    ({"messages": USER, "models": [7]}, "models[0]",
     "models[0]: must be a model name (a string), not 7"),
    ({"messages": USER, "model": "fast"}, "model",
     "model: /v1/fanout takes models, a list of model names (for one model, POST "
     "/v1/chat/completions)"),
    ({"models": ["fast"]}, "messages", "messages: missing (an array of {role, content} objects)"),
    ({"messages": [], "models": ["fast"]}, "messages",
     "messages: must be a non-empty array of messages, not an array"),
    ({"messages": ["hi"]}, "messages[0]",
     "messages[0]: must be an object with role and content, not 'hi'"),
    ({"messages": [*USER, {"role": "robot", "content": "x"}]}, "messages[1].role",
     "messages[1].role: must be one of system, developer, user, assistant, tool, function, "
     "not 'robot'"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "messages[0].content: missing"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content",
     "messages[0].content: must be a string or an array of content parts, not 5"),
    ({"messages": USER, "samples": 0}, "samples", "samples: must be a whole number >= 1, not 0"),
    ({"messages": USER, "samples": True}, "samples",
     "samples: must be a whole number >= 1, not true"),
    ({"messages": USER, "stream": "yes"}, "stream", "stream: must be true or false, not 'yes'"),
    ({"messages": USER, "mode": "fastest"}, "mode",
     'mode: must be "all" or "first", not \'fastest\''),
    ({"messages": USER, "temperature": "hot"}, "temperature",
     "temperature: must be a number, not 'hot'"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens",
     "max_tokens: must be a whole number >= 1, not 0"),
    ({"messages": USER, "n": 1.5}, "n", "n: must be a whole number >= 1, not 1.5"),
    ({"messages": USER, "stop": [1]}, "stop",
     "stop: must be a string or an array of strings, not an array"),
    ({"messages": USER, "tools": {}}, "tools", "tools: must be an array of tools, not an object"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0].function",
     "tools[0].function: must be an object with a name, not null"),
    ({"messages": USER, "tools": [{"function": {"name": ""}}]}, "tools[0].function.name",
     "tools[0].function.name: must be a non-empty string, not ''"),
    ({"messages": USER, "stream_options": {"include_usage": 1}}, "stream_options.include_usage",
     "stream_options.include_usage: must be true or false, not 1"),
]


@pytest.mark.parametrize(("body", "param", "message"), FANOUT_CASES)
def test_a_bad_fanout_body_names_its_field(body: dict[str, Any], param: str | None,
                                           message: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_fanout(body, CONFIG, LIMITS)
    assert caught.value.status == 400
    assert caught.value.body()["error"]["message"] == message
    assert caught.value.param == param


def test_a_long_value_is_never_echoed_in_full() -> None:
    with pytest.raises(ApiError) as caught:
        parse_fanout({"messages": USER, "models": ["x" * 5000]}, CONFIG, LIMITS)
    assert caught.value.message.startswith("models[0]: no model named a string of 5000 characters")


def test_models_default_to_the_configs_compare_models_and_params_go_over_the_models() -> None:
    ask = parse_fanout({"messages": USER, "temperature": 0.5, "max_tokens": 5, "seed": 3},
                       CONFIG, LIMITS)
    assert [plan.key for plan in ask.streams] == ["fast", "echo"]
    assert ask.stream is False and ask.mode == "all"
    assert ask.streams[0].request.params == {"temperature": 0.5, "max_tokens": 5, "seed": 3}
    writer = parse_fanout({"messages": USER, "models": ["writer"]}, CONFIG, LIMITS)
    assert writer.streams[0].request.params == {"max_tokens": 30}  # the model's own
    over = parse_fanout({"messages": USER, "models": ["writer"], "max_tokens": 3}, CONFIG, LIMITS)
    assert over.streams[0].request.params == {"max_tokens": 3}  # the request's over it
    assert over.streams[0].request.deadlines == CONFIG.deadlines_for(CONFIG.model("writer"))


def test_a_chat_body_takes_one_model() -> None:
    ask = parse_chat({"model": "short", "messages": USER, "stream": True,
                      "stream_options": {"include_usage": True}}, CONFIG, LIMITS)
    assert ask.model.name == "short" and ask.stream and ask.include_usage
    assert "stream_options" not in ask.request.params


BODIES: list[tuple[bytes, str]] = [
    (b"", "the body is empty: send a JSON object"),
    (b"{", "the body is not valid JSON: Expecting property name enclosed in double quotes "
           "(line 1, column 2)"),
    (b"[1]", "the body must be a JSON object, not an array"),
    (b'{"messages": NaN}', "the body is not valid JSON: NaN is not a JSON number"),
    (b"\xff{}", "the body is not UTF-8 text (byte 0)"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
     "the body holds a lone surrogate (a \\ud800-\\udfff escape): text must be valid Unicode"),
    (b"[" * 100_000 + b"]" * 100_000, "the body nests too deeply"),
]


async def test_bodies_that_are_not_json_objects_are_400s(served: Served) -> None:
    async with served.client() as client:
        with trio.fail_after(10):
            for path in ("/v1/fanout", "/v1/chat/completions"):
                for body, message in BODIES:
                    response = await client.post(path, content=body)
                    assert response.status_code == 400, (path, body[:20])
                    assert response.json()["error"] == {
                        "message": message, "type": "invalid_request_error", "param": None,
                        "code": None}
            wrong = await client.post("/v1/fanout", json={
                "messages": USER, "models": ["fast", "echo", "gtp-4o"]})
            method = await client.get("/v1/fanout")
            missing = await client.get("/v2/nothing")
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "models[2]"
    assert method.status_code == 405
    assert method.json()["error"]["message"] == "GET is not allowed on /v1/fanout"
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "no route for GET /v2/nothing"
    assert served.service.status()["rejected"]["bad_request"] == 2 * len(BODIES) + 1
