"""The plan of a batch: its units of work, their shards, and the plan's fingerprint.

A unit is one (prompt, model, sample).  Its key (``store.results.work_key``)
names it in every results and scores file; its ``content_key`` hashes what is
asked, so a changed prompt or parameter is redone on resume.  A shard ``i/N``
is the units whose key hashes to ``i`` (``store.results.shard_of``): the same
on every machine and run.  The plan's fingerprint names the whole plan (all
shards), so the records of every shard of one plan carry the same one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs
import httpx

from ..config import Config, ModelConfig
from ..request import StreamRequest, content_key
from ..store.plan_check import plan_fingerprint as fingerprint
from ..store.prompts import Prompt
from ..store.results import shard_of, work_key

__all__ = ["Work", "plan_fingerprint", "plan_work", "unsendable"]


@attrs.frozen
class Work:
    """One unit: a prompt, a model, a sample number."""

    key: str
    prompt: Prompt
    model: ModelConfig
    sample: int
    content_key: str

    def request(self, config: Config) -> StreamRequest:
        """The stream that answers this unit: the prompt's params over the model's, the
        prompt's tools instead of the model's."""
        return config.request(self.key, self.model, self.prompt.messages,
                              params=self.prompt.params, tools=self.prompt.tools)


def plan_work(prompts: Sequence[Prompt], models: Sequence[ModelConfig], samples: int,
              config: Config, shard: tuple[int, int] | None = None) -> list[Work]:
    """Every (prompt, model, sample) of ``shard`` (all of them without one), prompts
    in file order, then models, then samples.

    ``content_key`` hashes what is asked (endpoint, model id, messages,
    params, tools; never the key, nor the embedded upstream's port), so a
    changed prompt or parameter is redone on resume.  A prompt's ``tools`` are
    sent instead of the model's (``[[models]] tools``), as its params go over
    the model's.
    """
    where = config.base_url or "OPENAI_BASE_URL"
    work = []
    for prompt in prompts:
        for model in models:
            params = {**model.params, **prompt.params}
            asked = content_key(where, model.id, list(prompt.messages), params,
                                list(prompt.tools or model.tools or ()), model.api)
            for sample in range(samples):
                key = work_key(prompt.id, model.name, sample)
                if shard is None or shard_of(key, shard[1]) == shard[0]:
                    work.append(Work(key, prompt, model, sample, asked))
    return work


def plan_fingerprint(work: Sequence[Work], shards: int = 1) -> str:
    """The fingerprint of a whole plan (every shard's units: ``plan_work`` without a
    shard) cut in ``shards`` (``fanout.store.plan_check.plan_fingerprint``: what a
    merge recomputes from the records).  Every shard of one plan computes the same
    one; other prompts, params, models, samples or shard count give another."""
    return fingerprint(((unit.key, unit.content_key) for unit in work), shards)


def unsendable(prompts: Sequence[Prompt], models: Sequence[ModelConfig],
               name: str) -> list[str]:
    """A line per prompt that no request can carry (a lone surrogate is no UTF-8 text,
    NaN is no JSON, a parameter the model's dialect lacks), naming ``name`` (the
    prompts file) and the line: refused like a bad line, before anything is sent."""
    problems = []
    for prompt in prompts:
        messages, params = list(prompt.messages), dict(prompt.params)
        tools = list(prompt.tools or ())
        parts: list[Any] = [messages, params, tools]
        refused = _refused(prompt, models)
        if refused is not None:
            problems.append(f"{name}:{prompt.line}: cannot be sent: {refused}")
            continue
        if encodes(parts):
            continue
        # What fanout itself does with it (the library may learn to send it).
        body = {"model": models[0].id, "messages": messages, **params}
        try:
            content_key("", models[0].id, messages, params, tools)
            httpx.Request("POST", "http://127.0.0.1/", json=body)
        except (UnicodeEncodeError, ValueError, TypeError):
            problems.append(f"{name}:{prompt.line}: cannot be sent: {why_not(parts)}")
    return problems


def _refused(prompt: Prompt, models: Sequence[ModelConfig]) -> str | None:
    """Why a model's dialect cannot carry this prompt (a parameter it lacks), if it cannot."""
    for model in models:
        try:
            StreamRequest("check", model.id, prompt.messages, {**model.params, **prompt.params},
                          tools=prompt.tools or model.tools, api=model.api)
        except ValueError as exc:
            why = str(exc).removeprefix("stream 'check': ")
            return f"model {model.name!r}: {why}"
    return None


def encodes(value: Any) -> bool:
    """Whether ``value`` is JSON that encodes as UTF-8 (no NaN, no lone surrogate)."""
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
    except (UnicodeEncodeError, ValueError, TypeError):
        return False
    return True


def why_not(value: Any) -> str:
    """Why ``value`` does not encode (``encodes`` is false), in a few words."""
    try:
        json.dumps(value, ensure_ascii=False, allow_nan=False).encode()
    except UnicodeEncodeError as exc:
        return (f"it holds a lone surrogate (U+{ord(exc.object[exc.start]):04X}), which is not "
                "UTF-8 text")
    except (ValueError, TypeError) as exc:
        return f"not JSON: {exc}"
    return "?"
