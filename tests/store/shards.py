"""Shard files for the merge tests, from real ``fanout batch --shard I/N`` runs against the
embedded upstream.  ``stamp`` checks that their records carry the shard, plan and run that the
merge recomputes (and gives them to records that lack them); ``unstamp`` makes files as
``fanout batch`` wrote them before records named their shard."""

from __future__ import annotations

import io
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fanout.batch.plan import plan_work
from fanout.cli.batch import BatchOptions, run_batch
from fanout.config import load_config
from fanout.store.plan_check import plan_fingerprint
from fanout.store.prompts import load_prompts
from fanout.store.results import shard_of, work_key

CONFIG = """
[endpoint]
base_url = "embedded"

[deadlines]
idle = 3
total = 30

[batch]
models = ["fast", "echo"]

[[models]]
name = "fast"
id = "mock/fast"

[[models]]
name = "echo"
id = "mock/echo"

[[models]]
name = "refused"
id = "fault/400"
"""


def write_config(tmp_path: Path) -> str:
    path = tmp_path / "fanout.toml"
    path.write_text(CONFIG)
    return str(path)


def write_prompts(tmp_path: Path, count: int, name: str = "prompts.jsonl",
                  word: str = "Question") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps({"id": f"q{i}", "prompt": f"{word} {i}?",
                                        "expected": "x"}) + "\n" for i in range(count)))
    return str(path)


def run_shard(prompts: str, output: str, config: str, shard: tuple[int, int],
              models: Sequence[str] = (), samples: int = 1, score: bool = True) -> int:
    out, err = io.StringIO(), io.StringIO()
    status = run_batch(BatchOptions(prompts=prompts, output=output, models=tuple(models),
                                    config=config, shard=shard, samples=samples,
                                    scorers=("exact",) if score else ()),
                       stdout=out, stderr=err, environ={})
    assert status in (0, 1), err.getvalue()
    return status


def plan_of(prompts: str, config: str, models: Sequence[str], samples: int, shards: int
            ) -> tuple[str, dict[str, str]]:
    """The plan fingerprint and key -> content key, as brief-20 defines them."""
    settings = load_config(config)
    work = plan_work(load_prompts(prompts), settings.select(tuple(models),
                                                            default=settings.batch),
                     samples, settings)
    units = {unit.key: unit.content_key for unit in work}
    return plan_fingerprint(units.items(), shards), units


def stamp(path: str | Path, plan: str, shards: int, run: str | None = None) -> None:
    """Give every record of ``path`` (results or scores) its shard, plan and run."""
    path = Path(path)
    lines = []
    for line in path.read_bytes().splitlines():
        record: dict[str, Any] = json.loads(line)
        key = work_key(record["id"], record["model"], record["sample"])
        fields = {"shard": f"{shard_of(key, shards)}/{shards}", "plan": plan,
                  "run": run or plan}
        for name, value in fields.items():
            if name in record and name != "run":
                assert record[name] == value, (path, name, record[name], value)
        # after id and model: a torn line is known by how it starts ({"id":...,"model":)
        lines.append(json.dumps({**record, **fields}, ensure_ascii=False))
    path.write_text("".join(line + "\n" for line in lines))


def unstamp(path: str | Path) -> None:
    """Drop the shard, plan and run fields from every record of ``path``."""
    path = Path(path)
    lines = [{k: v for k, v in json.loads(line).items() if k not in ("shard", "plan", "run")}
             for line in path.read_bytes().splitlines()]
    path.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))


def sharded_run(tmp_path: Path, shards: int, prompts: str, config: str, *,
                models: Sequence[str] = (), samples: int = 1, fields: bool = True,
                folder: str = "shards", score: bool = True) -> Path:
    """Every shard of a plan run into ``folder``/results-I.jsonl (with scores)."""
    where = tmp_path / folder
    where.mkdir(exist_ok=True)
    plan, _ = plan_of(prompts, config, models, samples, shards)
    for index in range(shards):
        output = where / f"results-{index}.jsonl"
        run_shard(prompts, str(output), config, (index, shards), models, samples, score)
        for path in (output, output.with_name(f"results-{index}.scores.jsonl")):
            if path.exists():
                if fields:
                    stamp(path, plan, shards)
                else:
                    unstamp(path)
    return where


def records(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as file:
        return [json.loads(line) for line in file]


def keys(path: str | os.PathLike[str]) -> list[str]:
    return [work_key(r["id"], r["model"], r["sample"]) for r in records(path)]
