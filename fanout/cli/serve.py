"""``fanout serve``: the fan-out as an HTTP service, and the comparison page.

Prints the base URL on stdout (one line, so a script can read the port when
``--port 0`` was asked), a note on stderr, and serves until Ctrl-C or
SIGTERM.  SIGTERM (what a process manager sends) drains: new fan-outs get 503
(with ``Retry-After``; ``/healthz`` answers 503 too), the running ones get
``--grace`` seconds (``[serve] grace``, default 20) to finish, then those left
are cancelled.  Ctrl-C, or a second signal while draining, cancels them at
once (each stream still ends with its result, each response with its summary).
The command then exits 0.  A Ctrl-C after that exits at once (130).  Exit
status 2 for bad usage or config, 1 when the address cannot be bound.
"""

from __future__ import annotations

import logging
import math
import signal
import sys
from collections.abc import Mapping
from functools import partial
from typing import TYPE_CHECKING, TextIO

import attrs
import trio

from .._exceptions import ConfigError
from ..config import load_config
from .common import environment_note, open_endpoint
from .common import only as _only
from .render import inert

if TYPE_CHECKING:
    from ..serve import Service

__all__ = ["ServeOptions", "run_serve"]

EXIT_INTERRUPTED = 130


@attrs.frozen
class ServeOptions:
    config: str | None = None
    host: str | None = None
    port: int | None = None
    grace: float | None = None  # over [serve] grace


def run_serve(options: ServeOptions, *, stdout: TextIO | None = None,
              stderr: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Serve until stopped; returns the exit status (see the module docstring)."""
    try:
        from ..serve import ServiceKeys, is_loopback, open_service, serve_app
    except ImportError as exc:  # pragma: no cover - the serve extra is missing
        print(f"fanout serve: needs the serve extra (pip install 'fanout[serve]'): {exc}",
              file=stderr or sys.stderr)
        return 2
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    note = environment_note(options.config, environ)
    if note is not None:
        print(f"fanout serve: {inert(note)}", file=err)
    try:
        config = load_config(options.config, environ=environ)
        endpoint = config.endpoint(environ)
        keys = ServiceKeys.from_env(config.serve.keys_env, environ, config.source)
    except ConfigError as exc:
        print(f"fanout serve: {exc}", file=err)
        return 2
    if options.grace is not None:
        if not (math.isfinite(options.grace) and options.grace >= 0):
            print(f"fanout serve: --grace: {options.grace} is not a number of seconds >= 0",
                  file=err)
            return 2
        config = attrs.evolve(config, serve=attrs.evolve(config.serve, grace=options.grace))
    grace = config.serve.grace
    host = options.host or config.serve.host
    port = config.serve.port if options.port is None else options.port
    if not 0 <= port <= 65535:
        print(f"fanout serve: --port: {port} is not a port number (0..65535)", file=err)
        return 2
    if not keys and not is_loopback(host):
        print(f"fanout serve: refusing to listen on {host}: without service keys only "
              "loopback is served; set [serve] keys_env to a variable holding the keys",
              file=err)
        return 2
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("fanout serve: %(message)s"))
    log = logging.getLogger("fanout.serve")
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False

    def cancelled(running: int) -> None:
        print(f"fanout serve: stopping: {running} running fan-out"
              f"{'' if running == 1 else 's'} cancelled (each stream ends with its "
              "result)", file=err, flush=True)

    async def stop_on_signal(service: Service) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            first = await signals.__anext__()
            if first == signal.SIGINT or not grace or not service.fanouts:
                cancelled(service.shutdown())
                return
            running = len(service.fanouts)
            print(f"fanout serve: stopping: new fan-outs refused (503); {running} running "
                  f"fan-out{'' if running == 1 else 's'} may finish within {grace:g} s (a "
                  "second Ctrl-C or SIGTERM cancels them)", file=err, flush=True)

            async def again() -> None:
                async for _ in signals:
                    cancelled(service.shutdown())
                    return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(again)
                left = await service.drain(grace)
                nursery.cancel_scope.cancel()
            if left:
                print(f"fanout serve: stopping: the grace ran out; {left} running fan-out"
                      f"{'' if left == 1 else 's'} cancelled (each stream ends with its "
                      "result)", file=err, flush=True)
            elif not service.fanouts:
                print("fanout serve: stopping: every running fan-out finished", file=err,
                      flush=True)

    async def main() -> None:
        async with open_endpoint(endpoint) as resolved, \
                open_service(config, resolved, keys=keys) as service, \
                trio.open_nursery() as nursery:
            if port:
                service.bound(port)  # named before a health check can arrive
            url: str = await nursery.start(partial(
                serve_app, service, host, port,
                shutdown_trigger=partial(stop_on_signal, service)))
            service.bound(int(url.rsplit(":", 1)[1]))  # --port 0: the port just bound
            print(f"{url}/", file=out, flush=True)
            upstream = "the embedded upstream" if config.embedded else resolved.base_url
            listed = "" if config.embedded else " (and those its GET /models lists)"
            print(f"fanout serve: {len(config.models)} models from {config.source}{listed} via "
                  f"{upstream}; service keys {'required' if keys else 'not required'}; "
                  f"replica {service.replica}; Ctrl-C stops", file=err, flush=True)

    try:
        trio.run(main)
    except BaseException as exc:
        if _only(exc, KeyboardInterrupt):
            return EXIT_INTERRUPTED
        error = _only(exc, OSError)
        if isinstance(error, OSError):
            print(f"fanout serve: cannot listen on {host}:{port}: {error.strerror or error}",
                  file=err)
            return 1
        raise
    finally:
        log.removeHandler(handler)
    return 0
