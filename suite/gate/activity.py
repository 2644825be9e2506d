"""Activity checks: what each method must have done in a finished run, whatever a reference
says. A PruneX that silently stopped pruning, or a PowerSGD that never left its warm-up,
keeps accuracy and bytes near a reference (and a reference re-recorded after such a bug
enshrines it); these checks catch it. A method declares its check where it registers
(``@METHODS.register(..., activity=fn)``); ``fn(run: RunView)`` returns what the run did not
do, one line each, and ``bench compare`` fails a NEW run that has any.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from suite.results import schema
from suite.results.view import RunView

#: what a method declares: ``fn(run) -> [what the run did not do]``
ActivityCheck = Callable[[RunView], list[str]]


def check_run(view: RunView, check: ActivityCheck | None) -> list[str]:
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
    per round (not one per local step).

    Args:
        view: the finished run.

    Returns:
        What the run did not do, one line each ([] when it did its job).

    Examples:
        ```python
        @METHODS.register("my-localsgd", "...", activity=crosses_nodes_every_round)
        ```
    """
    found = []
    inter = view.iterations[schema.BYTES_INTER]
    if view.summary.get(schema.NODES, 2) > 1 and (inter <= 0).any():
        silent = view.iterations.loc[inter <= 0, schema.ITERATION].tolist()
        found.append(f"no inter-node traffic in round(s) {silent[:5]}")
    if view.dense_bytes and view.bytes_per_iteration > 1.05 * view.dense_bytes:
        found.append(
            f"sent {view.bytes_per_iteration / view.dense_bytes:.2f} x DDP's bytes per round "
            "(more than one dense exchange per round)"
        )
    return found


def reaches_keep(view: RunView, tolerance: float = 0.05) -> list[str]:
    """Structured pruning: the last round's density of the tensors the keeps can prune is at
    most the asked keep plus ``tolerance`` (a 1-channel stem or a depthwise conv, whose
    channel set a channel keep cannot prune, is not judged; runs of format 1 are judged on the
    density of every pruned layer, suite.results.upgrade). The asked keep of the conv sets is the
    product of the filter, channel and shape keeps; heads and neurons each keep their own
    fraction; where several families are pruned, the largest of them bounds the whole.

    Args:
        view: the finished run (its manifest's method settings hold the keeps).
        tolerance: how far above the asked keep the density may end.

    Returns:
        What the run did not do, one line each.
    """
    settings = view.settings
    conv = [settings.get(k) for k in ("filter_keep", "channel_keep", "shape_keep")]
    families = [math.prod(k for k in conv if k is not None)] if any(conv) else []
    families += [settings[k] for k in ("head_keep", "mlp_keep") if settings.get(k) is not None]
    asked = max(families) if families else 0.5
    density = float(view.iterations[schema.PRUNABLE_DENSITY].iloc[-1])
    if not math.isfinite(density):
        return ["recorded no density of the pruned layers in its last round"]
    if density > asked + tolerance:
        how = "it did not prune" if density >= 0.999 else "it pruned less than asked"
        return [f"density of the prunable layers ended at {density:.3f}, asked {asked:.3f} "
                f"(+{tolerance:g} allowed; {how})"]
    return []


def sends_fraction_of_dense(
    view: RunView, low: float, high: float, what: str, after_iteration: int = 0
) -> list[str]:
    """Inter-node bytes per iteration (from ``after_iteration`` on) between ``low`` and
    ``high`` times DDP's in the same set (skipped when the set has no DDP run).

    Args:
        view: the finished run.
        low: the least fraction of DDP's bytes it must send.
        high: the most.
        what: how the finding names the method's exchange.
        after_iteration: the first iteration judged (a warm-up of full exchanges before it).

    Returns:
        What the run did not do, one line each.

    Examples:
        ```python
        activity=lambda run: sends_fraction_of_dense(run, 0.45, 0.55, "a 16-bit hook")
        ```
    """
    if not view.dense_bytes:
        return []
    rows = view.iterations[view.iterations[schema.ITERATION] >= after_iteration]
    if rows.empty:
        return [f"no iterations from {after_iteration} on, so {what} was never exercised"]
    overall = float(view.iterations[schema.BYTES_INTER].mean())  # per rank; the summary's: world
    if overall <= 0:
        return [f"no inter-node traffic at all; {what} sends {low:g}-{high:g} x DDP's"]
    share = float(rows[schema.BYTES_INTER].mean()) / overall
    ratio = share * view.bytes_per_iteration / view.dense_bytes
    if not low <= ratio <= high:
        return [f"sent {ratio:.3f} x DDP's inter-node bytes per iteration; {what} sends "
                f"{low:g}-{high:g} x"]
    return []


def crosses_nodes(view: RunView) -> list[str]:
    """Every method of several nodes: a run on more than one node recorded bytes between
    them. The check of a method that declares none (a run whose inter-node collectives
    went past ``ctx.comm`` records none, and would read as the cheapest of all).

    Args:
        view: the finished run.

    Returns:
        What the run did not do, one line each.

    Examples:
        ```python
        activity=lambda run: crosses_nodes(run) + sends_fraction_of_dense(run, 0.2, 0.3, "x")
        ```
    """
    nodes = view.summary.get(schema.NODES) or 1
    if nodes > 1 and not view.summary.get(schema.INTER_NODE_BYTES_TOTAL):
        return [f"recorded no inter-node bytes on {nodes} nodes: a method of several nodes "
                "must cross them, through ctx.comm"]
    return []


def prunes_across_nodes(view: RunView) -> list[str]:
    """A structured pruning method (PruneX, the pruning baselines): it exchanges across
    nodes every round and reaches its keep.

    Args:
        view: the finished run.

    Returns:
        What the run did not do, one line each.
    """
    return crosses_nodes_every_round(view) + reaches_keep(view)
