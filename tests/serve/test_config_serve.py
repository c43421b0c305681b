"""The ``[serve]`` table: defaults, and one-line errors naming the key."""

from __future__ import annotations

import pytest

from fanout import ConfigError
from fanout.config import ServeConfig, load_config, parse_config


def test_defaults_and_values() -> None:
    assert parse_config("").serve == ServeConfig()
    defaults = ServeConfig()
    assert (defaults.host, defaults.port, defaults.keys_env, defaults.cors_origins) == (
        "127.0.0.1", 8080, None, ())
    serve = parse_config('[serve]\nkeys_env = "SVC"\nhost = "0.0.0.0"\nport = 0\n'
                         'cors_origins = ["http://localhost:5173", "https://[::1]:8443"]\n'
                         "max_body_bytes = 10\nmax_streams = 2\nmax_fanouts = 3\n"
                         "retry_after = 4\nkeepalive = 0.5\nreplica = 'eu-west_1'\nhead_timeout = 0.25\n"
                         "body_timeout = 3\nbody_min_rate = 10\n"
                         "max_reading_connections = 5\n").serve
    assert serve == ServeConfig(keys_env="SVC", host="0.0.0.0", port=0,
                                cors_origins=("http://localhost:5173", "https://[::1]:8443"),
                                max_body_bytes=10, max_streams=2, max_fanouts=3,
                                retry_after=4, keepalive=0.5, replica="eu-west_1", head_timeout=0.25,
                                body_timeout=3.0, body_min_rate=10,
                                max_reading_connections=5)
    assert load_config().serve == ServeConfig()  # config/default.toml: loopback, no keys


@pytest.mark.parametrize(("text", "message"), [
    ("[serve]\nkyes_env = 'X'", "f.toml: [serve]: unknown key 'kyes_env' (did you mean "
     "'keys_env'?) (known: keys_env, host, port, cors_origins, max_body_bytes, max_streams, "
     "max_fanouts, retry_after, keepalive, replica, head_timeout, body_timeout, body_min_rate, "
     "max_reading_connections, grace)"),
    ("[serve]\ngrace = -1", "f.toml: [serve] grace: must be a number of seconds >= 0, not -1"),
    ("[serve]\nreplica = 'eu 1'", "f.toml: [serve] replica: must be 1 to 63 letters, digits, _ "
     "or -, not 'eu 1' (it goes in fan-out ids and URLs)"),
    ("[serve]\nreplica = 'a.b'", "f.toml: [serve] replica: must be 1 to 63 letters, digits, _ "
     "or -, not 'a.b'"),
    ("[serve]\nreplica = ''", "f.toml: [serve] replica: must be 1 to 63 letters, digits, _ "
     "or -, not ''"),
    (f"[serve]\nreplica = '{'r' * 64}'", "f.toml: [serve] replica: must be 1 to 63 letters, "
     "digits, _ or -, not a string of 64 characters"),
    ("[serve]\nreplica = 7", "f.toml: [serve] replica: must be 1 to 63 letters, digits, _ "
     "or -, not 7"),
    ('[serve]\nreplica = "r1\\n"', "f.toml: [serve] replica: must be 1 to 63 letters, digits, "
     "_ or -, not 'r1\\n'"),
    ("[serve]\nkeys_env = 'sk-live-123'", "f.toml: [serve] keys_env: must be the *name* of an "
     "environment variable (like FANOUT_SERVICE_KEYS), not the keys themselves"),
    ("[serve]\nport = 70000", "f.toml: [serve] port: must be a port number 0..65535, not 70000"),
    ("[serve]\nport = '80'", "f.toml: [serve] port: must be a port number 0..65535, not '80'"),
    ("[serve]\nhost = ''", "f.toml: [serve] host: must be a non-empty string, not ''"),
    ("[serve]\ncors_origins = '*'", "f.toml: [serve] cors_origins: must be an array of origins "
     '(like "https://app.example")'),
    ("[serve]\ncors_origins = ['*']", "f.toml: [serve] cors_origins: '*' is not an origin: "
     'scheme://host[:port], no path (and no "*": list them)'),
    ("[serve]\ncors_origins = ['https://a.example/path']", "f.toml: [serve] cors_origins: "
     "'https://a.example/path' is not an origin: scheme://host[:port], no path"),
    ("[serve]\nmax_streams = 0", "f.toml: [serve] max_streams: must be a whole number >= 1, "
     "not 0"),
    ("[serve]\nmax_fanouts = 1.5", "f.toml: [serve] max_fanouts: must be a whole number >= 1, "
     "not 1.5"),
    ("[serve]\nkeepalive = -1", "f.toml: [serve] keepalive: must be a number of seconds > 0, "
     "not -1"),
    ("[serve]\nhead_timeout = 0", "f.toml: [serve] head_timeout: must be a number of "
     "seconds > 0, not 0"),
    ("[serve]\nhead_timeout = inf", "f.toml: [serve] head_timeout: must be a number of "
     "seconds > 0, not inf"),
    ("[serve]\nbody_timeout = '10'", "f.toml: [serve] body_timeout: must be a number of "
     "seconds > 0, not '10'"),
    ("[serve]\nbody_min_rate = 0", "f.toml: [serve] body_min_rate: must be a whole number "
     ">= 1, not 0"),
    ("[serve]\nmax_reading_connections = true", "f.toml: [serve] max_reading_connections: "
     "must be a whole number >= 1, not true"),
    ("serve = 3", "f.toml: serve: must be a table ([serve]), not 3"),
])
def test_every_mistake_is_one_line_naming_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "f.toml")
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)
