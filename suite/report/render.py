"""report.md and a self-contained report.html around the figures, with the tables behind
them (also as CSV) and the run ids each one came from. Text from run folders (run ids,
labels, notes) reaches report.md as ``markdown_text`` and report.html escaped: shown, never
markup."""

from __future__ import annotations

import base64
import html
import json
from pathlib import Path

import pandas as pd

from suite.plugins.registry import METHODS
from suite.report import kit
from suite.report.figures import CLOSING, FIGURES, Skipped
from suite.report.labels import several_of
from suite.report.load import FINAL_DENSITY, load_runs
from suite.report.tables import (
    caption_of,
    in_percent,
    markdown_text,
    paper_table,
    to_latex,
    to_markdown,
)
from suite.results import schema
from suite.results.catalogue import RUN_IDENTITY, insert_after
from suite.results.resultset import (
    BATCH_SIZE,
    CONFIGURATION,
    LR,
    LR_SCHEDULE,
    MACHINE_CLASS,
    SETTING,
    SHOWN_OPTIONS,
    VIEW,
    ResultSet,
)
from suite.results.resultset import column as column_of
from suite.results.stats import mean_ci
from suite.results.view import RunView

#: what makes runs repeats of one configuration (they differ only in the seed): runs of two
#: machine classes, or two budgets (epochs), are never pooled
CONFIG = [*insert_after(RUN_IDENTITY, schema.GPUS, schema.NODES), schema.SIMULATED]
#: what a configuration's runs share without it being part of their identity: the method's
#: exchange schedule, local steps between exchanges inside a node / across nodes
CARRIED = ["exchange_steps"]
#: per-run numbers averaged over repeats; those in WITH_CI also get a 95 % half-width
AVERAGED = ["final_acc", "best_acc", "s_per_iter", "ms_per_step", "train_s", "inter_MB_per_epoch",
            "inter_MB_per_iter", "density", "exported_params_M", "exported_GFLOPs"]
WITH_CI = ["final_acc", "s_per_iter", "ms_per_step", "train_s", "inter_MB_per_epoch"]


def run_table(runs: ResultSet) -> pd.DataFrame:
    """One row per run (``runs.csv``)."""
    frame = runs.runs
    shown = {text: json.loads(text) for text in set(frame[SHOWN_OPTIONS])}
    keys = [schema.RUN_ID, schema.METHOD, schema.WORKLOAD, schema.DATASET, schema.GPUS,
            schema.NODES, SHOWN_OPTIONS, CONFIGURATION, SETTING, MACHINE_CLASS, BATCH_SIZE, LR,
            LR_SCHEDULE, schema.EXCHANGE_EVERY,
            schema.SEED, schema.FINAL_ACCURACY, schema.BEST_ACCURACY, schema.EPOCHS,
            schema.ITERATION_SECONDS, schema.SAMPLES_PER_RANK, schema.TRAIN_SECONDS,
            schema.INTER_NODE_BYTES_TOTAL, schema.INTER_NODE_BYTES_PER_ITERATION, FINAL_DENSITY,
            VIEW, schema.SIMULATED]
    rows = []
    for values in zip(*(column_of(frame, key) for key in keys)):
        r = dict(zip(keys, values))
        epochs = r[schema.EPOCHS] or float("nan")
        rows.append({
            schema.RUN_ID: r[schema.RUN_ID],
            schema.METHOD: r[schema.METHOD],
            schema.WORKLOAD: r[schema.WORKLOAD],
            schema.DATASET: r[schema.DATASET],
            schema.GPUS: r[schema.GPUS],
            schema.NODES: r[schema.NODES],
            schema.OPTIONS: ",".join(f"{k}={v}" for k, v in shown[r[SHOWN_OPTIONS]].items()),
            # what repeats are grouped by: the resolved settings (options shows them)
            "configuration": r[CONFIGURATION],
            "setting": r[SETTING],
            "machine_class": r[MACHINE_CLASS],
            "exchange_steps": schema.exchange_text(r[schema.EXCHANGE_EVERY]),
            schema.BATCH_SIZE: r[BATCH_SIZE],
            schema.LR: r[LR],
            schema.LR_SCHEDULE: r[LR_SCHEDULE],
            schema.SEED: r[schema.SEED],
            "final_acc": r[schema.FINAL_ACCURACY],
            "best_acc": r[schema.BEST_ACCURACY],
            schema.EPOCHS: round(epochs, 3),
            "s_per_iter": r[schema.ITERATION_SECONDS],
            "ms_per_step": ms_per_step(r[schema.SAMPLES_PER_RANK], r[BATCH_SIZE],
                                       r[schema.TRAIN_SECONDS]),
            "train_s": r[schema.TRAIN_SECONDS],
            "inter_MB_per_epoch": (r[schema.INTER_NODE_BYTES_TOTAL] or 0) / 1e6 / epochs,
            "inter_MB_per_iter": (r[schema.INTER_NODE_BYTES_PER_ITERATION] or 0) / 1e6,
            schema.DENSITY: r[FINAL_DENSITY],
            "exported_params_M": exported(r[VIEW], "parameters") / 1e6,
            "exported_GFLOPs": exported(r[VIEW], "flops") / 1e9,
            schema.SIMULATED: bool(r[schema.SIMULATED]),
        })
    order = [schema.WORKLOAD, schema.METHOD, schema.GPUS, schema.SEED]
    return pd.DataFrame(rows).sort_values(order, kind="stable")


def exported(run: RunView, key: str) -> float:
    """A number of the run's exported model (``bench export``); NaN without one."""
    value = (run.export or {}).get("exported", {}).get(key)
    return float("nan") if value is None else float(value)


def ms_per_step(samples_per_rank, batch_size, train_seconds) -> float | None:
    """Training milliseconds per local step: comparable between methods whose iteration is
    one step (DDP) and a round of H steps (PruneX, local SGD)."""
    if not samples_per_rank or not batch_size or train_seconds is None:
        return None
    return 1e3 * train_seconds / (samples_per_rank / batch_size)


def summary_table(per_run: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (``summary.csv``) of ``run_table``'s rows: repeats
    (seeds) reduced to their mean, with the 95 % t half-width (``*_ci95``) of accuracy, time
    and bytes; ``run_id`` lists every repeat, so none is ever dropped."""
    grouping = [c if c != "options" else "configuration" for c in CONFIG]
    keys = per_run[grouping].astype(object).where(per_run[grouping].notna(), "-").astype(str)
    rows = []
    for _, group in per_run.groupby([keys[c] for c in grouping], sort=False):
        first = group.iloc[0]
        row = {c: first[c] for c in CONFIG}
        row.update({c: " | ".join(dict.fromkeys(group[c])) for c in CARRIED})
        row.update(run_id=",".join(group.run_id), repeats=len(group),
                   seeds=",".join(str(x) for x in group.seed))
        for column in AVERAGED:
            mean, half, _ = mean_ci(group[column])
            row[column] = mean
            if column in WITH_CI:
                row[f"{column}_ci95"] = half
        rows.append(row)
    order = [schema.RUN_ID, *CONFIG, *CARRIED, "repeats", "seeds"]
    frame = pd.DataFrame(rows)
    return frame[order + [c for c in frame.columns if c not in order]]


def _markdown(frame: pd.DataFrame) -> str:
    return to_markdown(frame, floatfmt=".4g")


def kept_apart(runs: ResultSet) -> list[str]:
    """One line per kind of difference that a report keeps apart and says so: ``runs of 3
    machine classes (cpu-gloo, ...), kept apart in every table and figure``."""
    return [f"runs of {len(values)} {kind} ({', '.join(values)}), kept apart in every table "
            "and figure" for kind, values in several_of(runs.runs).items()]


def render(results_dir: str | Path, out: str | Path, echo=print, width: str | None = None) -> Path:
    """Draw every figure whose data exists into ``out``; returns the report.md path.
    ``width`` "one" or "two" sizes every figure for one paper column or the two-column page
    (default: each figure's own, one column for single panels, else two)."""
    runs, skipped_runs = load_runs(results_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for line in skipped_runs:
        echo(f"skipped run {line}")
    apart = kept_apart(runs)
    for line in apart:
        echo(line)
    summary, paper, caption = write_tables(runs, out)
    results = [*(draw(runs, out, width=width) for draw in FIGURES),
               *(draw(runs, out, kit, width=width) for draw in METHODS.figures()),
               *(draw(runs, out, width=width) for draw in CLOSING)]
    md = [f"# prunex-bench report: {markdown_text(Path(results_dir))}", "",
          f"{len(runs)} runs. Every number below comes from these run folders.", "",
          *[f"{markdown_text(line)}." for line in apart], *([""] if apart else []),
          "## Summary", "", "One row per configuration: repeats (runs of one machine class, "
          "configuration and budget that differ in the seed) as their mean, `*_ci95` the "
          "95 % t half-width (empty for one repeat); `exchange_steps`: local steps between "
          "exchanges inside a node / across nodes; accuracy in percent here, a fraction in "
          "`summary.csv` and `runs.csv`; each run in `runs.csv`.",
          "", _markdown(in_percent(summary)), "",
          "## Paper table", "", f"{markdown_text(caption)}. Also as LaTeX: [table.tex](table.tex).",
          "",
          to_markdown(paper), ""]
    page = [f"<h1>prunex-bench report: {html.escape(str(results_dir))}</h1>",
            *[f"<p>{html.escape(line)}.</p>" for line in apart],
            "<h2>Summary</h2>", in_percent(summary).to_html(index=False, float_format="%.4g")]
    for result in results:
        add_figure_section(result, out, md, page, echo)
    if skipped_runs:
        md += ["## Runs not included", "", *[f"- {markdown_text(line)}" for line in skipped_runs],
               ""]
    damaged = runs.unreadable
    for line in damaged:
        echo(f"skipped unreadable file {line}")
    if damaged:
        md += ["## Files left out (unreadable)", "",
               *[f"- {markdown_text(line)}" for line in damaged], ""]
    (out / "report.md").write_text("\n".join(md))
    write_html(out, page)
    return out / "report.md"


def write_tables(runs: ResultSet, out: Path) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The report's tables as files: ``summary.csv`` (a row per configuration), ``runs.csv``
    (a row per run) and the paper table as ``table.tex`` and ``table.md``.

    Returns:
        The summary, the paper table and its caption, which report.md shows too.
    """
    per_run = run_table(runs)
    summary = summary_table(per_run)
    summary.to_csv(out / "summary.csv", index=False)
    per_run.to_csv(out / "runs.csv", index=False)
    paper, caption = paper_table(summary), caption_of(summary)
    (out / "table.tex").write_text(to_latex(paper, caption))
    (out / "table.md").write_text(f"{to_markdown(paper)}\n\n{markdown_text(caption)}\n")
    return summary, paper, caption


def add_figure_section(result, out: Path, md: list[str], page: list[str], echo) -> None:
    """One figure's section of report.md and report.html, appended to ``md`` and ``page``:
    the figure, its runs, its table (also written as ``<name>.csv``); a figure skipped for
    want of data gets a line that says why, echoed too.

    Args:
        result: what a figure's draw returned (a drawn figure or ``Skipped``).
        out: the report's folder.
        md: report.md's lines so far.
        page: report.html's parts so far.
        echo: where the skipped line is printed.
    """
    if isinstance(result, Skipped):
        line = f"Skipped: {result.title} ({result.name}): {result.reason}"
        echo(line)
        md.extend([f"## {markdown_text(result.title)}", "", markdown_text(line), ""])
        page.extend([f"<h2>{html.escape(result.title)}</h2>", f"<p>{html.escape(line)}</p>"])
        return
    result.table.to_csv(out / f"{result.name}.csv", index=False)
    runs_line = "Runs: " + ", ".join(result.run_ids)
    said = markdown_text(runs_line + (f". {result.note}." if result.note else ""))
    md.extend([f"## {markdown_text(result.title)}", "",
               f"![{markdown_text(result.title)}]({result.files[0].name})", "", said, "",
               f"Data: [{result.name}.csv]({result.name}.csv)", "",
               _markdown(in_percent(result.table.head(40))), ""])
    png = base64.b64encode(result.files[0].read_bytes()).decode()
    caption = html.escape(runs_line + (f". {result.note}." if result.note else ""))
    page.extend([f"<h2>{html.escape(result.title)}</h2>",
                 f'<img alt="{html.escape(result.name)}" src="data:image/png;base64,{png}">',
                 f"<p>{caption}</p>",
                 in_percent(result.table.head(40)).to_html(index=False, float_format="%.4g")])


def write_html(out: Path, page: list[str]) -> None:
    """report.html: the page's parts in one self-contained file (figures inlined), styled
    for a browser."""
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:auto}img{max-width:100%}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
    )
    (out / "report.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>prunex-bench report</title>"
        f"<style>{style}</style></head><body>{''.join(page)}</body></html>"
    )
