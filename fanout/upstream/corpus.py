"""Deterministic text for the scripted models: a small corpus of our own, cut like tokens.

Everything here is a pure function of its arguments: the same seed, model
and prompt always give the same fragments, on every machine.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["example_arguments", "fragments", "rng_for"]

# Written for fanout.  Multibyte text and emoji on purpose: a relay must carry them intact.
CORPUS = (
    "Rivers carve their valleys slowly, one flood at a time.",
    "The lighthouse keeper counted ships until the fog rolled in.",
    "A good parser never trusts where the network chose to cut the bytes.",
    "Trio runs every task inside a nursery, and the nursery waits for all of them.",
    "Le café était fermé, alors nous avons marché jusqu'à la gare.",
    "東京の朝は静かで、電車の音だけが聞こえる。",
    "Die Brücke über den Fluss wurde im Frühling neu gestrichen.",
    "Weather report: sunny ☀️ with a chance of rain 🌧️ by evening.",
    "Tests that prove things are worth more than tests that decorate.",
    "Каждый поток заканчивается ровно одним финальным событием.",
    "The market opened early; the bakers had been up since four 🥐.",
    "Ein kleiner Schritt für den Parser, ein großer für die Zuverlässigkeit 👍.",
    "Streams end in one of five ways, and only one of them is complete.",
    "She wrote the answer twice: once in ink, once in pencil ✍️.",
    "नदी के किनारे एक छोटा सा गाँव था।",
    "Deadlines are promises the scheduler keeps on your behalf.",
)

REASONING = (
    "Let me think about what is being asked.",
    "The question has two parts; I will take them in order.",
    "First, recall the facts that matter here.",
    "Then check the answer against the constraints.",
    "That seems consistent, so I can answer now.",
)


def rng_for(*parts: object) -> random.Random:
    """A random generator seeded from a stable hash of ``parts`` (never Python's ``hash``)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def fragments(rng: random.Random, count: int, source: Sequence[str] = CORPUS) -> list[str]:
    """``count`` token-like fragments of 1-8 characters of running text from ``source``."""
    out: list[str] = []
    while len(out) < count:
        sentence = rng.choice(source) + " "
        position = 0
        while position < len(sentence) and len(out) < count:
            size = rng.randint(1, 8)
            out.append(sentence[position : position + size])
            position += size
    return out


def cut(rng: random.Random, text: str) -> list[str]:
    """``text`` cut into fragments of 1-8 characters (joined they give ``text`` back)."""
    out = []
    position = 0
    while position < len(text):
        size = rng.randint(1, 8)
        out.append(text[position : position + size])
        position += size
    return out


def example_arguments(schema: Mapping[str, Any], rng: random.Random, depth: int = 0) -> Any:
    """A plausible value for a JSON Schema: the arguments a model would invent."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties") or {}
        required = schema.get("required") or list(properties)
        if depth > 4:
            return {}
        return {
            name: example_arguments(properties.get(name, {}), rng, depth + 1)
            for name in required
        }
    if kind == "array":
        items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
        return [] if depth > 4 else [example_arguments(items or {}, rng, depth + 1)]
    if kind == "integer":
        return rng.randint(1, 30)
    if kind == "number":
        return round(rng.uniform(0, 100), 2)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return rng.choice(["Paris", "Tokyo", "Zürich", "São Paulo", "Reykjavík", "Kraków"])
