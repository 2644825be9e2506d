"""One run, resolved once: the frozen plan every part of a run reads.

``bench run`` (and each cell of ``bench sweep``, each simulation of ``bench sim``) turns its
configuration into a ``RunPlan`` once, before anything is checked or started: the method
and its settings, the workload and its recipe with the run's overrides, the dataset and its
shape, the rank layout, the schedule (steps per epoch, the round, the budget) and the run id.
Preflight, the dry run, the launchers, the ranks, the simulator and the manifest read that
plan; none of them resolves the workload or the settings again or completes the
configuration in place (a ``RunConfig`` is frozen). The ranks receive the plan as JSON (the
configuration and the plan's facts, ``RunPlan.to_json``), rebuild it from the
configuration and refuse, in one line, a plan whose facts differ from their launcher's (a node
with other plugins installed, a workload whose factory is not deterministic).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from suite.cluster.netemu import parse_rate
from suite.cluster.topology import check_layout
from suite.config import MAX_RANKS, MAX_SEED, RunConfig, flag_of
from suite.data.datasets import dataset_spec, split_sizes
from suite.data.input_size import InputSize, input_size
from suite.data.workload import DatasetSpec, Recipe, Workload
from suite.errors import BenchError
from suite.plugins.method import RoundSettings
from suite.plugins.options import (
    POSITIVE,
    Check,
    check_value,
    resolve_settings,
    settings_dict,
)
from suite.plugins.registry import METHODS, WORKLOADS, Entry
from suite.results import schema
from suite.results.folder import make_run_id

__all__ = ["RECIPE_OVERRIDES", "RunPlan", "Schedule", "plan_run"]

#: RunConfig fields that override the workload's recipe
RECIPE_OVERRIDES = (schema.BATCH_SIZE, schema.LR, schema.MOMENTUM, schema.WEIGHT_DECAY,
                    schema.LR_SCHEDULE, schema.WARMUP_EPOCHS)
#: a run id names one folder inside --results-dir: no separators, no "..", no hidden names
SAFE_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: more iterations than any run can take (a billion of the fastest CPU step is years): a typo
MAX_ITERATIONS = 10**9
#: a year: the longest wait or interval a run may be given
MAX_SECONDS = 365 * 24 * 3600
#: the longest run id (a folder name; its files' names are the file system's, <= 255 bytes)
MAX_RUN_ID = 200
#: the longest --results-dir, so a run's deepest file stays under the system's path limit
MAX_RESULTS_DIR = 3000
#: the image sides --image-size takes (px)
MIN_IMAGE_SIDE, MAX_IMAGE_SIDE = 8, 1024
#: RunConfig field -> its range (ranks, seed, run length, recipe overrides, reliability)
RECIPE_CHECKS = {
    **dict.fromkeys((schema.GPUS, schema.GPUS_PER_NODE),
                    Check(lambda v: 1 <= v <= MAX_RANKS, f"at least 1 (at most {MAX_RANKS})")),
    schema.SEED: Check(lambda v: 0 <= v <= MAX_SEED, f"in [0, {MAX_SEED}] (2**63-1)"),
    schema.ITERATIONS: Check(lambda v: 1 <= v <= MAX_ITERATIONS,
                             f"in [1, {MAX_ITERATIONS:.0e}]"),
    "image_size": Check(lambda v: MIN_IMAGE_SIDE <= v <= MAX_IMAGE_SIDE,
                             f"in [{MIN_IMAGE_SIDE}, {MAX_IMAGE_SIDE}] (px)"),
    schema.TARGET_ACCURACY: Check(lambda v: 0 <= v <= 1, "a fraction in [0, 1], e.g. 0.85 (or "
                                  "85%)"),
    **dict.fromkeys((schema.EPOCHS, "eval_every", schema.BATCH_SIZE, schema.LR), POSITIVE),
    schema.MOMENTUM: Check(lambda v: 0 <= v < 1, "in [0, 1)"),
    schema.WEIGHT_DECAY: Check(lambda v: v >= 0, "at least 0"),
    schema.WARMUP_EPOCHS: Check(lambda v: v >= 0, "at least 0"),
    "checkpoint_every": POSITIVE,
    # a timed checkpoint at most every second, a collective given at least a second (and both
    # within a year): a smaller number is a typo, not a run
    "checkpoint_minutes": Check(lambda v: 1 / 60 <= v <= MAX_SECONDS / 60,
                                f"at least 1/60 (a second) and at most {MAX_SECONDS // 60}"),
    "collective_timeout": Check(lambda v: 1 <= v <= MAX_SECONDS,
                                f"in [1, {MAX_SECONDS}] seconds"),
    "max_restarts": Check(lambda v: v >= 0, "at least 0"),
    "bn_recalibrate": Check(lambda v: v >= 0, "at least 0"),
}
#: RunConfig fields a plan may change without resolving again: how a start of the run
#: treats its folder, and the node size a job discovers
RESTART_FIELDS = ("resume", "overwrite", schema.RUN_ID, schema.GPUS_PER_NODE)


@dataclass(frozen=True)
class Schedule:
    """How many local steps every rank takes, and in iterations of what size.

    Attributes:
        steps_per_epoch: local steps of one pass over a rank's shard.
        batch_size: per rank, as the loader takes it (a shard smaller than the recipe's
            batch is one whole-shard batch).
        round_steps: H, the local steps of one round, for a method with ``RoundSettings``;
            None where the method's own ``steps_per_iteration`` (1 unless it declares more)
            sizes its iterations.
        epochs: the epochs the budget is made of (``--epochs``, else the recipe's), or None
            under ``--iterations``.
        iterations: ``--iterations``, or None.
    """

    steps_per_epoch: int
    batch_size: int
    round_steps: int | None
    epochs: float | None
    iterations: int | None

    def budget_steps(self, steps_per_iteration: int) -> int:
        """Local steps per rank of the whole run. ``--epochs`` gives every method the same
        number (a round-based method's last round is cut to fit); ``--iterations`` counts
        whole iterations of the method's own size."""
        if self.iterations is not None:
            return self.iterations * steps_per_iteration
        return max(1, math.ceil(self.epochs * self.steps_per_epoch))

    def iterations_for(self, steps_per_iteration: int) -> int:
        return math.ceil(self.budget_steps(steps_per_iteration) / steps_per_iteration)

    @property
    def planned_steps_per_iteration(self) -> int:
        """What the plan knows before the method is built: H, else 1."""
        return self.round_steps or 1

    def describe(self) -> str:
        """``10 iteration(s) of 32 local step(s): 320 local steps per rank, budget 320
        (1 epoch(s) x 320 steps per epoch)``: what ``--dry-run`` prints."""
        h = self.planned_steps_per_iteration
        budget = self.budget_steps(h)
        iterations = self.iterations_for(h)
        short = budget - (iterations - 1) * h
        last = f", the last of {short}" if short != h else ""
        size = f"{h} local step(s)" + ("" if self.round_steps else
                                       " (1 unless the method declares steps_per_iteration)")
        if self.iterations is not None:
            why = (f"--iterations {self.iterations} x {h} = "
                   f"{budget / self.steps_per_epoch:.2f} epoch(s) of {self.steps_per_epoch} "
                   "steps")
        else:
            why = f"{self.epochs:g} epoch(s) x {self.steps_per_epoch} steps per epoch"
        total = (iterations - 1) * h + short
        return (f"{iterations} iteration(s) of {size}{last}: {total} local steps per rank, "
                f"budget {budget} ({why})")


@dataclass(frozen=True)
class RunPlan:
    """A run resolved once (see the module's docstring): what preflight, the launchers, the
    ranks, the simulator and the manifest read.

    Attributes:
        config: the resolved configuration (launcher, node size, device and run id filled
            in), frozen.
        method: the method's registry entry.
        settings: the method's settings object, every option converted and checked.
        workload: the workload (its model builder and recipe).
        recipe: the workload's recipe with the run's overrides.
        dataset: the dataset's name (``--dataset``, else the workload's).
        spec: the dataset's shape and classes, at the side the model is handed its images
            (``input_size.model_side``).
        train_samples: training samples of the dataset.
        test_samples: test samples of the dataset.
        schedule: steps per epoch, the round and the budget.
        input_size: the side the model takes the images at and how it was chosen (decided
            once, by the launcher: a rank takes its launcher's decision and never searches).
    """

    config: RunConfig
    method: Entry
    settings: Any
    workload: Workload
    recipe: Recipe
    dataset: str
    spec: DatasetSpec
    train_samples: int
    test_samples: int
    schedule: Schedule
    input_size: InputSize

    @property
    def run_id(self) -> str:
        return str(self.config.run_id)

    @property
    def nodes(self) -> int | None:
        """Nodes of the layout (None: discovered by the job's ranks)."""
        gpn = self.config.gpus_per_node
        return self.config.gpus // gpn if gpn else None

    def facts(self) -> dict:
        """What the plan resolved, as JSON values: recorded in the manifest (``plan``) and
        checked by every rank against its own resolution."""
        return {
            schema.RUN_ID: self.config.run_id,
            schema.METHOD: self.method.name,
            schema.PLAN_PLUGIN: self.method.plugin,
            schema.PLAN_SETTINGS: settings_dict(self.settings),
            schema.WORKLOAD: self.workload.name,
            schema.MODEL: self.workload.model_name,
            schema.RECIPE: asdict(self.recipe),
            schema.DATASET: self.dataset,
            schema.PLAN_SPEC: asdict(self.spec),
            schema.SAMPLES: [self.train_samples, self.test_samples],
            schema.PLAN_LAYOUT: {schema.GPUS: self.config.gpus,
                                 schema.GPUS_PER_NODE: self.config.gpus_per_node,
                                 schema.NODES: self.nodes},
            schema.LAUNCHER: self.config.launcher,
            schema.DEVICE: self.config.device,
            schema.PLAN_SCHEDULE: asdict(self.schedule),
            schema.PLAN_INPUT_SIZE: asdict(self.input_size),
        }

    @property
    def digest(self) -> str:
        """A short hash of the facts: equal digests, the same plan."""
        text = json.dumps(self.facts(), sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def to_json(self) -> str:
        """What a rank receives: the configuration and the plan's facts."""
        return json.dumps({schema.CONFIG: json.loads(self.config.to_json()), "facts": self.facts()},
                          sort_keys=True, default=str)

    @classmethod
    def from_json(cls, text: str) -> RunPlan:
        """The plan of ``to_json``'s text, resolved again here from its configuration (the
        model's input size taken as its launcher decided it: no rank searches on its own);
        a one-line error when this process resolves other facts than the launcher did."""
        data = json.loads(text)
        config = RunConfig.from_json(json.dumps(data[schema.CONFIG]))
        decided = data["facts"].get(schema.PLAN_INPUT_SIZE)
        plan = plan_run(config, decided=InputSize(**decided) if decided else None)
        sent = json.loads(json.dumps(data["facts"], default=str))
        here = json.loads(json.dumps(plan.facts(), default=str))
        differ = [key for key in sorted(set(sent) | set(here)) if sent.get(key) != here.get(key)]
        if differ:
            key = differ[0]
            raise BenchError(
                f"this rank resolves the run's {key} as {here.get(key)!r}, its launcher as "
                f"{sent.get(key)!r}: install the same plugins and suite on every node"
            )
        return plan

    def restarted(self, **changes) -> RunPlan:
        """This plan for another start of the run (``resume``, ``overwrite``), under the run
        id its ranks agreed on, or with the node size its job discovered: the fields of
        ``RESTART_FIELDS`` change nothing else that was resolved."""
        unknown = set(changes) - set(RESTART_FIELDS)
        if unknown:
            raise ValueError(f"{sorted(unknown)} need a plan resolved anew (plan_run)")
        return replace(self, config=replace(self.config, **changes))


def plan_run(config: RunConfig, *, decided: InputSize | None = None) -> RunPlan:
    """``config`` resolved into its plan, checked: the run id (a new one when none is
    given), the layout, the link flags, the recipe overrides' ranges, the workload, the
    method's settings, the dataset, the side the model takes its images at and the
    schedule. Each problem is one BenchError line.

    Args:
        config: the configuration with its launcher's facts filled in (the launcher itself,
            the node size where it has one, the device).
        decided: the model's input size as the launcher decided it (a rank's plan); None:
            decide it here (``suite.data.input_size``: the launcher, before any rank starts).

    Returns:
        The frozen plan.
    """
    check_config(config)
    if config.run_id is None:
        config = replace(config, run_id=new_run_id(config))
    method = METHODS.get(config.method)
    settings = resolve_settings(method.settings, config.options, config.method)
    workload = WORKLOADS.build(config.workload)
    overrides = {k: getattr(config, k) for k in RECIPE_OVERRIDES if getattr(config, k) is not None}
    recipe = replace(workload.recipe, **overrides)
    dataset = config.dataset or workload.dataset
    spec = dataset_spec(dataset)
    train, test = split_sizes(dataset, config.synthetic_size)
    schedule = schedule_of(config, settings, recipe, train)
    size = decided or input_size(workload, spec, config.image_size)
    return RunPlan(config, method, settings, workload, recipe, dataset,
                   replace(spec, image_size=size.model_side), train, test, schedule, size)


def new_run_id(config: RunConfig) -> str:
    """A fresh run id: ``<time>-<method>-<workload>-<N>g-<random>`` (``sim-`` first for the
    simulator)."""
    run_id = make_run_id(config.method, config.workload, config.gpus)
    return f"sim-{run_id}" if config.launcher == "sim" else run_id


def schedule_of(config: RunConfig, settings, recipe: Recipe, train_samples: int) -> Schedule:
    """The schedule of a rank's shard: ``train_samples`` over ``config.gpus`` ranks in batches
    of the recipe's size, as the rank's loader takes them."""
    shard = train_samples // config.gpus
    if shard == 0:
        raise BenchError(f"{train_samples} training samples cannot fill {config.gpus} shards")
    if config.batch_size is not None and config.batch_size > shard:
        raise BenchError(f"--batch-size {config.batch_size} is larger than a rank's shard "
                         f"({train_samples} training samples over {config.gpus} ranks: {shard}); "
                         f"give at most {shard}")
    batch = min(recipe.batch_size, shard)
    steps_per_epoch = shard // batch
    round_steps = (settings.steps_per_round(steps_per_epoch)
                   if isinstance(settings, RoundSettings) else None)
    rounds = config.iterations or 1
    if round_steps is not None and round_steps * rounds > MAX_ITERATIONS:
        raise BenchError(f"--local-steps/--local-epochs give rounds of {round_steps} local steps"
                         f" ({rounds} of them), more than any run takes ({MAX_ITERATIONS:.0e} "
                         f"local steps per rank); one epoch of a shard is {steps_per_epoch}")
    epochs = None
    if config.iterations is None:
        epochs = config.epochs if config.epochs is not None else recipe.epochs
    return Schedule(steps_per_epoch, batch, round_steps, epochs, config.iterations)


def check_config(config: RunConfig) -> None:
    """The configuration's own consistency, before anything is resolved from it."""
    _check_run_id(config.run_id)
    _check_results_dir(config.results_dir)
    for name in (schema.GPUS, schema.GPUS_PER_NODE, schema.SEED):
        value = getattr(config, name)
        if value is not None:
            check_value(flag_of(name), value, RECIPE_CHECKS[name])
    if config.gpus_per_node is not None:
        check_layout(config.gpus, config.gpus_per_node)
    _check_network(config)
    for name, check in RECIPE_CHECKS.items():
        value = getattr(config, name)
        if value is not None:
            check_value(flag_of(name), value, check)


def _check_run_id(run_id: str | None) -> None:
    """A given run id must be one folder name: it names the run's folder under the results
    root, so a '/' or '..' would write elsewhere.

    Raises:
        BenchError: it is not one safe folder name.
    """
    if run_id is not None and (not SAFE_RUN_ID.fullmatch(run_id) or ".." in run_id):
        raise BenchError(
            f"--run-id {run_id[:MAX_RUN_ID]!r} must be one folder name (letters, digits, '.', "
            "'_', '-'; no '/' or '..')"
        )
    if run_id is not None and len(run_id) > MAX_RUN_ID:
        raise BenchError(f"--run-id of {len(run_id)} characters: at most {MAX_RUN_ID} (it "
                         "names a folder)")


def _check_results_dir(results_dir: str) -> None:
    """``--results-dir`` fits the file system's limits with the run's files under it.

    Raises:
        BenchError: the path, or one of its names, is too long.
    """
    path = str(results_dir)
    longest = max((len(part.encode()) for part in Path(path).parts), default=0)
    if len(path) > MAX_RESULTS_DIR or longest > 255:
        raise BenchError(f"--results-dir of {len(path)} characters (a name of {longest} "
                         f"bytes): at most {MAX_RESULTS_DIR} characters, names of 255 bytes")


def _check_network(config: RunConfig) -> None:
    """``--inter-bw`` and ``--network emulated`` come together: an emulated network needs a
    rate (a valid one) and at least two nodes to throttle between, and a rate means nothing
    without it.

    Raises:
        BenchError: one without the other, a bad rate, or a single node.
    """
    if config.inter_bw is not None and config.network != "emulated":
        raise BenchError("--inter-bw needs --network emulated")
    if config.network == "emulated":
        if config.inter_bw is None:
            raise BenchError("--network emulated needs --inter-bw, e.g. 1gbit or 200mbit")
        parse_rate(config.inter_bw)
        if config.gpus_per_node is None or config.gpus // config.gpus_per_node < 2:
            raise BenchError("--network emulated needs at least two nodes (--gpus-per-node)")
