"""summary.json from the merged tables: the numbers ``bench compare`` and reports use."""

from __future__ import annotations

import pandas as pd

from suite.run.config import RunConfig


def phase_means(iterations: pd.DataFrame) -> dict[str, float]:
    """Phase -> mean seconds per iteration, averaged over ranks (the paper's fig. 8)."""
    cols = [c for c in iterations.columns if c.startswith("t_") and c != "t_iteration"]
    return {c[2:]: float(iterations[c].fillna(0.0).mean()) for c in cols}


def summarize(
    *,
    config: RunConfig,
    manifest: dict,
    dataset: str,
    iterations_done: int,
    iterations: pd.DataFrame | None,
    evals: pd.DataFrame | None,
    wall_seconds: float,
    time_to_target: float | None,
    converged: bool,
    status: str = "ok",
) -> dict:
    topo = manifest["topology"]
    budget = manifest.get("budget") or {}
    local_steps = iterations_done * manifest["steps_per_iteration"]
    if budget:  # the last round of a round-based method may be cut short
        local_steps = min(local_steps, budget["local_steps_per_rank"])
    batch = budget.get("batch_size", manifest["recipe"]["batch_size"])
    summary = {
        "run_id": manifest["run_id"],
        "status": status,
        "error": None,
        "method": config.method,
        "workload": config.workload,
        "dataset": dataset,
        "gpus": topo["world_size"],
        "nodes": topo["num_nodes"],
        "gpus_per_node": topo["gpus_per_node"],
        "iterations": iterations_done,
        "steps_per_iteration": manifest["steps_per_iteration"],
        "epochs": local_steps / manifest["steps_per_epoch"],
        "samples_per_rank": local_steps * batch,
        "final_accuracy": None,
        "best_accuracy": None,
        "target_accuracy": config.target_accuracy,
        "time_to_target_seconds": time_to_target,
        "wall_seconds": wall_seconds,
        "converged": converged,
        "options": config.options,
        "seed": config.seed,
        "simulated": bool(manifest.get("simulated", False)),
    }
    if iterations is not None and len(iterations):
        per_iter = iterations.groupby("iteration")
        slowest = per_iter["t_iteration"].max()
        inter = float(iterations["bytes_inter"].sum())
        summary.update(
            inter_node_bytes_total=inter,
            intra_node_bytes_total=float(iterations["bytes_intra"].sum()),
            inter_node_bytes_per_iteration=inter / iterations_done,
            train_seconds=float(slowest.sum()),
            iteration_seconds=float(slowest.mean()),
            phase_seconds=phase_means(iterations),
        )
        if "wire_tx_bytes" in iterations.columns:  # emulated links: what crossed the wire
            wire = float(iterations["wire_tx_bytes"].sum())
            summary.update(
                wire_inter_bytes_total=wire,
                wire_to_algorithmic_ratio=wire / inter if inter else None,
            )
    if evals is not None and len(evals):
        summary["final_accuracy"] = float(evals["accuracy"].iloc[-1])
        summary["best_accuracy"] = float(evals["accuracy"].max())
    return summary
