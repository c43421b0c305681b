"""The limits shards share (``fanout.sharedlimit``): the rules, the in-process and Redis
implementations held to one contract against a real ``redis-server`` (started here, on
a free loopback port, no persistence), a shard SIGKILLed while it holds slots, and
``fanout batch --shard I/4`` processes against one ``fanout mock`` serving
``fault/busy:N``: 429s counted from the records, against a one-process run.

Skipped only when ``redis-server`` is not installed (``make redis`` installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import fanout.batch
from fanout.batch import BatchOptions, ExitCode
from fanout.batch import runner as run_module
from fanout.config import parse_config
from fanout.sharedlimit import (
    LimitTable,
    LocalLimits,
    SharedLimits,
    SharedSlots,
    open_shared_limits,
    shown_spec,
    spec_problem,
)
from fanout.sharedlimit.redis import RedisLimits
from fanout.sharedlimit.slots import ENDPOINT, model_limit

from .helpers import fanout_mock

ROOT = Path(__file__).resolve().parent.parent
REDIS_SERVER = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(REDIS_SERVER is None,
                                 reason="needs redis-server (make redis installs it)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """A redis-server of this module's own: loopback, a free port, nothing saved
    (``None`` without the binary)."""
    if REDIS_SERVER is None:
        yield None
        return
    folder = tmp_path_factory.mktemp("redis")
    port = _free_port()
    process = subprocess.Popen(
        [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait(10)


@pytest.fixture
def redis_url(redis_server: str | None) -> str:
    if redis_server is None:
        pytest.skip("needs redis-server (make redis installs it)")
    return redis_server


_spaces = iter(range(10**6))


def _space() -> str:
    return f"test-{os.getpid()}-{next(_spaces)}"


@pytest.fixture(params=["local", "redis"])
async def limits(request: pytest.FixtureRequest, redis_server: str | None
                 ) -> AsyncIterator[list[SharedLimits]]:
    """Four clients of one shared limit: one ``LocalLimits`` four times, or four Redis
    clients (four connection pools) of one server."""
    if request.param == "local":
        local = LocalLimits()
        yield [local] * 4
        return
    if redis_server is None:
        pytest.skip("needs redis-server (make redis installs it)")
    clients: list[SharedLimits] = [RedisLimits(redis_server) for _ in range(4)]
    yield clients
    for client in clients:
        client.close()


# ------------------------------------------------------------------ the rules, no I/O

def test_the_table_grants_a_slot_of_every_limit_or_none() -> None:
    table = LimitTable()
    table.setup("s", {"endpoint": 3, "model:a": 2, "model:b": 2})
    both = ["endpoint", "model:a"]
    assert table.try_acquire("s", both, "h1", 10, now=0) is None
    assert table.try_acquire("s", both, "h2", 10, now=0) is None
    assert table.try_acquire("s", both, "h3", 10, now=0) == 0.0  # model a is full
    assert table.state("s", "endpoint", 0).held == 2  # and nothing was taken of it
    assert table.try_acquire("s", ["endpoint", "model:b"], "h4", 10, now=0) is None
    assert table.try_acquire("s", ["endpoint", "model:b"], "h5", 10, now=0) == 0.0  # endpoint
    assert table.try_acquire("s", both, "h1", 10, now=1) is None  # held already: renewed
    table.release("s", both, ["h1"])
    assert table.try_acquire("s", both, "h3", 10, now=1) is None
    # A lease that runs out gives its slots back; a renewed one does not.
    table.renew("s", both, ["h2"], 10, now=9)  # h2's leases end at 19 now
    assert table.state("s", "model:a", 12).held == 1  # h3's ran out at 11
    assert table.state("s", "endpoint", 12).held == 1  # h4's at 10, h3's at 11
    assert table.state("s", "endpoint", 19).held == 0


def test_the_table_backs_off_as_adaptive_limit_does() -> None:
    table = LimitTable()
    table.setup("s", {"model:a": 8})
    table.rate_limited("s", "model:a", 2.0, now=10)
    state = table.state("s", "model:a", 10)
    assert (state.cap, state.paused_for, state.rate_limited, state.decreases) == (4, 2.0, 1, 1)
    assert table.try_acquire("s", ["model:a"], "h", 5, now=11) == pytest.approx(1.0)
    table.rate_limited("s", "model:a", 0.5, now=10.5)  # the same burst: no new decrease
    assert table.state("s", "model:a", 10.5).cap == 4
    assert table.try_acquire("s", ["model:a"], "h", 5, now=12) is None  # the pause is over
    table.succeeded("s", "model:a", 3)
    assert table.state("s", "model:a", 12).cap == 4
    table.succeeded("s", "model:a")  # the 4th in a row: one slot more
    assert table.state("s", "model:a", 12).cap == 5
    table.succeeded("s", "model:a", 100)
    assert table.state("s", "model:a", 12).cap == 8  # never past the maximum
    table.setup("s", {"model:a": 6})  # a new maximum: the cap follows it down
    assert table.state("s", "model:a", 12).cap == 6
    for now in (20, 21, 22, 23, 24):
        table.rate_limited("s", "model:a", None, now=now)
    assert table.state("s", "model:a", 24).cap == 1  # never below one


def test_specs() -> None:
    for good in ("redis://127.0.0.1:6379/0", "rediss://h:1/2", "unix:///run/redis.sock",
                 "ray://", "ray://my-actor", "redis://h/0?lease=5", "off"):
        assert spec_problem(good) is None, good
    for bad in ("http://h", "redis-h:6379", "redis://h/0?lease=0", "redis://h?lease=x", ""):
        assert spec_problem(bad) is not None, bad
    assert shown_spec("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert "s3cret" not in open_shared_limits("redis://:s3cret@127.0.0.1:1/0").describe()
    assert open_shared_limits("redis://127.0.0.1:1/0?lease=2").lease == 2.0
    with pytest.raises(ValueError, match="expected redis://"):
        open_shared_limits("http://h")


# ------------------------------------------- the contract, in-process and on Redis

async def test_concurrency_is_never_exceeded_across_four_clients(
        limits: list[SharedLimits]) -> None:
    space, caps = _space(), {"a": 2, "b": 3}
    in_use = {"a": 0, "b": 0, ENDPOINT: 0}
    most = dict.fromkeys(in_use, 0)
    slots = [SharedSlots(client, space, 4, caps, poll=0.005) for client in limits]

    async def stream(slot: SharedSlots, model: str, key: str) -> None:
        await slot.acquire(model, key)
        for name in (model, ENDPOINT):
            in_use[name] += 1
            most[name] = max(most[name], in_use[name])
        await trio.sleep(0.01)
        for name in (model, ENDPOINT):
            in_use[name] -= 1  # before the slot goes back: never counted low
        slot.release(key)

    async with trio.open_nursery() as nursery:
        for slot in slots:
            await nursery.start(slot.run)
        async with trio.open_nursery() as streams:
            for number in range(48):
                slot = slots[number % 4]
                streams.start_soon(stream, slot, "ab"[number % 3 == 0], f"k{number}")
        nursery.cancel_scope.cancel()
    assert most["a"] <= 2 and most["b"] <= 3 and most[ENDPOINT] <= 4, most
    assert most[ENDPOINT] >= 3, most  # the clients did run side by side
    state = await limits[0].state(space, ENDPOINT)
    assert state.held == 0  # every slot went back


async def test_a_lease_not_renewed_runs_out(limits: list[SharedLimits]) -> None:
    space = _space()
    first, second = limits[0], limits[1]
    await first.setup(space, {"m": 1})
    assert await first.try_acquire(space, ["m"], "killed", 0.6) is None
    for _ in range(4):  # while its holder renews it, it is held
        await first.renew(space, ["m"], ["killed"], 0.6)
        assert await second.try_acquire(space, ["m"], "waiting", 0.6) == 0.0
        await trio.sleep(0.2)
    # The holder is gone (killed: it never releases): the lease runs out.
    with trio.fail_after(10):
        while await second.try_acquire(space, ["m"], "waiting", 5) is not None:
            await trio.sleep(0.05)
    state = await second.state(space, "m")
    assert state.held == 1
    await second.renew(space, ["m"], ["killed"], 5)  # too late: it is not taken back
    assert (await second.state(space, "m")).held == 1


async def test_a_429_one_client_reports_pauses_the_others(limits: list[SharedLimits]) -> None:
    space = _space()
    reporter, other = limits[0], limits[1]
    await reporter.setup(space, {"m": 8, "n": 8})
    await reporter.rate_limited(space, "m", 30.0)
    wait = await other.try_acquire(space, ["m"], "h", 5)
    assert wait is not None and 25 < wait <= 30  # paused: nothing granted before then
    assert await other.try_acquire(space, ["n"], "h", 5) is None  # another model is not
    state = await other.state(space, "m")
    assert (state.cap, state.rate_limited, state.decreases) == (4, 1, 1)
    await limits[2].rate_limited(space, "m", None)  # the same burst: one decrease
    assert (await other.state(space, "m")).cap == 4
    await limits[3].succeeded(space, "m", 4)  # cap successes: one slot back
    assert (await other.state(space, "m")).cap == 5


async def test_spaces_do_not_meet(limits: list[SharedLimits]) -> None:
    one, two = _space(), _space()
    await limits[0].setup(one, {"m": 1})
    await limits[1].setup(two, {"m": 1})
    assert await limits[0].try_acquire(one, ["m"], "h1", 5) is None
    assert await limits[1].try_acquire(two, ["m"], "h2", 5) is None
    assert await limits[1].try_acquire(one, ["m"], "h3", 5) == 0.0


async def test_submitters_wait_out_the_shared_pause(autojump_clock: trio.testing.MockClock
                                                    ) -> None:
    local = LocalLimits()
    space = _space()
    first, second = (SharedSlots(local, space, 8, {"m": 4}) for _ in range(2))
    async with trio.open_nursery() as nursery:
        await nursery.start(first.run)
        await nursery.start(second.run)
        await second.acquire("m", "before")
        first.rate_limited("m", 7.0)  # one shard's 429, Retry-After 7 s
        await trio.testing.wait_all_tasks_blocked()  # sent
        started = trio.current_time()
        await second.acquire("m", "after")  # the other shard waits it out
        assert trio.current_time() - started >= 6.99
        assert (await local.state(space, model_limit("m"))).cap == 2
        nursery.cancel_scope.cancel()
    assert (await local.state(space, ENDPOINT)).held == 0  # given back when it ended


# -------------------------------------------------- batches: shards and the mock

CONFIG = """\
[endpoint]
base_url = "{base_url}"

[concurrency]
max = 8

[deadlines]
total = 300

[[models]]
name = "busy"
id = "fault/busy:{busy}"
concurrency = {concurrency}

[[models]]
name = "endless"
id = "fault/endless:0.05"
concurrency = 2
"""


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "fanout", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "FANOUT_SHARED_LIMIT": ""}


def _records(paths: list[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for path in paths for line in path.read_text().splitlines()]


def _write(tmp_path: Path, base_url: str, prompts: int, *, busy: int = 4,
           concurrency: int = 4) -> tuple[Path, Path]:
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"})
                                    + "\n" for i in range(prompts)))
    config = tmp_path / "fanout.toml"
    config.write_text(CONFIG.format(base_url=base_url, busy=busy, concurrency=concurrency))
    return prompts_file, config


def _shards(tmp_path: Path, name: str, prompts: Path, config: Path, count: int,
            *extra: str) -> list[dict[str, Any]]:
    """``count`` ``fanout batch --shard I/count`` processes at once (one plain one for
    1): every record they wrote; each must exit 0."""
    folder = tmp_path / name
    folder.mkdir()
    commands = [_cli("batch", str(prompts), "-o", str(folder / f"results-{i}.jsonl"),
                     "--config", str(config), "-m", "busy",
                     *(["--shard", f"{i}/{count}"] if count > 1 else []), *extra)
                for i in range(count)]
    running = [subprocess.Popen(c, env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True) for c in commands]
    for process in running:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-2000:]
    return _records(sorted(folder.glob("results-*.jsonl")))


def _limited(records: list[dict[str, Any]]) -> int:
    return sum(record["rate_limited"] for record in records)


@needs_redis
def test_four_shards_on_redis_draw_no_more_429s_than_one_process(
        tmp_path: Path, redis_url: str) -> None:
    # fault/busy:4 answers 429 while 4 of its streams are open; the model's own
    # concurrency is 4, so one process never asks for a fifth.  Four shards that each
    # took the model's whole concurrency would ask for 16.
    with fanout_mock("--port", "0") as base_url:
        prompts, config = _write(tmp_path, base_url, 48)
        single = _shards(tmp_path, "single", prompts, config, 1)
        shared = _shards(tmp_path, "shared", prompts, config, 4, "--shared-limit", redis_url)
        static = _shards(tmp_path, "static", prompts, config, 4)
    for records in (single, shared, static):
        assert {(r["id"], r["outcome"]) for r in records} == {
            (f"q{i}", "completed") for i in range(48)}
    assert {r["shard"] for r in shared} == {"0/4", "1/4", "2/4", "3/4"}
    assert _limited(shared) <= 1.2 * _limited(single), (_limited(shared), _limited(single))
    # Without the shared limit, each shard takes its share of the model's concurrency too.
    assert _limited(static) <= 1.2 * _limited(single), (_limited(static), _limited(single))


@needs_redis
def test_a_killed_shards_slots_come_back_when_their_leases_run_out(
        tmp_path: Path, redis_url: str) -> None:
    url = f"{redis_url}?lease=2"
    with fanout_mock("--port", "0") as base_url:
        prompts, config = _write(tmp_path, base_url, 4)
        shard = subprocess.Popen(
            _cli("batch", str(prompts), "-o", str(tmp_path / "killed.jsonl"), "--config",
                 str(config), "-m", "endless", "--shared-limit", url),
            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        probe = RedisLimits(redis_url)
        try:
            keys: list[bytes] = []
            deadline = time.monotonic() + 60
            while not keys or probe.client.zcard(keys[0]) < 2:  # it holds both slots
                assert shard.poll() is None and time.monotonic() < deadline
                keys = list(probe.client.scan_iter("fanout:*:model:endless:holders"))
                time.sleep(0.05)
            [key] = keys
            space = key.decode().split("{")[1].split("}")[0]
            time.sleep(3)  # longer than a lease: renewed while its streams run
            assert trio.run(probe.state, space, model_limit("endless")).held == 2
            shard.send_signal(signal.SIGKILL)
            shard.wait(10)

            async def take_both() -> None:
                names = [ENDPOINT, model_limit("endless")]
                for holder in ("a", "b"):
                    with trio.fail_after(30):
                        while await probe.try_acquire(space, names, holder, 5) is not None:
                            await trio.sleep(0.05)

            trio.run(take_both)  # the killed shard's leases ran out: both came back
        finally:
            shard.kill()
            shard.wait(10)
            probe.close()


def test_the_static_share_divides_each_models_own_concurrency_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prompts, config_path = _write(tmp_path, "embedded", 8, concurrency=6)
    config_path.write_text(config_path.read_text()
                           + '\n[[models]]\nname = "plain"\nid = "mock/fast"\n')
    config = parse_config(config_path.read_text())
    models = config.select(("busy", "endless", "plain"))
    # shard, concurrency, per-model concurrency, shared -> caps; "plain" has none of its own
    cases = [(None, 8, None, False, {"busy": 6, "endless": 2, "plain": 8}),
             ((0, 4), 8, None, False, {"busy": 1, "endless": 1, "plain": 2}),
             ((1, 2), 8, None, False, {"busy": 3, "endless": 1, "plain": 4}),
             ((1, 2), 8, 5, False, {"busy": 2, "endless": 2, "plain": 2}),
             ((0, 4), 8, None, True, {"busy": 6, "endless": 2, "plain": 8}),
             ((0, 16), 4, None, False, {"busy": 1, "endless": 1, "plain": 1})]
    for shard, concurrency, per_model, shared, expected in cases:
        options = BatchOptions(prompts="p", output="o", shard=shard, concurrency=concurrency,
                               per_model_concurrency=per_model)
        assert run_module.model_caps(options, config, models, shared=shared) == expected, (
            shard, concurrency, per_model, shared)

    # And the session of a shard holds them.
    caps: list[dict[str, int]] = []

    class Recording(run_module.Session):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            caps.append({name: limit.maximum for name, limit in self.limits.items()})

    monkeypatch.setattr(run_module, "Session", Recording)
    fanout.batch.run_sync(BatchOptions(
        prompts=str(prompts), output=str(tmp_path / "r.jsonl"), config=str(config_path),
        models=("busy", "plain"), shard=(1, 2), concurrency=8), environ={})
    assert caps == [{"busy": 3, "plain": 4}]


def test_a_bad_or_unreachable_shared_limit_sends_nothing(tmp_path: Path) -> None:
    prompts, config = _write(tmp_path, "embedded", 2)
    closed = _free_port()  # nothing listens there
    output = tmp_path / "r.jsonl"
    unreachable = subprocess.run(
        _cli("batch", str(prompts), "-o", str(output), "--config", str(config), "-m", "busy",
             "--shard", "0/2", "--shared-limit", f"redis://:s3cret@127.0.0.1:{closed}/0"),
        env=_env(), capture_output=True, text=True, timeout=120)
    assert unreachable.returncode == ExitCode.TEMPFAIL, unreachable.stderr
    assert "the shared limit cannot be reached" in unreachable.stderr
    assert "s3cret" not in unreachable.stderr + unreachable.stdout
    assert not output.exists()  # nothing was sent, nor the file made
    bad = subprocess.run(
        _cli("batch", str(prompts), "-o", str(output), "--config", str(config),
             "--shared-limit", "http://127.0.0.1/"),
        env={**_env(), "FANOUT_SHARED_LIMIT": ""}, capture_output=True, text=True, timeout=120)
    assert bad.returncode == ExitCode.USAGE and "--shared-limit" in bad.stderr
    from_env = subprocess.run(
        _cli("batch", str(prompts), "-o", str(output), "--config", str(config)),
        env={**_env(), "FANOUT_SHARED_LIMIT": "nope"}, capture_output=True, text=True,
        timeout=120)
    assert from_env.returncode == ExitCode.USAGE and "FANOUT_SHARED_LIMIT" in from_env.stderr
    with pytest.raises(Exception, match=r"\[concurrency\] shared"):
        parse_config('[concurrency]\nshared = "nope://x"\n')
    assert parse_config('[concurrency]\nshared = "redis://h:1/0"\n').shared_limit == \
        "redis://h:1/0"


@needs_redis
def test_a_shared_limit_that_dies_mid_run_stops_sending_and_says_so(tmp_path: Path) -> None:
    # Redis goes away while a batch runs: no traceback; the streams in flight run on and
    # are recorded, nothing more is sent, one line says why, exit 75; a rerun with the
    # limit back finishes the rest.
    port = _free_port()
    folder = tmp_path / "redis"
    folder.mkdir()
    server_command = [REDIS_SERVER, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                      "--appendonly", "no", "--dir", str(folder)]
    assert REDIS_SERVER is not None
    url = f"redis://127.0.0.1:{port}/0?lease=2"

    def start() -> subprocess.Popen[bytes]:
        server = subprocess.Popen(server_command, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return server
            except OSError:
                time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    output = tmp_path / "r.jsonl"
    with fanout_mock("--port", "0") as base_url:
        prompts, config = _write(tmp_path, base_url, 40)
        config.write_text(config.read_text() + '\n[[models]]\nname = "slow"\n'
                          'id = "mock/slow:0.02"\nconcurrency = 2\n')
        command = _cli("batch", str(prompts), "-o", str(output), "--config", str(config),
                       "-m", "slow", "--shared-limit", url)
        server = start()
        batch = subprocess.Popen(command, env=_env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not output.exists() or len(output.read_text().splitlines()) < 2:
                assert batch.poll() is None and time.monotonic() < deadline
                time.sleep(0.05)
            server.kill()
            server.wait(10)
            _, err = batch.communicate(timeout=120)
        finally:
            batch.kill()
            server.kill()
        assert batch.returncode == 75, err[-2000:]
        assert "Traceback" not in err
        [line] = [line for line in err.splitlines() if "shared limit stopped answering" in line]
        assert f"127.0.0.1:{port}" in line
        records = _records([output])
        assert 2 <= len(records) < 40
        assert all(r["outcome"] == "completed" for r in records)  # in flight: run on
        server = start()
        try:
            again = subprocess.run(command, env=_env(), capture_output=True, text=True,
                                   timeout=300)
        finally:
            server.kill()
            server.wait(10)
    assert again.returncode == 0, again.stderr[-2000:]
    assert {r["id"] for r in _records([output]) if r["outcome"] == "completed"} == {
        f"q{i}" for i in range(40)}
