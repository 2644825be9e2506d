"""One function per figure of the paper's evaluation, each drawn from run folders only.

A function returns a ``Figure`` (files written, the table it plots, the run ids it used) or a
``Skipped`` with the reason its data is missing; it never raises for missing data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402

from suite.report.load import Run, final_density_of, first_line  # noqa: E402
from suite.stats import mean_ci  # noqa: E402

COMM_WORDS = ("allreduce", "allgather", "broadcast", "mask_sync")


@dataclass
class Figure:
    name: str
    title: str
    files: list[Path]
    table: pd.DataFrame
    run_ids: list[str]
    note: str = ""


@dataclass
class Skipped:
    name: str
    title: str
    reason: str


def _save(fig, out: Path, name: str) -> list[Path]:
    files = [out / f"{name}.png", out / f"{name}.svg"]
    fig.tight_layout()
    fig.savefig(files[0], dpi=120, bbox_inches="tight")
    fig.savefig(files[1], bbox_inches="tight")
    plt.close(fig)
    return files


def _epoch_seconds(run: Run) -> float | None:
    s = run.summary
    if not s.get("epochs") or s.get("train_seconds") is None:
        return None
    return s["train_seconds"] / s["epochs"]


def scaling(runs: list[Run], out: Path) -> Figure | Skipped:
    """Fig. 9: speedup and parallel efficiency vs GPUs, relative to each line's smallest
    configuration, from training seconds per epoch."""
    name, title = "fig09_scaling", "Strong scaling: speedup and parallel efficiency"
    rows = []
    for run in runs:
        seconds = _epoch_seconds(run)
        if seconds:
            rows.append({"series": run.series, "workload": run.summary["workload"],
                         "gpus": run.summary["gpus"], "epoch_seconds": seconds,
                         "run_id": run.run_id})  # fmt: skip
    frame = pd.DataFrame(rows)
    if frame.empty:
        return Skipped(name, title, "no run has training time and epochs")
    frame = frame.groupby(["workload", "series", "gpus"], as_index=False).agg(
        epoch_seconds=("epoch_seconds", "median"), run_id=("run_id", ",".join)
    )
    lines = frame.groupby(["workload", "series"]).filter(lambda g: g.gpus.nunique() >= 2)
    if lines.empty:
        return Skipped(name, title, "every method has runs at one GPU count only; need two")
    base = lines.loc[lines.groupby(["workload", "series"]).gpus.idxmin()]
    base = base.set_index(["workload", "series"])[["gpus", "epoch_seconds"]]
    lines = lines.join(base, on=["workload", "series"], rsuffix="_base")
    lines["speedup"] = lines.epoch_seconds_base / lines.epoch_seconds
    lines["efficiency"] = lines.speedup / (lines.gpus / lines.gpus_base)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    sns.lineplot(lines, x="gpus", y="speedup", hue="series", style="workload", marker="o",
                 ax=axes[0])  # fmt: skip
    ideal = sorted(lines.gpus.unique())
    axes[0].plot(ideal, [g / min(ideal) for g in ideal], "k--", lw=1, label="ideal")
    sns.lineplot(lines, x="gpus", y="efficiency", hue="series", style="workload", marker="o",
                 ax=axes[1], legend=False)  # fmt: skip
    axes[1].axhline(1.0, color="k", ls="--", lw=1)
    for ax, label in zip(axes, ("speedup", "parallel efficiency")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ideal, [str(g) for g in ideal])
        ax.set_xlabel("GPUs (ranks)")
        ax.set_ylabel(label)
    axes[0].legend(fontsize=7)
    files = _save(fig, out, name)
    ids = sorted({i for ids in lines.run_id for i in ids.split(",")})
    table = lines[["workload", "series", "gpus", "epoch_seconds", "speedup", "efficiency"]]
    return Figure(name, title, files, table, ids, "relative to each line's smallest GPU count")


def pareto(runs: list[Run], out: Path) -> Figure | Skipped:
    """Fig. 12: final accuracy vs sparsity of the pruned layers, one panel per workload;
    dense methods (sparsity 0) are the reference."""
    name, title = "fig12_pareto", "Accuracy vs sparsity"
    rows = [
        {"workload": r.summary["workload"], "label": r.label, "method": r.summary["method"],
         "sparsity": 1 - final_density_of(r), "accuracy": r.summary["final_accuracy"],
         "run_id": r.run_id}
        for r in runs if r.summary.get("final_accuracy") is not None
    ]  # fmt: skip
    per_run = pd.DataFrame(rows)
    if per_run.empty:
        return Skipped(name, title, "no run has an accuracy (simulated runs carry none)")
    frame = repeats_reduced(per_run, ["workload", "label", "method", "sparsity"], "accuracy")
    workloads = sorted(frame.workload.unique())
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4.2), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        part = frame[frame.workload == workload]
        sns.scatterplot(part, x="sparsity", y="accuracy", hue="method", s=60, ax=ax)
        ax.errorbar(part.sparsity, part.accuracy, yerr=part.accuracy_ci95.fillna(0), fmt="none",
                    ecolor="grey", capsize=3, lw=1)  # fmt: skip
        dense = part[part.sparsity == 0]
        if len(dense):
            ax.axhline(dense.accuracy.max(), color="grey", ls="--", lw=1, label="best dense")
        for _, row in part.iterrows():
            ax.annotate(row.label, (row.sparsity, row.accuracy), fontsize=6,
                        xytext=(3, 3), textcoords="offset points")  # fmt: skip
        ax.set_title(workload)
        ax.set_xlabel("sparsity of pruned layers (1 - density)")
        ax.legend(fontsize=7)
    files = _save(fig, out, name)
    run_ids = sorted(per_run.run_id)
    return Figure(name, title, files, frame, run_ids, "repeats: mean and 95 % interval")


def repeats_reduced(frame: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Rows of equal ``keys`` (repeats of a configuration) as one: the mean of ``value``,
    its 95 % half-width (``value_ci95``), the repeat count and every run id."""
    rows = []
    for key, group in frame.groupby(keys, sort=False):
        mean, half, n = mean_ci(group[value])
        rows.append({**dict(zip(keys, key)), value: mean, f"{value}_ci95": half, "repeats": n,
                     "run_id": ",".join(group.run_id)})  # fmt: skip
    return pd.DataFrame(rows)


def time_to_accuracy(runs: list[Run], out: Path) -> Figure | Skipped:
    """Fig. 5: accuracy vs training time and vs cumulative inter-node traffic."""
    name, title = "fig05_time_to_accuracy", "Accuracy vs training time and inter-node GB"
    parts = []
    for run in runs:
        evals = run.table("evals")
        if evals is not None and len(evals) and not run.simulated:
            parts.append(evals.assign(run=run.label, run_id=run.run_id,
                                      inter_gb=evals.inter_node_bytes / 1e9))  # fmt: skip
    if not parts:
        return Skipped(name, title, "no real run has evaluations")
    frame = pd.concat(parts, ignore_index=True)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = dict(zip(frame.run.unique(), sns.color_palette(n_colors=frame.run.nunique())))
    for label, curve in frame.groupby("run", sort=False):
        points = curve.groupby("iteration").agg(
            train_seconds=("train_seconds", "mean"), inter_gb=("inter_gb", "mean"),
            accuracy=("accuracy", "mean"), spread=("accuracy", lambda a: mean_ci(a)[1]),
        )  # fmt: skip
        band = points.spread.fillna(0)
        for ax, x in zip(axes, ("train_seconds", "inter_gb")):
            ax.plot(points[x], points.accuracy, marker="o", ms=3, color=colors[label],
                    label=label)  # fmt: skip
            ax.fill_between(points[x], points.accuracy - band, points.accuracy + band,
                            color=colors[label], alpha=0.2, lw=0)  # fmt: skip
    axes[0].set_xlabel("training seconds")
    axes[1].set_xlabel("cumulative inter-node GB (all ranks)")
    if frame.inter_gb.max() > 0 and frame.inter_gb[frame.inter_gb > 0].min() > 0:
        axes[1].set_xscale("log")
    axes[0].legend(fontsize=6)
    files = _save(fig, out, name)
    table = frame[["run_id", "run", "iteration", "epoch", "train_seconds", "inter_gb", "accuracy"]]
    return Figure(
        name,
        title,
        files,
        table,
        sorted(frame.run_id.unique()),
        "repeats of a configuration: mean per evaluation, band the 95 % interval",
    )


def _comm_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith("t_") and any(w in c for w in COMM_WORDS)]


def comm_latency(runs: list[Run], out: Path) -> Figure | Skipped:
    """Fig. 7: communication seconds per iteration (slowest rank), per run."""
    name, title = "fig07_comm_latency", "Communication latency per iteration"
    parts = []
    for run in runs:
        frame = run.table("iterations")
        if frame is None or not _comm_columns(frame):
            continue
        comm = frame[_comm_columns(frame)].fillna(0).sum(axis=1)
        per_iter = comm.groupby(frame.iteration).max()
        parts.append(pd.DataFrame({"iteration": per_iter.index, "comm_seconds": per_iter.values,
                                   "run": run.label, "run_id": run.run_id}))  # fmt: skip
    if not parts:
        return Skipped(name, title, "no run recorded communication phases")
    frame = pd.concat(parts, ignore_index=True)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    sns.lineplot(frame, x="iteration", y="comm_seconds", hue="run", ax=ax)
    ax.set_ylabel("communication seconds (slowest rank)")
    ax.set_yscale("log")
    ax.legend(fontsize=6)
    files = _save(fig, out, name)
    table = frame.groupby(["run_id", "run"], as_index=False).comm_seconds.agg(
        ["mean", "std", "max"]
    )
    return Figure(
        name,
        title,
        files,
        table,
        sorted(frame.run_id.unique()),
        "an iteration is a step (DDP, Top-K) or a round of local steps (PruneX)",
    )


def phase_breakdown(runs: list[Run], out: Path) -> Figure | Skipped:
    """Fig. 8: mean seconds per local step in each phase (mean over ranks), stacked, so
    methods that synchronize every step and once per round compare; and each phase's share
    of the communication time."""
    name, title = "fig08_phase_breakdown", "Phase breakdown per local step"
    rows = []
    for run in runs:
        phases = run.summary.get("phase_seconds") or {}
        if phases:
            steps = run.summary.get("steps_per_iteration") or 1
            rows.append({"run": run.label, "run_id": run.run_id,
                         **{k: v / steps for k, v in phases.items()}})  # fmt: skip
    if not rows:
        return Skipped(name, title, "no run recorded phase timings")
    per_run = pd.DataFrame(rows).fillna(0.0)
    ids = per_run.groupby("run").run_id.agg(",".join)  # repeats share a bar, none is dropped
    frame = per_run.drop(columns="run_id").groupby("run").mean()
    frame = frame[frame.sum().sort_values(ascending=False).index]
    palette = dict(zip(frame.columns, sns.color_palette("tab20", len(frame.columns))))
    fig, axes = plt.subplots(1, 2, figsize=(13, 0.45 * len(frame) + 2), sharey=True)
    frame.plot.barh(stacked=True, ax=axes[0], color=palette, legend=False)
    totals = per_run.drop(columns="run_id").set_index("run").sum(axis=1).groupby(level=0)
    spread = [mean_ci(totals.get_group(label))[1] for label in frame.index]
    axes[0].errorbar(frame.sum(axis=1), range(len(frame)), xerr=spread, fmt="none",
                     ecolor="black", capsize=3, lw=1)  # fmt: skip
    axes[0].set_xlabel("seconds per local step (an iteration / its local steps)")
    comm = frame[[c for c in frame.columns if any(w in c for w in COMM_WORDS)]]
    if comm.shape[1]:
        share = comm.div(comm.sum(axis=1).where(comm.sum(axis=1) > 0), axis=0)
        share.plot.barh(stacked=True, ax=axes[1], color=palette, legend=False)
        axes[1].set_xlabel("share of communication time")
    handles = [plt.Rectangle((0, 0), 1, 1, color=palette[c]) for c in frame.columns]
    axes[1].legend(handles, list(frame.columns), fontsize=7, bbox_to_anchor=(1.02, 1),
                   loc="upper left")  # fmt: skip
    files = _save(fig, out, name)
    table = frame.assign(run_id=[ids[label] for label in frame.index]).reset_index(names="run")
    run_ids = sorted(i for joined in ids for i in joined.split(","))
    note = (
        "mean over ranks, per local step, and over repeats (error bar: 95 % interval of "
        "the total); DDP's all-reduce overlaps its backward (inside local_compute)"
    )
    return Figure(name, title, files, table, run_ids, note)


def message_volume(runs: list[Run], out: Path) -> Figure | Skipped:
    """Fig. 6: inter-node bytes per iteration over training, and per epoch per run."""
    name, title = "fig06_inter_node_volume", "Inter-node message size and volume"
    parts, totals = [], []
    for run in runs:
        frame = run.table("iterations")
        if frame is None or "bytes_inter" not in frame:
            continue
        per_iter = frame.groupby("iteration").bytes_inter.sum()
        parts.append(pd.DataFrame({"iteration": per_iter.index, "inter_mb": per_iter.values / 1e6,
                                   "run": run.label, "run_id": run.run_id}))  # fmt: skip
        epochs = run.summary.get("epochs") or math.nan
        totals.append({"run": run.label, "run_id": run.run_id,
                       "inter_gb_total": per_iter.sum() / 1e9,
                       "inter_gb_per_epoch": per_iter.sum() / 1e9 / epochs})  # fmt: skip
    if not parts:
        return Skipped(name, title, "no run recorded inter-node bytes")
    frame, total = pd.concat(parts, ignore_index=True), pd.DataFrame(totals)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    sns.lineplot(frame, x="iteration", y="inter_mb", hue="run", ax=axes[0])
    axes[0].set_ylabel("inter-node MB per iteration (all ranks)")
    if (frame.inter_mb > 0).any():
        axes[0].set_yscale("log")
    axes[0].legend(fontsize=6)
    total = total.sort_values("inter_gb_per_epoch")
    sns.barplot(total, y="run", x="inter_gb_per_epoch", ax=axes[1], color="tab:blue")
    axes[1].set_xlabel("inter-node GB per epoch")
    axes[1].set_ylabel("")
    axes[1].tick_params(axis="y", labelsize=7)
    if total.inter_gb_per_epoch.max() > 100 * max(total.inter_gb_per_epoch.min(), 1e-12):
        axes[1].set_xscale("log")
    files = _save(fig, out, name)
    return Figure(name, title, files, total, sorted(total.run_id))


def _layer_runs(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.table("layers") is not None and len(r.table("layers"))]


def residuals(runs: list[Run], out: Path, layers_shown: int = 4) -> Figure | Skipped:
    """Figs. 10: intra- and inter-node primal residuals of a few layers over rounds."""
    name, title = "fig10_residuals", "Primal residuals per layer"
    chosen = _layer_runs(runs)
    if not chosen:
        return Skipped(name, title, "no PruneX run with layers.parquet")
    run = max(chosen, key=lambda r: r.summary["gpus"])
    layers = run.table("layers")
    constrained = layers[layers.constrained]
    names = list(dict.fromkeys(constrained.layer))
    picked = names[:: max(1, len(names) // layers_shown)][:layers_shown]
    part = (
        layers[layers.layer.isin(picked)]
        .melt(
            id_vars=["iteration", "layer"], value_vars=["r_intra", "r_inter"], var_name="residual"
        )
        .dropna()
    )
    fig, ax = plt.subplots(figsize=(8, 4.2))
    sns.lineplot(part, x="iteration", y="value", hue="layer", style="residual", ax=ax)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("primal residual (L2)")
    ax.set_title(run.label, fontsize=9)
    ax.legend(fontsize=6)
    files = _save(fig, out, name)
    return Figure(name, title, files, part, [run.run_id])


def penalties(runs: list[Run], out: Path) -> Figure | Skipped:
    """Fig. 11: rho1 and rho2 (mean over layers) over rounds, per PruneX run."""
    name, title = "fig11_rho", "Adaptive penalties over rounds"
    chosen = _layer_runs(runs)
    if not chosen:
        return Skipped(name, title, "no PruneX run with layers.parquet")
    parts = []
    for run in chosen:
        means = run.table("layers").groupby("iteration")[["rho1", "rho2"]].mean().reset_index()
        parts.append(means.melt(id_vars="iteration", var_name="penalty").assign(
            run=run.label, run_id=run.run_id))  # fmt: skip
    frame = pd.concat(parts, ignore_index=True)
    frame = frame[frame.value > 0]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    sns.lineplot(frame, x="iteration", y="value", hue="run", style="penalty", ax=ax)
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("rho (mean over layers)")
    ax.legend(fontsize=6)
    files = _save(fig, out, name)
    return Figure(name, title, files, frame, sorted(frame.run_id.unique()))


def read_masks(run: Run) -> dict | None:
    """A run's masks.pt as {layer: {"dense": tensor, ...}}, or None (noted on the run)."""
    path = run.folder / "masks.pt"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if isinstance(saved, dict) and all(torch.is_tensor(m["dense"]) for m in saved.values()):
            return saved
        run.unreadable.append(f"{path}: not a mapping of layers to masks")
    except Exception as exc:  # unpickling fails in many ways; each means a damaged file
        run.unreadable.append(f"{path}: {type(exc).__name__}: {first_line(exc)}")
    return None


def masks(runs: list[Run], out: Path, shown: int = 4) -> Figure | Skipped:
    """Fig. 13: the learned filter x channel masks of the largest conv layers."""
    name, title = "fig13_masks", "Learned structured masks (output filters x input channels)"
    candidates = [r for r in runs if (r.folder / "masks.pt").exists()]
    if not candidates:
        return Skipped(name, title, "no run folder has masks.pt (PruneX runs save it)")
    saved, run = None, None
    # PruneX's learned masks first (the paper's figure), then those of the pruning baselines
    learned = sorted(candidates, key=lambda r: (not r.summary["method"].startswith("prunex"),
                                                -r.summary["gpus"]))  # fmt: skip
    for run in learned:
        saved = read_masks(run)
        if saved is not None:
            break
    if saved is None:
        return Skipped(name, title, "every masks.pt is unreadable (listed above)")
    convs = sorted(saved.items(), key=lambda kv: kv[1]["dense"].numel(), reverse=True)[:shown]
    fig, axes = plt.subplots(1, len(convs), figsize=(3.2 * len(convs), 3.4), squeeze=False)
    rows = []
    for ax, (layer, mask) in zip(axes[0], convs):
        dense = mask["dense"].float()
        grid = dense.flatten(2).amax(-1) if dense.dim() == 4 else dense
        ax.imshow(grid.numpy(), cmap="gray_r", aspect="auto", interpolation="nearest",
                  vmin=0, vmax=1)  # fmt: skip
        density = float(dense.mean())
        ax.set_title(f"{layer}\ndensity {density:.2f}", fontsize=7)
        ax.set_xlabel("input channel", fontsize=7)
        ax.set_ylabel("output filter", fontsize=7)
        rows.append({"layer": layer, "shape": tuple(dense.shape), "density": density})
    fig.suptitle(run.label, fontsize=9)
    files = _save(fig, out, name)
    return Figure(name, title, files, pd.DataFrame(rows), [run.run_id], "black: kept")


FIGURES = (scaling, pareto, time_to_accuracy, comm_latency, phase_breakdown, message_volume,
           residuals, penalties, masks)  # fmt: skip
