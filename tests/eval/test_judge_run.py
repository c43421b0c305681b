"""The judge runner through the embedded upstream: verdicts, usage, cost, failures."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from fanout.config import parse_config
from fanout.eval.run import Scoring, select_scorers
from fanout.request import Endpoint
from fanout.store.results import work_key
from fanout.store.scores import ScoresFile, answer_key, read_scores
from fanout.upstream import RunningUpstream

MODELS = """
[[models]]
name = "judge"
id = "mock/judge"
price = { input = 2.00, output = 8.00 }

[[models]]
name = "cut-judge"
id = "fault/truncate:2"

[[models]]
name = "stalled-judge"
id = "fault/stall"

[[scorers]]
name = "judged"
kind = "judge"
model = "judge"
concurrency = 2

[[scorers]]
name = "cut"
kind = "judge"
model = "cut-judge"

[[scorers]]
name = "stalled"
kind = "judge"
model = "stalled-judge"
deadlines = { first_token = 0.3, idle = 0.3 }

[[scorers]]
name = "exact"
kind = "exact"
"""


def _record(prompt_id: str, text: str, *, expected: Any = None, outcome: str = "completed",
            reason: str | None = None) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": prompt_id, "model": "writer", "sample": 0, "outcome": outcome, "reason": reason,
        "content_key": f"ck-{prompt_id}", "text": text, "finish_reason": "stop",
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "tool_calls": []}],
        "messages": [{"role": "user", "content": f"question {prompt_id}"}],
    }
    if expected is not None:
        record["expected"] = expected
    return record


RECORDS = [
    _record("right", "The answer is Paris.", expected="Paris"),
    _record("wrong", "The answer is Lyon.", expected="Paris"),
    _record("either", "It is azure today.", expected=["blue", "azure"]),
    _record("cut", "The ans", expected="Paris", outcome="truncated", reason="connection lost"),
]


def _config(upstream: RunningUpstream) -> Any:
    return parse_config(f'[endpoint]\nbase_url = "{upstream.base_url}"\n' + MODELS, "t.toml")


async def _run(upstream: RunningUpstream, path: Path, names: tuple[str, ...],
               records: list[dict[str, Any]] = RECORDS, **options: Any) -> Scoring:
    config = _config(upstream)
    writer = ScoresFile(path)
    try:
        scoring = Scoring(config, select_scorers(config, names), writer, **options)
        for record in records:
            scoring.add(record)
        scoring.close()
        await scoring.run(Endpoint(upstream.base_url))
    finally:
        writer.close()
    return scoring


async def test_the_judge_grades_through_the_upstream(tmp_path: Path,
                                                     upstream: RunningUpstream) -> None:
    path = tmp_path / "s.jsonl"
    scoring = await _run(upstream, path, ("judged", "exact"))
    # mock/judge: PASS when the expected text occurs in the answer (any of a list).
    scores = read_scores(path)
    verdicts = {k[0]: (s["status"], s["passed"]) for k, s in scores.items() if k[1] == "judged"}
    assert verdicts == {work_key("right", "writer", 0): ("scored", True),
                        work_key("wrong", "writer", 0): ("scored", False),
                        work_key("either", "writer", 0): ("scored", True),
                        work_key("cut", "writer", 0): ("unscored", None)}
    assert upstream.stats.requests == {"mock/judge": 3}  # none for the unscored answer
    tally = scoring.tallies["judged"]
    assert tally.statuses == {"scored": 3, "unscored": 1} and tally.passed == 2
    right = scores[(work_key("right", "writer", 0), "judged")]
    judge = right["judge"]
    assert judge["model"] == "judge" and judge["model_id"] == "mock/judge"
    assert judge["outcome"] == "completed" and re.search(r"\nVERDICT [0-9a-f]{16}: PASS$",
                                                                 judge["text"])
    usage = judge["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert judge["cost_source"] == "price"
    assert judge["cost"] == pytest.approx((usage["prompt_tokens"] * 2.0
                                           + usage["completion_tokens"] * 8.0) / 1e6)
    assert tally.judge_cost == pytest.approx(sum(
        s["judge"]["cost"] for k, s in scores.items() if k[1] == "judged" and "judge" in s))
    assert right["answer_key"] == answer_key(RECORDS[0])
    assert right["scorer"] == "judged" and right["kind"] == "judge"
    cut = scores[(work_key("cut", "writer", 0), "judged")]
    assert cut["explanation"].startswith("truncated") and "judge" not in cut


async def test_current_judge_scores_are_not_asked_again(tmp_path: Path,
                                                        upstream: RunningUpstream) -> None:
    path = tmp_path / "s.jsonl"
    await _run(upstream, path, ("judged",))
    assert upstream.stats.requests == {"mock/judge": 3}
    scoring = await _run(upstream, path, ("judged",))
    assert scoring.tallies["judged"].current == 4
    assert upstream.stats.requests == {"mock/judge": 3}
    # A changed answer is judged again, alone.
    changed = [*RECORDS[:1], _record("wrong", "Paris, of course.", expected="Paris"),
               *RECORDS[2:]]
    scoring = await _run(upstream, path, ("judged",), records=changed)
    assert scoring.tallies["judged"].current == 3
    assert upstream.stats.requests == {"mock/judge": 4}
    assert read_scores(path)[(work_key("wrong", "writer", 0), "judged")]["passed"] is True


async def test_a_cut_judge_stream_is_an_error_score_and_asked_again(
        tmp_path: Path, upstream: RunningUpstream) -> None:
    path = tmp_path / "s.jsonl"
    scoring = await _run(upstream, path, ("cut",), records=RECORDS[:2])
    tally = scoring.tallies["cut"]
    assert tally.statuses == {"error": 2} and tally.judge_failed == 2 and tally.passed == 0
    for score in read_scores(path).values():
        assert score["status"] == "error" and score["passed"] is None
        assert score["score"] is None
        assert score["explanation"].startswith("judge truncated: ")
        assert score["judge"]["outcome"] == "truncated"
        assert score["judge"]["reason"] and score["judge"]["reason"] in score["explanation"]
    first = upstream.stats.requests["fault/truncate:2"]
    # Not current: the judge did not answer, so a rerun asks it again.
    scoring = await _run(upstream, path, ("cut",), records=RECORDS[:2])
    assert scoring.tallies["cut"].current == 0
    assert upstream.stats.requests["fault/truncate:2"] > first


async def test_a_stalled_judge_times_out_into_an_error(tmp_path: Path,
                                                       upstream: RunningUpstream) -> None:
    path = tmp_path / "s.jsonl"
    scoring = await _run(upstream, path, ("stalled",), records=RECORDS[:1])
    assert scoring.tallies["stalled"].statuses == {"error": 1}
    (score,) = read_scores(path).values()
    assert score["judge"]["outcome"] == "timed_out"
    assert score["explanation"].startswith("judge timed_out: ")


def test_select_scorers_knows_builtins_and_suggests() -> None:
    config = parse_config('[endpoint]\nbase_url = "embedded"\n' + MODELS, "t.toml")
    chosen = select_scorers(config, ["judged", "exact", "includes"])
    assert [s.name for s in chosen] == ["judged", "exact", "includes"]
    assert chosen[0].is_judge and chosen[0].concurrency == 2
    assert chosen[0].judge_model is not None and chosen[0].judge_model.id == "mock/judge"
    assert not chosen[1].is_judge and not chosen[2].is_judge
    stalled = select_scorers(config, ["stalled"])[0]
    assert stalled.deadlines is not None and stalled.deadlines.first_token == 0.3
    with pytest.raises(ValueError, match=r"--score 'judgd': no such scorer \(did you mean "
                                         r"'judged'\?\)"):
        select_scorers(config, ["judgd"])
    with pytest.raises(ValueError, match="asked for twice"):
        select_scorers(config, ["exact", "exact"])


@pytest.mark.parametrize(("scorer", "problem"), [
    ('name = "x"\nkind = "exact"\nignore_case = "yes"',
     "t.toml: scorers[1] (name 'x'): option 'ignore_case': must be true or false, not 'yes'"),
    ('name = "x"\nkind = "exactt"',
     "t.toml: scorers[1] (name 'x') kind: 'exactt' is not a kind of scorer (did you mean "
     "'exact'?)"),
    ('name = "x"\nkind = "judge"\nmodel = "jduge"',
     "t.toml: scorers[1] (name 'x') model: no model named 'jduge' (did you mean 'judge'?)"),
    ('kind = "exact"', "t.toml: scorers[1]: name is missing"),
])
def test_scorer_config_problems(scorer: str, problem: str) -> None:
    from fanout import ConfigError

    text = ('[endpoint]\nbase_url = "embedded"\n[[models]]\nname = "judge"\nid = "mock/judge"\n'
            f"[[scorers]]\n{scorer}\n")
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.toml")
    assert str(info.value).startswith(problem)


def test_every_config_problem_is_listed() -> None:
    from fanout import ConfigError

    text = ('[endpoint]\nbase_url = "embedded"\n'
            '[[models]]\nname = "m"\nid = "mock/fast"\nprice = { input = -1, output = 2 }\n'
            '[[models]]\nname = "n"\nid = "mock/fast"\nprice = { inptu = 1, output = 2 }\n'
            '[[scorers]]\nname = "a"\nkind = "exact"\n'
            '[[scorers]]\nname = "a"\nkind = "includes"\n')
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.toml")
    assert info.value.problems == [
        "t.toml: [[models]] #1 (m) price input: must be a number >= 0 (USD per million "
        "tokens), not -1",
        "t.toml: [[models]] #2 (n) price: unknown key 'inptu' (did you mean 'input'?) (known: "
        "input, output, cached_input)",
        "t.toml: scorers[2]: the name 'a' is used twice",
    ]


def test_a_price_needs_input_and_output() -> None:
    from fanout import ConfigError

    with pytest.raises(ConfigError, match=r"price: input missing"):
        parse_config('[[models]]\nname = "m"\nid = "x"\nprice = { output = 1 }\n', "t.toml")
    config = parse_config('[[models]]\nname = "m"\nid = "x"\n'
                          'price = { input = 1, output = 2.5, cached_input = 0.5 }\n')
    price = config.models[0].price
    assert price is not None
    assert (price.input, price.output, price.cached_input) == (1.0, 2.5, 0.5)


@pytest.mark.parametrize("api", ["responses", "anthropic"])
async def test_a_judge_in_another_dialect_grades_the_same(tmp_path: Path, api: str,
                                                          upstream: RunningUpstream) -> None:
    """A judge model with ``api = ...`` is asked in its own dialect (its route, its body),
    and its verdicts are the chat judge's."""
    config = parse_config(f'[endpoint]\nbase_url = "{upstream.base_url}"\n'
                          f'[[models]]\nname = "judge"\nid = "mock/judge"\napi = "{api}"\n'
                          '[[scorers]]\nname = "judged"\nkind = "judge"\nmodel = "judge"\n',
                          "t.toml")
    path = tmp_path / "s.jsonl"
    writer = ScoresFile(path)
    try:
        scoring = Scoring(config, select_scorers(config, ("judged",)), writer)
        for record in RECORDS:
            scoring.add(record)
        scoring.close()
        await scoring.run(Endpoint(upstream.base_url))
    finally:
        writer.close()
    verdicts = {k[0]: (s["status"], s["passed"]) for k, s in read_scores(path).items()}
    assert verdicts == {work_key("right", "writer", 0): ("scored", True),
                        work_key("wrong", "writer", 0): ("scored", False),
                        work_key("either", "writer", 0): ("scored", True),
                        work_key("cut", "writer", 0): ("unscored", None)}
    assert upstream.stats.routes == {api: 3}  # /v1/responses or /v1/messages, none else


# ------------------------------------------------------------ one slot, judges alone

def _slot_judges(upstream: RunningUpstream, cadence: float, extra: str = "") -> Any:
    return parse_config(f'[endpoint]\nbase_url = "{upstream.base_url}"\n{extra}'
                        f'[[models]]\nname = "judge"\nid = "slot/judge:{cadence}"\n'
                        '[[scorers]]\nname = "judged"\nkind = "judge"\nmodel = "judge"\n'
                        'concurrency = 4\n', "t.toml")


SLOT_RECORDS = [_record(f"q{i}", f"The answer is {'Paris' if i % 2 else 'Lyon'}.",
                        expected="Paris") for i in range(8)]


async def _score_all(config: Any, upstream: RunningUpstream, path: Path) -> Scoring:
    writer = ScoresFile(path)
    try:
        scoring = Scoring(config, select_scorers(config, ("judged",)), writer)
        for record in SLOT_RECORDS:
            scoring.add(record)
        scoring.close()
        await scoring.run(Endpoint(upstream.base_url))
    finally:
        writer.close()
    return scoring


@pytest.mark.parametrize("cadence", [0.002, 0.005, 0.01])
async def test_a_judge_the_server_cut_is_asked_again_never_scored(
        tmp_path: Path, upstream: RunningUpstream, cadence: float) -> None:
    # Four judge requests at once on one slot: each new one cuts the one being served.
    # A cut reply is no verdict: it is asked again, at the endpoint's lowered limit.
    path = tmp_path / "s.jsonl"
    scoring = await _score_all(_slot_judges(upstream, cadence), upstream, path)
    tally = scoring.tallies["judged"]
    assert upstream.context.slot.cuts >= 1
    assert tally.statuses == {"scored": 8} and tally.judge_failed == 0
    assert tally.judge_cut == upstream.context.slot.cuts  # every cut was seen, and asked again
    assert upstream.stats.requests["slot/judge:" + str(cadence)] == 8 + tally.judge_cut
    verdicts = {k[0]: s["passed"] for k, s in read_scores(path).items()}
    assert verdicts == {work_key(f"q{i}", "writer", 0): bool(i % 2) for i in range(8)}
    assert scoring.endpoint is not None and scoring.endpoint.lowest < 4
    assert f", {tally.judge_cut} judge stream" in tally.line("judged")


async def test_the_endpoint_cap_holds_for_judges(tmp_path: Path,
                                                 upstream: RunningUpstream) -> None:
    # [concurrency] max caps the endpoint, whoever sends: judges too (one slot, no cut).
    config = _slot_judges(upstream, 0.002, "[concurrency]\nmax = 1\n")
    scoring = await _score_all(config, upstream, tmp_path / "s.jsonl")
    assert upstream.context.slot.cuts == 0
    assert scoring.tallies["judged"].statuses == {"scored": 8}
    assert scoring.tallies["judged"].judge_cut == 0


async def test_the_limit_shared_is_the_endpoint_s_own(tmp_path: Path,
                                                     upstream: RunningUpstream) -> None:
    # One limit per endpoint: a limit for another base URL is not taken; this one is.
    from fanout.ratelimit import EndpointLimit
    config = _slot_judges(upstream, 0.0)
    for url, shared in (("http://127.0.0.1:9/v1", False), (upstream.base_url, True)):
        limit = EndpointLimit(1, url=url)
        writer = ScoresFile(tmp_path / "s.jsonl")
        try:
            scoring = Scoring(config, select_scorers(config, ("judged",)), writer, rescore=True)
            scoring.add(SLOT_RECORDS[0])
            scoring.close()
            await scoring.run(Endpoint(upstream.base_url), limit)
        finally:
            writer.close()
        assert (scoring.endpoint is limit) is shared
        assert scoring.tallies["judged"].statuses == {"scored": 1}
