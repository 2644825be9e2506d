"""What a ``bench run`` will do, checked and described before any rank starts.

Every check that can fail on the user's input runs here, in the parent, so a mistake costs
one line on stderr and no run folder; ``describe`` is what ``--dry-run`` prints. It reads
the run's plan (``suite.run.plan``), resolved once before it; what the ranks need in memory
is suite.commands.capacity's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from suite.cluster.netemu import check_privileges
from suite.commands.capacity import check_gpu_memory, check_memory, model_on_meta_device
from suite.config import LAUNCHER_FLAGS, flag_of
from suite.data.datasets import load_data
from suite.data.input_size import GIVEN, fails_everywhere
from suite.data.workload import example_input
from suite.errors import BenchError
from suite.plugins.options import settings_dict
from suite.plugins.registry import METHODS
from suite.processes import single_threaded
from suite.results.folder import MANIFEST, SUMMARY
from suite.results.lock import check_free
from suite.results.machine import ranks_on_cuda
from suite.run.plan import RunPlan
from suite.structured.inspection import preflight_structure
from suite.structured.masks import StructuredKeepSettings

__all__ = ["LAUNCHER_FLAGS", "describe", "refuse_foreign_flags", "split_options", "validate"]

#: files that mean a run folder is in use (a SLURM script and its logs do not)
RUN_FILES = (MANIFEST, SUMMARY, "parts", "iterations.parquet")


def refuse_foreign_flags(launcher: str, given: dict) -> None:
    """A flag of another launcher is an error, not silently ignored."""
    for owner, names in LAUNCHER_FLAGS.items():
        if owner == launcher:
            continue
        used = [n for n in names if given.get(n) is not None]
        if used:
            flags = ", ".join(flag_of(n) for n in used)
            raise BenchError(f"{flags} only applies to --launcher {owner}, not {launcher}")


def split_options(method: str, given: dict) -> tuple[dict, list[str]]:
    """(the options ``method`` reads, converted to their types; the flags of the others).

    Converted here so a run records ``{"local_steps": 4}`` whether the 4 came from a flag, a
    file or a manifest, and runs of one configuration match in ``bench compare``."""

    mine = {o.name: o for o in METHODS.get(method).options}
    kept = {k: mine[k].convert(v) for k, v in given.items() if k in mine}
    return kept, [flag_of(k) for k in given if k not in mine]


def validate(plan: RunPlan, *, check_data: bool = True, existing_folder_ok: bool = False) -> None:
    """Catch what the plan cannot run on here, in one line, before any rank is spawned (the
    plan itself checked the configuration, the workload and the method's settings)."""

    config = plan.config
    if config.network == "emulated":
        check_privileges()
    if config.launcher in ("local", "torchrun", "slurm"):
        check_run_folder(plan, existing_ok=existing_folder_ok)
    model = model_on_meta_device(plan)
    if hasattr(plan.settings, "check_model") and model is not None:
        plan.settings.check_model(model)  # the method's own checks, e.g. PruneX's --masks-from
    if plan.input_size.chosen == GIVEN and not ranks_on_cuda(config.device, config.gpus):
        check_given_size(plan)
    if isinstance(plan.settings, StructuredKeepSettings):
        check_structure_once(plan)
    if config.launcher == "local":
        if ranks_on_cuda(config.device, config.gpus):
            check_gpu_memory(plan, model)
        else:
            check_memory(plan, model)
    if not check_data:  # the simulator reads no data
        return
    load_data(
        plan.dataset,
        data_dir=config.data_dir,
        download=config.download,
        seed=config.seed,
        synthetic_size=config.synthetic_size,
    )


def check_run_folder(plan: RunPlan, *, existing_ok: bool = False) -> None:
    """The results folder is (or can be made) a writable folder, and the run folder is new,
    or given to --resume, or to be emptied (--overwrite). Creates nothing: a dry run too
    passes through here."""
    config = plan.config
    root = Path(config.results_dir)
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "a file is in the way" if not existing.is_dir() else "no write permission"
        raise BenchError(f"--results-dir {root} is not a writable folder ({why}: {existing})")
    folder = root / plan.run_id
    if existing_ok:  # a sweep skips, resumes or moves its cells' folders, never a live one
        if folder.is_dir():
            check_free(folder)
        return
    in_use = folder.is_dir() and any((folder / name).exists() for name in RUN_FILES)
    if in_use and not (config.resume or config.overwrite):
        raise BenchError(
            f"run folder {folder} already holds a run; give another --run-id, --overwrite to "
            f"replace it, or --resume {folder} to continue it"
        )
    if folder.exists() and not folder.is_dir():
        raise BenchError(f"run folder {folder} is a file")
    if in_use:
        check_free(folder)  # --resume or --overwrite of a run that is still going


def check_given_size(plan: RunPlan) -> None:
    """``--image-size`` is taken as given (``suite.data.input_size``); CPU ranks are refused
    here, in one line, a size their model does not run on (on CUDA ranks the size is left to
    them: a model may run only there).

    Raises:
        BenchError: the model does not run on images of the given size.
    """
    spec, side = plan.spec, plan.input_size.model_side
    why = fails_everywhere(plan.workload, spec, side)
    if why:
        raise BenchError(f"{plan.config.workload} does not run on {spec.in_chans}x{side}x{side} "
                         f"images ({why}); give a size it takes (--image-size), or none: the "
                         "smallest it takes is found")


#: (workload, dataset, image side, what is traced) already checked in this process (a
#: sweep's cells)
_STRUCTURES_CHECKED: set[tuple] = set()


@single_threaded  # a batch of one image: a second thread only waits for a core
def check_structure_once(plan: RunPlan) -> None:
    """The model's structured groups traced here, once per workload, dataset and keeps in
    this process: an untraceable model or a keep that prunes nothing is one line now, not
    a failed run after the ranks started (suite.structured.structures)."""

    settings = plan.settings
    key = (plan.config.workload, plan.dataset, plan.spec.image_size,
           tuple(settings.keeps.items()), getattr(settings, "pack", None))
    if key in _STRUCTURES_CHECKED:
        return
    torch.manual_seed(plan.config.seed)
    model = plan.workload.build_model(plan.spec)
    _, untraced = preflight_structure(settings, model, example_input(plan.spec),
                                      plan.config.workload)
    if untraced:
        print(f"warning: {untraced}: --pack live sends only the masks' blocks, and bench "
              "export removes no channel", file=sys.stderr, flush=True)
    _STRUCTURES_CHECKED.add(key)


def data_source(plan: RunPlan) -> str:
    """Where the run's data would come from, said without reading it."""
    config = plan.config
    if plan.dataset == "synthetic":
        return "synthetic, generated once per host and shared by its ranks"
    where = f"--data-dir {config.data_dir}" if config.data_dir else "its default place"
    return f"{plan.dataset} from {where}" + (" (--download)" if config.download else "")


def describe(plan: RunPlan, *, generated_run_id: bool = False) -> str:
    """The ``--dry-run`` plan: ranks and nodes, data, recipe, schedule against the budget,
    method settings, run folder."""

    config, recipe = plan.config, plan.recipe
    gpn = config.gpus_per_node
    layout = f"{plan.nodes} node(s) x {gpn}" if gpn else "nodes discovered from the job"
    lines = [
        f"method      {config.method}" + (f" (plugin {plan.method.plugin})"
                                          if plan.method.plugin else ""),
        f"workload    {config.workload} on {plan.dataset} ({plan.spec.in_chans}x"
        f"{plan.spec.image_size}x{plan.spec.image_size}, {plan.spec.num_classes} classes; "
        f"{plan.train_samples} train, {plan.test_samples} test samples)"
        + (f"; {plan.input_size.describe(config.workload)}" if plan.input_size.resized else ""),
        f"data        {data_source(plan)}: not read (dry run)",
        f"ranks       {config.gpus} ({layout}); launcher {config.launcher}, "
        f"device {config.device}" + (" (deterministic kernels)" if config.deterministic else "")
        + f", network {config.network}" + (f" {config.inter_bw}" if config.inter_bw else ""),
        f"recipe      batch {recipe.batch_size}/rank, lr {recipe.lr} ({recipe.lr_schedule}, "
        f"warmup {recipe.warmup_epochs:g} epochs), momentum {recipe.momentum}, weight decay "
        f"{recipe.weight_decay}",
        f"schedule    {plan.schedule.describe()}; seed {config.seed}",
    ]
    if plan.settings is not None:
        values = settings_dict(plan.settings)
        lines.append("options     " + ", ".join(f"{k}={v}" for k, v in values.items()))
    run_dir = Path(config.results_dir) / plan.run_id
    note = " (the id is new on each call: --run-id fixes it)" if generated_run_id else ""
    lines.append(f"run folder  {run_dir}{note}")
    lines.append(f"plan        {plan.digest}")
    return "\n".join(lines)
