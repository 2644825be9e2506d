"""What ``bench run``, ``bench rerun`` and ``bench sweep`` do once their flags are parsed:
build the configurations, resolve each once into its plan (``suite.run.plan``) with its
launcher's facts, check them all, then dry-run, submit, simulate or launch the plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from suite.commands.experiment import read_experiment
from suite.commands.preflight import describe, refuse_foreign_flags, split_options, validate
from suite.commands.sweep import CellStatus, expand, run_cells, run_facts, summary_lines
from suite.config import LAUNCHER_FLAGS, RunConfig, flag_of
from suite.errors import BenchError
from suite.launchers.local import (
    adopt_slurm_environment,
    job_config,
    launch_emulated,
    launch_in_job,
    launch_local,
    local_config,
)
from suite.launchers.slurm import slurm_config, slurm_request, submit_or_print
from suite.plugins.registry import METHODS
from suite.results import schema
from suite.results.folder import MANIFEST, RunFolder
from suite.results.lock import check_free
from suite.results.schema import Status
from suite.run.checkpoint import checked_checkpoint, unfinished_checkpoints
from suite.run.plan import RunPlan, plan_run

SIM_FLAGS = LAUNCHER_FLAGS["sim"]
SLURM_FLAGS = LAUNCHER_FLAGS["slurm"]


def run_fields(kwargs: dict) -> dict:
    """``bench run``'s parsed flags as RunConfig's fields, for a run and a simulation alike:
    the launchers' own flags and the GPU counts dropped (``RunConfig.from_flags`` takes one),
    --resume (a folder) and --overwrite as the yes/no a configuration records."""
    fields = {k: v for k, v in kwargs.items()
              if k not in (*SIM_FLAGS, *SLURM_FLAGS, "dry_run", schema.GPUS)}
    fields["resume"] = bool(fields.get("resume"))
    fields["overwrite"] = bool(fields.get("overwrite"))
    return fields


def config_from_flags(kwargs: dict, given: dict, *, warn: Callable | None = None) -> RunConfig:
    """The RunConfig of ``bench run``'s parsed flags (``run_fields``), with the method's
    options converted; options the method does not read are dropped with a warning."""
    method = kwargs[schema.METHOD]
    options, ignored = split_options(method, given)
    if ignored and warn is not None:
        warn(f"warning: {', '.join(ignored)} not read by {method}; ignored", err=True)
    return RunConfig.from_flags(run_fields(kwargs), options, kwargs[schema.GPUS][0])


#: flags a resume takes beside --resume: how it survives and where it runs, never what it
#: computes (its recorded configuration)
RESUME_FLAGS = ("resume", "dry_run", "checkpoint_every", "checkpoint_minutes", "max_restarts",
                "collective_timeout", "launcher", *SLURM_FLAGS)


def resume_arguments(kwargs: dict, given: set[str] = frozenset()) -> dict:
    """``bench run --resume RUN_DIR``: the recorded run's flags (its manifest), into its own
    folder, from its latest complete checkpoint; ``given``: the flags set on the command
    line, of which only ``RESUME_FLAGS`` are taken (they override the recorded ones), any
    other is refused rather than silently ignored."""

    refused = sorted(name for name in given if name not in RESUME_FLAGS)
    if refused:
        flags = ", ".join(flag_of(name) for name in refused)
        taken = ", ".join(flag_of(name) for name in RESUME_FLAGS[1:])
        raise BenchError(f"--resume continues the run with its recorded configuration; "
                         f"{flags} would change it (a resume takes only {taken})")
    folder = RunFolder(Path(kwargs["resume"]).resolve())
    if not folder.has_manifest:
        raise BenchError(f"--resume {folder.path}: no manifest.json (the run never started); "
                         "start it again with --overwrite")
    try:
        status = (folder.summary() or {}).get(schema.STATUS)
    except (OSError, ValueError):
        status = None
    if status == Status.OK:
        raise BenchError(f"--resume {folder.path}: the run already finished")
    check_free(folder.path)  # not a run still going, nor a rank of it; no link in it
    found = checked_checkpoint(folder.path)  # its metadata read safely, before any rank
    if found is None:
        unfinished = unfinished_checkpoints(folder.path)
        why = (f"only an unfinished one, {unfinished[-1].name} (its writing failed: a full "
               "disk?)" if unfinished else
               "it ran without --checkpoint-every/--checkpoint-minutes")
        raise BenchError(f"--resume {folder.path}: no complete checkpoint ({why}); start it "
                         "again with --overwrite")
    recorded = read_experiment(folder.path / MANIFEST)
    resumed = {k: v for k, v in kwargs.items() if k not in recorded}
    resumed.update(recorded, gpus=[recorded[schema.GPUS]], run_id=folder.path.name,
                   results_dir=str(folder.path.parent), resume=True, overwrite=False)
    resumed.update({name: kwargs[name] for name in given if name != "resume"})
    return resumed


def execute_run(kwargs: dict, given: dict, *, echo: Callable) -> None:
    """One run: ``kwargs`` are ``bench run``'s flags, ``given`` the method options set."""

    dry_run = kwargs.get("dry_run", False)
    sim = {k: kwargs.get(k) for k in SIM_FLAGS}
    slurm = {k: kwargs.get(k) for k in SLURM_FLAGS}
    launcher, gpus = kwargs["launcher"], kwargs[schema.GPUS]
    refuse_foreign_flags(launcher, {**sim, **slurm})
    if launcher == "sim":
        # lazy: suite.commands.simulate costs ~0.1 s to import; only this path needs it
        from suite.commands.simulate import run_simulations

        base = RunConfig.from_flags(run_fields(kwargs), {}, gpus[0])
        run_simulations([base.method], gpus, base, given, **sim, dry_run=dry_run, echo=echo)
        return
    if len(gpus) > 1:
        raise BenchError("--gpus takes one number except with --launcher sim; see `bench sweep`")
    config = config_from_flags(kwargs, given, warn=echo)
    if launcher == "slurm":
        request = slurm_request(**slurm)
    plan = resolve_run(config)
    # a rank of a job reads (and with --download fetches) its data once, in setup; a dry
    # run reads none (a folder's data is input, and the plan does not need it)
    validate(plan, check_data=plan.config.launcher == "local" and not dry_run)
    resized = plan.input_size.describe(config.workload)
    if resized and not dry_run:
        echo(f"note: {resized}", err=True)
    if launcher == "slurm":
        submit_or_print(plan, request, dry_run=dry_run, echo=echo)
        return
    if dry_run:
        echo(describe(plan, generated_run_id=config.run_id is None))
        return
    if plan.config.network == "emulated":
        echo(ending_line(launch_emulated(plan), resized))
    elif plan.config.launcher == "local":
        echo(ending_line(launch_local(plan), resized))
    else:
        launch_in_job(plan)


def ending_line(path: Path, resized: str = "") -> str:
    """How a finished run ended, in one line ending with its folder: ``ok: accuracy 86.23 %,
    wall 41.2 s, training 30.5 s, inter-node 0.795 MB; results: PATH`` (a failed or stopped
    run is one line of ``bench``'s error instead); ``resized`` (``images resized from 28x28
    to 32x32 ...``, ``InputSize.describe``) goes before the folder."""
    summary = RunFolder(path).summary() or {}
    facts = run_facts(summary, wall=True) + (f"; {resized}" if resized else "")
    return f"{summary.get(schema.STATUS, 'unknown')}: {facts}; results: {path}" if facts else (
        f"results: {path}")


def resolve_run(config: RunConfig) -> RunPlan:
    """``config``'s plan: its launcher's facts first (``auto``: torchrun inside a job, else
    local; the node size, the device, a job's world size), then everything else, once.

    Raises:
        BenchError: ``--network emulated`` with a launcher that is not, or resolves not to
            be, local (its nodes are namespaces of this machine); what the plan refuses.
    """
    launcher = config.launcher
    if launcher == "auto":
        launcher = "torchrun" if adopt_slurm_environment() else "local"
    if config.network == "emulated" and launcher != "local":  # the one place it is refused
        raise BenchError("--network emulated runs with --launcher local")
    if launcher == "slurm":
        return plan_run(slurm_config(config))
    if launcher == "torchrun":
        return plan_run(job_config(config))
    return plan_run(local_config(config))


def execute_sweep(kwargs: dict, given: dict, *, echo: Callable) -> bool:
    """A grid of runs; returns True if a cell failed."""

    kwargs = dict(kwargs)
    methods = [m for m in kwargs.pop("method").split(",") if m]
    workloads = [w for w in kwargs.pop("workload").split(",") if w]
    gpus, seeds, dry_run = kwargs.pop("gpus"), kwargs.pop("seed"), kwargs.pop("dry_run")
    force = kwargs.pop("force", False)
    if kwargs["launcher"] not in ("auto", "local"):
        raise BenchError("bench sweep launches its cells here (--launcher local); for a "
                         "cluster, submit `bench run --launcher slurm` per cell")
    kwargs["launcher"] = "local"
    catalogue = METHODS.option_catalogue()
    grid = {name: option_values(catalogue[name][0], value) for name, value in given.items()}
    first = {**kwargs, schema.METHOD: methods[0], schema.WORKLOAD: workloads[0]}
    base = RunConfig.from_flags(first, {}, gpus[0])
    cells = expand(base, workloads, methods, gpus, seeds, grid)
    data_checked: set[tuple] = set()  # each dataset read once here, none on a dry run
    for cell in cells:
        cell.plan = plan_run(local_config(cell.config))
        data = (cell.plan.dataset, cell.config.data_dir, cell.config.seed)
        validate(cell.plan, existing_folder_ok=True,  # the sweep skips, resumes or moves them
                 check_data=not dry_run and data not in data_checked)
        data_checked.add(data)
        checked_checkpoint(Path(base.results_dir) / cell.run_id)  # one it would resume
    if dry_run:
        for cell in cells:
            echo(f"{cell.run_id}  {cell.config.options}")
        return False
    launch = launch_emulated if base.network == "emulated" else launch_local
    try:
        run_cells(cells, Path(base.results_dir), launch, force=force)
    finally:  # an interrupted sweep still prints where every cell stands
        for line in summary_lines(cells):
            echo(line)
    return any(cell.status == CellStatus.FAILED for cell in cells)


def option_values(opt, value) -> list:
    """A sweep axis: ``"0.3,0.5"`` (or one flag value: booleans are not axes) as the
    option's typed values."""
    if isinstance(value, bool):
        return [value]
    return [opt.convert(v.strip()) for v in str(value).split(",") if v.strip()]


def config_defaults() -> dict:
    """RunConfig's fields at their defaults, as ``bench run``'s keyword arguments."""
    return {field.name: field.default for field in dataclasses.fields(RunConfig)
            if field.default is not dataclasses.MISSING}


def rerun_arguments(run_dir: str, *, results_dir: str | None, run_id: str | None,
                    dry_run: bool) -> dict:
    """``bench rerun``: the recorded run's configuration (its manifest) as ``bench run``'s
    arguments, into a new folder beside it unless ``results_dir`` says otherwise."""

    # a key an older (or damaged) manifest lacks runs at today's default, as a flag left out
    kwargs = {**config_defaults(), **read_experiment(Path(run_dir) / MANIFEST)}
    parent = str(Path(run_dir).resolve().parent)
    kwargs.update(results_dir=results_dir or parent, run_id=run_id, dry_run=dry_run)
    kwargs.update(gpus=[kwargs["gpus"]], resume=None, overwrite=False)
    return kwargs
