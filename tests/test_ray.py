"""examples/ray_batch.py on a local Ray, one task's worker SIGKILLed mid-way; its shards
sharing the endpoint's limits through a Ray actor on ``fault/busy:4``.

The Ray work runs in tests/ray_harness.py inside ``unshare -rn`` (a network namespace holding
only ``lo``): Ray listens on every interface it has, and there it has only loopback.  The
pytest process never imports Ray (its warnings stay in the subprocess); it checks the files
the run left: every planned unit exactly once, none lost, the retry resumed the killed
shard's own file, and the merge equals a one-process ``fanout batch`` of the same plan.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("slow", "slow-anthropic")  # tests/ray_harness.py's config
PROMPTS = 40
FEW = 6  # the prompts of the runs that fail (tests/ray_harness.py)
#: What a record must say the same in the merge as in the one-process run.
SAME = ("outcome", "reason", "finish_reason", "text", "choices", "usage", "model_id", "api",
        "content_key", "status", "cut")


def _ray_missing() -> str | None:
    probe = subprocess.run([sys.executable, "-c", "import ray"], capture_output=True,
                           text=True, timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"Ray cannot be imported ({last}): pip install -e '.[ray]' (make test does)"
    return None


def _namespace_missing() -> str | None:
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs unshare and ip (util-linux, iproute2) to keep Ray on loopback"
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return (f"unshare -rn is not allowed here ({probe.stderr.strip()}): Ray listens on "
                "every interface, so it runs only in a namespace that holds only lo")
    return None


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _key(record: dict[str, Any]) -> tuple[str, str, int]:
    return (str(record["id"]), record["model"], record["sample"])


def _completed(records: list[dict[str, Any]]) -> Counter[tuple[str, str, int]]:
    return Counter(_key(r) for r in records if r["outcome"] == "completed")


@pytest.fixture(scope="module")
def ray_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """tests/ray_harness.py's three runs in one namespace: its directory and report."""
    reason = _ray_missing() or _namespace_missing()
    if reason:
        pytest.skip(reason)
    workdir = tmp_path_factory.mktemp("ray")
    (workdir / "prompts.jsonl").write_text("".join(
        json.dumps({"id": f"q{i}", "prompt": f"Question number {i}: tell me something."})
        + "\n" for i in range(PROMPTS)))
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    harness = subprocess.run(
        ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh",
         sys.executable, str(ROOT / "tests" / "ray_harness.py"), str(workdir)],
        env=env, capture_output=True, text=True, timeout=170)
    assert harness.returncode == 0, harness.stderr[-3000:]
    return workdir, json.loads((workdir / "harness.json").read_text())


def test_a_killed_task_is_retried_resumes_and_merges_as_one_process(
        ray_run: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = ray_run
    assert report["single"]["exit"] == 0, report["single"]
    assert report["ray"]["exit"] == 0, report["ray"]

    planned = {(f"q{i}", model, 0) for i in range(PROMPTS) for model in MODELS}
    single = {_key(r): r for r in _records(workdir / "single.jsonl")}
    assert set(single) == planned
    assert all(record["text"] for record in single.values())  # something to compare

    # One task's worker was killed mid-way, and Ray ran the task again: another process
    # took its shard file's lock, and the task ended well (the example printed its exit 0).
    killed = report["killed"]
    assert killed.get("pid"), f"no worker was killed: {report}"
    assert killed["after"], f"no retry took {killed['shard']} after pid {killed['pid']}"
    shard = workdir / "shards" / killed["shard"]
    index = killed["shard"].removeprefix("results-").removesuffix(".jsonl")
    assert f"shard {index}/4: exit 0" in report["ray"]["stdout"]
    # The retry resumed the shard's own file: what was written before the kill is still
    # its head, nothing completed was sent again, and the kill came before its end.
    lines = shard.read_text().splitlines()
    assert lines[:len(killed["kept"])] == killed["kept"]
    shard_records = _records(shard)
    assert max(_completed(shard_records).values()) == 1
    assert len(killed["kept"]) < len(_completed(shard_records))

    # The shards together: every planned unit completed in exactly one of them.
    across: Counter[tuple[str, str, int]] = Counter()
    for path in sorted((workdir / "shards").glob("results-*.jsonl")):
        across.update(_completed(_records(path)))
    assert set(across) == planned
    assert set(across.values()) == {1}

    # The merge: every unit exactly once, none lost, equal to the one-process run.
    merged_records = _records(workdir / "merged.jsonl")
    assert Counter(map(_key, merged_records)) == Counter(planned)
    for record in merged_records:
        alone = single[_key(record)]
        assert {f: record.get(f) for f in SAME} == {f: alone.get(f) for f in SAME}, _key(record)


def _attempts(directory: Path) -> Counter[tuple[str, str, int]]:
    """How many records each unit has across a run's shard files (one per attempt)."""
    counts: Counter[tuple[str, str, int]] = Counter()
    for path in sorted(directory.glob("results-*.jsonl")):
        counts.update(map(_key, _records(path)))
    return counts


def test_a_shard_failed_for_good_is_not_retried(ray_run: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = ray_run
    run = report["for_good"]
    assert run["exit"] == 1, run
    # Every unit ran once: its task ended with exit 1, and Ray did not run it again.
    assert _attempts(workdir / "for-good") == Counter(
        {(f"q{i}", "bad", 0): 1 for i in range(FEW)})
    assert "WorkLeft" not in run["stdout"]
    assert run["stdout"].count(": exit 1:") == 2  # both shards' summaries
    assert "exit 1: some units failed" in run["stdout"]


def test_a_shard_with_work_left_is_retried_then_says_run_again(
        ray_run: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = ray_run
    run = report["refused"]
    assert run["exit"] == 75, run
    # Every unit ran twice (--retries 1): the task ended with exit 75, Ray ran it again,
    # and the retry resumed the same file (the first attempt's records are still there).
    assert _attempts(workdir / "refused") == Counter(
        {(f"q{i}", "slow", 0): 2 for i in range(FEW)})
    assert run["stdout"].count(": WorkLeft: ") == 2
    assert "exit 75: work is left: run the same command again" in run["stdout"]


def test_a_shard_refusing_its_input_says_why_and_nothing_is_merged(
        ray_run: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = ray_run
    run = report["no_config"]
    assert run["exit"] == 2, run
    # Each task's ConfigError came back once, as its one line naming the file.
    refusals = [line for line in run["stdout"].splitlines() if ": Refused: " in line]
    assert len(refusals) == 2, run["stdout"]
    assert all("missing.toml" in line for line in refusals)
    assert "Traceback" not in run["stdout"] + run["stderr"]
    assert "a shard refused its input" in run["stdout"]
    assert not (workdir / "no-config.jsonl").exists()
    assert not list((workdir / "no-config").glob("*.jsonl"))


def test_the_batch_options_of_the_command_line_reach_every_shard(tmp_path: Path) -> None:
    # What each Ray task is given (examples/ray_batch.py's shard_options), without
    # starting Ray: concurrency, scorers and the rest are fanout batch's, for every shard.
    reason = _ray_missing()
    if reason:
        pytest.skip(reason)
    config = tmp_path / "fanout.toml"
    config.write_text('[endpoint]\nbase_url = "embedded"\n[[models]]\nname = "fast"\n'
                      'id = "mock/fast"\n')
    script = (
        "import json, sys; sys.path.insert(0, 'examples'); import ray_batch; "
        "args = ray_batch.parse(sys.argv[1:]); "
        "print(json.dumps([{k: getattr(o, k) for k in ('shard', 'concurrency', "
        "'shard_concurrency', 'per_model_concurrency', 'scorers', 'accept_empty', "
        "'retry_failed', 'run_id', 'config')} for o in "
        "(ray_batch.shard_options(args, i) for i in range(args.shards))]))")
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "p.jsonl"), "-o", str(tmp_path / "m.jsonl"),
         "--shards", "2", "--config", str(config), "--concurrency", "8",
         "--shard-concurrency", "3", "--per-model-concurrency", "2", "--score", "exact",
         "--score", "finish", "--accept-empty", "--retry-failed", "--run-id", "r1"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    shards = json.loads(done.stdout)
    assert shards == [{"shard": [i, 2], "concurrency": 8, "shard_concurrency": 3,
                       "per_model_concurrency": 2, "scorers": ["exact", "finish"],
                       "accept_empty": True, "retry_failed": True, "run_id": "r1",
                       "config": str(config.resolve())} for i in range(2)]


def _rate_limited(paths: list[Path]) -> int:
    return sum(record["rate_limited"] for path in paths for record in _records(path))


def test_shards_sharing_a_ray_actor_draw_no_more_429s_than_one_process(
        ray_run: tuple[Path, dict[str, Any]]) -> None:
    workdir, report = ray_run
    assert report["busy_single"]["exit"] == 0, report["busy_single"]
    single = _rate_limited([workdir / "busy-single.jsonl"])
    planned = Counter({(f"q{i}", "busy", 0): 1 for i in range(PROMPTS)})
    for run, folder in (("busy_shared", "busy"), ("busy_static", "busy-static")):
        assert report[run]["exit"] == 0, report[run]
        shards = sorted((workdir / folder).glob("results-*.jsonl"))
        assert len(shards) == 4
        assert _completed([r for path in shards for r in _records(path)]) == planned
        # fault/busy:4 refuses a fifth stream of the model; its concurrency is 4, so one
        # process draws (next to) none.  Sharing the actor, the 4 tasks take 4 slots in
        # all, not 4 each; with the static share, 1 each.
        limited = _rate_limited(shards)
        assert limited <= 1.2 * single, (run, limited, single)
