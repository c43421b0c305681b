"""The garbage collector: ``fanout.tune_gc``, the ``fanout`` command's use of it, and
what it rests on: a stream that ended, however it ended, leaves no reference cycle
behind (its objects go when it ends, not at the next full collection).

Each runs in a process of its own: the collector's settings are the whole process's.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import trio

import fanout
from fanout.upstream.server import RunningUpstream

SETTINGS = """
import gc, json
print(json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def run_python(code: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=60)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_tune_gc_freezes_what_is_there_and_raises_the_young_threshold() -> None:
    got = run_python("import gc, json, fanout\n"
                     "before = gc.get_threshold()\n"
                     "previous = fanout.tune_gc()\n"
                     "print(json.dumps({'before': before, 'previous': previous,\n"
                     "  'threshold': gc.get_threshold(), 'frozen': gc.get_freeze_count(),\n"
                     "  'custom': (fanout.tune_gc(1234), gc.get_threshold())}))")
    assert got["previous"] == got["before"]
    before = got["before"]
    assert isinstance(before, list)
    assert got["threshold"] == [fanout._gc.YOUNG_THRESHOLD, before[1], before[2]]
    assert isinstance(got["frozen"], int) and got["frozen"] > 10_000  # the imported modules
    assert got["custom"] == [got["threshold"], [1234, before[1], before[2]]]


@pytest.mark.parametrize("young", [0, -1, 1.5, True, "700"])
def test_tune_gc_refuses_a_threshold_that_is_not_a_positive_whole_number(young: object) -> None:
    with pytest.raises(ValueError, match="young must be a whole number >= 1"):
        fanout.tune_gc(young)  # type: ignore[arg-type]


def test_the_fanout_command_sets_the_collector_when_it_starts() -> None:
    # The console script's entry point, with the command line replaced by a probe.
    got = run_python(
        "import gc, json, sys\n"
        "import fanout.cli.main\n"
        "def probe(argv=None, *, restore_sigint=None):\n"
        "    print(json.dumps({'threshold': gc.get_threshold(),\n"
        "                      'frozen': gc.get_freeze_count()}))\n"
        "    return 0\n"
        "fanout.cli.main.main = probe\n"
        "import _fanout_entry\n"
        "sys.exit(_fanout_entry.main())")
    threshold = got["threshold"]
    assert isinstance(threshold, list) and threshold[0] == fanout._gc.YOUNG_THRESHOLD
    assert isinstance(got["frozen"], int) and got["frozen"] > 10_000
    # ... and a library import alone changes nothing.
    untouched = run_python("import fanout, fanout.cli.main\n" + SETTINGS)
    assert untouched["frozen"] == 0
    assert untouched["threshold"] != threshold


# Streams ending every way an end is reached; what they left for the collector is counted
# with it off (``DEBUG_SAVEALL`` keeps what a collection would free), each fan-out kept
# (its results and its own structure stay while it is in use).
CLIENT = """
import gc, json, sys
import trio, fanout

base_url = sys.argv[1]
CASES = {
    "completed": ("mock/fast", "chat", {}),
    "tool calls": ("mock/tools", "chat", {}),
    "responses": ("mock/tools", "responses", {}),
    "anthropic": ("mock/tools", "anthropic", {}),
    "truncated": ("fault/truncate:12", "chat", {}),
    "no [DONE]": ("fault/no-done", "chat", {}),
    "retried 500": ("fault/500-then-ok", "chat", {}),
    "http error": ("fault/400", "chat", {}),
    "error event": ("fault/error-event", "chat", {}),
    "stale connection": ("fault/close-after-response", "chat", {}),
    "timed out": ("fault/stall", "chat", {"deadlines": fanout.Deadlines(idle=0.2)}),
    "cancelled": ("mock/slow", "chat", {"cancel": True}),
}


async def one(model, api, options):
    endpoint = fanout.Endpoint(base_url, "sk-gc-test", {"x-fanout-tokens": "30"}, api=api)
    cancel = options.pop("cancel", False)
    requests = [fanout.StreamRequest(f"s{i}", model, [{"role": "user", "content": "hi"}])
                for i in range(4)]
    async with fanout.open_fanout(endpoint, requests, **options) as fan:
        async for event in fan.events:
            if cancel and isinstance(event, fanout.TextDelta):
                fan.cancel(event.stream)
    return fan


gc.collect()
gc.disable()
gc.set_debug(gc.DEBUG_SAVEALL)
found = {}
kept = []  # each fan-out stays reachable: what is left is what its streams dropped
for name, (model, api, options) in CASES.items():
    fan = trio.run(one, model, api, dict(options))
    kept.append(fan)
    outcomes = sorted({r.outcome.value for r in fan.results.values()})
    gc.collect()
    found[name] = {"outcomes": outcomes, "garbage": sorted({type(o).__qualname__
                                                            for o in gc.garbage})}
    gc.garbage.clear()
print(json.dumps(found))
"""


async def test_a_stream_leaves_no_reference_cycle_however_it_ends(
        upstream: RunningUpstream) -> None:
    done = await trio.run_process([sys.executable, "-c", CLIENT, upstream.base_url],
                                  capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    found = json.loads(done.stdout.decode().strip().splitlines()[-1])
    # The cases did end as their names say ...
    assert found["completed"]["outcomes"] == ["completed"]
    assert found["truncated"]["outcomes"] == ["truncated"]
    assert found["timed out"]["outcomes"] == ["timed_out"]
    assert found["cancelled"]["outcomes"] == ["cancelled"]
    assert found["http error"]["outcomes"] == ["error"]
    # ... and none left garbage that only the cycle collector would free.
    left = {name: case["garbage"] for name, case in found.items() if case["garbage"]}
    assert left == {}, json.dumps(found, indent=1)
