"""A long-running worker: one fan-out open for as long as jobs come, memory flat.

    python examples/worker.py                    # 2,000 jobs through the embedded upstream
    python examples/worker.py --jobs 20000 --concurrency 64
    OPENAI_API_KEY=sk-... python examples/worker.py --base-url https://relay.example/v1 \\
        --model gpt-4o

Jobs arrive on a bounded trio memory channel (in a real worker: from a queue, a
database, a socket).  ``run_worker`` takes them while it has room, submits each to
one ``open_fanout(accept_more=True)``, hands every result to your ``handle`` exactly
once and forgets it, so the fan-out's memory stays flat however long it runs.

Shutting down: close the jobs channel to drain (every job in it runs), or set
``stop`` (the demo does on SIGTERM): no more jobs are taken, the streams in flight
get ``grace`` seconds to finish, then they are cancelled; every one of them still
reaches ``handle`` (``cancelled``, with its partial output).
"""

from __future__ import annotations

import argparse
import os
import signal
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

import fanout
from fanout.upstream import open_upstream


@dataclass(frozen=True)
class Job:
    id: str  # the stream key: unique among the jobs in flight
    model: str
    prompt: str
    max_tokens: int = 200


Handler = Callable[[Job, fanout.StreamResult], Awaitable[None]]


async def run_worker(endpoint: fanout.Endpoint, jobs: trio.MemoryReceiveChannel[Job],
                     handle: Handler, *, concurrency: int = 32, backlog: int = 8,
                     stop: trio.Event | None = None, grace: float = 30.0,
                     task_status: trio.TaskStatus[fanout.Fanout] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """Run ``jobs`` until the channel is closed and drained, or until ``stop`` is set.

    At most ``concurrency`` streams run at once, and ``backlog`` more wait for
    a slot (so a slot that frees is taken at once).  ``task_status.started``
    gets the ``Fanout`` (for a health check: ``fan.running``, ``fan.queued``).
    """
    stop = stop if stop is not None else trio.Event()
    # Submitted and not yet handled.  ``submit`` already waits while ``max_queued``
    # streams wait for a slot; taking a place here *before* taking a job adds that a
    # stop never strands a job taken off the channel and not yet submitted.
    room = trio.Semaphore(concurrency + backlog)
    submitted: dict[str, Job] = {}
    intake = trio.CancelScope()  # cancelled by a stop: take no more jobs

    async with trio.open_nursery() as nursery:
        async with fanout.open_fanout(endpoint, accept_more=True,
                                      max_concurrency=concurrency) as fan:
            task_status.started(fan)

            async def take_jobs() -> None:
                with intake:
                    while True:
                        await room.acquire()
                        try:
                            # A stop lands here or in acquire(): never between
                            # taking a job and submitting it, so no job is lost.
                            job = await jobs.receive()
                        except trio.EndOfChannel:
                            break
                        submitted[job.id] = job
                        await fan.submit(fanout.StreamRequest(
                            job.id, job.model, [{"role": "user", "content": job.prompt}],
                            {"max_tokens": job.max_tokens}))
                # Drained or stopped: ``fan.events`` ends once the streams in flight end.
                fan.seal()

            async def shut_down() -> None:
                await stop.wait()
                intake.cancel()  # the jobs not taken stay in the channel
                await trio.sleep(grace)
                fan.cancel_all("cancelled: the worker is shutting down")

            nursery.start_soon(take_jobs)
            nursery.start_soon(shut_down)
            async for event in fan.events:
                if isinstance(event, fanout.StreamFinished):  # exactly one per stream
                    job = submitted.pop(event.stream)
                    fan.forget(event.stream)  # else fan.results keeps every result
                    room.release()
                    await handle(job, event.result)
        nursery.cancel_scope.cancel()  # shut_down, still waiting for a stop


@asynccontextmanager
async def endpoint_for(base_url: str | None) -> AsyncIterator[fanout.Endpoint]:
    """The relay at ``base_url`` (key: ``$OPENAI_API_KEY``), else the embedded upstream."""
    if base_url:
        yield fanout.Endpoint(base_url, os.environ.get("OPENAI_API_KEY"))
    else:
        async with open_upstream() as upstream:
            yield fanout.Endpoint(upstream.base_url)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("OPENAI_BASE_URL"),
                        help="a real relay (default: $OPENAI_BASE_URL, else the embedded one)")
    parser.add_argument("--model", default="mock/fast")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    outcomes: Counter[str] = Counter()
    stop = trio.Event()

    async def handle(job: Job, result: fanout.StreamResult) -> None:
        outcomes[str(result.outcome)] += 1  # a real worker stores the result, acks the job, ...
        if sum(outcomes.values()) % 500 == 0:
            print(f"{sum(outcomes.values())} handled: {dict(outcomes)}")

    async def produce(send: trio.MemorySendChannel[Job]) -> None:
        async with send:  # closing it tells the worker: drain, then stop
            for number in range(args.jobs):
                # Waits while the channel is full: the producer runs at the worker's pace.
                await send.send(Job(f"job-{number}", args.model, f"Question {number}?", 20))

    async def on_sigterm() -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async for _ in signals:
                print("SIGTERM: no more jobs; the streams in flight get 10 s to finish")
                stop.set()

    async with endpoint_for(args.base_url) as endpoint, trio.open_nursery() as nursery:
        send, receive = trio.open_memory_channel[Job](args.concurrency)
        nursery.start_soon(produce, send)
        nursery.start_soon(on_sigterm)
        start = trio.current_time()
        await run_worker(endpoint, receive, handle, concurrency=args.concurrency, stop=stop,
                         grace=10.0)
        elapsed = trio.current_time() - start
        nursery.cancel_scope.cancel()
    total = sum(outcomes.values())
    print(f"{total} jobs in {elapsed:.1f}s ({total / elapsed:.0f}/s): {dict(outcomes)}")


if __name__ == "__main__":
    trio.run(main)
