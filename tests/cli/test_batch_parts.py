"""The pieces of `fanout batch`: prompts file, results file, shards, AIMD, report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from fanout import ChoiceResult, Flag, Outcome, StreamResult, Usage
from fanout.batch.plan import plan_work
from fanout.batch.session import is_done
from fanout.batch.summary import Final as _Final
from fanout.batch.summary import not_completed as _not_completed
from fanout.cli.report import _percentile, model_summary
from fanout.config import parse_config
from fanout.ratelimit import AdaptiveLimit, EndpointLimit
from fanout.store.prompts import PromptFileError, load_prompts
from fanout.store.results import (
    ResultsFile,
    parse_shard,
    read_results,
    shard_of,
    state_of,
    work_key,
)


def not_completed(finals: dict[str, _Final], total: int, ran: Any, *,
                  accept_empty: bool) -> list[str]:
    """The lines of ``fanout.batch.summary.not_completed``, as ``fanout batch`` prints
    them (server text made printable)."""
    from fanout.cli.report import printable
    return [printable(line) for line in
            _not_completed(finals, total, ran, accept_empty=accept_empty)[0]]

CONFIG = parse_config("[endpoint]\nbase_url = 'embedded'\n"
                      "[[models]]\nname = 'a'\nid = 'mock/fast'\n"
                      "[[models]]\nname = 'b'\nid = 'mock/echo'\nparams = { max_tokens = 5 }\n")


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# -------------------------------------------------------------------- prompts

def test_prompts_in_both_shapes(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl",
        json.dumps({"id": "q1", "prompt": "Hi?", "expected": "ignored"}),
        "",
        json.dumps({"id": 2, "messages": [{"role": "user", "content": "Yo"}], "system": "Be brief.",
                    "params": {"temperature": 0}, "tools": [{"type": "function"}]}),
    )
    first, second = load_prompts(path)
    assert (first.id, first.messages, first.line) == ("q1", ({"role": "user", "content": "Hi?"},), 1)
    assert second.messages[0] == {"role": "system", "content": "Be brief."}
    assert second.params == {"temperature": 0} and second.tools == ({"type": "function"},)
    assert second.line == 3


def test_every_bad_line_is_reported_with_its_number(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "p.jsonl",
        json.dumps({"id": "ok", "prompt": "fine"}),
        '{"id": "broken", "prompt": ',
        json.dumps({"prompt": "no id"}),
        json.dumps({"id": "ok", "prompt": "again"}),
        json.dumps({"id": "both", "prompt": "x", "messages": [{"role": "user", "content": "y"}]}),
        json.dumps({"id": "none"}),
        json.dumps({"id": True, "prompt": "x"}),
        json.dumps({"id": "m", "messages": []}),
        json.dumps({"id": "r", "messages": [{"content": "x"}]}),
        json.dumps({"id": "p", "prompt": "x", "params": {"stream": False}}),
        json.dumps({"id": "t", "prompt": "x", "tools": {"type": "function"}}),
        json.dumps(["not", "an", "object"]),
        json.dumps({"id": "e", "prompt": "   "}),
        json.dumps({"id": 1, "prompt": "int id"}),
        json.dumps({"id": "1", "prompt": "the same id as a string"}),
    )
    with pytest.raises(PromptFileError) as caught:
        load_prompts(path)
    name = str(path)
    assert caught.value.problems == [
        f"{name}:2: bad JSON: Expecting value (column 28)",
        f"{name}:3: missing id",
        f"{name}:4: duplicate id 'ok' (first on line 1)",
        f"{name}:5: has both prompt and messages: give one",
        f"{name}:6: needs exactly one of prompt or messages",
        f"{name}:7: id must be a non-empty string or an integer, not true",
        f"{name}:8: messages must be a non-empty list, not a list",
        f"{name}:9: messages[0].role must be a string, not null",
        f"{name}:10: params must not set 'stream'",
        f"{name}:11: tools must be a list of objects, not an object",
        f"{name}:12: must be a JSON object, not a list",
        f"{name}:13: prompt must be a non-empty string, not '   '",
        f"{name}:15: duplicate id '1' (first on line 14)",
    ]
    assert str(caught.value) == f"{name}: 13 bad lines"


def test_unreadable_prompt_files(tmp_path: Path) -> None:
    with pytest.raises(PromptFileError, match="no such file"):
        load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(PromptFileError) as caught:
        load_prompts(tmp_path / "empty.jsonl")
    assert caught.value.problems == [f"{tmp_path / 'empty.jsonl'}: no prompts (the file is empty)"]
    (tmp_path / "latin1.jsonl").write_bytes(b'{"id": "x", "prompt": "caf\xe9"}\n')
    with pytest.raises(PromptFileError) as caught:
        load_prompts(tmp_path / "latin1.jsonl")
    assert caught.value.problems == [f"{tmp_path / 'latin1.jsonl'}:1: not UTF-8 text"]


def test_many_bad_lines_are_listed_up_to_a_limit(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "p.jsonl", *["{"] * 80)
    with pytest.raises(PromptFileError) as caught:
        load_prompts(path)
    assert len(caught.value.problems) == 51 and caught.value.total == 80
    assert caught.value.problems[-1].endswith("... and 30 more bad lines")


# ------------------------------------------------------------ work and shards

def test_work_is_every_prompt_model_and_sample(tmp_path: Path) -> None:
    prompts = load_prompts(write_lines(tmp_path / "p.jsonl",
                                       *(json.dumps({"id": f"q{i}", "prompt": f"p{i}"})
                                         for i in range(5))))
    work = plan_work(prompts, CONFIG.models, 3, CONFIG)
    assert len(work) == 5 * 2 * 3 and len({w.key for w in work}) == 30
    assert work[0].request(CONFIG).params == {}
    assert work[3].request(CONFIG).params == {"max_tokens": 5}  # model b's params
    # The content key is stable across runs (the embedded port is not in it) and
    # changes with what is asked.
    again = plan_work(prompts, CONFIG.models, 3, CONFIG)
    assert [w.content_key for w in work] == [w.content_key for w in again]
    assert len({w.content_key for w in work}) == 10  # samples share theirs


@pytest.mark.parametrize("shards", [1, 2, 3, 7])
def test_shards_partition_the_work_exactly(tmp_path: Path, shards: int) -> None:
    prompts = load_prompts(write_lines(tmp_path / "p.jsonl",
                                       *(json.dumps({"id": i, "prompt": "x"}) for i in range(40))))
    everything = {w.key for w in plan_work(prompts, CONFIG.models, 2, CONFIG)}
    parts = [{w.key for w in plan_work(prompts, CONFIG.models, 2, CONFIG, (i, shards))}
             for i in range(shards)]
    assert sum(len(p) for p in parts) == len(everything) == 160
    assert set().union(*parts) == everything
    if shards > 1:
        assert all(parts)  # every shard gets some of 160


def test_shard_of_is_a_fixed_hash() -> None:
    key = work_key("q1", "a", 0)
    assert key == '["q1", "a", 0]' == work_key("q1", "a", 0)
    assert work_key(1, "a", 0) == work_key("1", "a", 0)
    assert shard_of(key, 1000) == 559  # sha256, the same on every machine


@pytest.mark.parametrize(("text", "error"), [
    ("0/4", None), ("3/4", None), ("4/4", "I must be in 0..N-1"), ("-1/4", "I must be in"),
    ("1", "expected I/N"), ("a/b", "expected I/N"), ("0/0", "N >= 1"),
])
def test_parse_shard(text: str, error: str | None) -> None:
    if error is None:
        assert parse_shard(text) == tuple(map(int, text.split("/")))
    else:
        with pytest.raises(ValueError, match=error):
            parse_shard(text)


# --------------------------------------------------------------- results file

def record(prompt_id: str, outcome: str = "completed", **extra: object) -> dict[str, object]:
    return {"id": prompt_id, "model": "a", "sample": 0, "outcome": outcome,
            "content_key": "k", **extra}


def test_the_latest_record_of_a_key_counts(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in (
        record("q1", "error"), record("q2"), record("q1", "completed"))))
    existing = read_results(path)
    assert existing.records == 3 and existing.torn_bytes == 0 and not existing.unreadable
    assert existing.latest[work_key("q1", "a", 0)]["outcome"] == "completed"
    assert list(existing.latest) == [work_key("q2", "a", 0), work_key("q1", "a", 0)]


def test_a_torn_last_line_is_ignored_then_cut(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    whole = json.dumps(record("q1")) + "\n" + json.dumps(record("q2")) + "\n"
    torn = json.dumps(record("q3"))[:25]
    path.write_text(whole + torn)
    existing = read_results(path)
    assert set(existing.latest) == {work_key("q1", "a", 0), work_key("q2", "a", 0)}
    assert existing.torn_bytes == len(torn) and existing.valid_size == len(whole)
    writer = ResultsFile(path)
    writer.write(record("q3"))
    writer.close()
    assert path.read_text() == whole + json.dumps(record("q3"), separators=(",", ":")) + "\n"


def test_a_whole_unterminated_last_record_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record("q1")) + "\n" + json.dumps(record("q2")))
    existing = read_results(path)
    assert len(existing.latest) == 2 and existing.torn_bytes == 0
    writer = ResultsFile(path)
    writer.write(record("q3"))
    writer.close()
    lines = path.read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == ["q1", "q2", "q3"]


def test_lines_that_are_not_records_are_counted_by_kind(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(record("q1")).encode() + b"\nnot json\n" + b'{"no": "fields"}\n'
                     + b"\xff\xfe\n" + json.dumps(record("q2")).encode() + b"\n")
    existing = read_results(path)
    assert len(existing.latest) == 2
    assert existing.unreadable.describe() == [
        "1 line is not JSON: line 2",
        "1 line is not a fanout record: line 3 (no id, model, sample, outcome, "
        "content_key)",
        "1 line is not UTF-8 text: line 4"]


def test_a_missing_file_is_empty(tmp_path: Path) -> None:
    existing = read_results(tmp_path / "none.jsonl")
    assert existing.records == 0 and not existing.latest


def test_the_writer_survives_what_orjson_refuses(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    writer = ResultsFile(path)
    writer.write(record("big", parsed=2**70, text="lone \ud800 surrogate"))
    writer.sync()
    writer.close()
    assert path.read_bytes().count(b"\n") == 1 and b"\\ud800" in path.read_bytes()
    line = json.loads(path.read_text())
    assert line["parsed"] == 2**70 and line["text"] == "lone \ud800 surrogate"


def test_writing_into_a_missing_directory_fails_clearly(tmp_path: Path) -> None:
    from fanout.store.results import ResultsFileError
    with pytest.raises(ResultsFileError, match=r"cannot open for writing: No such file or "
                       r"directory .*/nope/ does not exist"):
        ResultsFile(tmp_path / "nope" / "r.jsonl")


# ----------------------------------------------------------------------- AIMD

async def test_a_429_halves_once_per_cooldown(autojump_clock: MockClock) -> None:
    limit = AdaptiveLimit(16, cooldown=1.0)
    now = trio.current_time()
    limit.rate_limited_now(now, 2.0)
    limit.rate_limited_now(now + 0.1, 2.0)  # the same burst: no second halving
    assert (limit.limit, limit.rate_limited, limit.decreases) == (8, 2, 1)
    limit.rate_limited_now(now + 1.5, None)
    assert limit.limit == 4
    for _ in range(5):
        limit.rate_limited_now(trio.current_time() + 100, None)
        await trio.sleep(2)
    assert limit.limit == 1 and limit.lowest == 1  # never below the minimum


async def test_successes_add_one_slot_per_window(autojump_clock: MockClock) -> None:
    limit = AdaptiveLimit(8)
    limit.rate_limited_now(trio.current_time(), None)
    assert limit.limit == 4
    for _ in range(3):
        limit.succeeded()
    assert limit.limit == 4
    limit.succeeded()
    assert limit.limit == 5  # after 4 successes at a limit of 4
    for _ in range(100):
        limit.succeeded()
    assert limit.limit == 8 == limit.maximum  # never above the cap


async def test_lowering_the_limit_never_takes_a_slot_back(autojump_clock: MockClock) -> None:
    limit = AdaptiveLimit(4)
    for borrower in range(4):
        limit.limiter.acquire_on_behalf_of_nowait(borrower)
    limit.rate_limited_now(trio.current_time(), None)
    assert limit.limit == 2 and limit.limiter.borrowed_tokens == 4  # running streams run on
    for borrower in range(2):
        limit.limiter.release_on_behalf_of(borrower)
    with pytest.raises(trio.WouldBlock):
        limit.limiter.acquire_on_behalf_of_nowait("new")  # 2 borrowed, 2 allowed
    limit.limiter.release_on_behalf_of(2)
    limit.limiter.acquire_on_behalf_of_nowait("new")  # 1 borrowed: room for one


async def test_a_429_pauses_submissions_for_its_wait(autojump_clock: MockClock) -> None:
    limit = AdaptiveLimit(4)
    start = trio.current_time()
    limit.rate_limited_now(start, 3.0)
    await limit.wait_if_paused()
    assert trio.current_time() - start == pytest.approx(3.0)
    assert limit.paused == pytest.approx(3.0)
    await limit.wait_if_paused()  # no pause running: no wait
    assert trio.current_time() - start == pytest.approx(3.0)


# ------------------------------------------------------- the endpoint's limit

async def test_a_cut_halves_the_endpoint_once_per_generation(autojump_clock: MockClock) -> None:
    limit = EndpointLimit(16)
    sent = trio.current_time()
    await trio.sleep(1)
    assert limit.cut(sent, trio.current_time(), running=16) is True
    assert (limit.limit, limit.lowest, limit.cuts) == (8, 8, 1)
    # Streams sent before that decrease are the same burst: no second halving.
    assert limit.cut(sent, trio.current_time() + 0.5, running=12) is False
    assert limit.limit == 8 and limit.cuts == 2
    await trio.sleep(1)
    later = trio.current_time()  # sent after the decrease: a new generation's cut
    assert limit.cut(later, later + 0.1, running=3) is True
    assert limit.limit == 1  # half of what ran when it was cut, not of the limit
    assert limit.cut(later + 1, later + 2, running=2) is False  # never below 1
    assert (limit.limit, limit.lowest, limit.decreases) == (1, 1, 2)


def test_after_a_cut_a_slot_back_takes_longer_each_time() -> None:
    limit = EndpointLimit(4, probe=8)
    limit.cut(0.0, 1.0, running=2)
    assert limit.limit == 1
    for _ in range(7):
        limit.succeeded()
    assert limit.limit == 1
    limit.succeeded()
    assert limit.limit == 2  # the probe, after 8 successes in a row
    limit.cut(2.0, 3.0, running=2)  # the probe was cut: back to 1, and twice the wait
    assert limit.limit == 1
    for _ in range(15):
        limit.succeeded()
    assert limit.limit == 1
    limit.succeeded()
    assert limit.limit == 2
    limit.reset()  # the cuts were not the server's doing
    assert limit.limit == 4 and limit.lowest == 1
    limit.cut(4.0, 5.0, running=4)
    for _ in range(2):
        limit.succeeded()
    assert limit.limit == 2  # after a reset, the first probe waits 8 again
    for _ in range(6):
        limit.succeeded()
    assert limit.limit == 3


def test_a_success_never_raises_the_endpoint_above_its_maximum() -> None:
    limit = EndpointLimit(2)
    for _ in range(100):
        limit.succeeded()
    assert limit.limit == 2 and limit.lowest == 2 and limit.cuts == 0


# ----------------------------------------------------------- what a run says

def final(model: str, state: str, status: int | None = None,
          reason: str | None = "why") -> _Final:
    return _Final(model, state, status, reason)


def test_running_again_is_advised_only_when_it_can_help() -> None:
    from collections import Counter
    # a: some of its streams timed out, not all: a rerun may well do better.
    finals = {"1": final("a", "timed_out"), "2": final("b", "truncated", reason="cut")}
    assert not_completed(finals, 10, Counter({"a": 5, "b": 5}), accept_empty=False) == [
        "2 of 10 streams are not completed; run the same command again to redo them"]
    # b failed every one of its streams, the same way, but a 5xx is the server's: a rerun
    # may finish them; c had a 400 (for good) and a 503.
    finals = {"1": final("b", "error", 500, "HTTP 500: boom"),
              "2": final("b", "error", 500, "HTTP 500: boom again"),
              "3": final("c", "error", 400, "HTTP 400: bad\x1b[2J field"),
              "4": final("c", "error", 503, "HTTP 503: busy")}
    assert not_completed(finals, 9, Counter({"b": 2, "c": 5}), accept_empty=False) == [
        "4 of 9 streams are not completed",
        "c: 1 request refused as sent (HTTP 400: bad field): running again sends it unchanged; "
        "fix the prompt, the params or the model",
        "run the same command again to redo the other 3"]
    _, failures = _not_completed(finals, 9, Counter({"b": 2, "c": 5}), accept_empty=False)
    assert [f.key for f in failures if f.permanent] == ["3"]
    # b's every stream truncated: that is the model's own, a rerun will not help.
    finals = {"1": final("b", "truncated", 200, "cut"), "2": final("b", "truncated", 200, "cut")}
    lines, failures = _not_completed(finals, 2, Counter({"b": 2}), accept_empty=False)
    assert lines[1].startswith("b: all 2 of its streams were truncated (cut)")
    assert all(f.permanent for f in failures)
    # One stream is no pattern; 408, 409 and 429 are worth another try.
    for status in (408, 409, 429):
        lines = not_completed({"1": final("d", "error", status)}, 1, Counter({"d": 1}),
                              accept_empty=False)
        assert lines == ["1 of 1 streams are not completed; run the same command again to "
                         "redo them"]
    lines = not_completed({"1": final("e", "empty", 200, None), "2": final("e", "empty", 200,
                                                                        None)},
                          2, Counter({"e": 2}), accept_empty=False)
    assert lines[1] == ("e: all 2 of its streams came back empty: running the same "
                        "command again will not help; --accept-empty counts empty answers as "
                        "done")


def test_what_a_record_counts_as() -> None:
    assert state_of({"outcome": "completed", "flags": [], "choices": []}) == "completed"
    assert state_of({"outcome": "completed", "flags": ["empty_answer"]}) == "empty"
    assert state_of({"outcome": "completed", "flags": ["missing_usage"]}) == "completed"
    assert state_of({"outcome": "completed", "flags": ["unfinished_choice"]}) == "truncated"
    assert state_of({"outcome": "completed", "flags": [], "cut": True}) == "truncated"
    assert state_of({"outcome": "timed_out", "flags": []}) == "timed_out"
    # Written before flags existed: the choices say whether anything came.
    old = {"outcome": "completed", "choices": [{"text": " ", "reasoning": "", "refusal": "",
                                                "tool_calls": []}]}
    assert state_of(old) == "empty"
    old["choices"][0]["tool_calls"] = [{"name": "f"}]  # type: ignore[index]
    assert state_of(old) == "completed"
    assert state_of({"outcome": "completed"}) == "completed"  # nothing to go by
    assert is_done("completed", False) and not is_done("empty", False)
    assert is_done("empty", True) and not is_done("truncated", True)


# --------------------------------------------------------------------- report

def test_percentiles() -> None:
    assert _percentile([], 50) is None
    assert _percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert _percentile([float(i) for i in range(1, 101)], 95) == pytest.approx(95.05)  # linear
    assert _percentile([1.0], 95) == 1.0


def test_the_summary_counts_latest_outcomes_and_every_429() -> None:
    def r(pid: str, outcome: str, ttft: float | None, **extra: object) -> dict[str, object]:
        return record(pid, outcome, metrics={"ttft": ttft, "tokens_per_second": 10.0},
                      usage={"prompt_tokens": 3, "completion_tokens": 7}, **extra)

    rows = [r("q1", "error", None, rate_limited=3, retry_wait=3.0),
            r("q1", "completed", 0.2), r("q2", "completed", 0.4),
            r("q3", "timed_out", None, rate_limited=1, retry_wait=0.5)]
    summary = model_summary(rows)["a"]
    assert summary["runs"] == 3 and summary["completed"] == 2 and summary["timed_out"] == 1
    assert summary["error"] == 0  # q1's error was redone
    assert summary["completed_pct"] == pytest.approx(200 / 3)
    assert summary["ttft_p50"] == pytest.approx(0.3) and summary["ttft_p95"] == pytest.approx(0.39)
    assert summary["tokens_in"] == 9 and summary["tokens_out"] == 21
    assert summary["rate_limited"] == 4 and summary["retry_wait"] == 3.5


# ------------------------------------------------------- what counts as a cut

class _Fan:
    """What Session._finished needs of a fan-out."""

    def forget(self, key: str) -> None:
        pass


def _session(tmp_path: Path, *, accept_empty: bool = False, prompts: int = 4,
             concurrency: int = 8, scoring: Any = None) -> tuple[Any, list[Any]]:
    from fanout.batch import BatchOptions
    from fanout.batch.session import Session
    tmp_path.mkdir(exist_ok=True)
    lines = [json.dumps({"id": f"q{i}", "prompt": f"p{i}"}) for i in range(prompts)]
    work = plan_work(load_prompts(write_lines(tmp_path / "p.jsonl", *lines)), CONFIG.models[:2],
                     1, CONFIG)
    writer = ResultsFile(tmp_path / "r.jsonl")
    options = BatchOptions(prompts="p", output="r", concurrency=concurrency,
                           accept_empty=accept_empty)
    return Session(CONFIG, options, work, writer, cap=concurrency,
                   stamp={"shard": "0/1", "plan": "p", "run": "r"}, scoring=scoring), work


def _send(session: Any, unit: Any) -> None:
    # What _submit_model does for one unit, without a fan-out.
    session.queues[unit.model.name].remove(unit)
    session._pending += 1
    session.limits[unit.model.name].limiter.acquire_on_behalf_of_nowait(unit.key)
    session.endpoint.limiter.acquire_on_behalf_of_nowait(unit.key)
    session._submitted[unit.key] = trio.current_time()


def _end(session: Any, unit: Any, outcome: Outcome, *, others: int, text: str = "hi",
         usage: bool = True, flags: tuple[Flag, ...] = ()) -> dict[str, Any]:
    choices = (ChoiceResult(0, text=text, finish_reason="stop"),)
    result = StreamResult(outcome, choices=choices, flags=flags, stream=unit.key,
                          usage=Usage(1, 2, 3) if usage else None, others_running=others)
    written = session.writer.written
    session._finished(_Fan(), result)
    assert session.writer.written == written + 1  # every ending is a record
    return records_of(session)[-1]


def records_of(session: Any) -> list[dict[str, Any]]:
    session.writer.sync()
    return [json.loads(line) for line in session.writer.path.read_text().splitlines()]


async def test_a_cut_while_others_ran_is_redone_first_and_lowers_the_endpoint(
        tmp_path: Path) -> None:
    session, work = _session(tmp_path)
    a0, a1 = work[0], work[2]  # model a, prompts 0 and 1
    for unit in work:
        _send(session, unit)
    await trio.sleep(0.01)
    record = _end(session, a0, Outcome.TRUNCATED, others=7)
    assert record["cut"] is True and record["redo"] == 0
    assert session.queues["a"][0] is a0 and session.endpoint.limit == 4
    record = _end(session, a1, Outcome.TRUNCATED, others=6)  # the same burst
    assert record["cut"] is True and session.endpoint.limit == 4
    assert list(session.queues["a"])[:2] == [a1, a0]
    for unit in work[1:6:2]:  # b's first three complete: 3 in flight, room for a redo
        assert _end(session, unit, Outcome.COMPLETED, others=4)["cut"] is False
    _send(session, a0)
    record = _end(session, a0, Outcome.COMPLETED, others=3)
    assert (record["cut"], record["redo"], record["outcome"]) == (False, 1, "completed")
    assert session.counts == {"completed": 4} and session.redone == 2
    assert session.cut_lines() == [
        "the server cut 2 answers while up to 8 streams ran at once; they were redone at lower "
        "concurrency (8 → 4); set [concurrency] max = 4 for this endpoint (or --concurrency 4)"]
    # the endpoint is named, without what its URL may carry beside the address
    session.endpoint.url = "http://user:secret@relay.example:4000/v1?token=abc"
    assert session.cut_lines()[0].startswith(
        "the server cut 2 answers while up to 8 streams ran at once on "
        "http://relay.example:4000/v1; they were redone")


async def test_a_unit_is_redone_at_most_max_redos_times(tmp_path: Path) -> None:
    from fanout.batch.options import MAX_REDOS
    session, work = _session(tmp_path)
    unit = work[0]
    for n in range(MAX_REDOS + 1):
        _send(session, unit)
        record = _end(session, unit, Outcome.TRUNCATED, others=1)
        assert record["cut"] is (n < MAX_REDOS) and record["redo"] == n
    assert session.still_cut == 1 and session.finals[unit.key].state == "truncated"
    assert session.cut_lines()[1] == f"1 stream was still cut after {MAX_REDOS} redos"


class _Submits:
    """A fan-out that records when each request was submitted."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, float]] = []

    async def submit(self, request: Any) -> None:
        self.sent.append((request.key, trio.current_time()))


@pytest.mark.parametrize("seed", range(5))
def test_redos_back_off_as_retries_do(tmp_path: Path, seed: int) -> None:
    # A dead server cuts (or refuses) every redo: each redo of a unit waits longer than
    # the one before (up to BATCH_RETRY's ceiling for that redo), never all at once.
    from fanout.batch.options import BATCH_RETRY, MAX_REDOS

    async def main() -> list[float]:
        session, work = _session(tmp_path / str(seed))
        session._rng.seed(seed)
        unit = work[0]
        session.queues["b"].clear()
        fan = _Submits()
        waits: list[float] = []
        _send(session, unit)
        for n in range(1, MAX_REDOS + 1):
            cut_at = trio.current_time()
            assert _end(session, unit, Outcome.TRUNCATED, others=1)["cut"] is True
            due = session.redo_due[unit.key]
            assert cut_at <= due <= cut_at + min(BATCH_RETRY.maximum,
                                                 BATCH_RETRY.initial * 2 ** (n - 1))
            # The model's submitter sends the redo only once it is due (then waits, with
            # the redo pending, until this test gives up on it).
            with trio.move_on_after(100):
                await session._submit_model(fan, "a")
            key, sent = fan.sent[-1]
            assert key == unit.key and sent == pytest.approx(due)
            waits.append(sent - cut_at)
        return waits

    waits = trio.run(main, clock=MockClock(autojump_threshold=0))
    assert len(waits) == MAX_REDOS and all(w >= 0 for w in waits)
    assert sum(waits) > 0


async def test_the_same_ending_alone_means_it_was_no_cut(tmp_path: Path) -> None:
    session, work = _session(tmp_path)
    a0, a1, a2, b0 = work[0], work[2], work[4], work[1]
    for unit in (a0, a1, a2, b0):
        _send(session, unit)
    assert _end(session, a0, Outcome.TRUNCATED, others=3)["cut"] is True
    assert session.endpoint.limit == 2
    assert _end(session, a1, Outcome.TRUNCATED, others=0)["cut"] is False  # alone: its own
    assert session.endpoint.limit == 8  # a's was the only evidence: back to the maximum
    _send(session, a0)
    assert _end(session, a2, Outcome.TRUNCATED, others=2)["cut"] is False  # excused now
    assert _end(session, b0, Outcome.TRUNCATED, others=1)["cut"] is True  # b is not
    assert session.excused == {"a": 1}


async def test_an_empty_answer_while_others_ran_is_a_cut_unless_accepted(
        tmp_path: Path) -> None:
    for accept, cut in ((False, True), (True, False)):
        session, work = _session(tmp_path / str(accept), accept_empty=accept)
        _send(session, work[0])
        record = _end(session, work[0], Outcome.COMPLETED, others=2, text="",
                      flags=(Flag.EMPTY_ANSWER,))
        assert record["cut"] is cut


async def test_a_relay_that_drops_usage_on_a_cut(tmp_path: Path) -> None:
    session, work = _session(tmp_path)
    first, other, third, fourth = work[0], work[1], work[2], work[4]  # a, b, a, a
    for unit in (first, other, third, fourth):
        _send(session, unit)
    # No usage yet from model a: a suspect, counted completed for now.
    assert _end(session, first, Outcome.COMPLETED, others=3, usage=False)["cut"] is False
    assert session.counts == {"completed": 1} and not session.queues["a"].count(first)
    # Usage from another model says nothing about a's: the suspect stands as it was.
    assert _end(session, other, Outcome.COMPLETED, others=2)["cut"] is False
    assert first not in session.queues["a"] and session.counts == {"completed": 2}
    # Usage comes from a itself: the suspect was cut after all, and is redone.
    assert _end(session, fourth, Outcome.COMPLETED, others=1)["cut"] is False
    assert session.queues["a"][0] is first and session.counts == {"completed": 2}
    assert first.key not in session.finals and session.redone == 1
    # From now on, no usage from a while others ran is a cut at once...
    assert _end(session, third, Outcome.COMPLETED, others=1, usage=False)["cut"] is True
    # ... until a stream of a completes without usage alone: a does that.
    _send(session, first)
    assert _end(session, first, Outcome.COMPLETED, others=0, usage=False)["cut"] is False
    _send(session, third)
    assert _end(session, third, Outcome.COMPLETED, others=3, usage=False)["cut"] is False


async def test_missing_usage_of_a_model_that_never_sends_it_is_no_cut(tmp_path: Path) -> None:
    # Model a sends no usage at all, model b always does: a's answers stand, are never
    # redone, and the endpoint's concurrency stays where it was.
    session, work = _session(tmp_path, prompts=6, concurrency=12)
    for unit in work:
        _send(session, unit)
    for unit in work:
        usage = unit.model.name == "b"
        assert _end(session, unit, Outcome.COMPLETED, others=5, usage=usage)["cut"] is False
    assert session.redone == 0 and session.endpoint.limit == 12 and not session.cut_lines()
    assert session.counts == {"completed": 12}


class _Scoring:
    """What a session asks of its scoring: the records it is given to score."""

    def __init__(self) -> None:
        self.added: list[tuple[str, int]] = []
        self.tallies: dict[str, Any] = {}
        self.on_budget: Any = None

    def add(self, record: dict[str, Any]) -> None:
        self.added.append((record["id"], record["redo"]))


async def test_a_suspect_answer_is_judged_only_once_known_not_cut(tmp_path: Path) -> None:
    scoring = _Scoring()
    session, work = _session(tmp_path, scoring=scoring)
    first, other, third, fourth = work[0], work[1], work[2], work[4]  # a, b, a, a
    for unit in (first, other, third, fourth):
        _send(session, unit)
    # Completed without usage while others ran, before a showed usage: not scored yet.
    _end(session, first, Outcome.COMPLETED, others=3, usage=False)
    assert scoring.added == []
    _end(session, other, Outcome.COMPLETED, others=2)  # b's usage: a's suspect waits on
    assert scoring.added == [("q0", 0)]
    # Usage came from a: first was cut, and is redone; only the redo's answer is scored.
    _end(session, fourth, Outcome.COMPLETED, others=1)
    assert scoring.added == [("q0", 0), ("q2", 0)]
    _end(session, third, Outcome.COMPLETED, others=1, usage=False)  # a cut now: not scored
    assert scoring.added == [("q0", 0), ("q2", 0)]
    _send(session, first)
    _end(session, first, Outcome.COMPLETED, others=0)
    assert scoring.added == [("q0", 0), ("q2", 0), ("q0", 1)]
    # A suspect that turns out to stand (its model completes without usage alone) is scored.
    session2, work2 = _session(tmp_path / "two", scoring=(scoring2 := _Scoring()))
    a, a2 = work2[0], work2[2]
    _send(session2, a)
    _send(session2, a2)
    _end(session2, a, Outcome.COMPLETED, others=1, usage=False)
    assert scoring2.added == []
    _end(session2, a2, Outcome.COMPLETED, others=0, usage=False)  # a sends none
    assert scoring2.added == [("q0", 0), ("q1", 0)]


def test_a_model_that_fails_the_same_way_beside_refused_requests_gets_no_advice() -> None:
    from collections import Counter
    # flaky: every stream truncated, but one request was refused (a bad param): neither
    # a rerun helps, and nothing else is left to redo.
    finals = {str(i): final("flaky", "truncated", None, "broke after 3 events")
              for i in range(5)}
    finals["bad"] = final("flaky", "error", 400, "HTTP 400: 'temperature' must be a number")
    finals["t"] = final("fast", "timed_out", None, "no event within 5 s")
    lines = not_completed(finals, 12, Counter({"flaky": 6, "fast": 6}), accept_empty=False)
    assert lines == [
        "7 of 12 streams are not completed",
        "flaky: 1 request refused as sent (HTTP 400: 'temperature' must be a number): running "
        "again sends it unchanged; fix the prompt, the params or the model",
        "flaky: all 5 of its other streams were truncated (broke after 3 events): "
        "running the same command again will not help",
        "run the same command again to redo the other 1"]
    # Some of its other streams completed: the truncations may go the other way.
    lines = not_completed(finals, 12, Counter({"flaky": 8, "fast": 6}), accept_empty=False)
    assert lines[-1] == "run the same command again to redo the other 6"


def test_a_model_s_tools_are_sent_unless_the_prompt_has_its_own(tmp_path: Path) -> None:
    config = parse_config("[endpoint]\nbase_url = 'embedded'\n"
                          "[[models]]\nname = 'a'\nid = 'mock/tools'\n"
                          "tools = [{ type = 'function', function = { name = 'from_model' } }]\n")
    prompts = load_prompts(write_lines(
        tmp_path / "p.jsonl", json.dumps({"id": 1, "prompt": "x"}),
        json.dumps({"id": 2, "prompt": "x",
                    "tools": [{"type": "function", "function": {"name": "from_prompt"}}]})))
    first, second = plan_work(prompts, config.models, 1, config)
    assert first.request(config).tools == config.models[0].tools
    assert second.request(config).tools == ({"type": "function",
                                             "function": {"name": "from_prompt"}},)
    assert first.content_key != plan_work(prompts, CONFIG.models[:1], 1, CONFIG)[0].content_key
