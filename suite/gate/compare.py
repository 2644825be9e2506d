"""``bench compare BASELINE NEW``: the regression gate of nightly jobs.

Runs are compared like with like: matched by method, workload, dataset, ranks, method options,
setting (real, emulated link rate, simulated profile) and recipe (batch, lr, epochs run), so a
simulated run never meets a real one, nor a 0.1-epoch run a 1-epoch run. Repeats of a key are
reduced to their mean with a 95 % t interval. Accuracy changes are absolute (points), times and
bytes relative to the baseline, all signed so that positive is better. A change worse than its
threshold is a regression, except that with repeats on both sides the two intervals must also
not overlap, and that a time measured on a busy runner (its run's or its DDP twin's manifest
says other processes took more than the gate's share of the cores: suite.results.runner) is
"not judged" instead, on either side, and so is a time measured on another processor than
its baseline's (a runner judged against the portable class's reference); loss, accuracy and
bytes are judged as always. A key
whose NEW runs all failed (or were interrupted, or never finished) is a regression too, and so
is one whose runs' traffic was not counted (several nodes, intra-node bytes and no inter-node
bytes: its inter-node collectives went past the communicator), which is not ranked at all.
Keys present on one side only are listed, never dropped silently, and a method that both
sides ran under different settings is a regression of its own (``settings_rows``): a changed
default must not take a method out of the gate unseen.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from suite.errors import BenchError
from suite.gate.activity import ActivityCheck, check_run
from suite.gate.thresholds import Gate
from suite.results import schema
from suite.results.catalogue import (
    CATALOGUE,
    DENSE_METHOD,
    GATE_KEY,
    TIME_RATIO,
    TWIN_KEY,
    directions,
)
from suite.results.resultset import (
    COMMIT,
    CONFIGURATION,
    FOLDER,
    STARTED,
    VIEW,
    Declared,
    column,
    final_train_losses,
    nothing_declared,
    read_result_set,
)
from suite.results.runner import busy
from suite.results.schema import Status, Verdict
from suite.results.stats import half_width

#: why a run's bytes cannot be ranked (None: they can; ``uncounted_traffic``)
UNCOUNTED = "uncounted"
#: metric -> +1 when higher is better, -1 when lower is better (suite.results.catalogue)
METRICS = directions()
#: a comparison's key: the run identity, class first (suite.results.catalogue)
KEY = list(GATE_KEY)
#: the timing metrics, judged only on a quiet runner
TIME_METRICS = tuple(metric.name for metric in CATALOGUE if metric.timing)
#: what a run and its DDP twin (the dense reference of time ratios and activity checks) share
TWIN = list(TWIN_KEY)


def load_summaries(
    path: str | Path, declared: Declared = nothing_declared
) -> tuple[pd.DataFrame, list[str]]:
    """Every run under ``path`` (a run folder or a tree of them) as one row of its summary
    and comparison key (its ``view`` column holds the ``RunView``), and warnings: the
    result set (suite.results.resultset.read_result_set) with the key's columns made as
    runs are compared. ``declared`` gives each method's option defaults, so runs are matched
    by their resolved settings (``RunView.configuration``): a run's ``options`` is its
    configuration, its ``shown_options`` what a table shows of it. Epochs are those run
    (rounded), not those asked for."""
    root = Path(path)
    if not root.exists():
        raise BenchError(f"{root} does not exist")
    runs = read_result_set(root, declared)
    warnings = [f"skipped {line}" for line in runs.skipped]
    if not len(runs):
        why = f"; skipped {runs.skipped[0]}" if runs.skipped else ""
        raise BenchError(f"no run folders (summary.json) under {root}{why}")
    warnings += [f"unreadable {line}" for line in runs.unreadable]  # manifests, read by now
    frame = runs.runs
    warnings += [f"{folder}: still says running; counted as failed "
                 "(`bench recover` finalizes a killed run)"
                 for folder, status in zip(frame[FOLDER], frame[schema.STATUS])
                 if status == Status.RUNNING]
    frame[schema.FINAL_TRAIN_LOSS] = final_train_losses(list(frame[VIEW]))
    frame[schema.RUNNER_LOAD] = [view.manifest.get(schema.RUNNER_LOAD) for view in frame[VIEW]]
    frame[schema.OPTIONS] = frame[CONFIGURATION]
    frame[COMMIT] = [value or "-" for value in frame[COMMIT]]
    frame[STARTED] = [value or "-" for value in frame[STARTED]]
    frame[schema.EPOCHS] = [None if e is None else round(float(e), 3)
                            for e in frame[schema.EPOCHS]]
    frame[UNCOUNTED] = [uncounted_traffic(view.summary) for view in frame[VIEW]]
    frame = frame.infer_objects()
    for name in [*KEY, schema.STATUS, *METRICS, UNCOUNTED]:
        if name not in frame:
            frame[name] = None
    frame[KEY] = frame[KEY].astype(object).where(frame[KEY].notna(), "-").astype(str)
    frame[TIME_RATIO] = time_ratios(frame)
    return frame, warnings


def uncounted_traffic(summary: dict) -> str | None:
    """Why a run's bytes cannot be ranked, or None: on several nodes it recorded traffic
    inside the nodes and none between them, so its inter-node collectives went past the
    communicator (or its method never crossed nodes) and it would read as the cheapest."""
    nodes = summary.get(schema.NODES) or 1
    inter = summary.get(schema.INTER_NODE_BYTES_TOTAL) or 0
    intra = summary.get(schema.INTRA_NODE_BYTES_TOTAL) or 0
    if summary.get(schema.STATUS) == Status.OK and nodes > 1 and intra > 0 and inter == 0:
        return (f"not ranked: intra-node traffic and no inter-node bytes on {nodes} nodes (its "
                "inter-node collectives went past ctx.comm)")
    return None


def time_ratios(frame: pd.DataFrame) -> pd.Series:
    """Each run's seconds per local step over DDP's in the same set (same machine class,
    workload, ranks, setting, batch, epochs; DDP's mean over its repeats): the runner's speed
    cancels out. NaN where the set has no such DDP run."""
    seconds = pd.to_numeric(frame[schema.ITERATION_SECONDS], errors="coerce")
    steps = pd.to_numeric(frame.get(schema.STEPS_PER_ITERATION, 1.0), errors="coerce")
    steps = pd.Series(steps, index=frame.index).fillna(1.0)
    per_step = seconds / steps
    ok = (frame[schema.METHOD] == DENSE_METHOD) & (frame[schema.STATUS] == Status.OK)
    dense = per_step[ok].groupby([frame.loc[ok, k] for k in TWIN]).mean()
    keys = list(zip(*(frame[k] for k in TWIN)))
    return pd.Series([per_step.iloc[i] / dense[k] if k in dense.index else math.nan
                      for i, k in enumerate(keys)], index=frame.index)


def busy_keys(runs: pd.DataFrame, max_share: float | None) -> dict[tuple, str]:
    """Key -> why its times cannot be judged: one of its runs, or of its DDP twins (whose time
    its time ratio divides by), ran on a runner busier than ``max_share`` of its cores."""
    if max_share is None or runs.empty or schema.RUNNER_LOAD not in runs:
        return {}
    said = [busy(load, max_share) for load in runs[schema.RUNNER_LOAD]]
    twins = list(zip(*(runs[k] for k in TWIN)))
    dense = {}
    for why, method, twin in zip(said, runs[schema.METHOD], twins):
        if why and method == DENSE_METHOD:
            dense.setdefault(twin, why)
    found = {}
    for why, run_key, twin in zip(said, zip(*(runs[k] for k in KEY)), twins):
        why = why or dense.get(twin)
        if why:
            found.setdefault(run_key, why)
    return found


def timed_on(view) -> str | None:
    """The processor a run was timed on (its GPUs' model, else its CPU's vendor, family and
    model name), from its manifest; None where the manifest does not say."""
    hardware = (getattr(view, "manifest", None) or {}).get(schema.HARDWARE) or {}
    devices = hardware.get(schema.CUDA_DEVICES) or []
    if devices:
        return ", ".join(sorted({str(d) for d in devices}))
    parts = [hardware.get(k) for k in (schema.CPU_VENDOR, schema.CPU_FAMILY,
                                         schema.CPU_MODEL_NAME)]
    return " ".join(str(p) for p in parts) if any(parts) else None


def foreign_keys(baseline: pd.DataFrame, new: pd.DataFrame) -> dict[tuple, str]:
    """Key -> why its times cannot be judged: its NEW runs were timed on another processor
    than its baseline runs (a CPU runner judged against the portable class's reference,
    recorded elsewhere: kernels and numbers travel across vendors, speed does not)."""
    def machines(runs: pd.DataFrame) -> dict[tuple, set[str]]:
        found: dict[tuple, set[str]] = {}
        if VIEW not in runs:
            return found
        for run_key, view in zip(map(tuple, runs[KEY].values.tolist()), runs[VIEW]):
            machine = timed_on(view)
            if machine:
                found.setdefault(run_key, set()).add(machine)
        return found

    before, after = machines(baseline), machines(new)
    return {key: (f"timed on {', '.join(sorted(after[key]))}; the baseline on "
                  f"{', '.join(sorted(before[key]))}")
            for key in before.keys() & after.keys() if before[key] != after[key]}


def reduce_repeats(frame: pd.DataFrame) -> pd.DataFrame:
    """Per key and metric: mean, 95 % half-width (NaN for one repeat) and repeat count, of
    the runs that finished with their traffic counted."""
    counted = frame[UNCOUNTED].isna() if UNCOUNTED in frame else True
    ok = frame[(frame[schema.STATUS] == Status.OK) & counted].copy()
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
    gate: Gate,
    unmatched_hint: str | None = "",
) -> tuple[pd.DataFrame, dict[str, list[str]]]:
    """The comparison table and the lists of unmatched keys: each metric judged at its
    threshold (``gate.limit``), times not judged where a runner was busier than
    ``gate.outside_load`` allows; ``unmatched_hint``: what the line of a method run under
    other settings than its baseline says to do (None: such methods are only listed as
    unmatched, ``--allow-unmatched``; see ``settings_rows``)."""
    base_keys, new_keys = keys_of(baseline), keys_of(new)
    base_values, new_values = reduce_repeats(baseline), reduce_repeats(new)
    labels = {**shown_options_of(baseline), **shown_options_of(new)}
    new_values_keys = set(new_values.index)
    busy_times = {**foreign_keys(baseline, new), **busy_keys(baseline, gate.outside_load),
                  **busy_keys(new, gate.outside_load)}
    failed = failed_rows(new, new_keys - new_values_keys)
    rows = []
    for run_key in sorted(base_keys & new_keys, key=str):
        if run_key not in new_values_keys:  # every NEW run of this key failed
            rows.append(failed[run_key])
            continue
        for metric in metrics:
            before = stats_of(base_values, run_key, metric)
            after = stats_of(new_values, run_key, metric)
            rows.append(metric_row(run_key, metric, before, after, gate.limit(metric),
                                   busy_times.get(run_key)))
    new_only = sorted(new_keys - base_keys, key=str)
    for run_key in new_only:  # a run that failed is a regression even without a baseline twin
        if run_key not in new_values_keys:
            rows.append(failed[run_key])
    if unmatched_hint is not None:
        rows += settings_rows(base_keys, new_keys, unmatched_hint)
    for row in rows:
        row["shown_options"] = labels.get(tuple(row[k] for k in KEY), row[schema.OPTIONS])
    unmatched = {
        "only in baseline": [describe_key(k) for k in sorted(base_keys - new_keys, key=str)],
        "only in new": [describe_key(k) for k in new_only],
    }
    return pd.DataFrame(rows), unmatched


def metric_row(run_key: tuple, metric: str, before: dict, after: dict, limit: float,
               busy: str | None) -> dict:
    """One metric of one key judged at ``limit`` (its threshold): a time of a run whose
    runner was ``busy`` (why: None when it was quiet) is shown but not judged."""
    change, unit, verdict = judge(metric, before, after, limit)
    finding = None
    if metric in TIME_METRICS and busy is not None and change is not None:
        verdict, finding = Verdict.NOT_JUDGED, busy
    return table_row(run_key, metric, verdict, finding, baseline=before["mean"],
                     new=after["mean"], baseline_ci=before["half"], new_ci=after["half"],
                     repeats=f"{before['n']}/{after['n']}", change=change, unit=unit)


#: the metric of a row saying that a method ran under other settings than its baseline
SETTINGS = "settings"


def settings_rows(base_keys: set[tuple], new_keys: set[tuple], hint: str) -> list[dict]:
    """A regression row per method that both sides ran but not under the same settings: a
    baseline configuration without a NEW counterpart, or a NEW one the baseline lacks. Such a
    method would otherwise be judged on nothing (a changed default left PruneX unjudged while
    the gate passed), so its row names the settings that differ and ``hint``, what to do
    (re-record the reference). Methods that only one side ran are listed as unmatched, not
    failed: a nightly may run fewer methods than its reference holds."""
    def by_method(keys) -> dict[str, list[dict]]:
        found: dict[str, list[dict]] = {}
        for run_key in sorted(keys, key=str):
            found.setdefault(dict(zip(KEY, run_key))[schema.METHOD], []).append(
                dict(zip(KEY, run_key)))
        return found

    base, new = by_method(base_keys), by_method(new_keys)
    rows = []
    for method in sorted(base.keys() & new.keys()):
        only_new = [k for k in new[method] if k not in base[method]]
        only_base = [k for k in base[method] if k not in new[method]]
        if not (only_new or only_base):
            continue
        if only_new:
            differences = key_differences(nearest(only_new[0], base[method]), only_new[0])
        else:
            differences = (f"the baseline's {describe_fields(only_base[0])} has no NEW "
                           "counterpart")
        finding = f"{method} ran under other settings than its baseline: {differences}{hint}"
        run_key = tuple((only_new or only_base)[0][k] for k in KEY)
        rows.append(table_row(run_key, SETTINGS, Verdict.REGRESSION, finding, baseline="-",
                              new="-", change=None))
    return rows


def nearest(key: dict, candidates: list[dict]) -> dict:
    """The candidate key that differs from ``key`` in the fewest fields and options."""
    return min(candidates, key=lambda other: len(field_differences(other, key)))


def options_of(text: str) -> dict:
    """A key's options (its configuration as JSON) as a dict ({} for ``-``)."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def field_differences(before: dict, after: dict) -> list[tuple[str, object, object]]:
    """(name, baseline value, NEW value) of every key field and option that differs."""
    found = [(name, before[name], after[name]) for name in KEY
             if name != schema.OPTIONS and before[name] != after[name]]
    old, now = options_of(before[schema.OPTIONS]), options_of(after[schema.OPTIONS])
    found += [(name, old.get(name, DEFAULT_WORD), now.get(name, DEFAULT_WORD))
              for name in sorted(old.keys() | now.keys()) if old.get(name) != now.get(name)]
    return found


#: how a difference names an option left at its declared default
DEFAULT_WORD = "its default"


def key_differences(before: dict, after: dict) -> str:
    """``freeze_share 0.5 in the baseline, its default in NEW``, for every field that
    differs."""
    return "; ".join(f"{name} {old} in the baseline, {now} in NEW"
                     for name, old, now in field_differences(before, after))


def options_words(options) -> str:
    """A configuration's options as a table shows them: ``channel_keep=0.5, rho1=9.907``
    (floats to 4 significant digits), ``-`` for none."""
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except json.JSONDecodeError:
            return options
    if not options:
        return "-"
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in sorted(options.items()))


def describe_fields(key: dict) -> str:
    """A key as its method, options and recipe (``prunex channel_keep=0.3, 0.1 epochs``)."""
    return (f"{key[schema.METHOD]} {options_words(key[schema.OPTIONS])} ({key[schema.WORKLOAD]}, "
            f"{key[schema.GPUS]} ranks, {key[schema.EPOCHS]} epochs)")


def table_row(run_key: tuple, metric: str, verdict: Verdict, finding: str | None = None,
              **values) -> dict:
    """One row of the comparison: the key's fields, the metric, its numbers, and the verdict
    (``verdict``: the text tables print; ``regression``: whether it fails the gate)."""
    return {**dict(zip(KEY, run_key)), "metric": metric, **values,
            "verdict": verdict.text(finding), "regression": verdict == Verdict.REGRESSION,
            "finding": finding}


def shown_options_of(runs: pd.DataFrame) -> dict[tuple, str]:
    """key -> the options its runs show in a table (without what methods derived)."""
    column = runs["shown_options"] if "shown_options" in runs else runs[schema.OPTIONS]
    return dict(zip(map(tuple, runs[KEY].values.tolist()), column))


def with_exchange(table: pd.DataFrame, baseline: pd.DataFrame, new: pd.DataFrame
                  ) -> pd.DataFrame:
    """``table`` with each row's exchange schedule (``exchange``: ``4 / 32``, local steps
    between exchanges inside a node / across nodes): its NEW runs', else its baseline's,
    ``-`` where neither recorded one."""
    schedules = {}
    for runs in (baseline, new):
        texts = [schema.exchange_text(e) for e in column(runs, schema.EXCHANGE_EVERY)]
        schedules.update({key: text for key, text in
                          zip(map(tuple, runs[KEY].values.tolist()), texts) if text != "-"})
    if table.empty:
        return table
    return table.assign(exchange=[schedules.get(tuple(key), "-")
                                  for key in table[KEY].values.tolist()])


def keys_of(runs: pd.DataFrame) -> set[tuple]:
    """The comparison keys of a set's runs."""
    return set(map(tuple, runs[KEY].values.tolist()))


def activity_rows(
    new: pd.DataFrame, check_of: Callable[[str], ActivityCheck | None]
) -> tuple[list[dict], list[str]]:
    """Each finished NEW run's activity check (``check_of(method)``: the one its method
    declared, or None): what it did not do is a regression whatever the baseline says, and a
    check that passed is listed as such. Runs without a manifest (summaries written by hand or
    by old tools) are not checked, with a warning."""

    ok = new[new[schema.STATUS] == Status.OK]
    ddp = ok[ok[schema.METHOD] == DENSE_METHOD]
    dense = pd.to_numeric(ddp[schema.INTER_NODE_BYTES_PER_ITERATION], errors="coerce")
    dense = dense.groupby([ddp[k] for k in TWIN]).mean()
    rows, unchecked, without_check = [], 0, set()
    checks = {method: check_of(method) for method in ok[schema.METHOD].unique()}
    dense = dense.to_dict()
    for view, twin, run_key in zip(ok[VIEW], zip(*(ok[k] for k in TWIN)),
                                   zip(*(ok[k] for k in KEY))):
        check = checks[view.method]
        if check is None:
            without_check.add(view.method)
            continue
        if not view.manifest:
            unchecked += 1
            continue
        view.dense_bytes = float(dense[twin]) if twin in dense else None
        findings = check_run(view, check)
        for finding in findings:
            rows.append(table_row(run_key, "activity", Verdict.REGRESSION,
                                  f"{view.method} {finding}", baseline="-",
                                  new=view.folder.name, change=None))
        if not findings:
            rows.append(table_row(run_key, "activity", Verdict.OK,
                                  f"{view.method} did its job ({check_name(check)})",
                                  baseline="-", new=view.folder.name, change=None))
    warnings = [f"{unchecked} run(s) have no manifest: activity not checked"] if unchecked else []
    if without_check:
        warnings.append(f"{', '.join(sorted(without_check))} declare(s) no activity check "
                        "(METHODS.register(..., activity=...)): only compared to the baseline")
    return rows, warnings


def check_name(check) -> str:
    """What an activity check is called in a table: its function name, in words."""
    name = getattr(check, "__name__", "") or type(check).__name__
    return "activity check" if name == "<lambda>" else name.replace("_", " ")


def stats_of(values: pd.DataFrame, run_key: tuple, metric: str) -> dict:
    if run_key not in values.index:
        return {"mean": math.nan, "half": math.nan, "n": 0}
    row = values.loc[run_key]
    return {"mean": float(row[("mean", metric)]), "half": float(row[("half", metric)]),
            "n": int(row[("n", metric)])}


def judge(
    metric: str, before: dict, after: dict, limit: float
) -> tuple[float | None, str, Verdict]:
    """(change, its unit, verdict). The change is NEW against the baseline as it happened:
    accuracy in points, the rest relative (+45.7 % for a run that got that much slower);
    whether that is better or worse is the verdict's to say, at ``limit`` (the metric's
    threshold, in the change's unit). With two or more repeats on both sides a change beyond
    the threshold counts only if the two 95 % intervals do not overlap."""
    b, a = before["mean"], after["mean"]
    if not (math.isfinite(b) and math.isfinite(a)):
        return None, "", Verdict.NOT_APPLICABLE
    if metric == schema.FINAL_ACCURACY:
        change, unit = 100 * (a - b), "points"
    elif b == 0:
        return None, "", Verdict.NOT_APPLICABLE
    else:
        change, unit = (a - b) / abs(b), "relative"
    better = METRICS[metric] * change  # positive when NEW is better
    if abs(change) <= limit:
        return change, unit, Verdict.OK
    intervals = math.isfinite(before["half"]) and math.isfinite(after["half"])
    if intervals and abs(a - b) <= before["half"] + after["half"]:
        return change, unit, Verdict.WITHIN_INTERVALS
    return change, unit, Verdict.REGRESSION if better < 0 else Verdict.IMPROVED


def failed_rows(new: pd.DataFrame, failed_keys: set[tuple]) -> dict[tuple, dict]:
    """The status row of each key whose NEW runs all failed, were interrupted or never
    finished: the first error of its runs (else the first one's status). One pass over the
    runs, whatever the number of keys."""
    rows = {}
    if not failed_keys:
        return rows
    for run_key, runs in new.groupby(KEY, sort=False):
        if run_key not in failed_keys:
            continue
        uncounted = runs[UNCOUNTED].dropna().tolist()
        if uncounted:
            rows[run_key] = table_row(run_key, "traffic", Verdict.REGRESSION, uncounted[0],
                                      baseline="-", new="uncounted", change=None)
            continue
        errors = runs[schema.ERROR].dropna().tolist() if schema.ERROR in runs else []
        status = runs[schema.STATUS].iloc[0]
        reason = errors[0] if errors else f"status {status}"
        rows[run_key] = table_row(run_key, "status", Verdict.REGRESSION, reason,
                                  baseline=Status.OK.value, new=str(status), change=None)
    return rows


def describe_key(run_key: tuple) -> str:
    fields = dict(zip(KEY, run_key))
    machine = fields["machine_class"]
    text = f"[{machine}] " if machine != "-" else ""
    text += (f"{fields[schema.METHOD]} {fields[schema.WORKLOAD]} on {fields[schema.DATASET]} "
             f"{fields[schema.GPUS]} ranks")
    text += f" {fields[schema.OPTIONS]} ({fields['setting']}; batch {fields[schema.BATCH_SIZE]}, "
    return text + f"lr {fields[schema.LR]}, {fields[schema.EPOCHS]} epochs)"
