"""The summary as a table a paper can paste: one row per configuration, mean +- 95 %
interval over its repeats, human names; LaTeX (booktabs, through pandas' Styler) and
Markdown from the same cells.

Every string comes from run folders (a workload, a method or a machine class is whatever a
folder says), so each reaches LaTeX and Markdown as text only: in LaTeX all ten special
characters escaped, the caption's too (``latex_text``: a ``\\input{...}`` stays words, an
``_`` in ``timm:vit_tiny_patch16_224`` cannot break a paper's build); in Markdown no raw HTML
and no ``|`` or line break that splits a table (``markdown_text``).
"""

from __future__ import annotations

import html
import math

import pandas as pd

from suite.report.labels import budget_words
from suite.report.style import method_style, method_then_keep
from suite.results import schema

PM = "±"
#: files keep accuracy as a fraction under its schema name (``final_acc``, ``accuracy``);
#: a column in percent says so by this suffix
PCT = "_pct"
ACCURACY_PCT = "accuracy" + PCT
#: fraction columns of summary.csv and the figures' data, shown in percent where read
ACCURACY_FRACTIONS = ("final_acc", "best_acc", "accuracy")
TEXT = ("Method", "Workload", "Options", "Exchange (steps)", "Setting", "Machine", "Budget")
#: (summary column, header, decimals, scale) of the numbers a paper reports
NUMBERS = [
    ("final_acc", "Accuracy (%)", 2, 100.0),
    ("inter_MB_per_epoch", "Inter-node MB/epoch", 1, 1.0),
    ("ms_per_step", "ms/local step", 1, 1.0),
    ("train_s", "Train time (s)", 1, 1.0),
    ("exported_params_M", "Exported params (M)", 3, 1.0),  # where `bench export` ran
    ("exported_GFLOPs", "Exported GFLOPs", 3, 1.0),
]


def mean_pm(mean: float, half: float, decimals: int) -> str:
    """``81.82 ± 0.51``; the mean alone for one repeat (no interval)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "-"
    if half is None or (isinstance(half, float) and math.isnan(half)):
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} {PM} {half:.{decimals}f}"


def human_options(options: str) -> str:
    """``channel_keep=0.5,local_steps=4`` as ``channel keep 0.5, local steps 4``."""
    if not isinstance(options, str) or not options:
        return ""
    return ", ".join(part.replace("_", " ").replace("=", " ") for part in options.split(","))


def keeps_in(options: str) -> tuple:
    """``channel_keep=0.5,local_steps=4`` -> ``(("channel_keep", 0.5),)``: a row's keeps,
    to sort by."""
    pairs = (part.split("=", 1) for part in str(options or "").split(",") if "=" in part)
    return tuple((name, float(value)) for name, value in pairs
                 if name in schema.ALWAYS_SHOWN_OPTIONS)


def paper_table(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary.csv``'s rows as the paper's columns, by workload, method, keep and GPUs
    (not in the order the runs were read)."""
    order = sorted(range(len(summary)), key=lambda i: (
        str(summary.workload.iat[i]),
        *method_then_keep(summary.method.iat[i], keeps_in(summary.options.iat[i])),
        int(summary.gpus.iat[i])))
    rows = []
    for _, row in summary.iloc[order].iterrows():
        cells = {
            "Method": method_style(row.method).name,
            "Workload": row.workload,
            "GPUs": int(row.gpus),
            "Options": human_options(row.options),
            # local steps between exchanges inside a node / across nodes
            "Exchange (steps)": row.get("exchange_steps", "-"),
            "Setting": row.setting,
            "Machine": row.get("machine_class", "-"),
            "Budget": budget_words(row.epochs),
            "Seeds": int(row.repeats),
        }
        for column, header, decimals, scale in NUMBERS:
            if column not in row:
                continue
            half = row.get(f"{column}_ci95")
            cells[header] = mean_pm(
                row[column] * scale, None if half is None else half * scale, decimals
            )
        rows.append(cells)
    table = pd.DataFrame(rows)
    constant = [c for c in ("Workload", "Setting", "Machine", "Budget") if table[c].nunique() == 1]
    empty = ["Options"] if (table["Options"] == "").all() else []
    empty += ["Exchange (steps)"] if (table["Exchange (steps)"] == "-").all() else []
    empty += [h for _, h, _, _ in NUMBERS if h in table and (table[h] == "-").all()]
    return table.drop(columns=constant + empty)  # said once in the caption, not in every row


#: LaTeX's ten special characters as text writes them (as pandas' Styler escapes cells)
LATEX_SPECIALS = str.maketrans({
    "\\": r"\textbackslash ", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde ", "^": r"\textasciicircum ",
    "\n": " ", "\r": " ",
})


def latex_text(text) -> str:
    """``text`` as LaTeX typesets it literally: every special character escaped, line breaks
    as spaces (a blank line would end the table's paragraph)."""
    return str(text).translate(LATEX_SPECIALS)


def to_latex(table: pd.DataFrame, caption: str) -> str:
    """A booktabs ``table`` environment; every cell, header and the caption escaped for
    LaTeX (``latex_text``), ``±`` as ``$\\pm$``."""
    shown = table.map(lambda value: latex_text(value) if isinstance(value, str) else value)
    shown.columns = [latex_text(c) for c in table.columns]
    text = shown.style.hide(axis="index").to_latex(
        hrules=True,
        column_format="".join("l" if c in TEXT else "r" for c in table.columns),
        caption=latex_text(caption),
        position="t",
    )
    return text.replace(PM, r"$\pm$")


def caption_of(summary: pd.DataFrame) -> str:
    """What every row shares (workload, setting, machine class, budget), and how repeats are
    reduced."""
    shared = [f"{words} {summary[column].iloc[0]}"
              for column, words in (("workload", "workload"), ("setting", "setting"),
                                    ("machine_class", "machine class"))
              if column in summary and summary[column].nunique() == 1]
    if summary[schema.EPOCHS].nunique() == 1:
        shared.append(f"budget {budget_words(summary[schema.EPOCHS].iloc[0])}")
    return "; ".join([*shared, "mean ± 95 % t interval over seeds"])


def in_percent(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` as a reader sees it in report.md and report.html: each accuracy fraction
    (and its ``_ci95``) in percent under ``NAME (%)``; one that already has a ``_pct`` twin
    is left out rather than shown twice. The files keep the fractions."""
    shown = table.copy()
    for name in ACCURACY_FRACTIONS:
        if name not in shown:
            continue
        twins = [name, f"{name}_ci95"]
        if f"{name}{PCT}" in shown:
            shown = shown.drop(columns=[c for c in twins if c in shown])
            continue
        shown = shown.rename(columns={c: f"{c} (%)" for c in twins if c in shown})
        for c in twins:
            if f"{c} (%)" in shown:
                shown[f"{c} (%)"] = 100 * pd.to_numeric(shown[f"{c} (%)"], errors="coerce")
    return shown.rename(columns={c: f"{c.replace(PCT, '', 1)} (%)" for c in shown.columns
                                 if isinstance(c, str) and PCT in c})


#: what Markdown would read as markup in a table's text: its own escapes, code, links and
#: table cells (HTML's ``<``, ``>`` and ``&`` go as entities, line breaks as spaces)
MARKDOWN_SPECIALS = str.maketrans({
    "\\": "\\\\", "`": "\\`", "|": "\\|", "[": "\\[", "]": "\\]", "\n": " ", "\r": " ",
})


def markdown_text(text) -> str:
    """``text`` as Markdown shows it literally: no raw HTML (a run id of ``<img ...>`` is
    shown, not loaded), no ``|`` or line break that splits a table, no link or code span."""
    return html.escape(str(text), quote=False).translate(MARKDOWN_SPECIALS)


def markdown_frame(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with every string cell and header as ``markdown_text``."""
    shown = table.map(lambda value: markdown_text(value) if isinstance(value, str) else value)
    shown.columns = [markdown_text(c) for c in table.columns]
    return shown


def to_markdown(table: pd.DataFrame, **options) -> str:
    """``table`` as a Markdown table, its text shown literally (``markdown_frame``)."""
    return markdown_frame(table).to_markdown(index=False, **options)
