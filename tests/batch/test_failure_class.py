"""A unit's failure class decides whether a rerun can fix it, not how many units one run
held: `fanout batch` (a shard's exit code) and `fanout merge` judge the same records the
same way (``fanout.batch.summary.judge``), and a resume does not send again, unchanged, a
request the server refused as sent."""

from __future__ import annotations

import io
import json
from pathlib import Path

from fanout.batch import BatchOptions, ExitCode, merge
from fanout.cli.batch import run_batch
from fanout.store.results import shard_of, work_key

MODELS = {
    "refused": "fault/400",               # HTTP 400: the request as sent
    "broken": "fault/500-then-ok:1000",  # 500 on every attempt: the server's, not the model's
    "truncating": "fault/truncate:2",     # truncates every stream, alone too
}


def _config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text('[endpoint]\nbase_url = "embedded"\n[deadlines]\nidle = 5\ntotal = 30\n'
                    "[concurrency]\nmax = 1\n" + "".join(
                        f'[[models]]\nname = "{name}"\nid = "{model}"\n'
                        for name, model in MODELS.items()))
    return str(path)


def _prompts(tmp_path: Path, count: int, *, changed: str = "") -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"Question {i}?{changed}"})
                            + "\n" for i in range(count)))
    return str(path)


def _batch(tmp_path: Path, model: str, count: int, **options: object) -> tuple[int, str]:
    err = io.StringIO()
    status = run_batch(BatchOptions(prompts=_prompts(tmp_path, count), output=str(
        tmp_path / "results.jsonl"), models=(model,), config=_config(tmp_path),
        **options), stdout=io.StringIO(), stderr=err, environ={})  # type: ignore[arg-type]
    return status, err.getvalue()


def _records(tmp_path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]


def _merged(tmp_path: Path, count: int) -> tuple[int, list[str], list[str]]:
    report = merge([tmp_path / "results.jsonl"], tmp_path / "merged.jsonl",
                   prompts=_prompts(tmp_path, count), config=_config(tmp_path))
    return report.exit_code, sorted(report.failed_keys), sorted(report.unfinished_keys)


def test_a_shard_holding_one_unit_of_a_refused_model_exits_1_as_the_merge_says(
        tmp_path: Path) -> None:
    # 4 prompts in N shards: a shard that holds exactly one of them.
    keys = [work_key(f"q{i}", "refused", 0) for i in range(4)]
    index, count = next((i, n) for n in range(2, 9) for i in range(n)
                        if sum(shard_of(k, n) == i for k in keys) == 1)
    status, err = _batch(tmp_path, "refused", 4, shard=(index, count))
    assert status == ExitCode.FAILED, err
    code, failed, unfinished = _merged(tmp_path, 4)
    assert failed == [k for k in keys if shard_of(k, count) == index] and not unfinished
    assert code == 75  # the other shards are missing, not this unit unfinished


def test_one_truncating_unit_is_temporary_once_and_for_good_the_second_time(
        tmp_path: Path) -> None:
    # One sample is no pattern: a lone truncation may be the network's.  The same unit,
    # the same request, truncated again in a second run is the model's own: exit 1, and
    # the merge of that file says the same at every step.
    key = work_key("q0", "truncating", 0)
    status, err = _batch(tmp_path, "truncating", 1)
    assert status == ExitCode.TEMPFAIL, err
    assert _merged(tmp_path, 1) == (75, [], [key])
    status, err = _batch(tmp_path, "truncating", 1)
    assert status == ExitCode.FAILED, err
    assert "truncating: its one unit ended truncated in every run" in err
    assert _merged(tmp_path, 1) == (1, [key], [])


def test_a_model_whose_every_unit_got_a_5xx_is_temporary_for_the_merge_too(
        tmp_path: Path) -> None:
    # The server's failure, not the model's: fanout batch says 75, and so does the merge
    # (it once said 1: every unit of the model "ended the same way").
    status, err = _batch(tmp_path, "broken", 3)
    assert status == ExitCode.TEMPFAIL, err
    code, failed, unfinished = _merged(tmp_path, 3)
    assert (code, failed, len(unfinished)) == (75, [], 3)


def test_a_resume_skips_the_requests_refused_as_sent_and_they_stay_failed(
        tmp_path: Path) -> None:
    status, err = _batch(tmp_path, "refused", 3)
    assert status == ExitCode.FAILED, err
    assert len(_records(tmp_path)) == 3
    # The same requests again: nothing is sent, and they are failed for good as before.
    status, err = _batch(tmp_path, "refused", 3)
    assert status == ExitCode.FAILED, err
    assert ("fanout batch: 3 units skipped: refused as sent before (HTTP 400); "
            "--retry-failed to send them again") in err.splitlines()
    assert err.splitlines()[-1].startswith(
        "fanout batch: exit 1: 3 units failed in ways a rerun will not fix (HTTP 400")
    assert len(_records(tmp_path)) == 3
    # One unit more (a prompt added): only it is sent; all 4 are of the same class.
    status, err = _batch(tmp_path, "refused", 4)
    assert status == ExitCode.FAILED, err
    assert "fanout batch: 3 units skipped: refused as sent before (HTTP 400); " \
        "--retry-failed to send them again" in err.splitlines()
    assert err.splitlines()[-1].startswith("fanout batch: exit 1: 4 units failed")
    assert [r["id"] for r in _records(tmp_path)] == ["q0", "q1", "q2", "q3"]
    assert _merged(tmp_path, 4)[:2] == (1, sorted(work_key(f"q{i}", "refused", 0)
                                                  for i in range(4)))
    # --retry-failed sends them again.
    status, err = _batch(tmp_path, "refused", 4, retry_failed=True)
    assert status == ExitCode.FAILED, err
    assert "skipped" not in err
    assert len(_records(tmp_path)) == 8


def test_a_request_changed_since_it_was_refused_is_sent(tmp_path: Path) -> None:
    status, _ = _batch(tmp_path, "refused", 2)
    assert status == ExitCode.FAILED
    err = io.StringIO()
    status = run_batch(BatchOptions(
        prompts=_prompts(tmp_path, 2, changed=" (reworded)"), output=str(
            tmp_path / "results.jsonl"), models=("refused",), config=_config(tmp_path)),
        stdout=io.StringIO(), stderr=err, environ={})
    assert status == ExitCode.FAILED, err.getvalue()
    assert "skipped" not in err.getvalue()
    assert len(_records(tmp_path)) == 4


def test_a_relays_connection_error_is_never_the_models_own() -> None:
    # The same in-band error twice is the model's own, unless its words say the relay's
    # connection to its backend broke (LiteLLM's "Connection error."): that is temporary.
    from fanout.batch.summary import Final, judge
    litellm = ("litellm.APIConnectionError: APIConnectionError: OpenAIException - "
               "Connection error.")
    for reason, permanent in ((litellm, False), ("boom: the model failed", True)):
        failed = {f"k{i}": Final("m", "error", 200, reason) for i in range(3)}
        verdict = judge(failed, {"m": 3}, samples=lambda key: 1)
        assert (set(verdict.permanent) == set(failed)) is permanent, reason
