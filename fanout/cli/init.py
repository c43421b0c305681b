"""``fanout init``: a commented starter config for a real endpoint.

Writes ``fanout.toml`` (or PATH): the endpoint (``--base-url``, else
``OPENAI_BASE_URL``, else OpenAI's), where the key comes from, deadlines,
concurrency, two models, a scorer and the ``[batch]`` models.  With an endpoint
of yours (``--base-url`` or ``OPENAI_BASE_URL``) the two models are ids its
``GET /models`` lists (asked with ``OPENAI_API_KEY``); without, or when it gives
no list, placeholder ids (OpenAI's), and a line on stderr saying why.  The text is
checked with ``parse_config`` before anything is written, so the file always
loads.  Nothing already at PATH is touched (a file, a link, even a dangling
one: ``fanout.files.create_new``).  Exit status: 0 written, 2 for a bad URL or
anything at PATH.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import TextIO
from urllib.parse import urlsplit

import attrs
import trio

from .._exceptions import ConfigError
from ..config import parse_config
from ..files import create_new, kind_of
from ..request import Endpoint
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
models = {names}   # what `fanout compare` runs without -m

[batch]
models = {names}   # what `fanout batch` runs without -m

{models}
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
# model = {judge}
"""

_PLACEHOLDERS = """\
# A name of yours for a model id of the endpoint, with its request parameters and
# its price (USD per million tokens: costs in reports, --budget). Replace the ids
# with ones `fanout models` lists.
[[models]]
name = "fast"
id = "gpt-4o-mini"
params = { temperature = 0.2, max_tokens = 800 }
price = { input = 0.15, output = 0.60 }

[[models]]
name = "smart"
id = "gpt-4o"
params = { max_tokens = 800 }
price = { input = 2.50, output = 10.00 }
# api = "responses"          # this model through POST /responses
"""

_REAL = """\
# Two model ids the endpoint's GET /models lists ({count} in all: `fanout models`
# shows them).{more}
# The name is what -m and the results call a model: yours to change. Add a price
# (USD per million tokens) for costs in reports and --budget.
"""

_ENTRY = """\
[[models]]
name = {name}
id = {id}
params = {{ max_tokens = 800 }}
# price = {{ input = 0.15, output = 0.60 }}
"""

#: Ids that are no chat model (embeddings, speech, images, moderation), and the embedded
#: upstream's deliberately broken fault/... models: not picked for the starter.
_NOT_CHAT = re.compile(r"embed|whisper|tts|dall-e|moderation|image|audio|rerank|^fault/",
                       re.I)
#: Seconds ``fanout init`` waits for the endpoint's model list.
LIST_WAIT = 15.0


@attrs.frozen
class InitOptions:
    path: str = "fanout.toml"
    base_url: str | None = None


def pick_models(ids: Sequence[str]) -> list[str]:
    """Two of the endpoint's model ids for the starter (chat models, in its order)."""
    return [model_id for model_id in ids if not _NOT_CHAT.search(model_id)][:2]


def _models_part(listed: Sequence[str] | None) -> dict[str, str]:
    """The ``[[models]]`` entries, the names ``[compare]`` and ``[batch]`` run, and the
    judge's: two of ``listed`` (the endpoint's ids), else the placeholders."""
    ids = pick_models(listed or ())
    if not ids:
        return {"models": _PLACEHOLDERS, "names": '["fast", "smart"]', "judge": '"smart"'}
    assert listed is not None
    quoted = [json.dumps(model_id, ensure_ascii=False) for model_id in ids]
    rest = [i for i in listed if i not in ids]
    others = ([i for i in rest if not _NOT_CHAT.search(i)]
              + [i for i in rest if _NOT_CHAT.search(i)])[:4]
    more = f"\n# Others: {', '.join(others)}{', ...' if len(listed) > 6 else ''}" \
        if others else ""
    models = _REAL.format(count=len(listed), more=more) + "\n".join(
        _ENTRY.format(name=q, id=q) for q in quoted)
    return {"models": models, "names": "[" + ", ".join(quoted) + "]", "judge": quoted[-1]}


def starter_config(base_url: str, listed: Sequence[str] | None = None) -> str:
    """The starter config's text for ``base_url``: with ``listed`` (the ids the endpoint's
    ``GET /models`` gave), two of them, else placeholder ids; ``ValueError`` (one line)
    for a URL it cannot hold."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"--base-url: must be an http:// or https:// URL, not "
                         f"{inert(base_url[:80])!r}")
    if parts.username is not None or parts.password is not None:
        # Never echoed: the part before @ may be a secret.
        raise ValueError("--base-url: holds a user name or password; the key goes in an "
                         "environment variable (api_key_env), never in the file")
    text = _STARTER.format(base_url=json.dumps(base_url.rstrip("/"), ensure_ascii=False),
                           **_models_part(listed))
    try:
        parse_config(text, "the starter config")
    except ConfigError as exc:  # a URL TOML cannot hold as it is
        raise ValueError(f"--base-url: {exc}") from None
    return text


def _listed(base_url: str, env: Mapping[str, str]) -> tuple[list[str] | None, str | None]:
    """The model ids ``GET {base_url}/models`` lists (sent with ``OPENAI_API_KEY``, as the
    starter's endpoint would send it), or ``None`` and why not (one line, never the key)."""
    from ..net.model_list import ListError, list_models

    async def ask() -> list[str] | None:
        endpoint = Endpoint(base_url, env.get("OPENAI_API_KEY") or None,
                            key_env="OPENAI_API_KEY" if env.get("OPENAI_API_KEY") else None)
        with trio.move_on_after(LIST_WAIT):
            return [model_id for model_id, _ in await list_models(endpoint,
                                                                  connect_timeout=5.0)]
        return None

    try:
        listed = trio.run(ask)
    except ListError as exc:
        return None, str(exc)
    if listed is None:
        return None, f"no model list within {LIST_WAIT:g} s"
    return listed, None


def run_init(options: InitOptions, *, stdout: TextIO | None = None,
             stderr: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Write the starter config; returns the exit status (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    env = os.environ if environ is None else environ
    base_url = options.base_url or env.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
    path = options.path
    shown = inert(path)
    try:
        starter_config(base_url)  # the URL first: nothing is asked of a bad one
    except ValueError as exc:
        print(f"fanout init: {exc}", file=err)
        return 2
    listed: list[str] | None = None
    why: str | None = None
    # An endpoint of yours: its own ids (OpenAI's are the placeholders already).
    asked = (options.base_url or env.get("OPENAI_BASE_URL")) and not os.path.lexists(path)
    if asked:
        listed, why = _listed(base_url, env)
        if listed is not None and not pick_models(listed):
            why = (f"its GET /models lists {len(listed)} model"
                   f"{'s' if len(listed) != 1 else ''}, none of them a chat model")
    text = starter_config(base_url, listed)
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
    where = inert(base_url.rstrip("/"))
    picked = pick_models(listed or ())
    if picked:
        names = " and ".join(inert(i) for i in picked)
        print(f"wrote {shown}: the endpoint {where}, {names} (of the {len(listed or ())} "
              f"models it lists), a scorer. Next: `fanout compare \"hi\"{flag}`", file=out)
    elif asked:
        print(f"fanout init: the endpoint gave no model ids, so the file has placeholders "
              f"(gpt-4o-mini, gpt-4o) that it may not serve: {why}", file=err)
        print(f"wrote {shown}: the endpoint {where}, two placeholder models, a scorer. Next: "
              f"put two of the endpoint's model ids in the file (`fanout models{flag}` lists "
              f"them once it answers); then `fanout compare \"hi\"{flag}`", file=out)
    else:
        print(f"wrote {shown}: the endpoint {where}, two models, a scorer. Next: "
              f"`fanout models{flag}` lists the endpoint's model ids (put two of them in "
              f"the file), then `fanout compare \"hi\"{flag}`", file=out)
    return 0
