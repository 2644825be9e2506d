"""``bench sim``: the simulations of a grid of methods and GPU counts on one profile, each
written as a run folder marked ``simulated``, and a line per simulation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from suite.commands.preflight import split_options, validate
from suite.config import RunConfig
from suite.errors import BenchError
from suite.results import schema
from suite.results.folder import RunFolder
from suite.run.plan import plan_run
from suite.sim.profile import load_profile, shipped_profiles
from suite.sim.replay import DEFAULT_REPLAY, borrowed_accuracy, check_simulable, simulate_run


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
) -> list[Path]:
    """One simulated run folder per (method, GPU count); each method gets the options it
    declares. Everything is checked before the first simulation starts."""

    loaded = load_profile(profile or "v100-ib100")
    accuracy = borrowed_accuracy(accuracy_from)
    if replay is not None and replay < 1:
        raise BenchError(f"--replay must be at least 1, got {replay}")
    plans = []
    for method in methods:
        check_simulable(method)
        options, ignored = split_options(method, given)
        if ignored and len(methods) == 1:
            echo(f"warning: {', '.join(ignored)} not read by {method}; ignored", err=True)
        for n in gpus:
            plan = plan_run(replace(
                base, method=method, gpus=n, options=dict(options), launcher="sim",
                gpus_per_node=base.gpus_per_node or loaded.gpus_per_node,
                run_id=base.run_id if len(methods) * len(gpus) == 1 else None,
            ))
            validate(plan, check_data=False)
            plans.append(plan)
    if dry_run:
        for plan in plans:
            config = plan.config
            echo(f"{config.method:<12} {config.gpus:>4} GPUs on {loaded.name} "
                 f"({plan.nodes} x {config.gpus_per_node}), options {config.options}; "
                 f"{plan.schedule.describe()}")
        return []
    paths = []
    for plan in plans:
        config = plan.config
        path = simulate_run(plan, loaded, replay=replay or DEFAULT_REPLAY, accuracy=accuracy)
        summary = RunFolder(path).summary()
        echo(
            f"{config.method:<12} {config.gpus:>4} GPUs  "
            f"{summary[schema.ITERATION_SECONDS] * 1e3:9.1f} ms/iteration  "
            f"{summary[schema.INTER_NODE_BYTES_PER_ITERATION] / 1e6:9.2f} MB inter/iteration  "
            f"-> {path}"
        )
        paths.append(path)
    return paths


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
    run_simulations(methods, gpus, base, options, **sim, echo=echo)
