"""``bench compare``'s table as people read it: text no wider than a terminal (long options
elided, long verdicts whole in notes under the table), Markdown for a CI job's summary, JSON
for scripts. The judging itself, and its rules, are ``suite.gate.compare``'s.
"""

from __future__ import annotations

import json

import pandas as pd

from suite.gate.compare import options_words
from suite.results import schema
from suite.results.catalogue import CATALOGUE

#: a text table's width unless --wide (a terminal's, a CI log's)
TEXT_WIDTH = 120
#: what a compact table calls each metric (the --metric aliases)
SHORT_METRICS = {metric.name: metric.alias for metric in CATALOGUE}


def elided(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, its end replaced by ``…`` where cut."""
    text = str(text)
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"


def change_words(change, unit) -> str:
    """A row's change as read: ``+1.20 pts`` for an accuracy, ``-3.4%`` otherwise."""
    if change is None or change != change:
        return ""
    return f"{change:+.2f} pts" if unit == "points" else f"{change:+.1%}"


def value_words(mean, half, unit) -> str:
    """A mean with its interval where it has one: an accuracy in percent (as its change is
    in points), anything else to 4 significant digits."""
    if not isinstance(mean, float):
        return str(mean)
    known = isinstance(half, float) and half == half
    if unit == "points":
        return f"{100 * mean:.2f} %" + (f" ± {100 * half:.2g}" if known else "")
    return f"{mean:.4g}" + (f" ± {half:.2g}" if known else "")


def words_of(table: pd.DataFrame) -> pd.DataFrame:
    """The table's numbers and options in words, every column kept."""
    out = table.copy()
    units = table["unit"] if "unit" in table else pd.Series([None] * len(table),
                                                              index=table.index)
    out["change"] = [change_words(c, u) for c, u in zip(table["change"], units)]
    options = table["shown_options"].fillna(table[schema.OPTIONS]) if "shown_options" in table \
        else table[schema.OPTIONS]
    out[schema.OPTIONS] = [options_words(o) for o in options]
    for side in ("baseline", "new"):
        halves = table[f"{side}_ci"] if f"{side}_ci" in table else [None] * len(table)
        out[side] = [value_words(m, h, u) for m, h, u in zip(table[side], halves, units)]
    if "repeats" in out:  # activity and status rows are about runs, not repeats
        out["repeats"] = [r if isinstance(r, str) else "-" for r in out["repeats"]]
    if "exchange" not in out:
        out["exchange"] = "-"
    return out


def shown(table: pd.DataFrame, wide: bool = True) -> pd.DataFrame:
    """The table as people read it: changes as +1.2 pts / -3.4 %, means with their
    interval, options as words, the exchange schedule (``exchange``: local steps between
    exchanges inside a node / across nodes). ``wide``: every column, the metrics' full
    names; else the compact columns (what every row shares is left to ``shared_line``)."""
    out = words_of(table)
    if not wide:  # an activity row's NEW is its run folder: --wide and json name it
        out["new"] = [n if m != "activity" else "-" for n, m in zip(out["new"], out["metric"])]
        out["verdict"] = [str(v).replace(f": {m} ", ": ", 1)  # the method has its column
                          for v, m in zip(out["verdict"], out[schema.METHOD])]
        for side in ("baseline", "new"):
            out[side] = ["-" if v == "nan" else v for v in out[side]]
    if wide:
        keep = ["machine_class", "method", "workload", "gpus", "options", "exchange",
                "setting", "metric", "baseline", "new", "repeats", "change", "verdict"]
        return out[[c for c in keep if c in out]]
    out["metric"] = [SHORT_METRICS.get(m, m) for m in out["metric"]]
    out["exchange"] = [str(e).replace(" ", "") for e in out["exchange"]]
    varying = [c for c in ("machine_class", "workload", "gpus", "setting")
               if c in out and out[c].nunique() > 1]
    keep = ["method", *varying, "options", "exchange", "metric", "baseline", "new",
            "repeats", "change", "verdict"]
    return out[[c for c in keep if c in out]].rename(columns={"exchange": "exch",
                                                              "repeats": "n"})


def shared_line(table: pd.DataFrame) -> str:
    """What every row of a compact table shares, said once above it: ``cnn-fmnist, 4 GPUs,
    real, cpu-gloo-amd25-avx512-t1``."""
    parts = []
    for column_name, unit in (("workload", ""), ("gpus", " GPUs"), ("setting", ""),
                              ("machine_class", "")):
        if column_name in table and table[column_name].nunique() == 1:
            value = table[column_name].iloc[0]
            if value not in ("-", None):
                parts.append(f"{value}{unit}")
    return ", ".join(parts)


#: the columns a text table aligns right (numbers); the others align left
RIGHT_ALIGNED = ("gpus", "baseline", "new", "n", "repeats", "change")


def text_table(frame: pd.DataFrame) -> str:
    """``frame`` as aligned text: words left, numbers right, one space between columns."""
    columns = list(frame.columns)
    rows = frame.astype(str).values.tolist()
    widths = [max([len(c), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]

    def line(cells) -> str:
        return " ".join(cell.rjust(w) if c in RIGHT_ALIGNED else cell.ljust(w)
                        for c, cell, w in zip(columns, cells, widths)).rstrip()

    return "\n".join([line(columns), *(line(row) for row in rows)])


#: the order in which a text table too wide is narrowed: (column, down to how many
#: characters); a verdict is never cut (``noted``)
NARROWING = (("options", 18), ("new", 12), ("options", 10))
#: the widest verdict a compact table shows in its cell; a longer one gets a note under it
VERDICT_WIDTH = 30


def noted(cells: list[str], verdicts: list[str]) -> tuple[list[str], list[str]]:
    """(cells, notes): each verdict cell that fits ``VERDICT_WIDTH`` as it is, a longer one as
    its first word and a note number (``REGRESSION [1]``), with the whole verdict (``verdicts``:
    the words before the compact table left out the method) once in the notes (``[1]
    REGRESSION: prunex ran under ...``), so a reason is never cut."""
    numbers: dict[str, int] = {}
    shown_cells = []
    for cell, verdict in zip(map(str, cells), map(str, verdicts)):
        if len(cell) <= VERDICT_WIDTH:
            shown_cells.append(cell)
            continue
        number = numbers.setdefault(verdict, len(numbers) + 1)
        shown_cells.append(f"{cell.split(':', 1)[0]} [{number}]")
    cells = shown_cells
    return cells, [f"[{n}] {verdict}" for verdict, n in numbers.items()]


def fitted(frame: pd.DataFrame, width: int) -> str:
    """``frame`` as text no wider than ``width`` where it can be: the options and NEW
    columns elided in the order of ``NARROWING``."""
    frame = frame.astype(str)
    limits = {c: int(frame[c].str.len().max()) for c in ("options", "new") if c in frame}
    text = text_table(frame)
    excess = max(map(len, text.splitlines())) - width
    for name, floor in NARROWING:
        if excess <= 0 or name not in limits:
            continue
        cut = min(excess, max(0, limits[name] - floor))
        limits[name] -= cut
        shortened = frame.copy()
        for c, limit in limits.items():
            shortened[c] = [elided(v, limit) for v in frame[c]]
        text = text_table(shortened)
        excess = max(map(len, text.splitlines())) - width
    return text


def format_table(table: pd.DataFrame, fmt: str = "text", wide: bool = False) -> str:
    """The comparison as text (``TEXT_WIDTH`` columns, long options elided, long verdicts
    whole in notes under the table; ``wide``: every column in full) or Markdown (every
    column)."""
    if table.empty:
        return "(no matched runs)" if fmt != "json" else "[]"
    if fmt == "markdown":
        return shown(table).to_markdown(index=False)
    if wide:
        return shown(table).to_string(index=False)
    shared = shared_line(table)
    compact = shown(table, wide=False)
    compact["verdict"], notes = noted(list(compact["verdict"]), list(table["verdict"]))
    body = fitted(compact, TEXT_WIDTH)
    return (f"{shared}:\n" if shared else "") + body + "".join(f"\n{line}" for line in notes)


def as_json(
    table: pd.DataFrame, unmatched: dict, regressions: int, warnings: list, matched: int,
    thresholds: dict | None = None,
) -> str:
    """``bench compare --format json``: the rows, the unmatched keys, the counts, warnings,
    and per machine class the thresholds that judged it."""
    rows = json.loads(table.to_json(orient="records")) if len(table) else []
    return json.dumps({"rows": rows, "unmatched": unmatched, "regressions": regressions,
                       "matched": matched, schema.WARNINGS: warnings,
                       "thresholds": thresholds or {}}, indent=2)
