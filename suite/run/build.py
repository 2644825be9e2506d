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
from dataclasses import replace

import torch

from suite.config import RunConfig
from suite.data.schedule import LRSchedule
from suite.data.workload import DatasetSpec, Recipe, Workload
from suite.errors import BenchError
from suite.plugins.method import Method, RunContext
from suite.plugins.options import resolve_settings, settings_dict
from suite.plugins.registry import METHODS, WORKLOADS
from suite.results import schema
from suite.results.folder import git_revision, versions

#: RunConfig fields that override the workload's recipe
RECIPE_OVERRIDES = (schema.BATCH_SIZE, schema.LR, schema.MOMENTUM, schema.WEIGHT_DECAY,
                    schema.LR_SCHEDULE, schema.WARMUP_EPOCHS)
#: evaluations of a run whose --eval-every is not given
DEFAULT_EVALUATIONS = 10


def resolve_workload(config: RunConfig) -> tuple[Workload, Recipe, str]:
    """The workload, its recipe with the run's overrides, and the dataset's name."""
    workload = WORKLOADS.get(config.workload).factory()
    overrides = {k: getattr(config, k) for k in RECIPE_OVERRIDES if getattr(config, k) is not None}
    return workload, replace(workload.recipe, **overrides), config.dataset or workload.dataset


def method_settings(config: RunConfig):
    """The method's settings object from ``config.options`` (converted and checked)."""
    entry = METHODS.get(config.method)
    return resolve_settings(entry.settings, config.options, config.method)


def build_method(
    config: RunConfig,
    *,
    topology,
    comm,
    recorder,
    workload: Workload,
    recipe: Recipe,
    spec: DatasetSpec,
    loader,
    device: torch.device,
) -> tuple[RunContext, Method, int]:
    """The seeded model (identical on every rank), the method built on it, and the number
    of iterations the run will take."""
    settings = method_settings(config)
    torch.manual_seed(config.seed)
    model = workload.build_model(spec).to(device)
    ctx = RunContext(
        config, topology, comm, recorder, workload, recipe, model, loader, device, settings,
        spec=spec,
    )
    method = METHODS.get(config.method).factory(ctx)
    if not isinstance(method, Method):
        raise BenchError(
            f"method {config.method!r}: its factory returned {type(method).__name__}, not a "
            "suite.api.Method subclass (see tests/plugin_example/benchplugin.py)"
        )
    steps = method.steps_per_iteration
    ctx.budget_steps = budget_steps(config, loader.steps_per_epoch, steps, recipe)
    batch = loader.batch_size
    ctx.schedule = LRSchedule(
        recipe.lr_schedule,
        recipe.lr,
        warmup_samples=round(recipe.warmup_epochs * loader.steps_per_epoch * batch),
        total_samples=ctx.budget_steps * batch,
    )
    return ctx, method, math.ceil(ctx.budget_steps / steps)


def budget_steps(config: RunConfig, steps_per_epoch: int, steps_per_iteration: int, recipe) -> int:
    """Local steps per rank of the whole run. ``--epochs`` gives every method the same
    number (a round-based method's last round is cut to fit); ``--iterations`` counts whole
    iterations of the method's own size."""
    if config.iterations is not None:
        return config.iterations * steps_per_iteration
    epochs = config.epochs if config.epochs is not None else recipe.epochs
    return max(1, math.ceil(epochs * steps_per_epoch))


def count_iterations(config: RunConfig, steps_per_epoch: int, steps_per_iteration: int, recipe):
    budget = budget_steps(config, steps_per_epoch, steps_per_iteration, recipe)
    return math.ceil(budget / steps_per_iteration)


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
    config: RunConfig,
    ctx: RunContext,
    method: Method,
    *,
    dataset: str,
    iterations: int,
    train_samples: int,
    test_samples: int,
    **facts,
) -> dict:
    """What the run folder's ``manifest.json`` says; ``facts`` adds the launcher-specific
    keys (device, backend, topology, hardware, network or simulation)."""
    return {
        schema.FORMAT_VERSION_KEY: schema.FORMAT_VERSION,
        schema.RUN_ID: config.run_id,
        schema.CONFIG: {**json.loads(config.to_json()), schema.DATASET: dataset},
        schema.METHOD_SETTINGS: {**settings_dict(ctx.settings), **method.resolved_settings()},
        schema.RECIPE: ctx.recipe.__dict__,
        schema.PLANNED_ITERATIONS: iterations,
        schema.BUDGET: {  # what every rank consumes, whatever the method's iteration size
            schema.LOCAL_STEPS_PER_RANK: ctx.budget_steps,
            schema.BATCH_SIZE: ctx.loader.batch_size,
            schema.SAMPLES_PER_RANK: ctx.budget_steps * ctx.loader.batch_size,
        },  # the schedule over it is the recipe's (lr_schedule, warmup_epochs)
        schema.STEPS_PER_ITERATION: method.steps_per_iteration,
        schema.EXCHANGE_EVERY: method.exchange_every(),
        schema.OVERLAPPED_PHASES: list(method.overlapped_phases),
        schema.STEPS_PER_EPOCH: ctx.loader.steps_per_epoch,
        schema.TRAIN_SAMPLES: train_samples,
        schema.TEST_SAMPLES: test_samples,
        schema.PARAMETERS: sum(p.numel() for p in ctx.model.parameters()),
        schema.MODEL: ctx.workload.model_name if ctx.workload is not None else None,
        schema.VERSIONS: versions(),
        schema.GIT_REVISION: git_revision(),
        **facts,
        schema.STARTED: time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
