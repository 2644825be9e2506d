"""``bench sim``: the simulations of a grid of methods and GPU counts on one profile, each
written as a run folder marked ``simulated``, and a line per simulation; on stderr, within
seconds, what will run, its estimated cost here (and a smaller command where that exceeds a
few minutes), then each cell's build, replayed iterations and pricing."""

from __future__ import annotations

import re
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from suite.commands.preflight import split_options, validate
from suite.config import RunConfig
from suite.environment import number as environment_number
from suite.errors import BenchError
from suite.processes import single_threaded
from suite.results import schema
from suite.results.folder import RunFolder
from suite.run.plan import plan_run
from suite.sim.estimate import (
    PATIENCE_SECONDS,
    duration,
    estimate_seconds,
    plan_cell,
    quicker,
    smaller_command,
    time_local_step,
)
from suite.sim.measure import memory_bandwidth
from suite.sim.pricing import host_work_seconds
from suite.sim.profile import load_profile, shipped_profiles
from suite.sim.replay import DEFAULT_REPLAY, borrowed_accuracy, check_simulable, simulate_run


@single_threaded  # the checks' model traces too: a second thread only slows them here
def host_memory_bandwidth() -> float:
    """This host's memory bandwidth in bytes/s, which scales the replay's host-timed phases
    to the profile's machine: measured (a few hundred ms, on the clock those phases are
    timed on, so another process does not lower it), or PRUNEX_HOST_MEMORY_BANDWIDTH where
    set, so that simulations made apart (two ``bench sim`` calls, on runners whose memory
    differs) price those phases alike."""
    fixed = environment_number("PRUNEX_HOST_MEMORY_BANDWIDTH")
    return fixed if fixed > 0 else memory_bandwidth(torch.device("cpu"), clock=host_work_seconds)


def run_simulations(
    methods: list[str],
    gpus: list[int],
    base: RunConfig,
    given: dict,
    *,
    profile: str | None,
    replay: int | None,
    accuracy_from: str | None,
    dry_run: bool = False,
    echo,
    command: Sequence[str] | None = None,
) -> list[Path]:
    """One simulated run folder per (method, GPU count); each method gets the options it
    declares. Everything is checked before the first simulation starts. ``command``: the
    command line after ``bench`` (a smaller one is derived from it)."""

    def say(line: str) -> None:
        echo(line, err=True)

    began = time.perf_counter()
    replay = replay or DEFAULT_REPLAY
    loaded = load_profile(profile or "v100-ib100")
    accuracy = borrowed_accuracy(accuracy_from)
    if replay < 1:
        raise BenchError(f"--replay must be at least 1, got {replay}")
    plans = _plan_grid(methods, gpus, base, given, loaded=loaded, echo=echo)
    say(f"bench sim: {len(plans)} simulation(s) ({', '.join(methods)} x "
        f"{', '.join(map(str, gpus))} GPUs) of {base.workload} on {loaded.name}; "
        "checking them")
    for plan in plans:  # the model's structure traced, the options' ranges
        validate(plan, check_data=False)
    for line in schedule_warnings(plans):
        say(line)
    if dry_run:
        _list_plans(plans, loaded, echo)
        return []
    cells = [plan_cell(plan, replay) for plan in plans]
    expected = _announce_estimate(plans, cells, methods=methods, gpus=gpus, base=base,
                                  loaded=loaded, replay=replay, command=command, say=say)
    paths = _simulate_cells(plans, cells, loaded=loaded, replay=replay, accuracy=accuracy,
                            echo=echo, say=say)
    for line in efficiency_warnings(paths):
        say(line)
    say(f"bench sim: {len(paths)} simulation(s) in {duration(time.perf_counter() - began)}, "
        f"checks included (estimated {duration(expected)})")
    return paths


def _plan_grid(methods: list[str], gpus: list[int], base: RunConfig, given: dict, *,
               loaded, echo) -> list:
    """The plan of every (method, GPU count), methods outer; the checks that take no time
    come first, so a mistake is one line before anything is traced or timed.

    Args:
        given: the options from the command line; each method gets those it declares (the
            rest are named as ignored when there is one method).
        loaded: the profile; its GPUs per node unless ``base`` sets them.
    """
    plans = []
    for method in methods:  # the checks that take no time first: a mistake is one line
        check_simulable(method)
        options, ignored = split_options(method, given)
        if ignored and len(methods) == 1:
            echo(f"warning: {', '.join(ignored)} not read by {method}; ignored", err=True)
        for n in gpus:
            plans.append(plan_run(replace(
                base, method=method, gpus=n, options=dict(options), launcher="sim",
                gpus_per_node=base.gpus_per_node or loaded.gpus_per_node,
                run_id=base.run_id if len(methods) * len(gpus) == 1 else None,
            )))
    return plans


def _list_plans(plans: list, loaded, echo) -> None:
    """A ``--dry-run``'s output: a line per simulation that would run, on stdout."""
    for plan in plans:
        config = plan.config
        echo(f"{config.method:<12} {config.gpus:>4} GPUs on {loaded.name} "
             f"({plan.nodes} x {config.gpus_per_node}), options {config.options}; "
             f"{plan.schedule.describe()}")


def _announce_estimate(plans: list, cells: list, *, methods: list[str], gpus: list[int],
                       base: RunConfig, loaded, replay: int,
                       command: Sequence[str] | None, say: Callable[[str], None]) -> float:
    """Time one local step here, say what the whole grid will cost, and, past the user's
    patience, a smaller command that would not (derived from ``command``, or from the grid
    where none was given).

    Returns:
        The estimated seconds (the closing line compares with it).
    """
    build_s, step_s, parameters = time_local_step(plans[0])
    expected = estimate_seconds(cells, build_s, step_s)
    say(f"estimate: {sum(c.replayed_steps for c in cells)} local steps replayed for real over "
        f"{len(cells)} simulation(s) (up to {replay} iteration(s) each), at {step_s * 1e3:.0f} ms "
        f"per stand-in step of {base.workload} ({parameters / 1e6:.1f} M parameters) on this "
        f"machine now: about {duration(expected)}")
    if expected > PATIENCE_SECONDS:
        fewer_replay, fewer_gpus, fewer_seconds = quicker(cells, replay, build_s, step_s, gpus)
        argv = command if command is not None else [
            "sim", "--method", ",".join(methods), "--workload", base.workload,
            "--profile", loaded.name]
        say(f"that is more than {duration(PATIENCE_SECONDS)}; a smaller one (about "
            f"{duration(fewer_seconds)}): {smaller_command(argv, fewer_replay, fewer_gpus)}")
    return expected


def _simulate_cells(plans: list, cells: list, *, loaded, replay: int, accuracy, echo,
                    say: Callable[[str], None]) -> list[Path]:
    """Run each simulation in turn, its progress on stderr and its result line on stdout;
    the host's memory bandwidth is measured once, so the cells are priced alike.

    Returns:
        The run folders, in the order of ``plans``.
    """
    host_bandwidth = host_memory_bandwidth()  # once, so the cells are alike
    paths = []
    for number, (plan, cell) in enumerate(zip(plans, cells), 1):
        config = plan.config
        name = f"[{number}/{len(cells)}] {config.method} {config.gpus} GPUs"
        say(f"{name}: building {config.workload} on {plan.nodes} nodes x "
            f"{config.gpus_per_node}; {cell.iterations} iteration(s), "
            f"at least {cell.replayed_iterations} replayed")
        path = simulate_run(plan, loaded, replay=replay, accuracy=accuracy,
                            host_memory_bandwidth=host_bandwidth,
                            progress=Throttled(lambda line, name=name: say(f"{name}: {line}")))
        summary = RunFolder(path).summary()
        echo(
            f"{config.method:<12} {config.gpus:>4} GPUs  "
            f"{summary[schema.ITERATION_SECONDS] * 1e3:9.1f} ms/iteration  "
            f"{summary[schema.INTER_NODE_BYTES_PER_ITERATION] / 1e6:9.2f} MB inter/iteration  "
            f"-> {path}"
        )
        paths.append(path)
    return paths


def schedule_warnings(plans) -> list[str]:
    """A method whose rounds change length with the GPU count (the default H, one local
    epoch at most 32 steps, shrinks as the shards do): its curve mixes algorithms, where the
    paper scales at a fixed schedule. Names the H per count and the fixed form."""
    rounds: dict[str, dict[int, int]] = defaultdict(dict)
    for plan in plans:
        method, gpus, h = plan.config.method, plan.config.gpus, plan.schedule.round_steps
        if h is not None:
            rounds[method][gpus] = h
    lines = []
    for method, by_gpus in rounds.items():
        if len(set(by_gpus.values())) > 1:
            each = ", ".join(f"H={h} at {g}" for g, h in sorted(by_gpus.items()))
            lines.append(f"warning: {method}'s rounds change with the GPU count ({each} local "
                         "steps: one local epoch, at most 32); for the paper's fixed schedule "
                         f"give --local-steps {min(by_gpus.values())}")
    return lines


#: parallel efficiency a simulation may show above 1 (host-timed phases vary a little)
EFFICIENCY_NOISE = 0.01


def efficiency_warnings(paths: list[Path]) -> list[str]:
    """The invariant of a simulated strong-scaling sweep: no method's parallel efficiency
    (training seconds per epoch, relative to its fewest GPUs) above 1 beyond noise. The
    simulator prices compute per sample and adds communication, so more is a pricing fault."""
    per_method: dict[str, dict[int, float]] = defaultdict(dict)
    for path in paths:
        summary = RunFolder(path).summary()
        if summary.get(schema.EPOCHS):
            per_method[summary[schema.METHOD]][summary[schema.GPUS]] = (
                summary[schema.TRAIN_SECONDS] / summary[schema.EPOCHS])
    lines = []
    for method, seconds in per_method.items():
        base = min(seconds)
        for gpus, epoch_seconds in sorted(seconds.items()):
            efficiency = seconds[base] / epoch_seconds / (gpus / base)
            if efficiency > 1 + EFFICIENCY_NOISE:
                lines.append(f"warning: {method} at {gpus} GPUs simulates a parallel efficiency "
                             f"of {efficiency:.3f} over {base} GPUs, above 1: a pricing fault "
                             "of the simulator; report it with both run folders")
    return lines


class Throttled:
    """Progress lines at most every ``every`` seconds (a fast replay says one line, a slow
    one a line per iteration); a replay's first and last iteration and the pricing always."""

    ALWAYS = re.compile(r"^(pricing|replayed iteration (1/|(\d+)/\3 ))")

    def __init__(self, say: Callable[[str], None], every: float = 2.0):
        self.say, self.every, self.last = say, every, 0.0

    def __call__(self, line: str) -> None:
        now = time.perf_counter()
        if self.ALWAYS.match(line) or now - self.last >= self.every:
            self.say(line)
            self.last = now


def execute_sim(kwargs: dict, options: dict, *, echo: Callable) -> None:
    """``bench sim``: list the shipped profiles, or simulate every (method, GPU count)."""

    if kwargs.pop("list_profiles"):
        for name in shipped_profiles():
            echo(f"{name:<16} {load_profile(name).description}")
        return
    methods = [m for m in kwargs.pop("method").split(",") if m]
    gpus = kwargs.pop("gpus")
    sim = {k: kwargs.pop(k) for k in ("profile", "replay", "accuracy_from", "dry_run")}
    kwargs["launcher"] = "sim"
    base = RunConfig.from_flags({**kwargs, schema.METHOD: methods[0]}, {}, gpus[0])
    run_simulations(methods, gpus, base, options, **sim, echo=echo, command=sys.argv[1:])
