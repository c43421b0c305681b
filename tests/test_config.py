"""Config files: the shipped ones load, every mistake is one clear line, secrets stay out."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

import fanout.config as config_module
from fanout import ConfigError, Deadlines, Endpoint, load_config
from fanout.config import EMBEDDED, find_config, parse_config

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = """
[endpoint]
base_url = "https://relay.example/v1"
api_key_env = "RELAY_KEY"

[[models]]
name = "a"
id = "vendor/model-a"
"""


def check(text: str) -> str:
    """The one-line message a broken config gets."""
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "cfg.toml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("cfg.toml: ")
    return message


def test_the_shipped_configs_load() -> None:
    default = load_config(ROOT / "config" / "default.toml")
    assert default.embedded
    assert 3 <= len(default.compare) <= 4
    assert default.select(default=default.compare)[0].name == default.compare[0]
    relay = load_config(ROOT / "config" / "relay.example.toml")
    assert not relay.embedded and relay.api_key_env == "RELAY_API_KEY"
    assert len(relay.models) >= 12
    assert len({m.id for m in relay.models}) == len(relay.models)


def test_the_default_ships_inside_the_package_as_the_checkouts_file(tmp_path: Path) -> None:
    assert config_module.DEFAULT_CONFIG.parent.parent == Path(config_module.__file__).parent
    assert config_module.DEFAULT_CONFIG.read_bytes() == (ROOT / "config/default.toml").read_bytes()
    config = load_config(cwd=tmp_path, environ={})  # no fanout.toml here
    assert config.source == str(config_module.DEFAULT_CONFIG)
    assert config.embedded and config.endpoint({}) is None
    # What the README's examples name: the models and the scorers.
    names = {m.name for m in config.models}
    assert {"writer", "thinker", "tools", "smollm2", "echo", "flaky", "judge"} <= names
    assert {s.name for s in config.scorers} >= {"exact-ci", "has-answer", "judged"}


def test_lookup_order(tmp_path: Path) -> None:
    assert find_config(None, tmp_path) == config_module.DEFAULT_CONFIG
    (tmp_path / "fanout.toml").write_text(MINIMAL)
    assert find_config(None, tmp_path) == tmp_path / "fanout.toml"
    assert find_config("other.toml", tmp_path) == Path("other.toml")


def test_openai_base_url_takes_over_the_packaged_default_only(tmp_path: Path) -> None:
    environ = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    config = load_config(cwd=tmp_path, environ=environ)
    assert config.source == config_module.ENVIRONMENT_SOURCE
    assert not config.embedded and config.real_endpoint(environ)
    endpoint = config.endpoint(environ)
    assert endpoint is not None and endpoint.base_url == "http://127.0.0.1:9/v1"
    # The default's models are the embedded upstream's: not sent to a real endpoint.
    assert config.models == () and config.compare == () and config.batch == ()
    assert config.select(["writer"], environ=environ)[0].id == "writer"
    with pytest.raises(ConfigError, match="no model to run: give -m ID"):
        config.select(environ=environ)
    assert {s.name for s in config.scorers} >= {"exact-ci", "has-answer"}
    assert all(s.kind != "judge" for s in config.scorers)
    # A config chosen (--config, ./fanout.toml) with base_url = "embedded" stays embedded.
    assert load_config(ROOT / "config/default.toml", environ=environ).embedded
    (tmp_path / "fanout.toml").write_text(f"[endpoint]\nbase_url = '{EMBEDDED}'\n")
    assert load_config(cwd=tmp_path, environ=environ).embedded


def test_a_full_config() -> None:
    config = parse_config(MINIMAL + """
params = { temperature = 0.2, max_tokens = 100 }
deadlines = { first_token = 90 }
concurrency = 2

[[models]]
name = "b"
id = "vendor/model-b"

[deadlines]
first_token = 30
idle = 10.5

[concurrency]
max = 16
per_model = 4

[parser]
strict = true

[compare]
models = ["b"]
""", "cfg.toml")
    a = config.model("a")
    assert a.params == {"temperature": 0.2, "max_tokens": 100}
    assert config.deadlines == Deadlines(first_token=30, idle=10.5)
    # A model's own deadlines go over [deadlines] key by key.
    assert config.deadlines_for(a) == Deadlines(first_token=90, idle=10.5)
    assert config.deadlines_for(config.model("b")) == config.deadlines
    assert config.per_model_caps(config.models) == {"vendor/model-a": 2, "vendor/model-b": 4}
    assert config.max_concurrency == 16 and config.strict
    assert [m.name for m in config.select(default=config.compare)] == ["b"]
    assert [m.name for m in config.select(["a", "b"])] == ["a", "b"]
    # an id works too: the entry b, named as typed
    assert config.model("vendor/model-b") == attrs.evolve(config.model("b"), name="vendor/model-b")


@pytest.mark.parametrize(("text", "expected"), [
    ("[endpont]\nbase_url = 'x'", "top level: unknown key 'endpont' (did you mean 'endpoint'?)"),
    ("[deadlines]\nidel = 3", "[deadlines]: unknown key 'idel' (did you mean 'idle'?)"),
    ("[deadlines]\nidle = -1", "[deadlines] idle: must be a number of seconds > 0 (or false to disable it), not -1"),
    ("[deadlines]\ntotal = 0", "[deadlines] total: must be a number of seconds > 0 (or false to disable it), not 0"),
    ("[deadlines]\ntotal = 'ten'", "[deadlines] total: must be a number of seconds > 0 (or false to disable it), not 'ten'"),
    ("[deadlines]\ntotal = nan", "[deadlines] total: must be a number of seconds > 0 (or false to disable it), not nan"),
    ("[concurrency]\nmax = true", "[concurrency] max: must be a whole number >= 1, not true"),
    ("[concurrency]\nper_model = 0", "[concurrency] per_model: must be a whole number >= 1, not 0"),
    ("[concurrency]\nmax = 2.5", "[concurrency] max: must be a whole number >= 1, not 2.5"),
    ("[parser]\nstrict = 'yes'", "[parser] strict: must be true or false, not 'yes'"),
    ("deadlines = 3", "deadlines: must be a table ([deadlines]), not 3"),
    ("[endpoint]\nbase_url = 'ftp://x'", "[endpoint] base_url: must start with http:// or https://"),
    ("[endpoint]\nbase_url = 5", "[endpoint] base_url: must be a non-empty string, not 5"),
    ("[endpoint]\nheaders = { Authorization = 'Bearer x' }", "[endpoint] headers: must not carry Authorization"),
    ("[endpoint]\nheaders = { X-A = 1 }", "[endpoint] headers X-A: must be a string, not 1"),
    ("[[models]]\nid = 'x'", "[[models]] #1: name is missing"),
    ("[[models]]\nname = 'a'", "[[models]] #1 (a): id is missing"),
    ("[[models]]\nname = 'a'\nid = 'x'\ntemperature = 0.1",
     "[[models]] #1 (a): unknown key 'temperature' (request parameters go under params"),
    ("[[models]]\nname = 'a'\nid = 'x'\nparams = { stream = false }",
     "[[models]] #1 (a) params: must not set 'stream': fanout sets it"),
    ("[[models]]\nname = 'a'\nid = 'x'\ndeadlines = { idle = -2 }",
     "[[models]] #1 (a) deadlines idle: must be a number of seconds > 0 (or false to disable it), not -2"),
    ("[[models]]\nname = 'a'\nid = 'x'\nconcurrency = -1",
     "[[models]] #1 (a) concurrency: must be a whole number >= 1, not -1"),
    ("[[models]]\nname = 'a'\nid = 'x'\n[[models]]\nname = 'a'\nid = 'y'",
     "[[models]]: the name 'a' is used twice"),
    ("models = 'a'", "models: must be an array of tables ([[models]])"),
    ("[compare]\nmodels = ['nope']\n[[models]]\nname = 'nop'\nid = 'x'",
     "[compare] models: no model named 'nope' (did you mean 'nop'?) (known: nop)"),
    ("[endpoint\n", "not valid TOML: "),
])
def test_every_mistake_is_one_line(text: str, expected: str) -> None:
    assert expected in check(text)


def test_bad_toml_names_the_line() -> None:
    assert "line 3" in check("[endpoint]\nbase_url = 'x'\napi_key_env = = 'y'\n")


def test_a_pasted_key_is_refused_without_echoing_it() -> None:
    secret = "sk-proj-abcdef0123456789"
    message = check(f"[endpoint]\napi_key_env = '{secret}'")
    assert "api_key_env: must be the *name* of an environment variable" in message
    assert secret not in message


def test_the_key_comes_from_the_named_variable() -> None:
    config = parse_config(MINIMAL, "cfg.toml")
    endpoint = config.endpoint({"RELAY_KEY": "sk-secret-value"})
    assert endpoint == Endpoint("https://relay.example/v1", "sk-secret-value")
    assert "sk-secret-value" not in repr(endpoint)
    with pytest.raises(ConfigError) as caught:
        config.endpoint({"OPENAI_API_KEY": "sk-other-secret"})
    assert str(caught.value) == ("cfg.toml: [endpoint] api_key_env: the variable RELAY_KEY "
                                 "is not set (or empty)")


def test_openai_variables_are_the_fallbacks() -> None:
    config = parse_config("[[models]]\nname = 'a'\nid = 'x'", "cfg.toml")
    endpoint = config.endpoint({"OPENAI_BASE_URL": "https://api.example/v1/",
                                "OPENAI_API_KEY": "sk-fallback"})
    assert endpoint is not None
    assert (endpoint.base_url, endpoint.api_key) == ("https://api.example/v1", "sk-fallback")
    no_key = config.endpoint({"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"})
    assert no_key is not None and no_key.api_key is None
    with pytest.raises(ConfigError, match="no endpoint: set \\[endpoint\\] base_url, or "
                                          "OPENAI_BASE_URL"):
        config.endpoint({})
    with pytest.raises(ConfigError, match="OPENAI_BASE_URL: must start with http"):
        config.endpoint({"OPENAI_BASE_URL": "relay.example"})
    # A configured base URL wins over the variable.
    named = parse_config(MINIMAL, "cfg.toml").endpoint(
        {"OPENAI_BASE_URL": "https://elsewhere/v1", "RELAY_KEY": "k"})
    assert named is not None and named.base_url == "https://relay.example/v1"


def test_unknown_models_list_the_known_ones() -> None:
    config = parse_config("[endpoint]\nbase_url = 'embedded'\n[[models]]\nname = 'a'\n"
                          "id = 'mock/fast'\n[[models]]\nname = 'alpha'\nid = 'mock/echo'\n",
                          "cfg.toml")
    with pytest.raises(ConfigError) as caught:
        config.model("alpah")
    assert str(caught.value) == ("cfg.toml: no model named 'alpah' (did you mean 'alpha'?) "
                                 "(known: a, alpha)")
    with pytest.raises(ConfigError, match="model 'a' is asked for twice"):
        config.select(["a", "a"])
    with pytest.raises(ConfigError, match=r"model 'mock/fast' is asked for twice \(it is 'a'\)"):
        config.select(["a", "mock/fast"])
    with pytest.raises(ConfigError, match="no model named a string of 300 characters"):
        config.model("x" * 300)


def test_a_real_endpoint_takes_any_model_id() -> None:
    config = parse_config(MINIMAL + "price = { input = 1, output = 2 }\n", "cfg.toml")
    # An id without an entry: its name is its id, its dialect [endpoint] api (chat).
    adhoc = config.model("gpt-4o", environ={})
    assert (adhoc.name, adhoc.id, adhoc.api, adhoc.price, dict(adhoc.params)) == (
        "gpt-4o", "gpt-4o", "chat", None, {})
    # An entry still adds a name, params, a price and a dialect; found by id too, and
    # then named as typed (what columns and records show, what a person greps for).
    assert config.model("a").price is not None
    by_id = config.model("vendor/model-a")
    assert (by_id.name, by_id.id, by_id.price) == ("vendor/model-a", "vendor/model-a",
                                                   config.model("a").price)
    assert [m.name for m in config.select(["a", "meta-llama/Llama-3.1-8B:free"],
                                          environ={})] == ["a", "meta-llama/Llama-3.1-8B:free"]
    # No id has spaces or control characters: those are still unknown names.
    for bad in ("two words", "tab\there", ""):
        with pytest.raises(ConfigError, match="no model named"):
            config.model(bad, environ={})
    responses = parse_config(MINIMAL.replace('api_key_env', 'api = "responses"\napi_key_env'))
    assert responses.model("o3", environ={}).api == "responses"
    # Without a base_url in the file, OPENAI_BASE_URL decides.
    bare = parse_config("[[models]]\nname = 'a'\nid = 'x'\n", "bare.toml")
    assert bare.model("gpt-4o", environ={"OPENAI_BASE_URL": "http://h/v1"}).id == "gpt-4o"
    with pytest.raises(ConfigError, match=r"bare.toml: no model named 'gpt-4o' \(known: a\)"):
        bare.model("gpt-4o", environ={})
    embedded = parse_config("[endpoint]\nbase_url = 'embedded'\n", "e.toml")
    with pytest.raises(ConfigError, match="no model named 'gpt-4o'"):
        embedded.model("gpt-4o", environ={"OPENAI_BASE_URL": "http://h/v1"})


def test_the_embedded_endpoint_takes_any_embedded_model() -> None:
    config = parse_config(f"[endpoint]\nbase_url = '{EMBEDDED}'", "cfg.toml")
    assert config.model("fault/stall:3@byte").id == "fault/stall:3@byte"
    assert config.model("replay/01_plain").id == "replay/01_plain"
    with pytest.raises(ConfigError, match="no model named 'mock/nope'"):
        config.model("mock/nope")
    with pytest.raises(ConfigError, match="no \\[\\[models\\]\\] to run"):
        config.select()


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.toml")
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)
    binary = tmp_path / "bad.toml"
    binary.write_bytes(b"[endpoint]\nbase_url = '\xff'\n")
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        load_config(binary)


def test_every_mistake_of_a_file_is_reported_at_once() -> None:
    text = ("[endpoint]\nbase_url = 'ftp://x'\nrequire_finish_reason = 'no'\n"
            "[deadlines]\nidel = 3\n[concurrency]\nmax = 0\n"
            "[[models]]\nname = 'a'\nid = 'x'\ntemperature = 1\n"
            "[[models]]\nname = 'b'\n"
            "[compare]\nmodels = ['c']\n")
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "f.toml")
    problems = caught.value.problems
    assert len(problems) == 7, problems
    assert all(line.startswith("f.toml: ") for line in problems)
    assert [p.split(":")[1].strip() for p in problems] == [
        "[endpoint] require_finish_reason", "[endpoint] base_url", "[deadlines]",
        "[concurrency] max", "[[models]] #1 (a)", "[[models]] #2 (b)", "[compare] models"]


def test_batch_models_and_tools(tmp_path: Path) -> None:
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    path = tmp_path / "f.toml"
    path.write_text("[batch]\nmodels = ['a']\n[compare]\ntools = 'tools.json'\n"
                    "[[models]]\nname = 'a'\nid = 'x'\n"
                    "[[models]]\nname = 'b'\nid = 'y'\n"
                    "tools = [{ type = 'function', function = { name = 'f' } }]\n")
    config = load_config(path)
    assert config.batch == ("a",)
    assert config.compare_tools == tuple(tools)
    assert config.model("b").tools == ({"type": "function", "function": {"name": "f"}},)
    assert config.model("a").tools is None


@pytest.mark.parametrize(("tools", "message"), [
    ("{}", "tools must be a list of tool definitions, not a table"),
    ("[1]", "tools[0]: must be an object, not 1"),
    ('[{"function": {"name": "has space"}}]', "tools[0] function.name: must be 1-64 letters"),
    ('[{"function": {"name": "f", "parameters": {"type": 12}}}]',
     "tools[0] function.parameters: not a valid JSON Schema"),
    ('[{"function": {"name": "f"}}, {"function": {"name": "f"}}]', "'f' is defined twice"),
    ("not json", "not JSON"),
])
def test_a_bad_tools_file_is_one_line_naming_it(tmp_path: Path, tools: str, message: str) -> None:
    from fanout.config import read_tools

    path = tmp_path / "tools.json"
    path.write_text(tools)
    with pytest.raises(ConfigError) as caught:
        read_tools(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value)
    assert "\n" not in str(caught.value)
