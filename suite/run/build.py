"""How a run is put together, the same way for real and simulated runs.

The runner (real ranks) and the simulator (one process pricing collectives) differ in their
topology, communicator, recorder and loader; everything else, the recipe, the method's
settings, the seeded model, the method itself, the iteration count and the manifest, comes
from here, so a simulated run is configured exactly as the real one would be.
"""

from __future__ import annotations

import json
import math
import time

import torch

from suite.data.schedule import LRSchedule
from suite.errors import BenchError
from suite.plugins.method import Method, RunContext
from suite.plugins.options import settings_dict
from suite.plugins.registry import METHODS
from suite.results import schema
from suite.results.folder import git_revision, versions
from suite.run.plan import RunPlan, Schedule

#: evaluations of a run whose --eval-every is not given
DEFAULT_EVALUATIONS = 10


def build_method(
    plan: RunPlan, *, topology, comm, recorder, loader, device: torch.device,
) -> tuple[RunContext, Method, int, int]:
    """The seeded model (identical on every rank), the method built on it, the number of
    iterations the run will take and the local steps of each."""
    torch.manual_seed(plan.config.seed)
    model = plan.workload.build_model(plan.spec).to(device)
    ctx = RunContext(
        plan.config, topology, comm, recorder, plan.workload, plan.recipe, model, loader,
        device, plan.settings, spec=plan.spec,
    )
    method = METHODS.build(plan.config.method, ctx)
    if not isinstance(method, Method):
        raise BenchError(
            f"method {plan.config.method!r}: its factory returned {type(method).__name__}, not "
            "a suite.api.Method subclass (see tests/plugin_example/benchplugin.py)"
        )
    steps = steps_per_iteration(method, plan.schedule, plan.config.method)
    ctx.budget_steps = plan.schedule.budget_steps(steps)
    batch = loader.batch_size
    ctx.schedule = LRSchedule(
        plan.recipe.lr_schedule,
        plan.recipe.lr,
        warmup_samples=round(plan.recipe.warmup_epochs * loader.steps_per_epoch * batch),
        total_samples=ctx.budget_steps * batch,
    )
    return ctx, method, plan.schedule.iterations_for(steps), steps


def steps_per_iteration(method: Method, schedule: Schedule, name: str) -> int:
    """The local steps of one of the method's iterations: its own ``steps_per_iteration``
    where it declares one (on its class or itself), else H of its ``RoundSettings``, else 1.
    A method that declares steps per iteration is scheduled by it."""
    declared = "steps_per_iteration" in vars(method) or any(
        "steps_per_iteration" in vars(cls) for cls in type(method).__mro__ if cls is not Method
    )
    if not declared:
        return schedule.planned_steps_per_iteration
    steps = method.steps_per_iteration
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise BenchError(f"method {name!r}: steps_per_iteration must be a whole number of at "
                         f"least 1, got {steps!r}")
    return steps


def check_steps_taken(name: str, iteration: int, taken: int, expected: int,
                      declared: int) -> None:
    """One line when an iteration took another number of local steps than the schedule
    gave it: the run's budget, lr schedule and epochs would be off by that factor."""
    if taken == expected:
        return
    raise BenchError(
        f"method {name!r} took {taken} local step(s) in iteration {iteration}, but its schedule "
        f"gives it {expected} (steps_per_iteration = {declared}): a method that takes H "
        "batches per step sets self.steps_per_iteration = H (a round-based one inherits "
        "RoundSettings and takes ctx.round_steps() batches)"
    )


def evaluation_points(iterations: int, eval_every: int | None) -> set[int]:
    """Iteration counts after which to evaluate: every ``eval_every`` and the last; by
    default ``DEFAULT_EVALUATIONS`` evenly spread, but never more often than every third
    iteration: on CPU ranks one evaluation of the test set costs about a third of a 32-step
    round of cnn-fmnist, so a short run would otherwise spend its time evaluating."""
    if eval_every is not None:
        points = set(range(eval_every, iterations + 1, eval_every))
    else:
        n = max(1, min(DEFAULT_EVALUATIONS, iterations // 3))
        points = {math.ceil(k * iterations / n) for k in range(1, n + 1)}
    return points | {iterations}


def make_manifest(
    plan: RunPlan,
    ctx: RunContext,
    method: Method,
    *,
    iterations: int,
    steps_per_iteration: int,
    **facts,
) -> dict:
    """What the run folder's ``manifest.json`` says; ``facts`` adds the launcher-specific
    keys (device, backend, topology, hardware, network or simulation)."""
    config = plan.config
    return {
        schema.FORMAT_VERSION_KEY: schema.FORMAT_VERSION,
        schema.RUN_ID: config.run_id,
        schema.CONFIG: {**json.loads(config.to_json()), schema.DATASET: plan.dataset},
        schema.PLAN: {**plan.facts(), schema.PLAN_DIGEST: plan.digest},
        schema.METHOD_SETTINGS: {**settings_dict(ctx.settings), **method.resolved_settings()},
        schema.RECIPE: ctx.recipe.__dict__,
        schema.PLANNED_ITERATIONS: iterations,
        schema.BUDGET: {  # what every rank consumes, whatever the method's iteration size
            schema.LOCAL_STEPS_PER_RANK: ctx.budget_steps,
            schema.BATCH_SIZE: ctx.loader.batch_size,
            schema.SAMPLES_PER_RANK: ctx.budget_steps * ctx.loader.batch_size,
        },  # the schedule over it is the recipe's (lr_schedule, warmup_epochs)
        schema.STEPS_PER_ITERATION: steps_per_iteration,
        schema.EXCHANGE_EVERY: method.exchange_every(),
        schema.OVERLAPPED_PHASES: list(method.overlapped_phases),
        schema.STEPS_PER_EPOCH: ctx.loader.steps_per_epoch,
        schema.TRAIN_SAMPLES: plan.train_samples,
        schema.TEST_SAMPLES: plan.test_samples,
        schema.PARAMETERS: sum(p.numel() for p in ctx.model.parameters()),
        schema.MODEL: ctx.workload.model_name if ctx.workload is not None else None,
        schema.VERSIONS: versions(),
        schema.GIT_REVISION: git_revision(),
        **facts,
        schema.STARTED: time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
