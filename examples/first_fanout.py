"""One prompt to four models at once, against the embedded upstream: no key, no network.

    python examples/first_fanout.py

The library underneath `fanout compare`, with no terminal UI: events as they
arrive, then one result per stream.
"""

from __future__ import annotations

import trio

import fanout
from fanout.upstream import open_upstream

MODELS = ["mock/slow", "mock/reasoning", "fault/truncate", "fault/heartbeat-stall:6"]
PROMPT = [{"role": "user", "content": "Tell me about rivers."}]


async def main() -> None:
    async with open_upstream() as upstream:
        endpoint = fanout.Endpoint(upstream.base_url, "sk-demo")
        requests = [fanout.StreamRequest(m, m, PROMPT, {"max_tokens": 60}) for m in MODELS]
        deadlines = fanout.Deadlines(idle=1.0, total=10)
        print(f"embedded upstream at {upstream.base_url}; one prompt, {len(MODELS)} models at once")
        start = trio.current_time()
        async with fanout.open_fanout(endpoint, requests, deadlines=deadlines) as fan:
            async for event in fan.events:
                elapsed = f"{(trio.current_time() - start) * 1000:6.0f} ms"
                if isinstance(event, fanout.StreamStarted):
                    print(f"{elapsed}  {event.stream:24} started (HTTP {event.status})")
                elif isinstance(event, fanout.StreamFinished):
                    print(f"{elapsed}  {event.stream:24} finished: {event.result.outcome}")
    print()
    for key in MODELS:
        result = fan.results[key]
        choice = result.choices[0] if result.choices else None
        ttft = result.timings.ttft if result.timings else None
        print(f"{key}: {result.outcome}"
              + (f" ({result.timed_out} deadline)" if result.timed_out else "")
              + f", finish_reason={choice.finish_reason if choice else None}"
              + (f", TTFT {ttft * 1000:.0f} ms" if ttft is not None else ""))
        if choice and choice.reasoning:
            print(f"    reasoning: {len(choice.reasoning)} chars")
        print(f"    text: {result.text[:70]!r}{'...' if len(result.text) > 70 else ''}")
        if result.error:
            print(f"    error: {result.error.message!r}")  # untrusted text: never raw


if __name__ == "__main__":
    trio.run(main)
