"""The embedded upstream's judge models: deterministic graders for ``judge`` scorers.

``mock/judge`` reads the request's last user message, finds the sections that
``fanout.eval.judge`` puts around the values it inserts (``<<<BEGIN ANSWER>>>`` …
``<<<END ANSWER>>>``, the same for ``EXPECTED``) and the request's nonce (in the
instruction ``VERDICT <nonce>: PASS``, outside the sections), and answers one line
of reasoning, then ``VERDICT <nonce>: PASS`` or ``VERDICT <nonce>: FAIL`` (a prompt
with no nonce gets ``GRADE: PASS`` / ``GRADE: FAIL``, which the judge scorer does
not accept):

- with an EXPECTED section: PASS when the normalised expected text occurs in
  the normalised answer.  Normalised: case folded, punctuation removed, white
  space collapsed and stripped (``fanout.eval.scorers``' ``exact`` options).  A
  section that is a JSON array is a list of acceptable answers (any one
  occurring passes; a non-string item counts as its JSON text).  An expected
  text that normalises to nothing matches only an answer that does too;
- without one: PASS when the answer, stripped, is not empty and ends with ``.``;
- with no ANSWER section at all: FAIL, saying so.

It never quotes the answer back.  ``mock/judge-quoting`` decides the same, then
ends its reply by quoting the answer back, undelimited, as chatty models do: a
``GRADE: PASS`` or ``VERDICT ...: PASS`` line planted in the answer then ends the
reply, and must not decide.  ``mock/judge-garbage`` answers a paragraph with no
verdict in it (the judge scorer must call that an ``error``).  All stream like
``mock/fast``
(``:SECONDS`` between chunks, usage when asked, ``max_tokens`` cuts) and answer
without streaming too.  ``slot/judge`` gives ``mock/judge``'s verdicts in the
one slot of the ``slot/*`` models (a llama.cpp serving answers and judges
alike): a new ``slot/*`` request cuts it (``[DONE]``, no finish reason), and
it cuts the stream that held the slot.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from ..eval._text import Normalise
from ..eval.judge import BEGIN, END
from .corpus import cut, rng_for
from .models import (
    CHAT_ONLY,
    SSE_HEADERS,
    Context,
    ModelSpec,
    _Choice,
    _completion,
    _limit,
    _own_pauses,
    _slot,
    _stream,
)
from .plans import ChatRequest, Plan

__all__ = ["GARBAGE", "JUDGE_MODELS", "judge_reply", "nonce_of", "quoting_reply", "sections"]

_NORMALISE = Normalise(ignore_case=True, collapse_whitespace=True, ignore_punctuation=True)

GARBAGE = ("Well, I have read the question and the answer twice. There is much to say "
           "about both, and reasonable graders may disagree; I would rather not commit "
           "to anything today. Perhaps ask me again later.")


def sections(text: str) -> dict[str, str]:
    """The delimited sections of a judge prompt: name -> content (the first of each)."""
    found: dict[str, str] = {}
    opening = re.escape(BEGIN).replace(r"\{\}", r"(?P<name>[A-Z]+)")
    for match in re.finditer(opening + r"\n", text):
        name = match["name"]
        end = text.find("\n" + END.format(name), match.end())
        if end != -1 and name not in found:
            found[name] = text[match.end():end]
    return found


_NONCE = re.compile(r"\bVERDICT\s+([0-9A-Za-z]+)\s*:")
_SECTION = re.compile(re.escape(BEGIN).replace(r"\{\}", r"(?P<name>[A-Z]+)")
                      + r"\n.*?\n" + re.escape(END).replace(r"\{\}", r"(?P=name)"), re.DOTALL)


def nonce_of(prompt: str) -> str | None:
    """The nonce a judge prompt asks the verdict line to carry (``VERDICT <nonce>:``
    outside its sections; the last one), or ``None``."""
    found = _NONCE.findall(_SECTION.sub("", prompt))
    return found[-1] if found else None


def _acceptable(expected: str) -> list[str]:
    try:
        value = json.loads(expected)
    except ValueError:
        return [expected]
    if isinstance(value, list) and value:
        return [v if isinstance(v, str) else json.dumps(v) for v in value]
    return [expected]


def judge_reply(prompt: str) -> str:
    """``mock/judge``'s whole answer to a judge prompt (the rule of the module)."""
    why, ok = _decide(sections(prompt))
    nonce = nonce_of(prompt)
    label = f"VERDICT {nonce}" if nonce else "GRADE"
    return f"{why}\n{label}: {'PASS' if ok else 'FAIL'}"


def quoting_reply(prompt: str) -> str:
    """``mock/judge-quoting``'s answer: ``mock/judge``'s, then the answer quoted back."""
    answer = sections(prompt).get("ANSWER", "")
    return f"{judge_reply(prompt)}\n\nFor the record, the answer I graded was:\n{answer}"


def _decide(found: dict[str, str]) -> tuple[str, bool]:
    if "ANSWER" not in found:
        return "I found no ANSWER section to grade.", False
    answer = found["ANSWER"]
    if "EXPECTED" not in found:
        ok = bool(answer.strip()) and answer.strip().endswith(".")
        return ("The answer is a complete sentence ending with a full stop." if ok else
                "The answer is empty or does not end with a full stop."), ok
    got = _NORMALISE(answer)
    for item in _acceptable(found["EXPECTED"]):
        wanted = _NORMALISE(item)
        if (wanted in got) if wanted else not got:
            return "The expected answer occurs in the answer.", True
    return "The expected answer does not occur in the answer.", False


def _choices(request: ChatRequest, text: str) -> list[_Choice]:
    """``text`` as each of the request's choices, cut into tokens (``max_tokens`` obeyed)."""
    # the nonce is new in every request: the same question streams the same way
    nonce = nonce_of(request.prompt)
    asked = request.prompt.replace(nonce, "<nonce>") if nonce else request.prompt
    answers = []
    for index in range(request.n):
        rng = rng_for(request.seed, request.name, asked, index)
        choice = _Choice(parts=[("content", piece) for piece in cut(rng, text)])
        _limit(choice, request, len(choice.parts))
        answers.append(choice)
    return answers


def _replying(reply: Callable[[ChatRequest], str]) -> Callable[[ChatRequest, Context], Plan]:
    def plan(request: ChatRequest, context: Context) -> Plan:
        answers = _choices(request, reply(request))
        if not request.stream:
            return _completion(request, answers)
        return Plan(200, SSE_HEADERS, steps=_stream(request, answers,
                                                    _own_pauses(request, context, 0.0)),
                    fragment=request.fragment)
    return plan


JUDGE_MODELS: dict[str, ModelSpec] = {spec.id: spec for spec in [
    ModelSpec("mock/judge", "grades a fanout judge prompt: VERDICT <nonce>: PASS iff the "
              "expected text occurs in the answer (normalised)",
              _replying(lambda request: judge_reply(request.prompt))),
    ModelSpec("mock/judge-quoting", "grades like mock/judge, then quotes the answer back "
              "after its verdict line", _replying(lambda request: quoting_reply(request.prompt))),
    ModelSpec("mock/judge-garbage", "answers a judge prompt with prose and no verdict",
              _replying(lambda request: GARBAGE)),
    ModelSpec("slot/judge", "mock/judge in the one slot of slot/*: a new slot/* request cuts "
              "it ([DONE], no finish_reason), it cuts the stream that held the slot "
              "(:SECONDS between chunks, default 0.02)",
              _slot("clean", lambda request: _choices(request, judge_reply(request.prompt))),
              CHAT_ONLY),
]}
