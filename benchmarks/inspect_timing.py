"""Where `bench inspect`'s seconds go: the held-out timm models that used to take minutes and
the model zoo's slowest, each on Fashion-MNIST's 1x28x28 images at the size it needs (no
``--image-size``: the command finds the smallest size the model takes), one process each, as
a user types it.

Per model: the process's wall seconds and CPU seconds (user + sys of the child), the load
average before and after (the machine may be shared: a busy one slows every number, quiet
means a 1-minute load under 0.5 on this 2-core machine), the size the model was inspected
at, and the command's own phases (``bench inspect --json``'s ``phases``): ``start`` (the
interpreter, torch and the suite's imports: the wall seconds the phases do not cover),
``factory`` (the workload's factory: timm's import for ``timm:NAME``), ``size`` (deciding the
image side), ``build``, ``prepare``, ``trace`` (Torch-Pruning's groups), ``masks``, ``export``
(the smaller model and its float64 check) and ``liveness`` (its float64 check). The goal: a
model under 30 M parameters answers within ``GOAL_SECONDS`` on this machine, quiet. A model
over it is timed again after the others (``--retries``) and its fastest try kept, since on a
shared machine the load comes and goes; the ``tries`` column says how often it was timed.

    python benchmarks/inspect_timing.py                  # every model below (minutes)
    python benchmarks/inspect_timing.py --only timm:fasternet_t0,timm:resnet18
    python benchmarks/inspect_timing.py --smoke          # one small model, no table written
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from suite.api import schema

#: the held-out timm models of the issue (minutes each before: loaded machine, 96 px)
HELD_OUT = ("timm:fasternet_t0", "timm:tf_efficientnetv2_b0", "timm:tf_mixnet_s",
            "timm:mobilenetv4_conv_small", "timm:ghostnetv3_050", "timm:resnet18")
#: the slowest of benchmarks/measured/model_zoo.md under 30 M parameters (and MaxViT-T, just
#: over it), slowest first
ZOO_SLOWEST = ("torchvision:inception_v3", "torchvision:densenet201", "torchvision:swin_t",
               "torchvision:densenet169", "torchvision:swin_v2_t",
               "torchvision:regnet_x_800mf", "timm:efficientformerv2_s0",
               "torchvision:regnet_y_1_6gf", "torchvision:densenet161", "timm:rexnet_100",
               "torchvision:maxvit_t")
SMOKE = ("timm:resnet10t",)
#: where the seconds of a model that takes long go, as its phases show it (said under the
#: table for a model under 30 M parameters over the goal)
DENSE_BLOCKS = ("export: Torch-Pruning remakes its concat index mappings after each group it "
                "removes, and a dense block's concat scans its dependencies in a loop "
                "quadratic in its inputs (up to 49)")
WHY = {
    **{f"torchvision:densenet{depth}": DENSE_BLOCKS for depth in (121, 161, 169, 201)},
    "timm:efficientformerv2_s0": "trace: Torch-Pruning's Python index mappings make 4 million "
    "channel indices through the attention reshapes before they reach the budget "
    "(MAX_MAPPING_WORK) and the model is grouped as blocks",
    "timm:rexnet_100": "trace: Torch-Pruning's Python index mappings carry 4 million channel "
    "indices along the padded residual stream before they reach the budget "
    "(MAX_MAPPING_WORK) and the model is grouped as blocks",
    "timm:ghostnetv3_050": "2,269 modules: every copy of the model (deepcopy: the trace, the "
    "masked model, the export and its float64 check) and every build of the size search "
    "costs about half a second to a second",
    "torchvision:inception_v3": "75 px (its weights' stated minimum): the export and its "
    "float64 check at 75 px",
}
#: the answer a model under ``SMALL_PARAMETERS`` should give within, on this machine, quiet
GOAL_SECONDS = 20.0
SMALL_PARAMETERS = 30_000_000
PHASES = ("factory", "size", "build", "prepare", "trace", "masks", "export", "liveness")


@dataclass
class Timing:
    """One model's ``bench inspect``: its process's seconds and the load around them, and
    what its JSON says (``status`` ``failed``: no JSON came back, ``reason`` says why)."""

    model: str
    wall: float
    cpu: float
    load_before: float
    load_after: float
    status: str = "failed"
    reason: str | None = None
    parameters: int = 0
    size: int | None = None
    how: str | None = None
    phases: dict = field(default_factory=dict)
    start: float | None = None
    tries: int = 1

    @property
    def verdict(self) -> str:
        """Whether it answered within the goal, ok or refused (only models under
        ``SMALL_PARAMETERS`` have one; a process that gave no answer has none)."""
        if self.status not in ("ok", "refused"):
            return "-"
        if self.parameters >= SMALL_PARAMETERS:
            return "over 30 M"
        return "yes" if self.wall <= GOAL_SECONDS else "no"


def cpu_seconds() -> float:
    """User + sys seconds of the children this process waited for so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def time_inspect(model: str, limit: float) -> Timing:
    """``bench inspect --model MODEL --json`` in its own process, timed: wall and CPU seconds,
    the load average around it, and what its JSON says (status, size, phases)."""
    command = [sys.executable, "-m", "suite.cli", "inspect", "--model", model, "--json"]
    load_before, cpu_before = os.getloadavg()[0], cpu_seconds()
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=limit)
        found = json.loads(proc.stdout) if proc.returncode in (0, 2) and proc.stdout else None
        why = None if found else (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
    except subprocess.TimeoutExpired:  # subprocess.run kills it
        found, why = None, f"no answer within {limit:g} s"
    wall = time.perf_counter() - started
    timing = Timing(model, wall, cpu_seconds() - cpu_before, load_before, os.getloadavg()[0],
                    reason=why)
    if found is not None:
        size = found.get(schema.PLAN_INPUT_SIZE) or {}  # as a run's plan records it
        timing.status, timing.reason = found[schema.STATUS], found.get("reason")
        timing.parameters = found.get("dense_parameters") or 0
        timing.size, timing.how = size.get(schema.INPUT_MODEL_SIDE), size.get(schema.INPUT_CHOSEN)
        timing.phases = found.get("phases") or {}
        timing.start = wall - (found.get("seconds") or 0)
    return timing


def table(rows: list[Timing]) -> str:
    """The Markdown table: one row per model, its phases in seconds."""
    head = ["model", "params (M)", "size", "status", "tries", "wall s", "CPU s", "load 1-min",
            "start", *PHASES, f"<= {GOAL_SECONDS:g} s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row.model, f"{row.parameters / 1e6:.1f}",
                 f"{row.size} ({row.how})" if row.size else "-",
                 row.status if not row.reason else f"{row.status}: {row.reason}", str(row.tries),
                 f"{row.wall:.1f}", f"{row.cpu:.1f}",
                 f"{row.load_before:.2f} -> {row.load_after:.2f}",
                 f"{row.start:.1f}" if row.start is not None else "-",
                 *(f"{row.phases[p]:.1f}" if p in row.phases else "-" for p in PHASES),
                 row.verdict]
        lines.append("| " + " | ".join(cell.replace("|", "/") for cell in cells) + " |")
    return "\n".join(lines)


def header(rows: list[Timing]) -> str:
    """What was measured, where, and how loaded the machine was meanwhile."""
    loads = [v for row in rows for v in (row.load_before, row.load_after)]
    quiet = max(loads) < 0.5
    small = [row for row in rows if row.verdict in ("yes", "no")]
    late = [row.model for row in small if row.verdict == "no"]
    return "\n".join([
        "# `bench inspect` timing: where its seconds go "
        "(`python benchmarks/inspect_timing.py`)",
        "",
        f"Machine: {platform.node()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}; Fashion-MNIST 1x28x28, channel keep 0.5, no "
        "--image-size (the size column: the side inspected and how it was chosen).",
        f"Load average (1 min) over the measurement: {min(loads):.2f} to {max(loads):.2f}: "
        + ("quiet." if quiet else "**not quiet**: the machine was shared; wall seconds grow "
           "with the load, CPU seconds (user + sys) less so."),
        f"Models under 30 M parameters answering (ok or refused) within {GOAL_SECONDS:g} s "
        f"wall: {len(small) - len(late)} "
        f"of {len(small)}" + (f" (not: {', '.join(late)})" if late else "") + ". The work "
        "runs on one thread (the start's imports too), so on a quiet machine a wall second "
        "comes near a CPU second; under load both grow (CPU seconds by the cores' contention). "
        "A model over the goal was timed again after the others, its fastest try kept (tries).",
        "", "",
    ])


def slowest_phase(row: Timing) -> str:
    """The phase (or the start) that took longest, for a model ``WHY`` has no word on."""
    spent = {**row.phases, "start": row.start or 0.0}
    name = max(spent, key=spent.get)
    return f"its slowest phase: {name}, {spent[name]:.1f} s"


def cpu_verdict(row: Timing) -> str:
    """Whether a model over the goal in wall seconds is over it in CPU seconds too (then it
    would be over on a quiet machine as well; else the load made it late)."""
    if row.cpu > GOAL_SECONDS:
        return f"over {GOAL_SECONDS:g} s in CPU seconds too: likely over it quiet as well"
    return f"within {GOAL_SECONDS:g} s in CPU seconds: late by the machine's load"


def notes(rows: list[Timing]) -> str:
    """Why each model under 30 M parameters over the goal took long (``WHY``)."""
    late = [row for row in rows if row.verdict == "no"]
    lines = [f"- {row.model} ({row.wall:.1f} s wall, {row.cpu:.1f} s CPU, load "
             f"{row.load_before:.2f}; {cpu_verdict(row)}): "
             + WHY.get(row.model, slowest_phase(row)) for row in late]
    return "\n".join(["", "Over the goal here, and where its seconds go:", *lines]) if lines else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=None, help="comma list of models (timm:NAME, ...)")
    parser.add_argument("--limit", type=float, default=600.0, help="seconds per model")
    parser.add_argument("-o", "--output", default=None,
                        help="default: benchmarks/measured/inspect_timing.md (none with "
                        "--smoke)")
    parser.add_argument("--smoke", action="store_true", help="one small model")
    parser.add_argument("--retries", type=int, default=1,
                        help="times a model over the goal is timed again after the others "
                        "(the fastest try kept: a shared machine's load comes and goes)")
    args = parser.parse_args()
    models = list(SMOKE) if args.smoke else [*HELD_OUT, *ZOO_SLOWEST]
    if args.only:
        models = args.only.split(",")
    rows = []
    for model in models:
        rows.append(time_inspect(model, args.limit))
        row = rows[-1]
        print(f"{model}: {row.status} at {row.size} px, wall {row.wall:.1f} s, CPU "
              f"{row.cpu:.1f} s, load {row.load_before:.2f} -> {row.load_after:.2f}", flush=True)
    for index, row in enumerate(rows):
        for _ in range(args.retries if row.verdict == "no" else 0):
            again = time_inspect(row.model, args.limit)
            print(f"{row.model} again: wall {again.wall:.1f} s, CPU {again.cpu:.1f} s, load "
                  f"{again.load_before:.2f}", flush=True)
            again.tries = row.tries + 1
            row = rows[index] = again if again.wall < row.wall else replace(row, tries=again.tries)
    text = header(rows) + table(rows) + "\n" + notes(rows) + "\n"
    print(text)
    if args.output or not args.smoke:
        out = Path(args.output or Path(__file__).parent / "measured" / "inspect_timing.md")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


if __name__ == "__main__":
    main()
