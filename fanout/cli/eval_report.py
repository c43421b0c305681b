"""The evaluation part of ``fanout report``: scores, cost and a comparison, as tables that
fit the console (the shapes are ``fanout.eval.aggregate``'s).

Each table is tried whole, then with two-line headers and tighter padding, then as
one block per row (``label value`` pairs, as many a line as fit): every number
is whole in each layout, ``-`` is unknown.  Scores and intervals are shown with
two decimals, rates (pass, pass@k, pass^k) as whole percentages, dollars with
four significant digits (``+`` when some costs were unknown).  Text from the
files (model names, prompt ids, groups) goes through ``printable``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from ..eval.aggregate import Comparison, Evaluation, Flip, ModelRow, Paired, ScorerRow
from ..eval.cost import format_cost
from ..eval.stats import EXACT_BELOW, Estimate
from .render import pair_lines, printable

__all__ = ["comparison_view", "cost_lines", "evaluation_view", "fit", "format_cost",
           "matrix_view"]

#: The narrowest a first column gets before a layout gives up for the next one.
FIRST_MIN = 8
#: Prompt ids listed on a line of flaky or flipped prompts (``--json`` lists them all).
LISTED = 12
#: Between an interval's ends.
DASH = "\u2013"

Column = tuple[str, str]  # (label, two-line header)


# ------------------------------------------------------------------------ formats

def _score(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _interval(estimate: Estimate | None, *, percent: bool = False) -> str:
    if estimate is None:
        return "-"
    shown = _rate if percent else _score
    return f"{shown(estimate.low)}{DASH}{shown(estimate.high)}"


def _value(estimate: Estimate | None) -> float | None:
    return None if estimate is None else estimate.value


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return "<0.001" if value < 0.001 else f"{value:.3f}"


# ------------------------------------------------------------------------- layout

def _table(columns: Sequence[Column], rows: Sequence[Mapping[str, Text]], *,
           narrow: bool) -> Table:
    if narrow:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                      padding=(0, 1, 0, 0))
    else:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False)
    for index, (label, short) in enumerate(columns):
        if index == 0:
            table.add_column(short if narrow else label, justify="left", overflow="fold")
        else:
            table.add_column(short if narrow else label, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*(row[label] for label, _ in columns))
    return table


def _width(console: Console, table: Table, first: Sequence[str]) -> int:
    natural = console.measure(table, options=console.options.update_width(10**6)).maximum
    widest = max(cell_len(text) for text in first)
    return natural - widest + min(widest, FIRST_MIN)


def fit(columns: Sequence[Column], rows: Sequence[Mapping[str, Text]],
        console: Console) -> list[RenderableType]:
    """``rows`` (label -> cell) as one table that fits ``console``, else as blocks."""
    first = [columns[0][0], columns[0][1], *(row[columns[0][0]].plain for row in rows)]
    for narrow in (False, True):
        table = _table(columns, rows, narrow=narrow)
        if _width(console, table, first) <= console.width:
            return [table]
    parts: list[RenderableType] = []
    for row in rows:
        parts.append(Text(row[columns[0][0]].plain, "bold", overflow="fold"))
        parts += pair_lines([(label, row[label]) for label, _ in columns[1:]], console.width)
    return parts


def _listed(head: str, ids: Sequence[str], style: str = "dim") -> Text:
    shown = ", ".join(printable(i) for i in ids[:LISTED])
    more = f", … ({len(ids) - LISTED} more: --json lists them)" if len(ids) > LISTED else ""
    line = Text(head, no_wrap=True, overflow="ellipsis")
    line.append(shown + more, style)
    return line


def _name(row: ModelRow) -> str:
    model = printable(row.model)
    return model if row.group is None else f"{model} · {printable(row.group)}"


# ------------------------------------------------------------------------- scores

def _counts(row: ModelRow, scorer: ScorerRow) -> dict[str, Text]:
    def count(value: int, bad: str = "yellow") -> Text:
        return Text(str(value), bad if value else "dim")

    return {"model": Text(_name(row)), "units": Text(str(scorer.units)),
            "scored": Text(str(scorer.scored)), "unscored": count(scorer.unscored),
            "errors": count(scorer.errors, "red"), "no score": count(scorer.missing),
            "prompts": Text(str(scorer.prompts))}


def _numbers(row: ModelRow, scorer: ScorerRow, k: int) -> dict[str, Text]:
    cells = {"model": Text(_name(row)), "mean": Text(_score(_value(scorer.mean))),
             "mean 95% CI": Text(_interval(scorer.mean)),
             "pass": Text(_rate(_value(scorer.pass_rate))),
             "pass 95% CI": Text(_interval(scorer.pass_rate, percent=True))}
    if k > 1:
        cells |= {"pass@1": Text(_rate(scorer.pass_at_k.get(1))),
                  f"pass@{k}": Text(_rate(scorer.pass_at_k.get(k))),
                  f"pass^{k}": Text(_rate(scorer.pass_hat_k.get(k))),
                  "flaky": Text(str(len(scorer.flaky)), "yellow" if scorer.flaky else "dim")}
    return cells


def _interval_note(evaluation: Evaluation) -> str:
    if evaluation.interval == "analytic":
        return ("95% intervals: Wilson for pass rates (per sample), normal over prompt means "
                "for scores")
    return (f"95% intervals: bootstrap over prompts ({evaluation.resamples:,} resamples, "
            f"seed {evaluation.seed})")


def _cell(estimate: Estimate | None) -> Text:
    if estimate is None:
        return Text("-", "dim")
    return Text(f"{_score(estimate.value)} [{_score(estimate.low)}, {_score(estimate.high)}]")


def matrix_view(evaluation: Evaluation, console: Console) -> list[RenderableType]:
    """The whole evaluation at a glance: one row per model, one column per scorer, each
    cell the mean score and its 95% interval (``0.70 [0.50, 0.90]``); nothing when
    nothing was scored.  The per-scorer details follow it (``evaluation_view``)."""
    if not evaluation.scorers:
        return []
    columns: list[Column] = [("model", "model")]
    columns += [(printable(name), printable(name)) for name in evaluation.scorers]
    rows = []
    for row in evaluation.rows:
        cells = {"model": Text(_name(row))}
        for scorer in row.scorers:
            cells[printable(scorer.scorer)] = _cell(scorer.mean)
        rows.append(cells)
    title = Text("mean score [95% CI]", "bold")
    return [title, *fit(columns, rows, console), Text()]


def evaluation_view(evaluation: Evaluation, console: Console, *, cost: bool = True
                    ) -> list[RenderableType]:
    """The scores of every scorer, then (``cost``) cost, laid out for ``console``."""
    parts: list[RenderableType] = []
    k = evaluation.samples
    if not evaluation.scorers:
        parts += [Text("no scores (fanout score RESULTS.jsonl --score NAME scores them)",
                       "dim")]
    for name in evaluation.scorers:
        pairs = [(row, next(s for s in row.scorers if s.scorer == name))
                 for row in evaluation.rows]
        title = Text(f"scores: {printable(name)}", "bold")
        if k > 1:
            title.append(f" (k = {k} samples a prompt)", "dim")
        count_columns: list[Column] = [
            ("model", "model"), ("units", "units"), ("scored", "scored"),
            ("unscored", "un-\nscored"), ("errors", "errors"), ("no score", "no\nscore"),
            ("prompts", "prompts")]
        number_columns: list[Column] = [
            ("model", "model"), ("mean", "mean"), ("mean 95% CI", "mean\n95% CI"),
            ("pass", "pass"), ("pass 95% CI", "pass\n95% CI")]
        if k > 1:
            number_columns += [("pass@1", "pass\n@1"), (f"pass@{k}", f"pass\n@{k}"),
                               (f"pass^{k}", f"pass\n^{k}"), ("flaky", "flaky")]
        counts = [_counts(row, scorer) for row, scorer in pairs]
        numbers = [_numbers(row, scorer, k) for row, scorer in pairs]
        both = count_columns + number_columns[1:]
        merged = [c | n for c, n in zip(counts, numbers, strict=True)]
        whole = fit(both, merged, console)
        parts += [Text(), title]
        if len(whole) == 1:
            parts += whole
        else:
            parts += [*fit(count_columns, counts, console), Text(),
                      *fit(number_columns, numbers, console)]
        for row, scorer in pairs:
            if scorer.flaky:
                parts.append(_listed(f"  {_name(row)}: {len(scorer.flaky)} flaky: ",
                                     scorer.flaky))
            if scorer.short:
                several = scorer.short != 1
                parts.append(Text(f"  {_name(row)}: {scorer.short} prompt"
                                  f"{'s' if several else ''} with fewer than {k} scored "
                                  f"samples left out of pass@{k} and pass^{k}",
                                  "dim", no_wrap=True, overflow="ellipsis"))
    notes = [_interval_note(evaluation)] if evaluation.scorers else []
    if evaluation.stale:
        notes.append(f"{evaluation.stale} stale scores left out (of an older answer: "
                     "fanout score rescores them)")
    if evaluation.orphans:
        notes.append(f"{evaluation.orphans} scores of keys the results file does not hold "
                     "left out")
    parts += [Text(note, "dim") for note in notes]
    if cost:
        parts += cost_lines(evaluation, console)
    return parts


def cost_lines(evaluation: Evaluation, console: Console) -> list[RenderableType]:
    """Cost per model (and group), the total, and the judge's apart."""
    rows = [{"model": Text(_name(row)),
             "cost": Text(format_cost(row.cost, row.cost_unknown)),
             "known": Text(str(row.cost_known)),
             "unknown": Text(str(row.cost_unknown), "yellow" if row.cost_unknown else "dim")}
            for row in evaluation.rows]
    parts: list[RenderableType] = [Text(), Text("cost (USD; every attempt counts)", "bold")]
    parts += fit([("model", "model"), ("cost", "cost"), ("known", "known"),
                  ("unknown", "unknown")], rows, console)
    unknown = (f" ({evaluation.cost_unknown} records of unknown cost)"
               if evaluation.cost_unknown else "")
    line = f"total {format_cost(evaluation.cost, evaluation.cost_unknown)}{unknown}"
    judge = evaluation.judge
    if judge.calls:
        line += (f"; judge {format_cost(judge.cost, judge.unknown)} over {judge.calls} "
                 f"calls" + (f" ({judge.unknown} of unknown cost)" if judge.unknown else ""))
    parts.append(Text(line))
    return parts


# --------------------------------------------------------------------- comparison

def comparison_view(comparison: Comparison, against: str, console: Console
                    ) -> list[RenderableType]:
    """Run A (the report's file) against the baseline B (``--against``)."""
    shown = printable(against)
    head = Text(f"against {shown} (B, the baseline): A - B over the keys both completed "
                "and scored", "bold")
    counts = (f"{comparison.both} keys in both ({comparison.not_both_completed} not completed "
              f"in both), {comparison.only_a} only in A, {comparison.only_b} only in B")
    parts: list[RenderableType] = [Text(), head, Text(counts)]
    for side, by_model in (("A", comparison.only_a_by_model), ("B", comparison.only_b_by_model)):
        if by_model:
            listed = ", ".join(f"{printable(m)} {n}" for m, n in by_model.items())
            parts.append(Text(f"  only in {side}: {listed}", "dim", no_wrap=True,
                              overflow="ellipsis"))
    if not comparison.rows:
        parts.append(Text("no key was completed and scored by the same scorer in both",
                          "yellow"))
        return parts
    columns: list[Column] = [
        ("model", "model"), ("pairs", "pairs"), ("A", "A"), ("B", "B"), ("A-B", "A-B"),
        ("95% CI", "95% CI"), ("p", "p\nboot"), ("pass→fail", "pass\n→fail"),
        ("fail→pass", "fail\n→pass"), ("McNemar p", "McNe-\nmar p")]
    for scorer in sorted({row.scorer for row in comparison.rows}):
        rows = [row for row in comparison.rows if row.scorer == scorer]
        parts += [Text(), Text(f"scorer: {printable(scorer)}", "bold"),
                  *fit(columns, [_paired_cells(row) for row in rows], console)]
        for row in rows:
            for what, flips in (("pass→fail", row.pass_to_fail),
                                ("fail→pass", row.fail_to_pass)):
                if flips:
                    parts.append(_listed(f"  {printable(row.model)} {what}: ",
                                         _flip_names(flips)))
    parts.append(Text(f"p boot: paired bootstrap over prompts ({comparison.resamples:,} "
                      f"resamples, seed {comparison.seed}); McNemar: exact binomial below "
                      f"{EXACT_BELOW} flips, else chi-square with continuity correction",
                      "dim"))
    return parts


def _paired_cells(row: Paired) -> dict[str, Text]:
    estimate = row.difference.difference if row.difference else None
    return {
        "model": Text(printable(row.model)), "pairs": Text(str(row.pairs)),
        "A": Text(_score(row.mean_a)), "B": Text(_score(row.mean_b)),
        "A-B": Text("-" if estimate is None else f"{estimate.value:+.2f}"),
        "95% CI": Text("-" if estimate is None
                       else f"[{estimate.low:+.2f}, {estimate.high:+.2f}]"),
        "p": Text(_p(row.difference.p_value if row.difference else None)),
        "pass→fail": Text(str(len(row.pass_to_fail)), "red" if row.pass_to_fail else "dim"),
        "fail→pass": Text(str(len(row.fail_to_pass)), "green" if row.fail_to_pass else "dim"),
        "McNemar p": Text(_p(row.mcnemar.p_value))}


def _flip_names(flips: Sequence[Flip]) -> list[str]:
    several = any(flip.sample for flip in flips)
    return [f"{flip.id}#{flip.sample}" if several else str(flip.id) for flip in flips]

