"""Activity checks: what each method must have done in a finished run, whatever a reference
says. A PruneX that silently stopped pruning, or a PowerSGD that never left its warm-up,
keeps accuracy and bytes near a reference (and a reference re-recorded after such a bug
enshrines it); these checks catch it. A method declares its check where it registers
(``@METHODS.register(..., activity=fn)``); ``fn(run: RunView)`` returns what the run did not
do, one line each, and ``bench compare`` fails a NEW run that has any.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pandas as pd


@dataclass
class RunView:
    """A finished run as an activity check reads it."""

    folder: Path
    summary: dict
    manifest: dict
    #: DDP's inter-node bytes per iteration in the same result set, same workload, ranks and
    #: machine class: the dense exchange (None when the set has no such DDP run)
    dense_bytes: float | None = None

    @property
    def method(self) -> str:
        return self.summary["method"]

    @property
    def settings(self) -> dict:
        """The method's resolved settings (the manifest's ``method_settings``)."""
        return self.manifest.get("method_settings") or {}

    @cached_property
    def iterations(self) -> pd.DataFrame:
        """Per iteration, the mean over ranks of every numeric column."""
        frame = pd.read_parquet(self.folder / "iterations.parquet")
        return frame.groupby("iteration").mean(numeric_only=True).reset_index()

    @property
    def bytes_per_iteration(self) -> float:
        return float(self.summary.get("inter_node_bytes_per_iteration") or 0.0)


def load_view(folder: Path, summary: dict) -> RunView:
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = {}
    return RunView(folder, summary, manifest)


def check_run(view: RunView, check: Callable[[RunView], list[str]] | None) -> list[str]:
    """The check's findings; a check that cannot read the run says so instead of passing."""
    if check is None:
        return []
    try:
        return list(check(view))
    except Exception as exc:  # a missing column or file is a finding, not a crash
        return [f"activity check could not read the run ({type(exc).__name__}: {exc})"]


# -- the checks the built-ins share (exported through suite.api) -----------------------------


def crosses_nodes_every_round(view: RunView) -> list[str]:
    """Round-based methods: inter-node traffic in every round, and at most one dense exchange
    per round (not one per local step)."""
    found = []
    inter = view.iterations["bytes_inter"]
    if view.summary.get("nodes", 2) > 1 and (inter <= 0).any():
        silent = view.iterations.loc[inter <= 0, "iteration"].tolist()
        found.append(f"no inter-node traffic in round(s) {silent[:5]}")
    if view.dense_bytes and view.bytes_per_iteration > 1.05 * view.dense_bytes:
        found.append(
            f"sent {view.bytes_per_iteration / view.dense_bytes:.2f} x DDP's bytes per round "
            "(more than one dense exchange per round)"
        )
    return found


def reaches_keep(view: RunView, tolerance: float = 0.05) -> list[str]:
    """Structured pruning: the last round's density of the pruned layers is at most the
    asked keep (the product of the filter, channel and shape keeps) plus ``tolerance``."""
    settings = view.settings
    keeps = [settings.get(k) for k in ("filter_keep", "channel_keep", "shape_keep")]
    asked = math.prod(k for k in keeps if k is not None) if any(keeps) else 0.5
    density = float(view.iterations["density"].iloc[-1])
    if not math.isfinite(density):
        return ["recorded no density of the pruned layers in its last round"]
    if density > asked + tolerance:
        return [f"density of the pruned layers ended at {density:.3f}, asked {asked:.3f} "
                "(it did not prune)"]  # fmt: skip
    return []


def sends_fraction_of_dense(
    view: RunView, low: float, high: float, what: str, after_iteration: int = 0
) -> list[str]:
    """Inter-node bytes per iteration (from ``after_iteration`` on) between ``low`` and
    ``high`` times DDP's in the same set (skipped when the set has no DDP run)."""
    if not view.dense_bytes:
        return []
    rows = view.iterations[view.iterations["iteration"] >= after_iteration]
    if rows.empty:
        return [f"no iterations from {after_iteration} on, so {what} was never exercised"]
    overall = float(view.iterations["bytes_inter"].mean())  # per rank; the summary's: world
    if overall <= 0:
        return [f"no inter-node traffic at all; {what} sends {low:g}-{high:g} x DDP's"]
    ratio = (
        float(rows["bytes_inter"].mean()) / overall * view.bytes_per_iteration / view.dense_bytes
    )
    if not low <= ratio <= high:
        return [f"sent {ratio:.3f} x DDP's inter-node bytes per iteration; {what} sends "
                f"{low:g}-{high:g} x"]  # fmt: skip
    return []
