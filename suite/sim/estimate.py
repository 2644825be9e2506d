"""What a simulation will cost on this machine, said before it starts.

A simulation's time is its replay: the first ``--replay`` iterations of each (method, GPU
count) run the method's own step for real, on stand-in batches, in one process. So the cost
is the local steps replayed over all cells times what one local step of the workload's model
costs here, plus building the model and the method once per cell. Both are measured on the
spot (``time_local_step``: the model built and three stand-in steps timed, one thread, as the
replay runs), so the estimate is of this machine under its present load, not of the profile
being simulated.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from suite.processes import single_threaded
from suite.run.plan import RunPlan
from suite.sim.standins import STAND_IN_BATCH, STAND_IN_SIZE

#: a simulation that would take longer than this (seconds) says so, with a smaller command
PATIENCE_SECONDS = 180
#: a replayed local step costs more than the model's forward and backward pass alone: the
#: method's own work per step (proximal terms, error feedback, the optimizer) and per round
#: (projection, packing, the freeze's calibration passes); measured on this 2-core machine
#: over the sim page's examples (docs/commands/sim.md), the replay took 2-4x the bare steps
STEP_FACTOR = 3.5
#: building a cell costs about this many model builds (the model, the method's copies of
#: it, the structure's dependency trace)
BUILD_FACTOR = 3.0


@dataclass(frozen=True)
class Cell:
    """One simulation of a grid: its method and GPU count, the iterations it will take and
    the local steps its replay runs for real."""

    method: str
    gpus: int
    iterations: int
    replayed_iterations: int
    replayed_steps: int


def plan_cell(plan: RunPlan, replay: int) -> Cell:
    """The iterations of ``plan``'s simulation and the local steps its first ``replay``
    iterations take (as the plan schedules them: a round-based method's iteration is a round
    of H local steps, any other method's one step)."""
    schedule = plan.schedule
    per_iteration = schedule.planned_steps_per_iteration
    budget = schedule.budget_steps(per_iteration)
    iterations = schedule.iterations_for(per_iteration)
    replayed = min(replay, iterations)
    return Cell(plan.config.method, plan.config.gpus, iterations, replayed,
                min(replayed * per_iteration, budget))


@single_threaded
def time_local_step(plan: RunPlan, steps: int = 3) -> tuple[float, float, int]:
    """(seconds to build the workload's model, seconds of one stand-in local step: forward,
    backward and an SGD update, the fastest of ``steps`` after two untimed (the first ones
    allocate the gradients and the momentum; on a loaded machine the fastest is the step,
    the rest the load, which the estimate cannot foresee), parameters)."""
    spec, recipe = plan.spec, plan.recipe
    start = time.perf_counter()
    torch.manual_seed(plan.config.seed)
    model = plan.workload.build_model(spec)
    built = time.perf_counter() - start
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=recipe.momentum)
    images = torch.randn(STAND_IN_BATCH, spec.in_chans, STAND_IN_SIZE, STAND_IN_SIZE)
    labels = torch.zeros(STAND_IN_BATCH, dtype=torch.long)
    times = []
    for _ in range(steps + 2):
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return built, min(times[2:]), sum(p.numel() for p in model.parameters())


def estimate_seconds(cells: Sequence[Cell], build_seconds: float, step_seconds: float) -> float:
    """The whole grid's seconds: each cell's build and its replayed local steps."""
    steps = sum(cell.replayed_steps for cell in cells)
    return len(cells) * BUILD_FACTOR * build_seconds + STEP_FACTOR * steps * step_seconds


def duration(seconds: float) -> str:
    """``45 s``, ``3.5 min``, ``1.2 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def smaller_command(argv: Sequence[str], replay: int, gpus: Sequence[int]) -> str:
    """``argv`` (a ``bench`` command line after ``bench``) with ``--replay`` and ``--gpus``
    set to the given values, as a user would type it again."""
    words, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in ("--replay", "--gpus"):
            skip = True
            continue
        if word.startswith(("--replay=", "--gpus=")):
            continue
        words.append(word)
    return " ".join(["bench", *words, "--gpus", ",".join(map(str, gpus)),
                     "--replay", str(replay)])


def quicker(cells: Sequence[Cell], replay: int, build_seconds: float, step_seconds: float,
            gpus: Sequence[int]) -> tuple[int, list[int], float]:
    """The largest ``--replay`` (and, where even one replayed iteration is too long, the
    fewest GPU counts: the smallest and the largest) whose estimate fits in
    ``PATIENCE_SECONDS``; returns them with that estimate."""
    choices = [list(gpus)] + ([[min(gpus), max(gpus)]] if len(gpus) > 2 else []) + \
        ([[min(gpus)]] if len(gpus) > 1 else [])
    best = (1, choices[-1], math.inf)
    for counts in choices:
        for r in range(replay, 0, -1):
            if counts == list(gpus) and r == replay:  # the command as given
                continue
            shorter = [Cell(c.method, c.gpus, c.iterations, min(r, c.iterations),
                            round(c.replayed_steps * min(r, c.iterations)
                                  / max(1, c.replayed_iterations)))
                       for c in cells if c.gpus in counts]
            seconds = estimate_seconds(shorter, build_seconds, step_seconds)
            if seconds <= PATIENCE_SECONDS:
                return r, counts, seconds
            best = min(best, (r, counts, seconds), key=lambda b: b[2])
    return best
