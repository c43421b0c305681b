"""Config files: which endpoint, which models, which deadlines.

A config is TOML (read with the stdlib ``tomllib``)::

    [endpoint]
    base_url = "https://relay.example/v1"   # or "embedded": the in-process upstream
    api_key_env = "RELAY_API_KEY"           # the *name* of the variable holding the key
    headers = { "X-Title" = "fanout" }
    require_finish_reason = true            # false: [DONE] alone completes a stream
    api = "chat"                            # or "responses", "anthropic": the dialect

    [deadlines]                             # seconds, or false to disable one;
    connect = 10                            # unset ones keep fanout's defaults
    first_token = 60
    idle = 30
    total = 300

    [concurrency]
    max = 64                                # streams in flight
    per_model = 8                           # per model id
    shared = "redis://10.0.0.5:6379/0"      # fanout batch --shard: limits shared by shards

    [parser]
    strict = false

    [compare]
    models = ["fast", "thinker"]            # what ``fanout compare`` runs without -m

    [serve]                                 # ``fanout serve`` (all optional)
    keys_env = "FANOUT_SERVICE_KEYS"        # the *name* of a variable: client tokens, a,b,c
    host = "127.0.0.1"
    port = 8080
    cors_origins = ["https://app.example"]  # CORS off unless listed
    max_body_bytes = 1048576                # one request's body
    max_streams = 32                        # models x samples (x n) in one request
    max_fanouts = 64                        # fan-outs running at once (429 past it)
    retry_after = 1                         # seconds, in a 429's Retry-After
    keepalive = 15                          # seconds of silence before a ": keep-alive"
    replica = "eu-1"                        # names this replica (its fan-out ids, headers);
                                            # default: host name and port, "web1-8080"
    head_timeout = 10                       # seconds for a request's head (then 408, closed)
    body_timeout = 10                       # seconds for its body, plus 1 s per body_min_rate
    body_min_rate = 1000                    #   bytes received
    max_reading_connections = 256           # connections read at once (past it: the oldest closed)
    grace = 20                              # seconds SIGTERM lets running fan-outs finish (0: none)

    [[models]]
    name = "fast"                           # what -m and the results call it
    id = "gpt-4o-mini"                      # what the relay calls it
    params = { temperature = 0.2, max_tokens = 400 }
    deadlines = { first_token = 20 }        # over [deadlines]
    concurrency = 4                         # over [concurrency] per_model
    api = "responses"                       # over [endpoint] api
    price = { input = 0.15, output = 0.60, cached_input = 0.075 }  # USD per 1M tokens
    max_output_tokens = 4096                # not sent: bounds its cost for --budget

    [[scorers]]                             # ``--score NAME`` (fanout score, batch)
    name = "exact-ci"                       # unique
    kind = "exact"                          # one of fanout.eval.scorers.KINDS
    ignore_case = true                      # every other key is the kind's option

    [[scorers]]
    name = "judged"
    kind = "judge"
    model = "fast"                          # a [[models]] name: the judge
    concurrency = 4                         # judge streams in flight (default 4)
    deadlines = { total = 60 }              # over the judge model's own

Every key is checked: a typo, a wrong type, a negative deadline or a key
variable that is not set is a ``ConfigError`` with one line naming the file
and the key.  So is a parameter the model's dialect does not have
(``n`` for an ``api = "anthropic"`` model, ...: see ``fanout.bodies``).
Without ``base_url``, ``OPENAI_BASE_URL`` is used; without ``api_key_env``,
``OPENAI_API_KEY`` (if set).  On such a real endpoint, ``-m`` takes any model
id without a ``[[models]]`` entry (``Config.model``); an entry adds a name,
params, a price and a dialect.  The key itself never goes in
a config file, and no error ever prints a variable's value.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, final

import attrs

from ._exceptions import ConfigError
from .bodies import APIS, refused_param
from .eval.cost import Price
from .request import Deadlines, Endpoint, StreamRequest
from .sharedlimit.base import spec_problem

if TYPE_CHECKING:
    from .eval.scorers import Scorer

__all__ = ["DEFAULT_CONFIG", "EMBEDDED", "ENVIRONMENT_SOURCE", "REPLICA_NAME", "Config",
           "ModelConfig", "ScorerConfig", "ServeConfig", "check_tools", "find_config",
           "load_config", "parse_config", "read_tools"]

#: ``base_url = "embedded"``: start the embedded upstream in-process (no key, no network).
EMBEDDED = "embedded"

#: The default config, inside the package (so it is there after ``pip install``, from any
#: folder): the embedded upstream and the models and scorers the README's examples use.
#: The checkout's ``config/default.toml`` is the same file (a test keeps them identical).
DEFAULT_CONFIG = Path(__file__).resolve().parent / "data" / "default.toml"

_DEADLINES = ("connect", "first_byte", "first_token", "idle", "total")
# Request parameters people put next to ``id`` instead of under ``params``.
_PARAM_NAMES = frozenset({
    "temperature", "top_p", "max_tokens", "max_completion_tokens", "seed", "stop", "n",
    "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "reasoning_effort",
    "response_format", "tool_choice", "parallel_tool_calls", "user",
})
_RESERVED_PARAMS = ("model", "messages", "stream", "tools")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
#: A model id taken as it is on a real endpoint: printable, no spaces, at most 256.
_AD_HOC_ID = re.compile(r"[!-~\u00a0-\U0010ffff]{1,256}\Z")
# A browser origin as it sends it: scheme://host[:port], a bracketed IPv6 host allowed.
#: ``[serve] replica``: safe in a URL path, a fan-out id and a load balancer's config.
REPLICA_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}\Z")
_ORIGIN = re.compile(r"https?://([A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?\Z")


@final
@attrs.frozen
class ModelConfig:
    """One ``[[models]]`` entry: ``name`` (ours) for ``id`` (the relay's), with its params."""

    name: str
    id: str
    params: Mapping[str, Any] = attrs.field(factory=dict)
    deadlines: Deadlines | None = None
    concurrency: int | None = None
    #: The deadlines this model's table set (``None``: disabled), over ``[deadlines]``.
    deadline_overrides: Mapping[str, float | None] = attrs.field(factory=dict, repr=False)
    #: OpenAI tool definitions sent with this model's requests (``None``: none).
    tools: tuple[Mapping[str, Any], ...] | None = None
    #: USD per million tokens (``None``: no price; a cost is then known only when the
    #: relay reports one).
    price: Price | None = None
    #: The dialect of its requests: its own ``api``, else ``[endpoint] api``, else chat.
    api: str = "chat"
    #: At most how many tokens it writes in one answer when a request sets no
    #: ``max_tokens`` (not sent; ``--budget`` bounds its cost with it; ``None``: unknown).
    max_output_tokens: int | None = None


#: A judge's own concurrency when its ``[[scorers]]`` entry sets none.
JUDGE_CONCURRENCY = 4


@final
@attrs.frozen
class ScorerConfig:
    """One ``[[scorers]]`` entry, checked and built: ``scorer`` (what
    ``fanout.eval.scorers.make_scorer`` made of ``kind`` and ``options``); for a
    judge, ``concurrency`` (its streams in flight) and ``deadlines`` (over its
    model's)."""

    name: str
    kind: str
    options: Mapping[str, Any]
    scorer: Scorer
    concurrency: int = JUDGE_CONCURRENCY
    deadline_overrides: Mapping[str, float | None] = attrs.field(factory=dict)


@final
@attrs.frozen
class ServeConfig:
    """The ``[serve]`` table: how ``fanout serve`` listens and what it allows.

    ``keys_env`` names the environment variable holding the service's client
    tokens (comma-separated); ``None``: no keys, and then the service binds
    only loopback.  ``cors_origins``: the origins a browser may call from
    (none: CORS off).  The limits bound one request (``max_body_bytes``,
    ``max_streams`` = models x samples x n) and the service
    (``max_fanouts`` running at once; past it a 429 with ``retry_after``).
    ``keepalive``: seconds without data before an SSE comment is sent.
    ``replica``: this process's name among replicas behind a load balancer
    (``REPLICA_NAME``: letters, digits, ``_``, ``-``; at most 63); ``None``: the
    host name and the port.

    Reading a request is bounded (``fanout.serve.reading``): its head must be whole
    within ``head_timeout`` seconds of the connection opening (or of the previous
    response's end on a kept-alive connection); its body gets ``body_timeout``
    seconds plus one more for every ``body_min_rate`` bytes received.  Past either,
    the connection is closed (after a 408 when some of the request arrived and no
    response was started).  At most ``max_reading_connections`` connections are
    read at once (waiting for or reading a head or body): one more closes the one
    read the longest.

    ``grace``: on SIGTERM, new fan-outs are refused (503) and the running ones get
    this many seconds to finish before they are cancelled (0: cancelled at once).
    """

    keys_env: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = 1024 * 1024
    max_streams: int = 32
    max_fanouts: int = 64
    retry_after: int = 1
    keepalive: float = 15.0
    replica: str | None = None
    head_timeout: float = 10.0
    body_timeout: float = 10.0
    body_min_rate: int = 1000
    max_reading_connections: int = 256
    grace: float = 20.0


@final
@attrs.frozen
class Config:
    """A whole config file, checked.  ``source`` names where it came from."""

    source: str
    base_url: str | None = None
    api_key_env: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    models: tuple[ModelConfig, ...] = ()
    compare: tuple[str, ...] = ()
    deadlines: Deadlines = attrs.field(factory=Deadlines)
    max_concurrency: int | None = None
    per_model_concurrency: int | None = None
    #: ``[concurrency] shared``: the limit the shards of a batch share (``redis://...``,
    #: ``ray://``; see ``fanout.sharedlimit``).
    shared_limit: str | None = None
    strict: bool = False
    require_finish_reason: bool = True
    #: What ``fanout batch`` runs without ``-m`` (``[batch] models``; empty: every model).
    batch: tuple[str, ...] = ()
    #: ``[compare] tools``: sent with every compare request that has none of its own.
    compare_tools: tuple[Mapping[str, Any], ...] | None = None
    serve: ServeConfig = attrs.field(factory=ServeConfig)
    #: ``[[scorers]]``, in order.
    scorers: tuple[ScorerConfig, ...] = ()
    #: ``[endpoint] api``: the dialect of models that do not set their own.
    api: str = "chat"

    @property
    def embedded(self) -> bool:
        """True when the endpoint is the in-process embedded upstream."""
        return self.base_url == EMBEDDED

    def real_endpoint(self, environ: Mapping[str, str] | None = None) -> bool:
        """True when the endpoint is a server of yours (``[endpoint] base_url``, else
        ``OPENAI_BASE_URL``), not the embedded upstream (nor none at all)."""
        env = os.environ if environ is None else environ
        base_url = self.base_url or env.get("OPENAI_BASE_URL") or None
        return base_url is not None and base_url != EMBEDDED

    def model(self, name: str, *, environ: Mapping[str, str] | None = None) -> ModelConfig:
        """The model called ``name`` (or, failing that, with id ``name``: that entry's
        settings under the name typed, which is what columns and records show).

        Without such an entry: on a real endpoint (``real_endpoint(environ)``), any
        model id, sent as it is (its name is its id; its dialect ``[endpoint] api``);
        on the embedded upstream, any of its model ids; else ``ConfigError`` naming
        the known models (and the closest one).
        """
        entry = self._entry(name)
        if entry is not None:
            # Found by its id: shown and recorded as typed (`-m fault/truncate` is
            # "fault/truncate", never the entry's name), with the entry's settings.
            return entry if entry.name == name else attrs.evolve(entry, name=name)
        if self.embedded and _is_embedded_model(name):
            return ModelConfig(name=name, id=name, api=self.api)  # any embedded model, ad hoc
        if _AD_HOC_ID.match(name) and self.real_endpoint(environ):
            return ModelConfig(name=name, id=name, api=self.api)  # any id of the endpoint's
        known = ", ".join(m.name for m in self.models) or "none"
        hint = _did_you_mean(name, [m.name for m in self.models])
        raise ConfigError(f"{self.source}: no model named {_kind(name)}{hint} (known: {known})")

    def _entry(self, name: str) -> ModelConfig | None:
        """The ``[[models]]`` entry called ``name``, else the first whose id it is."""
        return next((m for m in self.models if m.name == name), None) or next(
            (m for m in self.models if m.id == name), None)

    def select(self, names: Iterable[str] = (), *, default: Iterable[str] = (),
               environ: Mapping[str, str] | None = None) -> tuple[ModelConfig, ...]:
        """The models ``names`` ask for (see ``model``); without names, ``default``,
        else all of them."""
        wanted = list(names) or list(default) or [m.name for m in self.models]
        if not wanted:
            if self.real_endpoint(environ):
                raise ConfigError(f"{self.source}: no model to run: give -m ID (any model "
                                  "id of the endpoint; `fanout models` lists them)")
            raise ConfigError(f"{self.source}: no [[models]] to run")
        chosen: list[ModelConfig] = []
        entries: list[ModelConfig] = []
        for name in wanted:
            model = self.model(name, environ=environ)
            entry = self._entry(name)
            if any(c.name == model.name for c in chosen) or (
                    entry is not None and any(e is entry for e in entries)):
                also = f" (it is {entry.name!r})" if entry is not None and \
                    entry.name != model.name else ""
                raise ConfigError(f"model {model.name!r} is asked for twice{also}")
            chosen.append(model)
            if entry is not None:
                entries.append(entry)
        return tuple(chosen)

    def deadlines_for(self, model: ModelConfig) -> Deadlines:
        """``[deadlines]`` with the model's own deadlines over them, key by key."""
        if not model.deadline_overrides:
            return self.deadlines
        return attrs.evolve(self.deadlines, **model.deadline_overrides)

    def request(self, key: str, model: ModelConfig, messages: Sequence[Mapping[str, Any]], *,
                params: Mapping[str, Any] | None = None,
                tools: Sequence[Mapping[str, Any]] | None = None) -> StreamRequest:
        """The stream ``model`` runs for ``messages``, as every front end sends it
        (``compare``, ``batch``, ``serve``'s two routes): ``params`` over the model's
        own params (its ``tool_choice`` too), ``tools`` instead of the model's own
        (none or empty: the model's ``tools``), its deadlines over ``[deadlines]``, its
        dialect.  ``ValueError`` from ``StreamRequest``'s checks."""
        return StreamRequest(key, model.id, messages, {**model.params, **(params or {})},
                             deadlines=self.deadlines_for(model),
                             tools=tools or model.tools, api=model.api)

    def scorer(self, name: str) -> ScorerConfig | None:
        """The ``[[scorers]]`` entry called ``name``, if any."""
        return next((s for s in self.scorers if s.name == name), None)

    def per_model_caps(self, models: Iterable[ModelConfig]) -> dict[str, int] | int | None:
        """``per_model_concurrency`` for ``open_fanout``: model id -> cap."""
        caps = {m.id: m.concurrency for m in models if m.concurrency is not None}
        if not caps:
            return self.per_model_concurrency
        if self.per_model_concurrency is not None:
            for model in models:
                caps.setdefault(model.id, self.per_model_concurrency)
        return caps

    def endpoint(self, environ: Mapping[str, str] | None = None) -> Endpoint | None:
        """The ``Endpoint`` to stream from; ``None`` for the embedded upstream.

        Reads the key from the variable ``api_key_env`` names (else
        ``OPENAI_API_KEY``); the base URL falls back to ``OPENAI_BASE_URL``.
        """
        env = os.environ if environ is None else environ
        base_url = self.base_url or env.get("OPENAI_BASE_URL") or None
        if base_url is None:
            raise ConfigError(f"{self.source}: no endpoint: set [endpoint] base_url, "
                              "or OPENAI_BASE_URL in the environment")
        if base_url == EMBEDDED:
            return None
        where = "[endpoint] base_url" if self.base_url else "OPENAI_BASE_URL"
        _check_url(base_url, f"{self.source}: {where}")
        if self.api_key_env is not None:
            key = env.get(self.api_key_env)
            if not key:
                raise ConfigError(f"{self.source}: [endpoint] api_key_env: the variable "
                                  f"{self.api_key_env} is not set (or empty)")
        else:
            key = env.get("OPENAI_API_KEY") or None
        return Endpoint(base_url, key, dict(self.headers),
                        require_finish_reason=self.require_finish_reason, api=self.api,
                        key_env=(self.api_key_env or "OPENAI_API_KEY") if key else None)


def find_config(explicit: str | os.PathLike[str] | None = None,
                cwd: str | os.PathLike[str] | None = None) -> Path:
    """The config file to use: ``explicit``, else ``./fanout.toml``, else the
    packaged default (``DEFAULT_CONFIG``)."""
    if explicit is not None:
        return Path(explicit)
    local = Path(cwd if cwd is not None else ".") / "fanout.toml"
    if local.is_file():
        return local
    return DEFAULT_CONFIG


#: ``Config.source`` of the packaged default given over to ``OPENAI_BASE_URL``.
ENVIRONMENT_SOURCE = "OPENAI_BASE_URL (no config file)"


def load_config(path: str | os.PathLike[str] | None = None, *,
                cwd: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Config:
    """Find (see ``find_config``), read and check a config; ``ConfigError`` if it is wrong.

    The packaged default is the embedded upstream's, unless ``OPENAI_BASE_URL`` is set
    (in ``environ``, else ``os.environ``): no config file was chosen, so that endpoint
    is the one, with any model id for ``-m`` and none of the default's models (they
    are the embedded upstream's) nor its judges; its deadlines, concurrency and other
    scorers stay.  A config file that names its ``base_url`` always wins.
    """
    found = find_config(path, cwd)
    config = parse_config(_read_text(found, "config"), str(found))
    env = os.environ if environ is None else environ
    if found == DEFAULT_CONFIG and env.get("OPENAI_BASE_URL"):
        return attrs.evolve(config, source=ENVIRONMENT_SOURCE, base_url=None, models=(),
                            compare=(), batch=(), compare_tools=None,
                            scorers=tuple(s for s in config.scorers if s.kind != "judge"))
    return config


def _read_text(path: Path, what: str) -> str:
    """A file's UTF-8 text; ``ConfigError`` with one line naming it and the OS's reason."""
    try:
        return path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what} file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a {what} file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None


def parse_config(text: str, source: str = "<config>") -> Config:
    """Check the TOML ``text``; ``source`` names it in errors."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    return _Checker(source).config(data)


class _Checker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[str] = []
        self.default_api = "chat"  # [endpoint] api, once read

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {where}: {message}")

    def keys(self, table: Mapping[str, Any], where: str, known: Iterable[str],
             hint: Callable[[str], str] | None = None) -> None:
        known = list(known)
        # Every unknown key, one line each: a file with three typos is fixed in one go.
        lines = [str(self.fail(where, f"unknown key {key!r}"
                               f"{(hint(key) if hint else '') or _did_you_mean(key, known)}"
                               f" (known: {', '.join(known)})"))
                 for key in table if key not in known]
        if lines:
            raise ConfigError("\n".join(lines))

    def table(self, data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise self.fail(name, f"must be a table ([{name}]), not {_kind(value)}")
        return value

    @contextmanager
    def section(self) -> Iterator[None]:
        """Check one part; a mistake there is noted and the rest is still checked."""
        try:
            yield
        except ConfigError as exc:
            self.problems.extend(str(exc).splitlines())

    def config(self, data: Mapping[str, Any]) -> Config:
        """The whole file; every mistake in it is reported, one line each, in one error."""
        base_url = api_key_env = None
        headers: dict[str, str] = {}
        require_finish_reason, strict = True, False
        api = "chat"
        deadlines = Deadlines()
        max_concurrency = per_model = shared_limit = None
        models: list[ModelConfig] = []
        compare_models: list[str] = []
        compare_tools: tuple[Mapping[str, Any], ...] | None = None
        batch_models: list[str] = []
        serve = ServeConfig()
        with self.section():
            self.keys(data, "top level", ("endpoint", "deadlines", "concurrency", "parser",
                                          "compare", "batch", "serve", "models", "scorers"))
        with self.section():
            endpoint = self.table(data, "endpoint")
            self.keys(endpoint, "[endpoint]",
                      ("base_url", "api_key_env", "headers", "require_finish_reason", "api"))
            with self.section():
                api = self.api(endpoint, "[endpoint]") or "chat"
            self.default_api = api
            with self.section():
                require_finish_reason = self.boolean(endpoint, "require_finish_reason",
                                                     "[endpoint]", True)
            with self.section():
                base_url = self.string(endpoint, "base_url", "[endpoint]")
                if base_url is not None and base_url != EMBEDDED:
                    _check_url(base_url, f"{self.source}: [endpoint] base_url")
            with self.section():
                api_key_env = self.string(endpoint, "api_key_env", "[endpoint]")
                if api_key_env is not None and not _ENV_NAME.match(api_key_env):
                    api_key_env = None  # possibly the key itself pasted in: never echo it
                    raise self.fail("[endpoint] api_key_env", "must be the *name* of an "
                                    "environment variable (like RELAY_API_KEY), not the key "
                                    "itself")
            with self.section():
                headers = self.headers(endpoint.get("headers", {}))
        with self.section():
            deadlines = Deadlines(**self.deadlines(self.table(data, "deadlines"),
                                                   "[deadlines]"))
        with self.section():
            concurrency = self.table(data, "concurrency")
            self.keys(concurrency, "[concurrency]", ("max", "per_model", "shared"))
            with self.section():
                max_concurrency = self.count(concurrency, "max", "[concurrency]")
            with self.section():
                per_model = self.count(concurrency, "per_model", "[concurrency]")
            with self.section():
                shared_limit = self.string(concurrency, "shared", "[concurrency]")
                problem = spec_problem(shared_limit) if shared_limit is not None else None
                if problem is not None:
                    shared_limit = None
                    raise self.fail("[concurrency] shared", problem)
        with self.section():
            parser = self.table(data, "parser")
            self.keys(parser, "[parser]", ("strict",))
            strict = self.boolean(parser, "strict", "[parser]", False)
        with self.section():
            raw_models = data.get("models", [])
            if not isinstance(raw_models, list):
                raise self.fail("models", "must be an array of tables ([[models]])")
            for number, raw in enumerate(raw_models, 1):
                with self.section():
                    model = self.model(raw, number)
                    if any(m.name == model.name for m in models):
                        raise self.fail("[[models]]", f"the name {model.name!r} is used twice")
                    models.append(model)
        names = [m.name for m in models]
        with self.section():
            compare = self.table(data, "compare")
            self.keys(compare, "[compare]", ("models", "tools"))
            with self.section():
                compare_models = self.model_names(compare, "[compare] models", names)
            with self.section():
                compare_tools = self.tools(compare.get("tools"), "[compare] tools")
        with self.section():
            batch = self.table(data, "batch")
            self.keys(batch, "[batch]", ("models",))
            batch_models = self.model_names(batch, "[batch] models", names)
        with self.section():
            serve = self.serve(self.table(data, "serve"))
        scorers: list[ScorerConfig] = []
        with self.section():
            raw_scorers = data.get("scorers", [])
            if not isinstance(raw_scorers, list):
                raise self.fail("scorers", "must be an array of tables ([[scorers]])")
            for number, raw in enumerate(raw_scorers, 1):
                with self.section():
                    scorer = self.scorer(raw, number, models)
                    if any(s.name == scorer.name for s in scorers):
                        raise self.fail(f"scorers[{number}]",
                                        f"the name {scorer.name!r} is used twice")
                    scorers.append(scorer)
        if self.problems:
            raise ConfigError("\n".join(self.problems))
        return Config(
            source=self.source, base_url=base_url, api_key_env=api_key_env, headers=headers,
            models=tuple(models), compare=tuple(compare_models), deadlines=deadlines,
            max_concurrency=max_concurrency, per_model_concurrency=per_model,
            shared_limit=shared_limit, strict=strict,
            require_finish_reason=require_finish_reason, batch=tuple(batch_models),
            compare_tools=compare_tools, serve=serve, scorers=tuple(scorers), api=api)

    def api(self, table: Mapping[str, Any], where: str) -> str | None:
        """``api``: one of the dialects, or None when the table does not set it."""
        value = table.get("api")
        if value is None:
            return None
        if not isinstance(value, str) or value not in APIS:
            hint = _did_you_mean(value, APIS) if isinstance(value, str) else ""
            raise self.fail(f"{where} api", f"must be one of {', '.join(map(repr, APIS))}, "
                            f"not {_kind(value)}{hint}")
        return value

    def boolean(self, table: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(f"{where} {key}", f"must be true or false, not {_kind(value)}")
        return value

    def model_names(self, table: Mapping[str, Any], where: str, known: list[str]) -> list[str]:
        names = table.get("models", [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise self.fail(where, "must be an array of model names")
        for name in names:
            if name not in known:
                raise self.fail(where, f"no model named {name!r}{_did_you_mean(name, known)} "
                                f"(known: {', '.join(known)})")
        return names

    def tools(self, value: Any, where: str) -> tuple[Mapping[str, Any], ...] | None:
        """``tools``: an array of OpenAI tool definitions, or the path of a JSON file of
        them (relative to the config file)."""
        if value is None:
            return None
        if isinstance(value, str):
            base = Path(self.source).parent if self.source not in ("<config>",) else Path()
            path = base / value
            try:
                return read_tools(path)
            except ConfigError as exc:
                raise self.fail(where, str(exc)) from None
        try:
            return check_tools(value)
        except ValueError as exc:
            raise self.fail(where, str(exc)) from None

    def serve(self, table: Mapping[str, Any]) -> ServeConfig:
        where = "[serve]"
        self.keys(table, where, [field.name for field in attrs.fields(ServeConfig)])
        defaults = ServeConfig()
        keys_env = self.string(table, "keys_env", where)
        if keys_env is not None and not _ENV_NAME.match(keys_env):
            # Possibly a token pasted in: never echo it.
            raise self.fail(f"{where} keys_env", "must be the *name* of an environment "
                            "variable (like FANOUT_SERVICE_KEYS), not the keys themselves")
        host = self.string(table, "host", where) or defaults.host
        port = table.get("port", defaults.port)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise self.fail(f"{where} port", f"must be a port number 0..65535, not {_kind(port)}")
        origins = table.get("cors_origins", [])
        if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
            raise self.fail(f"{where} cors_origins", "must be an array of origins "
                            "(like \"https://app.example\")")
        for origin in origins:
            if not _ORIGIN.match(origin):
                raise self.fail(f"{where} cors_origins", f"{_kind(origin)} is not an origin: "
                                "scheme://host[:port], no path (and no \"*\": list them)")
        keepalive = table.get("keepalive", defaults.keepalive)
        if isinstance(keepalive, bool) or not isinstance(keepalive, int | float) or (
                math.isnan(keepalive) or keepalive <= 0):
            raise self.fail(f"{where} keepalive",
                            f"must be a number of seconds > 0, not {_kind(keepalive)}")

        grace = table.get("grace", defaults.grace)
        if isinstance(grace, bool) or not isinstance(grace, int | float) or (
                not math.isfinite(grace) or grace < 0):
            raise self.fail(f"{where} grace",
                            f"must be a number of seconds >= 0, not {_kind(grace)}")

        replica = table.get("replica")
        if replica is not None and not (isinstance(replica, str) and REPLICA_NAME.match(replica)):
            raise self.fail(f"{where} replica", f"must be 1 to 63 letters, digits, _ or -, not "
                            f"{_kind(replica)} (it goes in fan-out ids and URLs)")

        def seconds(key: str, default: float) -> float:
            value = table.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or (
                    not math.isfinite(value) or value <= 0):
                raise self.fail(f"{where} {key}",
                                f"must be a number of seconds > 0, not {_kind(value)}")
            return float(value)

        def count(key: str, default: int) -> int:
            value = self.count(table, key, where)
            return default if value is None else value

        return ServeConfig(
            keys_env=keys_env, host=host, port=port, cors_origins=tuple(origins),
            max_body_bytes=count("max_body_bytes", defaults.max_body_bytes),
            max_streams=count("max_streams", defaults.max_streams),
            max_fanouts=count("max_fanouts", defaults.max_fanouts),
            retry_after=count("retry_after", defaults.retry_after),
            keepalive=float(keepalive), replica=replica,
            head_timeout=seconds("head_timeout", defaults.head_timeout),
            body_timeout=seconds("body_timeout", defaults.body_timeout),
            body_min_rate=count("body_min_rate", defaults.body_min_rate),
            max_reading_connections=count("max_reading_connections",
                                          defaults.max_reading_connections),
            grace=float(grace))

    def model(self, raw: Any, number: int) -> ModelConfig:
        where = f"[[models]] #{number}"
        if not isinstance(raw, dict):
            raise self.fail(where, f"must be a table, not {_kind(raw)}")
        if isinstance(raw.get("name"), str) and raw["name"]:
            where = f"[[models]] #{number} ({raw['name']})"

        def hint(key: str) -> str:
            return f" (request parameters go under params: params = {{ {key} = ... }})" \
                if key in _PARAM_NAMES else ""

        self.keys(raw, where, ("name", "id", "params", "deadlines", "concurrency", "tools",
                               "price", "api", "max_output_tokens"), hint)
        name = self.string(raw, "name", where, required=True)
        model_id = self.string(raw, "id", where, required=True)
        assert name is not None and model_id is not None
        params = raw.get("params", {})
        if not isinstance(params, dict):
            raise self.fail(f"{where} params", f"must be a table, not {_kind(params)}")
        for reserved in _RESERVED_PARAMS:
            if reserved in params:
                raise self.fail(f"{where} params", f"must not set {reserved!r}: fanout sets it")
        api = self.api(raw, where) or self.default_api
        refused = refused_param(api, params)
        if refused is not None:
            name_, why = refused
            source = "" if "api" in raw else ", from [endpoint] api"
            raise self.fail(f"{where} params", f"{name_!r} is not a parameter of api "
                            f"\"{api}\" ({why}{source})")
        overrides: dict[str, float | None] = {}
        if "deadlines" in raw:
            if not isinstance(raw["deadlines"], dict):
                raise self.fail(f"{where} deadlines",
                                f"must be a table, not {_kind(raw['deadlines'])}")
            overrides = self.deadlines(raw["deadlines"], f"{where} deadlines")
        return ModelConfig(name=name, id=model_id, params=params,
                           deadlines=Deadlines(**overrides) if overrides else None,
                           concurrency=self.count(raw, "concurrency", where),
                           deadline_overrides=overrides,
                           tools=self.tools(raw.get("tools"), f"{where} tools"),
                           price=self.price(raw.get("price"), f"{where} price"), api=api,
                           max_output_tokens=self.count(raw, "max_output_tokens", where))

    def price(self, value: Any, where: str) -> Price | None:
        """``price = { input = 2.50, output = 10.00, cached_input = 1.25 }``: USD per
        million tokens, numbers >= 0; input and output required."""
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(where, "must be a table like { input = 2.50, output = 10.00 } "
                            f"(USD per million tokens), not {_kind(value)}")
        known = ("input", "output", "cached_input")
        unknown = [key for key in value if key not in known]
        if unknown:
            hint = _did_you_mean(unknown[0], known) if len(unknown) == 1 else ""
            raise self.fail(where, f"unknown key{'s' if len(unknown) > 1 else ''} "
                            f"{', '.join(map(repr, unknown))}{hint} (known: {', '.join(known)})")
        missing = [key for key in ("input", "output") if key not in value]
        if missing:
            raise self.fail(where, f"{' and '.join(missing)} missing (USD per million tokens)")
        for key, rate in value.items():
            if isinstance(rate, bool) or not isinstance(rate, int | float) or \
                    not math.isfinite(rate) or rate < 0:
                raise self.fail(f"{where} {key}", "must be a number >= 0 (USD per million "
                                f"tokens), not {_kind(rate)}")
        return Price(float(value["input"]), float(value["output"]),
                     None if value.get("cached_input") is None
                     else float(value["cached_input"]))

    def scorer(self, raw: Any, number: int, models: list[ModelConfig]) -> ScorerConfig:
        """One ``[[scorers]]`` table: ``name``, ``kind``, and the kind's options as the
        other keys; built now, so a bad option is a config problem."""
        from .eval.scorers import KINDS, make_scorer  # only configs with scorers

        where = f"scorers[{number}]"
        if not isinstance(raw, dict):
            raise self.fail(where, f"must be a table, not {_kind(raw)}")
        name = self.string(raw, "name", where, required=True)
        assert name is not None
        where = f"scorers[{number}] (name {name!r})"
        kind = self.string(raw, "kind", where, required=True)
        assert kind is not None
        if kind not in KINDS:
            raise self.fail(f"{where} kind", f"{_kind(kind)} is not a kind of scorer"
                            f"{_did_you_mean(kind, KINDS)} (kinds: {', '.join(KINDS)})")
        options = {key: value for key, value in raw.items() if key not in ("name", "kind")}
        if kind == "judge":
            judge = options.get("model")
            names = [m.name for m in models]
            if isinstance(judge, str) and judge not in names \
                    and not any(m.id == judge for m in models):
                raise self.fail(f"{where} model", f"no model named {judge!r}"
                                f"{_did_you_mean(judge, names)} (known: "
                                f"{', '.join(names) or 'none'}): the judge is a [[models]] entry")
        base = Path(self.source).parent if self.source not in ("<config>",) else None
        try:
            scorer = make_scorer(name, kind, options, base_dir=base)
        except ValueError as exc:
            raise self.fail(where, str(exc)) from None
        if kind != "judge":
            return ScorerConfig(name=name, kind=kind, options=options, scorer=scorer)
        return ScorerConfig(name=name, kind=kind, options=options, scorer=scorer,
                            concurrency=getattr(scorer, "concurrency", None)
                            or JUDGE_CONCURRENCY,
                            deadline_overrides=dict(getattr(scorer, "deadlines", None) or {}))

    def string(self, table: Mapping[str, Any], key: str, where: str, *,
               required: bool = False) -> str | None:
        value = table.get(key)
        if value is None:
            if required:
                raise self.fail(where, f"{key} is missing")
            return None
        if not isinstance(value, str) or not value.strip():
            raise self.fail(f"{where} {key}", f"must be a non-empty string, not {_kind(value)}")
        return value

    def count(self, table: Mapping[str, Any], key: str, where: str) -> int | None:
        value = table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(f"{where} {key}", f"must be a whole number >= 1, not {_kind(value)}")
        return value

    def deadlines(self, table: Mapping[str, Any], where: str) -> dict[str, float | None]:
        """The deadlines a table sets: seconds, or ``false`` to disable one."""
        self.keys(table, where, _DEADLINES)
        checked: dict[str, float | None] = {}
        for key, value in table.items():
            if value is False:
                checked[key] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or (
                    math.isnan(value) or value <= 0):
                raise self.fail(f"{where} {key}", f"must be a number of seconds > 0 (or false "
                                f"to disable it), not {_kind(value)}")
            checked[key] = value
        return checked

    def headers(self, value: Any) -> dict[str, str]:
        where = "[endpoint] headers"
        if not isinstance(value, dict):
            raise self.fail(where, f"must be a table of strings, not {_kind(value)}")
        for name, header in value.items():
            if name.lower() in ("authorization", "x-api-key"):
                raise self.fail(where, f"must not carry {name}: the key never goes in "
                                "a config file; name its variable in api_key_env")
            if not isinstance(header, str):
                raise self.fail(f"{where} {name}", f"must be a string, not {_kind(header)}")
        return dict(value)


def read_tools(path: str | os.PathLike[str]) -> tuple[Mapping[str, Any], ...]:
    """The OpenAI tool definitions in a JSON file (a list), checked; ``ConfigError``
    with one line naming the file and what is wrong."""
    text = _read_text(Path(path), "tools")
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON: {exc}") from None
    try:
        return check_tools(value)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def check_tools(value: Any) -> tuple[Mapping[str, Any], ...]:
    """``value`` as OpenAI tool definitions: a list of ``{"type": "function", "function":
    {"name": ..., "parameters": <a JSON Schema>}}``; ``ValueError`` naming the entry."""
    import jsonschema  # only where tools are used

    if not isinstance(value, list):
        raise ValueError(f"tools must be a list of tool definitions, not {_kind(value)}")
    names: set[str] = set()
    for index, tool in enumerate(value):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise ValueError(f"{where}: must be an object, not {_kind(tool)}")
        if tool.get("type", "function") != "function":
            raise ValueError(f"{where} type: must be \"function\", not {_kind(tool['type'])}")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ValueError(f"{where}: needs a \"function\" object with a name")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ValueError(f"{where} function.name: must be 1-64 letters, digits, _ or -, "
                             f"not {_kind(name)}")
        if name in names:
            raise ValueError(f"{where} function.name: {name!r} is defined twice")
        names.add(name)
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise ValueError(f"{where} function.parameters: must be a JSON Schema object")
        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.exceptions.SchemaError as exc:
            raise ValueError(f"{where} function.parameters: not a valid JSON Schema: "
                             f"{exc.message}") from None
    return tuple(value)


def _check_url(url: str, where: str) -> None:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{where}: must start with http:// or https:// "
                          f"(or be \"{EMBEDDED}\"), not {url[:80]!r}")


def _is_embedded_model(name: str) -> bool:
    from .upstream.catalog import MODELS  # only when the endpoint is the embedded one

    base = name.split("@", 1)[0].split(":", 1)[0]
    return base in MODELS or (base.startswith("replay/") and len(base) > len("replay/"))


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _kind(value: Any) -> str:
    """How an error names a wrong value: short, and never a long string in full."""
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else f"a string of {len(value)} characters"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
