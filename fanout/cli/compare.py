"""``fanout compare``: one prompt, several models, their answers side by side as they stream.

Three outputs: the live view (a terminal), labelled blocks and a summary
(anything else), JSON Lines (``--json``).  Every stream that did not complete
shows its one-line reason; a completed one shows its flags.  Exit status: 0
when every stream completed and none with an empty answer, 1 otherwise (one
line per stream on stderr says why), 2 for bad usage or config, 130 after
Ctrl-C.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TextIO

import attrs
import trio
from rich.console import Console
from rich.live import Live
from rich.text import Text

from .._exceptions import ConfigError
from ..config import Config, ModelConfig, load_config, read_tools
from ..core.events import Event
from ..core.result import Flag, Outcome
from ..fanout import Fanout, open_fanout
from ..records import dumps
from ..request import Endpoint
from .common import (
    environment_note,
    interrupt_on_sigint,
    open_endpoint,
    silence_stdout,
    text_console,
)
from .common import only as _only
from .records import event_record
from .render import Column, CompareView, cut_advice, cut_line, inert, summary_table

__all__ = ["CompareOptions", "read_prompt",
           "run_compare"]

#: Live redraws per second: on a timer, never once per chunk.
FPS = 15
EXIT_INTERRUPTED = 130
#: How often, while a stream waits for its slot, compare looks whether it got it: the
#: live TTFT counts from then, as the engine's counts from the request being sent.
SLOT_POLL = 0.001

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class UsageError(Exception):
    """A bad argument: one line, exit status 2."""


@attrs.frozen
class CompareOptions:
    prompt: str
    models: tuple[str, ...] = ()
    system: str | None = None
    config: str | None = None
    json: bool = False
    reasoning: bool = True
    full: bool = False  # the final screen shows every line (no cap, no collapsed blanks)
    tools: str | None = None  # a JSON file of tool definitions, sent with every request


def read_prompt(argument: str, stdin: TextIO | None = None) -> str:
    """``PROMPT`` as given, ``-`` for standard input, ``@FILE`` for a file's text."""
    if argument == "-":
        text = (stdin or sys.stdin).read()
        where = "standard input"
    elif argument.startswith("@") and len(argument) > 1:
        path = Path(argument[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"PROMPT {argument}: no such file") from None
        except UnicodeDecodeError:
            raise UsageError(f"PROMPT {argument}: not UTF-8 text") from None
        except OSError as exc:
            raise UsageError(f"PROMPT {argument}: cannot read: {exc.strerror or exc}") from None
        where = str(path)
    else:
        text, where = argument, "PROMPT"
    if not text.strip():
        raise UsageError(f"{where}: the prompt is empty")
    return text


def run_compare(options: CompareOptions, *, console: Console | None = None,
                stdout: TextIO | None = None, stderr: TextIO | None = None,
                environ: dict[str, str] | None = None) -> int:
    """Run one comparison; returns the exit status (see the module docstring)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    for what, text in (("PROMPT", options.prompt), ("--system", options.system or "")):
        if _LONE_SURROGATE.search(text):
            # From bytes that are not UTF-8 on the command line: nothing can send them.
            print(f"fanout compare: {what}: not UTF-8 text", file=err)
            return 2
    note = environment_note(options.config, environ)
    if note is not None:
        print(f"fanout compare: {inert(note)}", file=err)
    try:
        config = load_config(options.config, environ=environ)
        models = config.select(options.models, default=config.compare, environ=environ)
        endpoint = config.endpoint(environ)
        tools = read_tools(options.tools) if options.tools is not None else None
    except ConfigError as exc:
        for line in str(exc).splitlines() or [""]:  # one problem a line, each prefixed
            print(f"fanout compare: {inert(line)}", file=err)
        return 2
    messages: list[dict[str, Any]] = []
    if options.system:
        messages.append({"role": "system", "content": options.system})
    messages.append({"role": "user", "content": options.prompt})
    if console is None:
        console = text_console(out, wide=True)  # off a terminal: the summary is never folded
    session = _Session(config, models, messages, options, console, out, tools)
    try:
        trio.run(session.run, endpoint)
    except BaseException as exc:
        if _only(exc, BrokenPipeError):
            silence_stdout()  # the reader went away (`| head`)
            return 1
        if _only(exc, KeyboardInterrupt):
            return EXIT_INTERRUPTED  # a second Ctrl-C: out at once
        raise
    if session.interrupted:
        return EXIT_INTERRUPTED
    failed = False
    for line in problems(session.columns):
        print(f"fanout compare: {line}", file=err)
        failed = True
    return 1 if failed else 0


def problems(columns: Sequence[Column]) -> list[str]:
    """One line per stream that did not complete (its status and reason), per empty
    answer, and per stream the server cut while others ran (what to do about it).
    Any line but the cut advice of a completed stream fails the run; a cut always
    comes with one of the others."""
    lines = []
    for column in columns:
        key, result = inert(column.key), column.result
        if result is None:  # pragma: no cover (every stream ends with a result)
            lines.append(f"{key}: no result")
            continue
        if result.outcome != Outcome.COMPLETED:
            reason = result.reason or column.error or ""
            lines.append(f"{key}: {column.status}"
                         + (f": {cut_line(inert(reason), 300)}" if reason else ""))
        elif Flag.EMPTY_ANSWER in result.flags:
            finish = ",".join(r or "none" for r in column.finish_reasons()) or "none"
            lines.append(f"{key}: completed (finish {cut_line(inert(finish), 60)}), but the "
                         "answer is empty: no text, reasoning, refusal or tool call")
        else:
            continue
        if column.cut_while_others_ran:
            advice = cut_advice(column.cut_while_others_ran, column.cut_kind)
            lines.append(f"{key}: {advice}")
    return lines


class _Session:
    def __init__(self, config: Config, models: Sequence[ModelConfig],
                 messages: list[dict[str, Any]], options: CompareOptions,
                 console: Console, out: TextIO,
                 tools: tuple[Mapping[str, Any], ...] | None = None) -> None:
        self.config = config
        self.tools = tools
        self.models = models
        self.messages = messages
        self.options = options
        self.console = console
        self.out = out
        self.columns: list[Column] = []
        self.by_key: dict[str, Column] = {}
        self.interrupted = False

    async def run(self, endpoint: Endpoint | None) -> None:
        async with open_endpoint(endpoint) as resolved:
            requests = [self.config.request(m.name, m, self.messages, tools=self.tools_for(m))
                        for m in self.models]
            now = trio.current_time()
            self.columns = [Column(m.name, m.id if m.api == "chat" else f"{m.api}: {m.id}",
                                   started=now, expected_choices=_choices(m))
                            for m in self.models]
            self.by_key = {c.key: c for c in self.columns}
            async with open_fanout(
                    resolved, requests, max_concurrency=self.config.max_concurrency,
                    per_model_concurrency=self.config.per_model_caps(self.models),
                    deadlines=self.config.deadlines, strict=self.config.strict) as fan, \
                    trio.open_nursery() as nursery:
                # Time queued counts from here: the client is built, the streams start.
                for column in self.columns:
                    column.started = trio.current_time()
                nursery.start_soon(interrupt_on_sigint, partial(self._interrupt, fan))
                nursery.start_soon(self._watch_slots, fan)
                if self.options.json:
                    await self._consume(fan, self._json_line(trio.current_time()))
                elif self.console.is_terminal:
                    await self._live(fan)
                else:
                    await self._consume(fan)
                    self._final(trio.current_time(), blocks=True)
                nursery.cancel_scope.cancel()

    def tools_for(self, model: ModelConfig) -> tuple[Mapping[str, Any], ...] | None:
        """What a model's requests send as ``tools``: ``--tools``, else the model's own,
        else ``[compare] tools``."""
        for tools in (self.tools, model.tools, self.config.compare_tools):
            if tools is not None:
                return tools
        return None

    def _interrupt(self, fan: Fanout) -> None:
        # Ctrl-C: cancel every stream, keep what arrived, show it.
        self.interrupted = True
        fan.cancel_all()

    async def _watch_slots(self, fan: Fanout) -> None:
        """Note when each stream leaves the queue (its request goes out then), until
        every one has: the live TTFT and time count from there, as the engine's do."""
        while True:
            self._slots_taken(fan)
            if all(column.sent is not None or column.done for column in self.columns):
                return
            await trio.sleep(SLOT_POLL)

    def _slots_taken(self, fan: Fanout) -> None:
        queued, now = fan.queued, trio.current_time()
        for column in self.columns:
            if column.key not in queued:
                column.slot_taken(now)

    def _json_line(self, start: float) -> Callable[[Event, float], None]:
        def write(event: Event, now: float) -> None:
            record = event_record(event)
            record["t"] = round(now - start, 6)
            # dumps: every control, bidi control and lone surrogate escaped.
            self.out.write(dumps(record) + "\n")
            self.out.flush()
        return write

    async def _live(self, fan: Fanout) -> None:
        view = CompareView(self.columns, reasoning=self.options.reasoning)
        console = self.console
        with Live(console=console, auto_refresh=False, transient=True,
                  redirect_stdout=False, redirect_stderr=False,
                  vertical_overflow="crop") as live:
            async with trio.open_nursery() as nursery:
                async def redraw() -> None:
                    while True:
                        self._slots_taken(fan)
                        live.update(view.live(console, trio.current_time()), refresh=True)
                        await trio.sleep(1 / FPS)

                nursery.start_soon(redraw)
                await self._consume(fan)
                nursery.cancel_scope.cancel()
        self._final(trio.current_time(), blocks=False)

    async def _consume(self, fan: Fanout,
                       also: Callable[[Event, float], None] | None = None) -> None:
        """Fold every event into its column (the exit status reads them), and ``also``."""
        async for event in fan.events:
            now = trio.current_time()
            self.by_key[event.stream].apply(event, now)
            if also is not None:
                also(event, now)

    def _final(self, now: float, *, blocks: bool) -> None:
        console = self.console
        view = CompareView(self.columns, reasoning=self.options.reasoning,
                           full=self.options.full)
        if blocks:
            for column in self.columns:
                # soft_wrap: the text goes out as the model wrote it, unwrapped.
                console.print(view.header(column, now, one_line=True), soft_wrap=True)
                console.print(view.body(column, plain=True), soft_wrap=True)
                console.print()
            console.print(summary_table(self.columns, now))
        else:
            console.print(view.final(console, now))
            console.print(summary_table(self.columns, now, width=console.width))
        if self.interrupted:
            console.print(Text(interrupted_line(self.columns), style="bold yellow"))


def interrupted_line(columns: Sequence[Column]) -> str:
    """After Ctrl-C: which streams were cancelled, and which had finished before."""
    cancelled = [inert(c.key) for c in columns if c.status == "cancelled"]
    finished = [f"{inert(c.key)}: {c.status}" for c in columns if c.status != "cancelled"]
    if not finished:
        return (f"interrupted (Ctrl-C): every stream was cancelled ({', '.join(cancelled)}); what "
                "arrived is shown above")
    return (f"interrupted (Ctrl-C): {len(cancelled)} cancelled ({', '.join(cancelled) or 'none'}), "
            f"{len(finished)} had finished ({', '.join(finished)}); what arrived is shown "
            "above")


def _choices(model: ModelConfig) -> int:
    n = model.params.get("n", 1)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 1


