"""``bench compare BASELINE NEW``: the regression gate of nightly jobs.

Runs are matched by (method, workload, gpus, method options); repeats of a key are reduced to
their median. Each metric's change is relative to the baseline, signed so that positive is
better (higher accuracy; lower time and bytes), and a change worse than ``-max_regression`` is
a regression. A key whose NEW runs all failed is a regression too. Keys present on one side
only are listed, never dropped silently.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from suite.errors import BenchError

# metric -> +1 when higher is better, -1 when lower is better
METRICS = {
    "final_accuracy": +1,
    "iteration_seconds": -1,
    "time_to_target_seconds": -1,
    "inter_node_bytes_per_iteration": -1,
}
ALIASES = {
    "accuracy": "final_accuracy",
    "time": "iteration_seconds",
    "time-to-target": "time_to_target_seconds",
    "bytes": "inter_node_bytes_per_iteration",
}
KEY = ["method", "workload", "gpus", "options"]


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
    files = [root / "summary.json"] if (root / "summary.json").exists() else []
    files = files or sorted(root.rglob("summary.json"))
    rows, warnings = [], []
    for file in files:
        try:
            summary = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            warnings.append(f"skipped {file}: unreadable summary ({exc})")
            continue
        if summary.get("method") is None:  # killed before its identity was recorded
            from suite.recover import identity_from_manifest
            from suite.results import RunFolder

            known = identity_from_manifest(RunFolder(file.parent))
            summary.update({k: v for k, v in known.items() if summary.get(k) is None})
        if summary.get("status") == "running":
            warnings.append(f"{file.parent}: still says running; counted as failed "
                            "(`bench recover` finalizes a killed run)")  # fmt: skip
        summary["options"] = json.dumps(summary.get("options") or {}, sort_keys=True)
        summary["folder"] = str(file.parent)
        rows.append(summary)
    if not rows:
        raise BenchError(f"no run folders (summary.json) under {root}")
    frame = pd.DataFrame(rows)
    for column in [*KEY, "status", *METRICS]:
        if column not in frame:
            frame[column] = None
    return frame, warnings


def _median(frame: pd.DataFrame) -> pd.DataFrame:
    ok = frame[frame.status == "ok"]
    values = ok.groupby(KEY)[list(METRICS)].median(numeric_only=False)
    return values.apply(pd.to_numeric, errors="coerce")


def compare(
    baseline: pd.DataFrame, new: pd.DataFrame, metrics: list[str], max_regression: float
) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """The comparison table and the lists of unmatched and failed keys."""
    base_keys = set(map(tuple, baseline[KEY].values.tolist()))
    new_keys = set(map(tuple, new[KEY].values.tolist()))
    base_values, new_values = _median(baseline), _median(new)
    rows = []
    for key in sorted(base_keys & new_keys, key=str):
        if key not in new_values.index:  # every NEW run of this key failed
            rows.append(failed_row(new, key))
            continue
        for metric in metrics:
            before = base_values.loc[key, metric] if key in base_values.index else math.nan
            after = new_values.loc[key, metric]
            if not (math.isfinite(before) and math.isfinite(after)) or before == 0:
                change, verdict = None, "n/a"
            else:
                change = METRICS[metric] * (after - before) / abs(before)
                if change < -max_regression:
                    verdict = "REGRESSION"
                elif change > max_regression:
                    verdict = "improved"
                else:
                    verdict = "ok"
            rows.append(dict(zip(KEY, key), metric=metric, baseline=before, new=after,
                             change=change, verdict=verdict))  # fmt: skip
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


def failed_row(new: pd.DataFrame, key: tuple) -> dict:
    """Every NEW run of ``key`` failed, was interrupted or never finished."""
    runs = new.set_index(KEY).loc[[key]]
    errors = runs["error"].dropna().tolist() if "error" in runs else []
    status = runs["status"].iloc[0]
    reason = errors[0] if errors else f"status {status}"
    return dict(zip(KEY, key), metric="status", baseline="ok", new=str(status), change=None,
                verdict=f"REGRESSION: {reason}")  # fmt: skip


def _describe(key: tuple) -> str:
    method, workload, gpus, options = key
    return f"{method} {workload} {gpus} GPUs {options}"


def format_table(table: pd.DataFrame) -> str:
    if table.empty:
        return "(no matched runs)"
    shown = table.copy()
    shown["change"] = shown["change"].map(lambda c: "" if c is None or c != c else f"{c:+.1%}")
    for column in ("baseline", "new"):
        shown[column] = shown[column].map(lambda v: f"{v:.4g}" if isinstance(v, float) else str(v))
    return shown.to_string(index=False)
