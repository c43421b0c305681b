"""The cost of `fanout compare`'s live view: one frame, against a naive full redraw.

    .venv/bin/python bench/render.py [--columns 4] [--rounds 5]

Builds N columns holding answers of growing size (1k, 10k, 50k characters
each, multi-paragraph text) and times one live frame drawn through a real
``rich.live.Live`` onto an in-memory 160x48 terminal, every column receiving
its chunks between frames (so every frame redraws every column):

  fanout tail   CompareView.live(): each column wraps only its tail (what fits)
  naive full    the whole text of every column rendered each frame, cropped by
                Live (what a live view without tail-cutting does)

Rows run round-robin; medians over --rounds.  Also prints what each frame
rate costs in CPU: fanout redraws on a 15 fps timer, a per-chunk redraw
would draw once per chunk (4 models at ~60 tokens/s: ~240 frames/s).
"""

from __future__ import annotations

import sys
from pathlib import Path

# bench/ holds a fanout.py: keep this folder off the path, or `import fanout` finds it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse
import io
import random
import statistics
import time

from rich.console import Console
from rich.live import Live

from fanout import ChoiceFinished, StreamStarted, TextDelta
from fanout.cli.compare import FPS
from fanout.cli.render import Column, CompareView

WORDS = ("river", "stream", "model", "token", "deadline", "nursery", "channel", "parser",
         "event", "chunk", "the", "a", "of", "and", "to", "in", "is", "that", "it", "was",
         "for", "on", "are", "with", "as", "they", "be", "at", "one", "have", "this", "from")
CHUNKS_PER_SECOND = 240  # 4 models at ~60 tokens/s, each token its own chunk


def answer(size: int, seed: int) -> list[str]:
    """~size characters of prose as ~4-character deltas, paragraphs every ~600."""
    rng = random.Random(seed)
    deltas, length = [], 0
    while length < size:
        word = rng.choice(WORDS)
        piece = (" " if deltas else "") + word
        if rng.random() < 0.01:
            piece += ".\n\n"
        deltas.append(piece)
        length += len(piece)
    return deltas


def columns(count: int, size: int) -> list[Column]:
    made = []
    for i in range(count):
        column = Column(f"model-{i}", f"vendor/model-{i}", started=0.0)
        column.apply(StreamStarted(1, 200), 0.01)
        for delta in answer(size, seed=i):
            column.apply(TextDelta(0, delta), 0.5)
        if i % 2:
            column.apply(ChoiceFinished(0, "length"), 0.9)
        made.append(column)
    return made


def frame_seconds(view: CompareView, full: bool, frames: int = 20) -> float:
    """Seconds per frame while every column streams: between two frames each column
    gets the chunks of 1/15 s (4 at 60 tokens/s), as in a live comparison."""
    console = Console(file=io.StringIO(), width=160, height=48, force_terminal=True,
                      color_system="truecolor")
    per_frame = CHUNKS_PER_SECOND // FPS // len(view.columns)
    with Live(console=console, auto_refresh=False, vertical_overflow="crop") as live:
        start = time.perf_counter()
        for _ in range(frames):
            for column in view.columns:
                for _ in range(per_frame):
                    column.apply(TextDelta(0, " more"), 0.6)
            renderable = view.final(console, 1.0) if full else view.live(console, 1.0)
            live.update(renderable, refresh=True)
        return (time.perf_counter() - start) / frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--columns", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    sizes = (1_000, 10_000, 50_000)
    views = {size: CompareView(columns(args.columns, size)) for size in sizes}
    timings: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for size in sizes:
            for row in ("fanout tail", "naive full"):
                timings.setdefault((size, row), []).append(
                    frame_seconds(views[size], full=row == "naive full"))

    print(f"{args.columns} columns on a 160x48 terminal; ms per frame, median of {args.rounds}")
    print(f"{'chars/column':>12}  {'row':<12} {'ms/frame':>9} {'vs naive':>9} "
          f"{'CPU @15fps':>11} {'CPU @240fps':>12}")
    for size in sizes:
        naive = statistics.median(timings[(size, "naive full")])
        for row in ("fanout tail", "naive full"):
            ms = statistics.median(timings[(size, row)])
            print(f"{size:>12,}  {row:<12} {ms * 1000:>9.2f} {ms / naive:>8.2f}x "
                  f"{ms * FPS * 100:>10.0f}% {ms * CHUNKS_PER_SECOND * 100:>11.0f}%")
    print("CPU columns: share of one core spent drawing at the timer's rate (15 fps) and at "
          "a per-chunk redraw's rate (240 chunks/s)")


if __name__ == "__main__":
    main()
