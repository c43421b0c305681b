"""`fanout.batch` as a library: run_sync and run, the summary, the record fields, the
shard's share of the endpoint, `python -m fanout`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

import fanout
import fanout.batch
import fanout.batch.runner as run_module
from fanout.batch import BatchObserver, BatchOptions, BatchProgress, BatchSummary, ExitCode
from fanout.batch.plan import plan_fingerprint, plan_work
from fanout.config import parse_config
from fanout.store.prompts import load_prompts
from fanout.store.results import shard_of, work_key

CONFIG = """
[endpoint]
base_url = "embedded"
[deadlines]
idle = 5
total = 30
[concurrency]
max = 8
[[models]]
name = "fast"
id = "mock/fast"
[[models]]
name = "echo"
id = "mock/echo"
"""


def _setup(tmp_path: Path, prompts: int = 6, config: str = CONFIG) -> tuple[str, str]:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?"}) + "\n"
                            for i in range(prompts)))
    (tmp_path / "fanout.toml").write_text(config)
    return str(path), str(tmp_path / "fanout.toml")


def _records(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line]


def test_the_public_face() -> None:
    assert set(fanout.batch.__all__) == {"BatchObserver", "BatchOptions", "BatchProgress",
                                         "BatchSummary", "ExitCode", "Failure",
                                         "MergeReport", "merge", "run", "run_sync"}
    for name in fanout.batch.__all__:
        assert getattr(fanout.batch, name).__doc__, name
    assert [int(code) for code in ExitCode] == [0, 1, 2, 3, 75, 130, 143]


def test_run_sync_returns_a_summary_and_prints_nothing(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    prompts, config = _setup(tmp_path)
    output = str(tmp_path / "results.jsonl")
    summary = fanout.batch.run_sync(BatchOptions(prompts=prompts, output=output,
                                                 config=config, samples=2))
    assert isinstance(summary, BatchSummary)
    assert summary.exit_code == ExitCode.DONE == 0
    assert (summary.total, summary.done, summary.left) == (24, 24, 0)
    assert summary.counts == {"completed": 24} and summary.ran == {"completed": 24}
    assert summary.failures == () and summary.shard == (0, 1)
    assert summary.exit_line() == "exit 0: every unit is done (24 of 24)"
    assert capfd.readouterr() == ("", "")  # the library never prints
    records = _records(output)
    assert {(r["shard"], r["plan"], r["run"]) for r in records} == {
        ("0/1", summary.plan, summary.plan)}
    assert len(summary.plan) == 16 and int(summary.plan, 16) >= 0
    # Again: nothing to do, the same plan.
    again = fanout.batch.run_sync(BatchOptions(prompts=prompts, output=output, config=config,
                                               samples=2))
    assert (again.exit_code, again.done, again.ran, again.plan) == (0, 24, {}, summary.plan)


async def test_run_inside_a_trio_program(tmp_path: Path) -> None:
    prompts, config = _setup(tmp_path, 3)
    seen: list[str] = []

    class Watch(BatchObserver):
        def note(self, line: str) -> None:
            seen.append(line)

        def finished(self, progress: BatchProgress) -> None:
            seen.append(f"finished {progress.done}/{progress.total}")

    summary = await fanout.batch.run(
        BatchOptions(prompts=prompts, output=str(tmp_path / "r.jsonl"), config=config,
                     models=("fast",), run_id="nightly-7"), observer=Watch())
    assert summary.exit_code == 0 and summary.done == 3
    assert seen[0].startswith("3 streams: 3 prompts x 1 models x 1 samples")
    assert seen[-1] == "finished 3/3"
    assert {r["run"] for r in _records(tmp_path / "r.jsonl")} == {"nightly-7"}


def test_bad_input_raises_config_error_and_sends_nothing(tmp_path: Path) -> None:
    prompts, config = _setup(tmp_path)
    output = tmp_path / "r.jsonl"
    with pytest.raises(fanout.ConfigError, match=r"--samples must be >= 1, not 0"):
        fanout.batch.run_sync(BatchOptions(prompts=prompts, output=str(output), config=config,
                                           samples=0))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    with pytest.raises(fanout.ConfigError) as caught:
        fanout.batch.run_sync(BatchOptions(prompts=str(bad), output=str(output),
                                           config=config))
    assert caught.value.problems[0].startswith(f"{bad}:1:")
    with pytest.raises(fanout.ConfigError, match="--shard 4/4"):
        fanout.batch.run_sync(BatchOptions(prompts=prompts, output=str(output), config=config,
                                           shard=(4, 4)))
    assert not output.exists() or output.read_bytes() == b""


def test_every_shard_of_a_plan_names_it_and_together_they_are_the_plan(
        tmp_path: Path) -> None:
    prompts, config = _setup(tmp_path, 10)
    plans, keys = set(), []
    for index in range(3):
        output = tmp_path / f"results-{index}.jsonl"
        summary = fanout.batch.run_sync(BatchOptions(prompts=prompts, output=str(output),
                                                     config=config, shard=(index, 3)))
        assert summary.exit_code == 0 and summary.shard == (index, 3)
        for record in _records(output):
            assert record["shard"] == f"{index}/3"
            assert shard_of(work_key(record["id"], record["model"], record["sample"]), 3) \
                == index
            plans.add((record["plan"], record["run"]))
            keys.append(work_key(record["id"], record["model"], record["sample"]))
    assert len(plans) == 1  # one plan, one run id (the plan's) for all shards
    assert len(keys) == len(set(keys)) == 20
    # The fingerprint is the whole plan's: other shard counts, prompts or samples differ.
    parsed = parse_config(CONFIG)
    whole = plan_work(load_prompts(prompts), parsed.models, 1, parsed)
    (plan, _), = plans
    assert plan == plan_fingerprint(whole, 3)
    assert plan != plan_fingerprint(whole, 4)
    assert plan != plan_fingerprint(plan_work(load_prompts(prompts), parsed.models, 2,
                                              parsed), 3)
    assert plan != plan_fingerprint(whole[1:], 3)


def test_a_shard_takes_its_share_of_the_endpoint(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    caps: list[tuple[int, int]] = []

    class Recording(run_module.Session):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            caps.append((kwargs["cap"], self.endpoint.maximum))

    monkeypatch.setattr(run_module, "Session", Recording)
    prompts, config = _setup(tmp_path, 2)
    cases = [(None, None, None, 8), ((0, 4), None, None, 2), ((1, 3), None, None, 2),
             ((0, 16), None, None, 1), ((0, 4), 3, None, 3), ((0, 4), None, 20, 5),
             (None, None, 20, 20)]
    for number, (shard, share, concurrency, expected) in enumerate(cases):
        fanout.batch.run_sync(BatchOptions(
            prompts=prompts, output=str(tmp_path / f"r{number}.jsonl"), config=config,
            shard=shard, shard_concurrency=share, concurrency=concurrency))
        assert caps[-1] == (expected, expected), (shard, share, concurrency)


def test_scores_records_name_the_batch_that_scored_them(tmp_path: Path) -> None:
    prompts, config = _setup(tmp_path, 3)
    output = tmp_path / "r.jsonl"
    summary = fanout.batch.run_sync(BatchOptions(
        prompts=prompts, output=str(output), config=config, models=("fast",),
        scorers=("exact",), shard=(0, 1), run_id="r1"))
    scores = _records(tmp_path / "r.scores.jsonl")
    assert scores and {(s["shard"], s["plan"], s["run"]) for s in scores} == {
        ("0/1", summary.plan, "r1")}


def test_python_dash_m_fanout_runs_the_command_line(tmp_path: Path) -> None:
    prompts, config = _setup(tmp_path, 2)
    output = tmp_path / "r.jsonl"
    done = subprocess.run([sys.executable, "-m", "fanout", "batch", prompts, "-o", str(output),
                           "--config", config, "-m", "fast", "--shard", "1/2",
                           "--run-id", "job-9"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1].startswith("fanout batch: exit 0: every unit is done")
    assert {(r["shard"], r["run"]) for r in _records(output)} <= {("1/2", "job-9")}
    version = subprocess.run([sys.executable, "-m", "fanout", "--version"],
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("fanout ")


def test_old_records_without_the_fields_still_resume(tmp_path: Path) -> None:
    prompts, config = _setup(tmp_path, 2)
    output = tmp_path / "r.jsonl"
    fanout.batch.run_sync(BatchOptions(prompts=prompts, output=str(output), config=config))
    old = [{k: v for k, v in r.items() if k not in ("shard", "plan", "run")}
           for r in _records(output)]
    output.write_text("".join(json.dumps(r) + "\n" for r in old))
    summary = fanout.batch.run_sync(BatchOptions(prompts=prompts, output=str(output),
                                                 config=config))
    assert (summary.exit_code, summary.done, summary.ran) == (0, 4, {})


def test_trio_is_not_running_in_run_sync() -> None:
    # run_sync is for plain code: inside trio, the caller awaits run().
    async def inside() -> None:
        with pytest.raises(RuntimeError):
            trio.run(trio.sleep, 0)

    trio.run(inside)


def test_the_docs_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    batch_page = (Path(__file__).parents[2] / "docs" / "batch.md").read_text()
    section = batch_page[batch_page.index("## Batch as a library"):]
    code = section[section.index("```python\n") + 10:]
    code = code[:code.index("```")]
    _setup(tmp_path, 8)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/batch.md", "exec"), {})
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("0 ")  # ExitCode.DONE, then done and total
    shard = _records(tmp_path / "results-0.jsonl")
    assert shard and {r["shard"] for r in shard} == {"0/4"}
    assert (tmp_path / "results-0.scores.jsonl").exists()


NO_USAGE_BESIDE_USAGE = """
[endpoint]
base_url = "embedded"
[deadlines]
idle = 5
total = 30
[concurrency]
max = 64
[[models]]
name = "quiet"
id = "fault/no-usage"
[[models]]
name = "fast"
id = "mock/fast"
"""


def test_a_model_without_usage_beside_one_with_usage_is_not_taken_for_cut(
        tmp_path: Path) -> None:
    # 12 prompts x a model that never sends usage + one that does, at concurrency 64:
    # missing usage alone is no evidence of a cut, so nothing is redone, the
    # concurrency stays, and no advice about one-slot servers is given.
    prompts, config = _setup(tmp_path, 12, NO_USAGE_BESIDE_USAGE)
    output = tmp_path / "results.jsonl"
    notes: list[str] = []

    class Watch(BatchObserver):
        def note(self, line: str) -> None:
            notes.append(line)

    summary = fanout.batch.run_sync(BatchOptions(prompts=prompts, output=str(output),
                                                 config=config), observer=Watch())
    records = _records(output)
    assert summary.exit_code == 0 and summary.redone == 0
    assert len(records) == 24 and not any(r["cut"] for r in records)
    assert {r["outcome"] for r in records} == {"completed"}
    quiet = [r for r in records if r["model"] == "quiet"]
    assert len(quiet) == 12 and all("missing_usage" in r["flags"] for r in quiet)
    assert not [line for line in notes if "cut" in line or "concurrency" in line]


def test_usage_sent_per_choice_is_added_up_in_the_record(tmp_path: Path) -> None:
    # A server that sends usage after each choice (llama.cpp with n = 2): the record's
    # usage is their sum, and says it was per choice; one sent for the whole response
    # (mock/fast) is kept as it came.
    config = CONFIG.split("[[models]]")[0] + (
        '[[models]]\nname = "per-choice"\nid = "fault/usage-per-choice"\nparams = { n = 2 }\n'
        '[[models]]\nname = "fast"\nid = "mock/fast"\nparams = { n = 2 }\n')
    prompts, config_path = _setup(tmp_path, 1, config)
    output = tmp_path / "results.jsonl"
    summary = fanout.batch.run_sync(BatchOptions(prompts=prompts, output=str(output),
                                                 config=config_path))
    assert summary.exit_code == 0
    by_model = {r["model"]: r for r in _records(output)}
    per_choice, whole = by_model["per-choice"]["usage"], by_model["fast"]["usage"]
    parts = per_choice["per_choice"]
    assert len(parts) == 2 and all(p["prompt_tokens"] == per_choice["prompt_tokens"]
                                   for p in parts)
    assert per_choice["completion_tokens"] == sum(p["completion_tokens"] for p in parts)
    assert per_choice["total_tokens"] == (per_choice["prompt_tokens"]
                                          + per_choice["completion_tokens"])
    assert "per_choice" not in whole and whole["completion_tokens"] > 0
