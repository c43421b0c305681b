"""``fanout init``: a commented starter config for a real endpoint.

Writes ``fanout.toml`` (or PATH): the endpoint (``--base-url``, else
``OPENAI_BASE_URL``, else OpenAI's), where the key comes from, deadlines,
concurrency, two models, a scorer and the ``[batch]`` models.  The text is
checked with ``parse_config`` before anything is written, so the file always
loads.  Nothing already at PATH is touched (a file, a link, even a dangling
one: ``fanout.files.create_new``).  Exit status: 0 written, 2 for a bad URL or
anything at PATH.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import TextIO
from urllib.parse import urlsplit

import attrs

from .._exceptions import ConfigError
from ..config import parse_config
from ..files import create_new, kind_of
from .render import inert

__all__ = ["DEFAULT_BASE_URL", "InitOptions", "run_init", "starter_config"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_STARTER = """\
# fanout's config, written by `fanout init`. `fanout compare "hi"` runs the [compare]
# models; `-m ID` takes any model id of the endpoint too (`fanout models` lists them).
# Every key is described in the configuration reference (docs/configuration.md).

[endpoint]
# Your OpenAI-compatible server: a relay, vLLM, llama.cpp, Ollama, OpenAI, ...
# OpenAI-compatible servers usually end their base URL with /v1.
base_url = {base_url}
# The NAME of the environment variable holding the API key (never the key itself).
# Unset, OPENAI_API_KEY is sent when it is set; a local server may need no key.
# api_key_env = "OPENAI_API_KEY"
# api = "chat"               # or "responses", "anthropic": the dialect of every model

[deadlines]                  # seconds, or false to disable one
connect = 10
first_token = 60             # a reasoning model may think for minutes: raise it
idle = 30                    # the longest silence inside a stream
total = 600

[concurrency]
max = 16                     # streams in flight on the endpoint (1 for a one-slot server)
per_model = 8

[compare]
models = ["fast", "smart"]   # what `fanout compare` runs without -m

[batch]
models = ["fast", "smart"]   # what `fanout batch` runs without -m

# A name of yours for a model id of the endpoint, with its request parameters and
# its price (USD per million tokens: costs in reports, --budget). Replace the ids
# with ones `fanout models` lists.
[[models]]
name = "fast"
id = "gpt-4o-mini"
params = {{ temperature = 0.2, max_tokens = 800 }}
price = {{ input = 0.15, output = 0.60 }}

[[models]]
name = "smart"
id = "gpt-4o"
params = {{ max_tokens = 800 }}
price = {{ input = 2.50, output = 10.00 }}
# api = "responses"          # this model through POST /responses

# `--score has-answer` (fanout batch, fanout score): passes when the prompt's
# "expected" text occurs in the answer, ignoring case.
[[scorers]]
name = "has-answer"
kind = "includes"
ignore_case = true

# A model grading the answers against "expected" (it costs requests):
# [[scorers]]
# name = "judged"
# kind = "judge"
# model = "smart"
"""


@attrs.frozen
class InitOptions:
    path: str = "fanout.toml"
    base_url: str | None = None


def starter_config(base_url: str) -> str:
    """The starter config's text for ``base_url``; ``ValueError`` (one line) for a URL
    it cannot hold."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--base-url: must be an http:// or https:// URL, not "
                         f"{inert(base_url[:80])!r}")
    if parts.username is not None or parts.password is not None:
        # Never echoed: the part before @ may be a secret.
        raise ValueError("--base-url: holds a user name or password; the key goes in an "
                         "environment variable (api_key_env), never in the file")
    text = _STARTER.format(base_url=json.dumps(base_url.rstrip("/"), ensure_ascii=False))
    try:
        parse_config(text, "the starter config")
    except ConfigError as exc:  # a URL TOML cannot hold as it is
        raise ValueError(f"--base-url: {exc}") from None
    return text


def run_init(options: InitOptions, *, stdout: TextIO | None = None,
             stderr: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Write the starter config; returns the exit status (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    env = os.environ if environ is None else environ
    base_url = options.base_url or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    try:
        text = starter_config(base_url)
    except ValueError as exc:
        print(f"fanout init: {exc}", file=err)
        return 2
    path = options.path
    shown = inert(path)
    try:
        fd, _ = create_new(path, 0o644)
    except FileExistsError:
        there = kind_of(path)
        what = "a file" if there == "a regular file" else there
        print(f"fanout init: {shown}: {what} is already there; nothing was written (give "
              "another PATH, or remove it first)", file=err)
        return 2
    except OSError as exc:
        print(f"fanout init: {shown}: cannot create: {exc.strerror or exc}", file=err)
        return 2
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        print(f"fanout init: {shown}: cannot write: {exc.strerror or exc}", file=err)
        return 2
    flag = "" if os.path.abspath(path) == os.path.abspath("fanout.toml") else \
        f" --config {shown}"
    print(f"wrote {shown}: the endpoint {inert(base_url.rstrip('/'))}, two models, a scorer. "
          f"Next: `fanout models{flag}` lists the endpoint's model ids (put two of them in "
          f"the file), then `fanout compare \"hi\"{flag}`", file=out)
    return 0
