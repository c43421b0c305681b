"""The public API as a typed trio app uses it: mypy --strict accepts it."""

from __future__ import annotations

from pathlib import Path

from mypy import api

USER_CODE = '''
import trio
import fanout
import fanout.records

async def main() -> None:
    endpoint = fanout.Endpoint("http://127.0.0.1:1/v1", "k", {"X-Title": "t"})
    ask = [{"role": "user", "content": "hi"}]
    requests = [fanout.StreamRequest(m, m, ask, {"max_tokens": 5},
                                     tools=[{"type": "function"}]) for m in ("a", "b")]
    retry = fanout.RetryPolicy(statuses={429})
    deadlines = fanout.Deadlines(idle=1, total=2.5)
    async with fanout.open_fanout(endpoint, requests, retry=retry, deadlines=deadlines,
                                  per_model_concurrency={"a": 1}) as fan:
        events: fanout.EventChannel[fanout.Event] = fan.events
        async for event in events:
            if isinstance(event, fanout.TextDelta):
                text: str = event.text
            elif isinstance(event, fanout.StreamFinished):
                result: fanout.StreamResult = event.result
                ttft: float | None = result.timings.ttft if result.timings else None
            if isinstance(event, fanout.ContentEvent):
                choice: int = event.choice  # every content event has one
            if isinstance(event, fanout.CONTENT_EVENTS):
                same: int = event.choice
            match event:
                case fanout.TextDelta() | fanout.ReasoningDelta():
                    piece: str = event.text
                case _:
                    pass
            record: dict[str, object] = fanout.records.event_record(event)
    async with fanout.open_fanout(endpoint, accept_more=True, max_queued=16) as more:
        handle: fanout.StreamHandle = await more.submit(requests[0])
        snapshot: fanout.StreamSnapshot = handle.snapshot()
        state: str = snapshot.state
        waited: fanout.StreamResult = await more.wait("a")
        cancelled: list[str] = more.cancel_where(lambda r: "t" in r.tags)
        more.seal()
    results: dict[str, fanout.StreamResult] = await fanout.run_fanout(
        endpoint, requests, max_concurrency=4, deadlines=deadlines, seed=1)
    flags: tuple[fanout.Flag, ...] = results["a"].flags
    reason: str | None = results["a"].reason
    outcome: fanout.Outcome = results["a"].outcome
    config: fanout.Config = fanout.load_config()
    model: fanout.ModelConfig = config.model("fast")
    parsed: fanout.StreamResult = fanout.parse_stream([b"data: [DONE]\\n\\n"])

trio.run(main)
'''


def test_typed_user_code_passes_mypy_strict(tmp_path: Path) -> None:
    source = tmp_path / "user.py"
    source.write_text(USER_CODE)
    out, err, status = api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path),
                                str(source)])
    assert status == 0, out + err


MISSPELT = '''
import fanout

async def main(endpoint: fanout.Endpoint) -> None:
    await fanout.run_fanout(endpoint, [], max_concurency=4)
'''


def test_a_misspelt_run_fanout_option_is_a_type_error(tmp_path: Path) -> None:
    source = tmp_path / "misspelt.py"
    source.write_text(MISSPELT)
    out, _err, status = api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path),
                                str(source)])
    assert status == 1
    assert 'Unexpected keyword argument "max_concurency"' in out, out


def test_the_installed_package_is_found_by_mypy_outside_the_checkout(tmp_path: Path) -> None:
    # `pip install -e .` must leave a plain path a type checker follows (hatchling's .pth),
    # not an import hook: run mypy from elsewhere, as a user's project would.
    import subprocess
    import sys

    source = tmp_path / "elsewhere.py"
    source.write_text("import fanout\n\noutcome: fanout.Outcome = fanout.Outcome.COMPLETED\n")
    out = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                          "--cache-dir", str(tmp_path / "cache"), str(source)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
