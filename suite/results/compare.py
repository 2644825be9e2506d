"""``bench compare BASELINE NEW``: the regression gate of nightly jobs.

Runs are compared like with like: matched by method, workload, dataset, ranks, method options,
setting (real, emulated link rate, simulated profile) and recipe (batch, lr, epochs run), so a
simulated run never meets a real one, nor a 0.1-epoch run a 1-epoch run. Repeats of a key are
reduced to their mean with a 95 % t interval. Accuracy changes are absolute (points), times and
bytes relative to the baseline, all signed so that positive is better. A change worse than its
threshold is a regression, except that with repeats on both sides the two intervals must also
not overlap. A key whose NEW runs all failed (or were interrupted, or never finished) is a
regression too. Keys present on one side only are listed, never dropped silently.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from suite.errors import BenchError
from suite.results.folder import SUMMARY, RunFolder
from suite.results.stats import half_width

# metric -> +1 when higher is better, -1 when lower is better
METRICS = {
    "final_accuracy": +1,
    "time_ratio": -1,
    "iteration_seconds": -1,
    "time_to_target_seconds": -1,
    "inter_node_bytes_per_iteration": -1,
}
ALIASES = {
    "accuracy": "final_accuracy",
    "time": "iteration_seconds",
    "time-ratio": "time_ratio",
    "time-to-target": "time_to_target_seconds",
    "bytes": "inter_node_bytes_per_iteration",
}
KEY = ["machine_class", "method", "workload", "dataset", "gpus", "options", "setting",
       "batch_size", "lr", "lr_schedule", "epochs"]  # fmt: skip
#: the timing metrics, which may get a threshold of their own (--max-time-regression)
TIME_METRICS = ("time_ratio", "iteration_seconds", "time_to_target_seconds")
#: what a run and its DDP twin (the dense reference of time ratios and activity checks) share
TWIN = ["machine_class", "workload", "dataset", "gpus", "setting", "batch_size", "epochs"]


def parse_threshold(text: str) -> float:
    """``5%`` or ``0.05`` -> 0.05."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise BenchError(f"--max-regression {text!r} is not a fraction or percentage") from None
    if not 0 <= value < 10:
        raise BenchError(f"--max-regression {text!r} must be between 0% and 1000%")
    return value


def parse_metrics(names: tuple[str, ...]) -> list[str]:
    chosen = []
    for name in (n for item in names for n in item.split(",") if n):
        metric = ALIASES.get(name, name)
        if metric not in METRICS:
            known = ", ".join([*METRICS, *ALIASES])
            raise BenchError(f"unknown metric {name!r}; known: {known}")
        chosen.append(metric)
    return chosen or list(METRICS)


def load_summaries(path: str | Path) -> tuple[pd.DataFrame, list[str]]:
    """Every run summary under ``path`` (a run folder or a tree of them), and warnings."""
    root = Path(path)
    if not root.exists():
        raise BenchError(f"{root} does not exist")
    files = [root / SUMMARY] if (root / SUMMARY).exists() else []
    files = files or sorted(root.rglob(SUMMARY))
    rows, warnings = [], []
    for file in files:
        try:
            summary = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            warnings.append(f"skipped {file}: unreadable summary ({exc})")
            continue
        if summary.get("method") is None:  # killed before its identity was recorded
            from suite.results.folder import RunFolder
            from suite.results.recover import identity_from_manifest

            known = identity_from_manifest(RunFolder(file.parent))
            summary.update({k: v for k, v in known.items() if summary.get(k) is None})
        if summary.get("status") == "running":
            warnings.append(f"{file.parent}: still says running; counted as failed "
                            "(`bench recover` finalizes a killed run)")  # fmt: skip
        summary["options"] = json.dumps(summary.get("options") or {}, sort_keys=True)
        summary["folder"] = str(file.parent)
        summary.update(recipe_and_setting(file.parent, summary))
        rows.append(summary)
    if not rows:
        raise BenchError(f"no run folders (summary.json) under {root}")
    frame = pd.DataFrame(rows)
    for column in [*KEY, "status", *METRICS]:
        if column not in frame:
            frame[column] = None
    frame[KEY] = frame[KEY].astype(object).where(frame[KEY].notna(), "-").astype(str)
    frame["time_ratio"] = time_ratios(frame)
    return frame, warnings


def time_ratios(frame: pd.DataFrame) -> pd.Series:
    """Each run's seconds per local step over DDP's in the same set (same machine class,
    workload, ranks, setting, batch, epochs; DDP's mean over its repeats): the runner's speed
    cancels out. NaN where the set has no such DDP run."""
    seconds = pd.to_numeric(frame["iteration_seconds"], errors="coerce")
    steps = pd.to_numeric(frame.get("steps_per_iteration", 1.0), errors="coerce")
    steps = pd.Series(steps, index=frame.index).fillna(1.0)
    per_step = seconds / steps
    ok = (frame["method"] == "ddp") & (frame["status"] == "ok")
    dense = per_step[ok].groupby([frame.loc[ok, k] for k in TWIN]).mean()
    keys = list(zip(*(frame[k] for k in TWIN)))
    return pd.Series([per_step.iloc[i] / dense[k] if k in dense.index else math.nan
                      for i, k in enumerate(keys)], index=frame.index)  # fmt: skip


def recipe_and_setting(folder: Path, summary: dict) -> dict:
    """The key fields a summary lacks, from the run's manifest: where its times come from,
    and its recipe. Epochs are those run (rounded), not those asked for."""
    try:
        manifest = RunFolder(folder).manifest() or {}
    except (OSError, ValueError):
        manifest = {}
    from suite.results.folder import setting_of

    recipe = manifest.get("recipe") or {}
    epochs = summary.get("epochs")
    from suite.results.machine import machine_class

    return {
        "machine_class": machine_class(manifest) if manifest else "-",
        "commit": manifest.get("git_revision") or "-",
        "started": manifest.get("started") or "-",
        "setting": setting_of(summary, manifest),
        "batch_size": recipe.get("batch_size"),
        "lr": recipe.get("lr"),
        # runs recorded before schedules existed trained at a constant lr
        "lr_schedule": schedule_of(recipe) if recipe else None,
        "epochs": None if epochs is None else round(float(epochs), 3),
    }


def reduce_repeats(frame: pd.DataFrame) -> pd.DataFrame:
    """Per key and metric: mean, 95 % half-width (NaN for one repeat) and repeat count."""
    ok = frame[frame.status == "ok"].copy()
    for metric in METRICS:
        ok[metric] = pd.to_numeric(ok[metric], errors="coerce")
    grouped = ok.groupby(KEY)[list(METRICS)]
    mean, std, count = grouped.mean(), grouped.std(), grouped.count()
    half = std.copy()
    for metric in METRICS:
        half[metric] = [half_width(s, int(n)) for s, n in zip(std[metric], count[metric])]
    return pd.concat({"mean": mean, "half": half, "n": count}, axis=1)


def compare(
    baseline: pd.DataFrame,
    new: pd.DataFrame,
    metrics: list[str],
    max_regression: float,
    max_accuracy_drop: float = 1.0,
    max_time_regression: float | None = None,
) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """The comparison table and the lists of unmatched keys. ``max_regression`` is relative
    (bytes, and times unless ``max_time_regression`` is given); ``max_accuracy_drop`` is in
    accuracy points."""
    limits = {m: max_regression for m in METRICS}
    if max_time_regression is not None:
        limits.update({m: max_time_regression for m in TIME_METRICS})
    base_keys, new_keys = keys_of(baseline), keys_of(new)
    base_values, new_values = reduce_repeats(baseline), reduce_repeats(new)
    rows = []
    for key in sorted(base_keys & new_keys, key=str):
        if key not in new_values.index:  # every NEW run of this key failed
            rows.append(failed_row(new, key))
            continue
        for metric in metrics:
            before = stats_of(base_values, key, metric)
            after = stats_of(new_values, key, metric)
            change, unit, verdict = judge(metric, before, after, limits[metric],
                                          max_accuracy_drop)  # fmt: skip
            rows.append(dict(zip(KEY, key), metric=metric, baseline=before["mean"],
                             new=after["mean"], baseline_ci=before["half"], new_ci=after["half"],
                             repeats=f"{before['n']}/{after['n']}", change=change, unit=unit,
                             verdict=verdict))  # fmt: skip
    new_only = sorted(new_keys - base_keys, key=str)
    new_values_keys = set(new_values.index)
    for key in new_only:  # a run that failed is a regression even without a baseline twin
        if key not in new_values_keys:
            rows.append(failed_row(new, key))
    unmatched = {
        "only in baseline": [_describe(k) for k in sorted(base_keys - new_keys, key=str)],
        "only in new": [_describe(k) for k in new_only],
    }
    return pd.DataFrame(rows), unmatched


def keys_of(runs: pd.DataFrame) -> set[tuple]:
    """The comparison keys of a set's runs."""
    return set(map(tuple, runs[KEY].values.tolist()))


def activity_rows(new: pd.DataFrame) -> tuple[list[dict], list[str]]:
    """Each finished NEW run's activity check (declared with its method): what it did not do
    is a regression whatever the baseline says. Runs without a manifest (summaries written
    by hand or by old tools) are not checked, with a warning."""
    from suite.plugins.registry import METHODS
    from suite.results.activity import check_run, load_view

    ok = new[new.status == "ok"]
    ddp = ok[ok.method == "ddp"]
    dense = pd.to_numeric(ddp["inter_node_bytes_per_iteration"], errors="coerce")
    dense = dense.groupby([ddp[k] for k in TWIN]).mean()
    rows, unchecked = [], 0
    for _, run in ok.iterrows():
        folder = Path(run["folder"])
        entry = METHODS.find(run["method"])
        if entry is None or entry.activity is None:
            continue
        if not (folder / "manifest.json").is_file():
            unchecked += 1
            continue
        view = load_view(folder, run.to_dict())
        twin = tuple(run[k] for k in TWIN)
        view.dense_bytes = float(dense[twin]) if twin in dense.index else None
        for finding in check_run(view, entry.activity):
            rows.append(dict(zip(KEY, (run[k] for k in KEY)), metric="activity",
                             baseline="-", new=folder.name, change=None,
                             verdict=f"REGRESSION: {run['method']} {finding}"))  # fmt: skip
    warnings = [f"{unchecked} run(s) have no manifest: activity not checked"] if unchecked else []
    return rows, warnings


def stats_of(values: pd.DataFrame, key: tuple, metric: str) -> dict:
    if key not in values.index:
        return {"mean": math.nan, "half": math.nan, "n": 0}
    row = values.loc[key]
    return {"mean": float(row[("mean", metric)]), "half": float(row[("half", metric)]),
            "n": int(row[("n", metric)])}  # fmt: skip


def judge(
    metric: str, before: dict, after: dict, max_regression: float, max_accuracy_drop: float
) -> tuple[float | None, str, str]:
    """(signed change, its unit, verdict): accuracy in points, the rest relative. With two
    or more repeats on both sides a change beyond the threshold counts only if the two 95 %
    intervals do not overlap."""
    b, a = before["mean"], after["mean"]
    if not (math.isfinite(b) and math.isfinite(a)):
        return None, "", "n/a"
    if metric == "final_accuracy":
        change, unit, limit = 100 * (a - b), "points", max_accuracy_drop
    elif b == 0:
        return None, "", "n/a"
    else:
        change, unit, limit = METRICS[metric] * (a - b) / abs(b), "relative", max_regression
    if abs(change) <= limit:
        return change, unit, "ok"
    intervals = math.isfinite(before["half"]) and math.isfinite(after["half"])
    if intervals and abs(a - b) <= before["half"] + after["half"]:
        return change, unit, "ok (within the repeats' intervals)"
    return change, unit, "REGRESSION" if change < 0 else "improved"


def failed_row(new: pd.DataFrame, key: tuple) -> dict:
    """Every NEW run of ``key`` failed, was interrupted or never finished."""
    runs = new.set_index(KEY).loc[[key]]
    errors = runs["error"].dropna().tolist() if "error" in runs else []
    status = runs["status"].iloc[0]
    reason = errors[0] if errors else f"status {status}"
    return dict(zip(KEY, key), metric="status", baseline="ok", new=str(status), change=None,
                verdict=f"REGRESSION: {reason}")  # fmt: skip


def _describe(key: tuple) -> str:
    fields = dict(zip(KEY, key))
    machine = fields["machine_class"]
    text = f"[{machine}] " if machine != "-" else ""
    text += f"{fields['method']} {fields['workload']} on {fields['dataset']} {fields['gpus']} ranks"
    text += f" {fields['options']} ({fields['setting']}; batch {fields['batch_size']}, "
    return text + f"lr {fields['lr']}, {fields['epochs']} epochs)"


def shown(table: pd.DataFrame) -> pd.DataFrame:
    """The table as people read it: changes as +1.2 pts / -3.4 %, means with their interval."""
    out = table.copy()

    def change(row) -> str:
        c = row["change"]
        if c is None or c != c:
            return ""
        return f"{c:+.2f} pts" if row.get("unit") == "points" else f"{c:+.1%}"

    def value(mean, half) -> str:
        if not isinstance(mean, float):
            return str(mean)
        return f"{mean:.4g}" + (
            f" ± {half:.2g}" if isinstance(half, float) and half == half else ""
        )

    out["change"] = [change(row) for _, row in table.iterrows()]
    for side in ("baseline", "new"):
        halves = table[f"{side}_ci"] if f"{side}_ci" in table else [None] * len(table)
        out[side] = [value(m, h) for m, h in zip(table[side], halves)]
    keep = ["method", "workload", "gpus", "options", "setting", "metric", "baseline", "new",
            "repeats", "change", "verdict"]  # fmt: skip
    return out[[c for c in keep if c in out]]


def format_table(table: pd.DataFrame, fmt: str = "text") -> str:
    if table.empty:
        return "(no matched runs)" if fmt != "json" else "[]"
    if fmt == "markdown":
        return shown(table).to_markdown(index=False)
    return shown(table).to_string(index=False)


def as_json(
    table: pd.DataFrame, unmatched: dict, regressions: int, warnings: list, matched: int
) -> str:
    rows = json.loads(table.to_json(orient="records")) if len(table) else []
    return json.dumps({"rows": rows, "unmatched": unmatched, "regressions": regressions,
                       "matched": matched, "warnings": warnings}, indent=2)  # fmt: skip


def schedule_of(recipe: dict) -> str:
    """``cosine+warmup0.1`` or ``constant``: the lr schedule a manifest's recipe names."""
    kind = recipe.get("lr_schedule", "constant")
    warmup = recipe.get("warmup_epochs") or 0
    return f"{kind}+warmup{warmup:g}" if warmup else kind
