"""``fanout``: the command line (``compare``, ``batch``, ``score``, ``report``, ``merge``,
``serve``, ``mock``, ``models``, ``init``).

Only this package imports rich: the library itself never draws anything.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import trio

from .. import __version__
from ..batch.options import EXIT_TABLE
from ..core import COMPILED
from ..upstream.capture import PACKAGED_CAPTURES, Capture, find_captures
from ..upstream.catalog import MODELS
from ..upstream.fragment import MODES, Fragmenter
from ..upstream.server import MODELS_FAULTS, RunningUpstream, serve_upstream
from .common import only as _only
from .common import silence_stdout

__all__ = ["main"]


class _TableEpilog(argparse.HelpFormatter):
    """Wraps the description as usual; the exit-status table stays a table."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text == EXIT_TABLE:
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class _Parser(argparse.ArgumentParser):
    """argparse, with a typo'd option said where it happened: the subcommand's usage and
    error (not the top level's), and ``did you mean --model?`` when one of the
    subcommand's options is close."""

    _seen: list[str] | None = None

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        self._seen = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                   namespace: argparse.Namespace | None = None) -> argparse.Namespace:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # The subcommand left them: its usage and its options say what was meant.
            sub = self._command(getattr(parsed, "command", None)) or self
            sub.error(f"unrecognized arguments: {' '.join(extras)}", extras)
        return parsed

    def _command(self, name: str | None) -> _Parser | None:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and name in action.choices:
                found = action.choices[name]
                return found if isinstance(found, _Parser) else None
        return None

    def error(self, message: str, words: Sequence[str] | None = None) -> NoReturn:
        super().error(message + self._did_you_mean(self._seen or [] if words is None
                                                   else words))

    def _did_you_mean(self, words: Sequence[str]) -> str:
        """`` (did you mean --model?)`` for the first word that looks like an option this
        parser does not have and is close to one it has; else ``""``."""
        options = [o for action in self._actions for o in action.option_strings
                   if o.startswith("--")]
        for word in words:
            if word == "--":
                break
            flag = word.split("=", 1)[0]
            if not flag.startswith("--") or flag in options or flag in self._option_string_actions:
                continue
            close = difflib.get_close_matches(flag, options, n=1, cutoff=0.6)
            if close:
                return f" (did you mean {close[0]}?)"
        return ""


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fanout", description=(
        "Stream chat completions from many models at once, through one endpoint and one key."))
    core = "compiled with mypyc" if COMPILED else "pure Python"
    parser.add_argument("--version", action="version",
                        version=f"fanout {__version__} (core: {core})")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    compare = commands.add_parser(
        "compare", help="one prompt, several models, side by side as they stream",
        description="Send one prompt to several models at once through one endpoint and "
                    "watch their answers stream side by side. Exit status: 0 when every "
                    "stream completed with an answer, 1 otherwise (stderr says why, per "
                    "stream), 2 for bad usage, 130 after Ctrl-C.")
    compare.add_argument("prompt", metavar="PROMPT",
                         help="the prompt; - reads standard input, @FILE reads a file")
    compare.add_argument("-m", "--model", dest="models", action="append", default=[],
                         metavar="NAME", help="a model of the config (repeat; default: the "
                         "config's [compare] models, else all); with a real endpoint, any "
                         "model id it serves (fanout models lists them); with the embedded "
                         "upstream, any of its model ids: mock/..., fault/..., "
                         "replay/<capture> (fanout mock --list shows them)")
    compare.add_argument("--system", metavar="TEXT", help="a system message before the prompt")
    compare.add_argument("--config", metavar="FILE", help="config file (default: ./fanout.toml, "
                         "else the packaged default: the embedded upstream, or "
                         "OPENAI_BASE_URL when it is set)")
    compare.add_argument("--json", action="store_true",
                         help="JSON Lines on stdout: one object per event, one per result")
    compare.add_argument("--no-reasoning", dest="reasoning", action="store_false",
                         help="hide reasoning text")
    compare.add_argument("--tools", metavar="FILE",
                         help="a JSON file with a list of OpenAI tool definitions, sent with "
                              "every request (over the config's tools)")
    compare.add_argument("--full", action="store_true",
                         help="on a terminal, the final screen shows every line of every answer "
                              "(by default blank runs collapse and each column stops at 100 "
                              "lines)")

    batch = commands.add_parser(
        "batch", help="prompts x models x samples into a results file, resumable",
        description="Run every prompt of PROMPTS.jsonl against every model (or each -m), "
                    "K samples each, writing one JSON line per finished stream to RESULTS. "
                    "Running the same command again skips what completed and redoes the "
                    "rest. Streams the server cut while others ran are redone at once, at "
                    "lower concurrency. With --score, each answer is scored as it arrives "
                    "(RESULTS.scores.jsonl). An empty answer is not done unless "
                    "--accept-empty; run again with a new --budget to continue after exit 3.",
        epilog=EXIT_TABLE, formatter_class=_TableEpilog)
    batch.add_argument("prompts", metavar="PROMPTS.jsonl",
                       help='one JSON object a line: {"id": ..., "prompt": "..."} or '
                            '{"id": ..., "messages": [...]}, optional system, params, tools')
    batch.add_argument("-m", "--model", dest="models", action="append", default=[],
                       metavar="NAME", help="a model of the config (repeat; default: the "
                       "config's [batch] models, else all); any model id of a real endpoint "
                       "or of the embedded upstream too")
    batch.add_argument("-o", "--output", required=True, metavar="RESULTS.jsonl",
                       help="results file (appended to; resumed from)")
    batch.add_argument("--samples", type=int, default=1, metavar="K",
                       help="samples per prompt and model (default 1)")
    batch.add_argument("--concurrency", type=int, metavar="N",
                       help="streams in flight (default: the config's [concurrency] max, else 32)")
    batch.add_argument("--per-model-concurrency", type=int, metavar="N",
                       help="streams in flight per model, at most (lowered on 429s, then "
                            "raised back)")
    batch.add_argument("--shard", metavar="I/N",
                       help="run only shard I of N (0-based; a hash of each stream's key); "
                            "the shard takes 1/N of the endpoint's concurrency and of each "
                            "model's, unless --shared-limit")
    batch.add_argument("--shard-concurrency", type=int, metavar="K",
                       help="streams in flight for this shard (default: --concurrency, or "
                            "the config's [concurrency] max, divided by N, at least 1)")
    batch.add_argument("--shared-limit", metavar="URL",
                       help="share the endpoint's and each model's concurrency, and the "
                            "429 back-off, with the other shards through this Redis "
                            "(redis://HOST:PORT/DB; ?lease=SECONDS, default 30) instead of "
                            "taking 1/N (default: $FANOUT_SHARED_LIMIT, else the config's "
                            "[concurrency] shared; off: none)")
    batch.add_argument("--run-id", metavar="ID",
                       help="written as \"run\" in every results and scores record "
                            "(default: the plan's fingerprint)")
    batch.add_argument("--accept-empty", action="store_true",
                       help="count a completed stream with an empty answer as done (by "
                            "default it is counted apart as empty, and redone on resume)")
    batch.add_argument("--retry-failed", action="store_true",
                       help="send again the units whose last record is the same request "
                            "refused as sent (HTTP 4xx but 408/409/429); by default a resume "
                            "skips them, and they stay failed (exit 1)")
    batch.add_argument("--config", metavar="FILE", help="config file (as for compare)")

    batch.add_argument("--score", dest="scorers", action="append", default=[], metavar="NAME",
                       help="score each answer as it arrives with this scorer (repeat): a "
                            "[[scorers]] name of the config, or a builtin (exact, includes, "
                            "numeric, choice, json, finish, tool_call)")
    batch.add_argument("--scores", metavar="FILE",
                       help="the scores file (default: RESULTS.scores.jsonl beside -o)")
    batch.add_argument("--budget", type=float, metavar="USD",
                       help="stop sending when this run's cost (finished streams, judges "
                            "included, plus a bound for those in flight) would pass USD, and "
                            "cancel a stream about to pass it; exit 3 then (every model needs "
                            "a price, and max_tokens or max_output_tokens)")

    score = commands.add_parser(
        "score", help="(re)score a results file into its scores file",
        description="Score the latest answer of every stream of RESULTS.jsonl with each "
                    "--score scorer, into RESULTS.scores.jsonl (or --scores). Sends no model "
                    "request except a judge's. Scores already current (same answer, same "
                    "scorer) are kept, so running it again scores only what is new; "
                    "--rescore scores everything again. After Ctrl-C or SIGTERM no judge is "
                    "sent; those in flight are cancelled; what was scored stays. A unit is "
                    "a score to write; a judge the server refuses as sent (HTTP 4xx) fails "
                    "for good (1), any other judge failure or a write error is left (75).",
        epilog=EXIT_TABLE, formatter_class=_TableEpilog)
    score.add_argument("results", metavar="RESULTS.jsonl")
    score.add_argument("--score", dest="scorers", action="append", default=[], metavar="NAME",
                       required=True, help="a [[scorers]] name of the config or a builtin "
                       "(repeat)")
    score.add_argument("--scores", metavar="FILE",
                       help="the scores file (default: RESULTS.scores.jsonl)")
    score.add_argument("--prompts", metavar="PROMPTS.jsonl",
                       help="take expected, category, tags and messages from this prompts "
                            "file, by prompt id (over the results records')")
    score.add_argument("--config", metavar="FILE", help="config file (as for compare)")
    score.add_argument("--rescore", action="store_true",
                       help="score again what is already current")

    report = commands.add_parser(
        "report", help="per-model summary of a results file, and its evaluation",
        description="Summarize a results file of fanout batch, per model: outcomes, TTFT, "
                    "tokens/s, tokens, 429s, cost. The latest record of each stream counts "
                    "(a redo of the same run that failed with no output never replaces "
                    "one that kept some). "
                    "With scores (RESULTS.scores.jsonl beside it, or --scores): each scorer's "
                    "mean and pass rate with 95% intervals, pass@k, pass^k and flaky prompts "
                    "over samples; --against compares two runs key by key. Exit status: 0 "
                    "with a report, 1 when the file holds no record, 2 for a file that cannot "
                    "be read or is not a results (or scores) file, or bad usage.")
    report.add_argument("results", metavar="RESULTS.jsonl")
    report.add_argument("--json", action="store_true", help="JSON instead of tables")
    report.add_argument("--scores", metavar="FILE",
                        help="the scores file (default: RESULTS.scores.jsonl, when it exists)")
    report.add_argument("--by", choices=("category", "tag"),
                        help="scores per model and prompt category (or tag)")
    report.add_argument("--samples", type=int, metavar="K",
                        help="the k of pass@k and pass^k (default: the most samples a prompt "
                             "has)")
    report.add_argument("--interval", choices=("bootstrap", "analytic"), default="bootstrap",
                        help="95%% intervals: bootstrap over prompts (default; 10,000 "
                             "resamples, seed 13), or analytic (Wilson, normal)")
    report.add_argument("--against", metavar="B.jsonl",
                        help="compare with another run's results (the baseline), key by key")
    report.add_argument("--against-scores", metavar="FILE",
                        help="the baseline's scores (default: B.scores.jsonl)")
    report.add_argument("--html", metavar="OUT.html",
                        help="also write the report as one self-contained HTML file")
    report.add_argument("--prompts", metavar="PROMPTS.jsonl",
                        help="take expected, category, tags and messages from this prompts "
                             "file, by prompt id (as fanout score --prompts scored them)")
    report.add_argument("--against-prompts", metavar="PROMPTS.jsonl",
                        help="the same for the baseline")
    from .report import add_watch_arguments

    add_watch_arguments(report)

    from .merge import add_parser as add_merge

    add_merge(commands)

    serve = commands.add_parser(
        "serve", help="the fan-out as an HTTP service, and a comparison page",
        description="Serve POST /v1/fanout (one request, many models, one merged stream), "
                    "POST /v1/chat/completions (one model, passed through), GET /v1/models, "
                    "/v1/status, /healthz and the comparison page at /. Prints the base URL; "
                    "serves until Ctrl-C or SIGTERM (SIGTERM refuses new fan-outs and lets the "
                    "running ones finish within --grace; Ctrl-C cancels them, each stream "
                    "ends with its result), then exits 0. Binding anything but "
                    "loopback needs service keys ([serve] keys_env).")
    serve.add_argument("--config", metavar="FILE", help="config file (as for compare)")
    serve.add_argument("--grace", type=float, metavar="SECONDS",
                       help="on SIGTERM, how long running fan-outs may finish before they "
                            "are cancelled; new ones get 503 meanwhile (default: [serve] "
                            "grace, else 20; 0: cancel at once)")
    serve.add_argument("--host", help="address to bind (default: [serve] host, else 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: [serve] port, else 8080; 0: "
                       "any free one)")

    models = commands.add_parser(
        "models", help="the model ids the endpoint offers (its GET /models)",
        description="List the model ids the endpoint's GET /models offers, one a line, "
                    "sorted (owned_by beside each when given); any of them works with -m. "
                    "Exit status: 0 with a list, 1 when the endpoint gives none (stderr says "
                    "why), 2 for a bad config.")
    models.add_argument("--config", metavar="FILE", help="config file (as for compare)")

    init = commands.add_parser(
        "init", help="write a commented starter config for a real endpoint",
        description="Write a commented starter config (the endpoint, where the key comes "
                    "from, deadlines, two models: two ids the endpoint's GET /models lists, "
                    "else placeholders, a scorer, [batch] models) to PATH. Never "
                    "overwrites: anything at PATH (a file, a link) is left as it is. Exit "
                    "status: 0 written, 2 otherwise.")
    init.add_argument("path", metavar="PATH", nargs="?", default="fanout.toml",
                      help="where (default: ./fanout.toml, which every command reads)")
    init.add_argument("--base-url", metavar="URL",
                      help="the endpoint's base URL (default: OPENAI_BASE_URL, else "
                           "https://api.openai.com/v1)")

    mock = commands.add_parser(
        "mock", help="serve the embedded OpenAI-compatible upstream",
        description="Serve the embedded upstream: scripted models, faults and capture "
                    "replay, on POST /v1/chat/completions, /v1/responses and /v1/messages "
                    "(every model on all three unless --list says otherwise). Prints its base "
                    "URL, serves until Ctrl-C.")
    mock.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    mock.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    mock.add_argument("--key", help="require this bearer key (x-api-key on /v1/messages; "
                      "401 otherwise)")
    mock.add_argument("--cadence", type=float, metavar="SECONDS",
                      help="seconds between chunks for every model (default: per model)")
    mock.add_argument("--fragment", default="auto",
                      help=f"how writes are cut: {', '.join(MODES)} (random:SEED)")
    mock.add_argument("--captures", type=Path, action="append", default=[], metavar="DIR",
                      help="also serve the captures in DIR as replay/<name>")
    mock.add_argument("--models-fault", choices=sorted(MODELS_FAULTS), metavar="FAULT",
                      help="GET /v1/models fails instead of listing the models: "
                           + "; ".join(f"{name}: {what}" for name, what in MODELS_FAULTS.items()))
    mock.add_argument("--list", action="store_true", help="list the models and exit")
    return parser


def _mock(args: argparse.Namespace) -> int:
    if args.list:
        from .render import hanging

        # at word boundaries, to the terminal's width (80 columns when it is no terminal)
        width = shutil.get_terminal_size((80, 24)).columns
        for spec in MODELS.values():
            routes = f" [{spec.routes} only]" if spec.routes else ""
            print(*hanging(spec.id, f"{spec.description}{routes}", width=width, indent=27),
                  sep="\n")
        print(*hanging("replay/<capture>", "a recorded stream with its timing (:x0 = no "
                       "delays; on /v1/responses and /v1/messages a chat capture is said in "
                       "their events):", width=width, indent=27), sep="\n")
        for name, path in sorted(find_captures([PACKAGED_CAPTURES, *args.captures]).items()):
            capture = Capture.load(path)
            print(*hanging(f"  replay/{name}", f"HTTP {capture.status}, "
                           f"{len(capture.body):,} bytes", width=width, indent=39), sep="\n")
        return 0
    try:
        Fragmenter(args.fragment)
    except ValueError as exc:
        print(f"fanout mock: --fragment: {exc}", file=sys.stderr)
        return 2
    if args.cadence is not None and args.cadence < 0:
        print(f"fanout mock: --cadence: {args.cadence} is negative", file=sys.stderr)
        return 2
    for directory in args.captures:
        if not directory.is_dir():
            print(f"fanout mock: --captures: {directory} is not a directory", file=sys.stderr)
            return 2
    if not _is_loopback(args.host):
        print(f"fanout mock: warning: binding {args.host}, not loopback: anyone who can "
              "reach this machine can use it", file=sys.stderr)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_stop_on_sigterm, nursery.cancel_scope)
            running: RunningUpstream = await nursery.start(partial(
                serve_upstream, args.host, args.port, key=args.key, cadence=args.cadence,
                fragment=args.fragment, captures=[PACKAGED_CAPTURES, *args.captures],
                models_fault=args.models_fault))
            print(running.base_url, flush=True)
            print(f"fanout mock: {len(MODELS)} models and the captures as replay/<name>, on "
                  "/chat/completions, /responses and /messages; "
                  f"key {'required' if args.key else 'not required'}; Ctrl-C stops",
                  file=sys.stderr, flush=True)

    try:
        trio.run(run)
    except BaseException as exc:
        if _only(exc, KeyboardInterrupt):
            return 0  # Ctrl-C is how a server is stopped
        error = _only(exc, OSError)
        if isinstance(error, OSError):
            print(f"fanout mock: cannot listen on {args.host}:{args.port}: "
                  f"{error.strerror or error}", file=sys.stderr)
            return 1
        raise
    return 0


def _compare(args: argparse.Namespace) -> int:
    from .compare import CompareOptions, UsageError, read_prompt, run_compare

    try:
        prompt = read_prompt(args.prompt)
    except UsageError as exc:
        print(f"fanout compare: {exc}", file=sys.stderr)
        return 2
    return run_compare(CompareOptions(
        prompt=prompt, models=tuple(args.models), system=args.system, config=args.config,
        json=args.json, reasoning=args.reasoning, tools=args.tools, full=args.full))


def _serve(args: argparse.Namespace) -> int:
    from .serve import ServeOptions, run_serve

    return run_serve(ServeOptions(config=args.config, host=args.host, port=args.port,
                                  grace=args.grace))


def _batch(args: argparse.Namespace) -> int:
    from ..store.results import parse_shard
    from .batch import BatchOptions, run_batch

    shard = None
    if args.shard is not None:
        try:
            shard = parse_shard(args.shard)
        except ValueError as exc:
            print(f"fanout batch: {exc}", file=sys.stderr)
            return 2
    return run_batch(BatchOptions(
        prompts=args.prompts, output=args.output, models=tuple(args.models),
        samples=args.samples, concurrency=args.concurrency,
        per_model_concurrency=args.per_model_concurrency, shard=shard,
        shard_concurrency=args.shard_concurrency, shared_limit=args.shared_limit,
        run_id=args.run_id, config=args.config,
        accept_empty=args.accept_empty, scorers=tuple(args.scorers), scores=args.scores,
        budget=args.budget, retry_failed=args.retry_failed))


def _score(args: argparse.Namespace) -> int:
    from .score import ScoreOptions, run_score

    return run_score(ScoreOptions(
        results=args.results, scorers=tuple(args.scorers), scores=args.scores,
        prompts=args.prompts, config=args.config, rescore=args.rescore))


async def _stop_on_sigterm(scope: trio.CancelScope) -> None:
    # SIGTERM (what process managers send) stops the server as cleanly as Ctrl-C.
    with trio.open_signal_receiver(signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: The exit status after Ctrl-C (128 + SIGINT, what a shell reports for it).
EXIT_INTERRUPTED = 130


def main(argv: Sequence[str] | None = None, *,
         restore_sigint: Callable[[int, Any], Any] | None = None) -> int:
    """Run the command line; returns the exit status (1, quietly, when the reader of
    stdout went away: ``fanout mock --list | head``; 130 after a Ctrl-C no command
    handled itself: one line, never a traceback).

    ``restore_sigint``: the SIGINT handler to put back once this function handles
    ``KeyboardInterrupt`` (the console script's entry point, ``_fanout_entry``,
    installs its own while the package imports).
    """
    command = "fanout"
    try:
        if restore_sigint is not None:
            signal.signal(signal.SIGINT, restore_sigint)
        args = _parser().parse_args(argv)
        command = f"fanout {args.command}"
        try:
            return _run(args)
        except BrokenPipeError:
            silence_stdout()
            return 1
    except BaseException as exc:
        if not _only(exc, KeyboardInterrupt):
            raise
        # What was written stays (every command writes whole lines or replaces files
        # whole); nothing more is done.
        print(f"{command}: interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(args: argparse.Namespace) -> int:
    if args.command == "mock":
        return _mock(args)
    if args.command == "compare":
        return _compare(args)
    if args.command == "batch":
        return _batch(args)
    if args.command == "serve":
        return _serve(args)
    if args.command == "score":
        return _score(args)
    if args.command == "merge":
        from .merge import run_merge

        return run_merge(args)
    if args.command == "models":
        from .models import ModelsOptions, run_models

        return run_models(ModelsOptions(config=args.config))
    if args.command == "init":
        from .init import InitOptions, run_init

        return run_init(InitOptions(path=args.path, base_url=args.base_url))
    if args.command == "report" and args.watch:
        from .report import watch

        return watch([args.results], every=args.every, max_updates=args.max_updates,
                     prompts=args.prompts, config=args.config)
    if args.command == "report":
        from .report import report

        return report(args.results, as_json=args.json, scores=args.scores, by=args.by,
                      samples=args.samples, against=args.against,
                      against_scores=args.against_scores, html=args.html,
                      interval=args.interval, prompts=args.prompts,
                      against_prompts=args.against_prompts)
    raise AssertionError(f"unhandled command {args.command!r}")  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
