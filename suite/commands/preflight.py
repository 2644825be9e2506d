"""What a ``bench run`` will do, checked and described before any rank starts.

Every check that can fail on the user's input runs here, in the parent, so a mistake costs
one line on stderr and no run folder; ``describe`` is what ``--dry-run`` prints.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import torch

from suite.cluster.netemu import check_privileges, parse_rate
from suite.cluster.ranks import ranks_on_cuda, ranks_per_gpu
from suite.cluster.topology import check_layout
from suite.config import RunConfig
from suite.data.datasets import dataset_spec, load_data, split_sizes
from suite.data.workload import example_input
from suite.errors import BenchError
from suite.plugins.method import RoundSettings
from suite.plugins.options import POSITIVE, Check, check_value, settings_dict
from suite.plugins.registry import METHODS
from suite.results.folder import MANIFEST, SUMMARY
from suite.run.build import count_iterations, method_settings, resolve_workload
from suite.structured.masks import StructuredKeepSettings
from suite.structured.structures import check_structure

#: a run id names one folder inside --results-dir: no separators, no "..", no hidden names
SAFE_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

#: RunConfig field -> its range (run length, recipe overrides, reliability)
RECIPE_CHECKS = {
    **dict.fromkeys(("iterations", "epochs", "eval_every", "batch_size", "lr"), POSITIVE),
    "momentum": Check(lambda v: 0 <= v < 1, "in [0, 1)"),
    "weight_decay": Check(lambda v: v >= 0, "at least 0"),
    "warmup_epochs": Check(lambda v: v >= 0, "at least 0"),
    **dict.fromkeys(("checkpoint_every", "checkpoint_minutes", "collective_timeout"), POSITIVE),
    "max_restarts": Check(lambda v: v >= 0, "at least 0"),
    "bn_recalibrate": Check(lambda v: v >= 0, "at least 0"),
}

#: what one CPU rank holds besides its data and model: the interpreter with torch, timm and
#: gloo loaded (measured: 0.55-0.6 GiB RSS per cnn-fmnist rank before its data)
RANK_BASE_BYTES = int(0.55 * 2**30)
#: copies of the parameters a rank keeps (weights, gradients, momentum; PruneX's z, z_i, u,
#: v and consensus; the evaluation copy), an upper bound over the methods
PARAMETER_COPIES = 10

#: what a CUDA context and torch's kernels take on a GPU before any tensor (torch's CUDA
#: context is typically 0.3-0.6 GiB; the upper end, so the guard errs toward refusing)
CUDA_CONTEXT_BYTES = int(0.6 * 2**30)

#: files that mean a run folder is in use (a SLURM script and its logs do not)
RUN_FILES = (MANIFEST, SUMMARY, "parts", "iterations.parquet")

#: launcher -> the flags that only it reads
LAUNCHER_FLAGS = {
    "slurm": (
        "slurm_partition",
        "slurm_account",
        "slurm_time",
        "slurm_cpus_per_task",
        "slurm_signal_lead",
    ),
    "sim": ("profile", "replay", "accuracy_from"),
}


def refuse_foreign_flags(launcher: str, given: dict) -> None:
    """A flag of another launcher is an error, not silently ignored."""
    for owner, names in LAUNCHER_FLAGS.items():
        if owner == launcher:
            continue
        used = [n for n in names if given.get(n) is not None]
        if used:
            flags = ", ".join("--" + n.replace("_", "-") for n in used)
            raise BenchError(f"{flags} only applies to --launcher {owner}, not {launcher}")


def split_options(method: str, given: dict) -> tuple[dict, list[str]]:
    """(the options ``method`` reads, converted to their types; the flags of the others).

    Converted here so a run records ``{"local_steps": 4}`` whether the 4 came from a flag, a
    file or a manifest, and runs of one configuration match in ``bench compare``."""

    mine = {o.name: o for o in METHODS.get(method).options}
    kept = {k: mine[k].convert(v) for k, v in given.items() if k in mine}
    return kept, ["--" + k.replace("_", "-") for k in given if k not in mine]


def validate(
    config: RunConfig, *, check_data: bool = True, existing_folder_ok: bool = False
) -> None:
    """Catch bad input here, in one line, before any rank is spawned."""

    _, _, dataset = resolve_workload(config)
    settings = method_settings(config)  # converts and range-checks every method option
    if config.run_id is not None and (
        not SAFE_RUN_ID.fullmatch(config.run_id) or ".." in config.run_id
    ):
        raise BenchError(
            f"--run-id {config.run_id!r} must be one folder name (letters, digits, '.', '_', "
            "'-'; no '/' or '..')"
        )
    if config.gpus_per_node is not None:
        check_layout(config.gpus, config.gpus_per_node)
    if config.inter_bw is not None and config.network != "emulated":
        raise BenchError("--inter-bw needs --network emulated")
    if config.network == "emulated":
        if config.inter_bw is None:
            raise BenchError("--network emulated needs --inter-bw, e.g. 1gbit or 200mbit")
        parse_rate(config.inter_bw)
        if config.gpus_per_node is None or config.gpus // config.gpus_per_node < 2:
            raise BenchError("--network emulated needs at least two nodes (--gpus-per-node)")
        check_privileges()
    for name, check in RECIPE_CHECKS.items():
        value = getattr(config, name)
        if value is not None:
            check_value("--" + name.replace("_", "-"), value, check)
    if config.launcher in ("local", "torchrun", "slurm"):
        check_run_folder(config, existing_ok=existing_folder_ok)
    model = model_on_meta_device(config, dataset)
    if hasattr(settings, "check_model") and model is not None:
        settings.check_model(model)  # the method's own checks, e.g. PruneX's --masks-from
    if isinstance(settings, StructuredKeepSettings):
        check_structure_once(config, dataset, settings)
    if config.launcher == "local":
        if ranks_on_cuda(config.device, config.gpus):
            check_gpu_memory(config, dataset, model)
        else:
            check_memory(config, dataset, model)
    if not check_data:  # the simulator reads no data
        return
    load_data(
        dataset,
        data_dir=config.data_dir,
        download=config.download,
        seed=config.seed,
        synthetic_size=config.synthetic_size,
    )


def check_run_folder(config: RunConfig, *, existing_ok: bool = False) -> None:
    """The results folder is (or can be made) a writable folder, and the run folder is new,
    or given to --resume, or to be emptied (--overwrite). Creates nothing: a dry run too
    passes through here."""
    root = Path(config.results_dir)
    existing = next(p for p in (root, *root.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "a file is in the way" if not existing.is_dir() else "no write permission"
        raise BenchError(f"--results-dir {root} is not a writable folder ({why}: {existing})")
    if config.run_id is None or existing_ok:
        return
    folder = root / config.run_id
    in_use = folder.is_dir() and any((folder / name).exists() for name in RUN_FILES)
    if in_use and not (config.resume or config.overwrite):
        raise BenchError(
            f"run folder {folder} already holds a run; give another --run-id, --overwrite to "
            f"replace it, or --resume {folder} to continue it"
        )
    if folder.exists() and not folder.is_dir():
        raise BenchError(f"run folder {folder} is a file")


#: (workload, dataset, what is traced) already checked in this process (a sweep's cells)
_STRUCTURES_CHECKED: set[tuple] = set()


def check_structure_once(config: RunConfig, dataset: str, settings) -> None:
    """The model's structured groups traced here, once per workload, dataset and keeps in
    this process: an untraceable model or a keep that prunes nothing is one line now, not
    a failed run after the ranks started (suite.structured.structures)."""

    key = (config.workload, dataset, tuple(settings.keeps.items()), getattr(settings, "pack", None))
    if key in _STRUCTURES_CHECKED:
        return
    workload, _, _ = resolve_workload(config)
    spec = dataset_spec(dataset)
    torch.manual_seed(config.seed)
    model = workload.build_model(spec)
    check_structure(settings, model, example_input(spec), config.workload)
    _STRUCTURES_CHECKED.add(key)


#: (workload, dataset) -> its model on the meta device, built once in this process (a grid's
#: cells share it: ResNet-152 takes about 1.4 s to build even without storage)
_META_MODELS: dict[tuple, object] = {}


def model_on_meta_device(config: RunConfig, dataset: str):
    """The run's model with shapes but no storage (for checks, which only read it), or None
    if it cannot be built that way."""

    key = (config.workload, dataset)
    if key not in _META_MODELS:
        workload, _, _ = resolve_workload(config)
        try:
            with torch.device("meta"):
                _META_MODELS[key] = workload.build_model(dataset_spec(dataset))
        except Exception:  # a model that insists on real storage is checked by the ranks
            _META_MODELS[key] = None
    return _META_MODELS[key]


def available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (Linux), else None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def sample_bytes(dataset: str) -> int:
    """Bytes of one float32 image of ``dataset``."""

    spec = dataset_spec(dataset)
    return spec.in_chans * spec.image_size**2 * 4


def parameter_bytes(model) -> int:
    """PARAMETER_COPIES fp32 copies of ``model``'s parameters (none known: 0)."""
    return (
        PARAMETER_COPIES * 4 * sum(p.numel() for p in model.parameters())
        if model is not None
        else 0
    )


def rank_memory_estimate(config: RunConfig, dataset: str, model) -> int:
    """Bytes one CPU rank needs: base, the whole dataset as float32 (every rank loads it and
    keeps its shard), and the parameter copies."""

    samples = sum(split_sizes(dataset, config.synthetic_size))
    return RANK_BASE_BYTES + samples * sample_bytes(dataset) + parameter_bytes(model)


def check_memory(config: RunConfig, dataset: str, model) -> None:
    """Refuse, in one line, local CPU ranks that cannot fit in this machine's memory: they
    would be OOM-killed one by one, minutes in."""
    available = available_memory()
    if available is None:
        return
    each = rank_memory_estimate(config, dataset, model)
    need = config.gpus * each
    if need > 0.9 * available:
        gib = 2**30
        raise BenchError(
            f"{config.gpus} local CPU ranks need about {need / gib:.1f} GiB "
            f"({each / gib:.2f} GiB each), this machine has {available / gib:.1f} GiB "
            "available; use fewer --gpus, --launcher slurm on a cluster, or --launcher sim "
            "to simulate it"
        )


def activation_bytes(model, dataset: str, batch_size: int) -> int:
    """Bytes of every leaf module's output for one batch, from a forward pass on the meta
    device (no storage): what backward keeps of the activations, about."""

    spec = dataset_spec(dataset)
    total = 0

    def count(_module, _inputs, output):
        nonlocal total
        if isinstance(output, torch.Tensor):
            total += output.numel() * output.element_size()

    leaves = [m for m in model.modules() if not any(True for _ in m.children())]
    hooks = [m.register_forward_hook(count) for m in leaves]
    try:
        with torch.device("meta"), torch.no_grad():
            model(torch.empty(batch_size, spec.in_chans, spec.image_size, spec.image_size))
    except Exception:  # a model meta tensors cannot run: its activations go uncounted
        total = 0
    finally:
        for hook in hooks:
            hook.remove()
    return total


def gpu_rank_memory_estimate(config: RunConfig, dataset: str, model) -> int:
    """Bytes one CUDA rank needs on its GPU: the CUDA context, the parameter copies (weights,
    gradients, momentum and what the method keeps), the activations of a batch and their
    gradients, and the rank's resident data shard."""

    _, recipe, _ = resolve_workload(config)
    train, _ = split_sizes(dataset, config.synthetic_size)
    shard = train // config.gpus * sample_bytes(dataset)
    activations = activation_bytes(model, dataset, recipe.batch_size) if model is not None else 0
    return CUDA_CONTEXT_BYTES + parameter_bytes(model) + 2 * activations + shard


def free_gpu_memory(count: int) -> list[int]:
    """Free bytes of the first ``count`` GPUs (``torch.cuda.mem_get_info``), read in a child
    process: a CUDA context made here would hold 0.3-0.6 GiB of every GPU for as long as
    this launcher lives, which is the whole run."""
    code = (
        "import sys, torch; "
        "print(*(torch.cuda.mem_get_info(i)[0] for i in range(int(sys.argv[1]))))"
    )
    probe = subprocess.run([sys.executable, "-c", code, str(count)], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or [f"exit code {probe.returncode}"])[-1]
        raise BenchError(f"cannot read the GPUs' free memory ({why[:200]}); check the CUDA "
                         "driver with nvidia-smi")
    return [int(free) for free in probe.stdout.split()]


def check_gpu_memory(config: RunConfig, dataset: str, model) -> None:
    """Refuse, in one line, local CUDA ranks that cannot fit in their GPUs' free memory
    (``torch.cuda.mem_get_info``), ranks that share a GPU counted together: they would fail
    with an out-of-memory error after setup, or one by one mid-run."""

    gpus = torch.cuda.device_count()
    if not gpus:
        return  # --device cuda without CUDA is refused by the ranks, in one line
    sharing = ranks_per_gpu(config.gpus, gpus)
    free = min(free_gpu_memory(min(gpus, config.gpus)))
    each = gpu_rank_memory_estimate(config, dataset, model)
    if sharing * each > 0.95 * free:
        gib = 2**30
        raise BenchError(
            f"{config.gpus} CUDA ranks ({sharing} per GPU) need about "
            f"{sharing * each / gib:.1f} GiB per GPU ({each / gib:.2f} GiB each), the GPUs have "
            f"{free / gib:.1f} GiB free; use fewer --gpus, a smaller --batch-size, or --launcher "
            "slurm on a cluster"
        )


def describe(config: RunConfig, run_dir: Path | str) -> str:
    """The ``--dry-run`` plan: ranks and nodes, data, recipe, method settings, run folder."""

    _, recipe, dataset = resolve_workload(config)
    settings = method_settings(config)
    gpn = config.gpus_per_node
    layout = f"{config.gpus // gpn} node(s) x {gpn}" if gpn else "nodes discovered from the job"
    lines = [
        f"method      {config.method}",
        f"workload    {config.workload} on {dataset}",
        f"ranks       {config.gpus} ({layout}); launcher {config.launcher}, "
        f"device {config.device}, network {config.network}"
        + (f" {config.inter_bw}" if config.inter_bw else ""),
        f"recipe      batch {recipe.batch_size}/rank, lr {recipe.lr} ({recipe.lr_schedule}, "
        f"warmup {recipe.warmup_epochs:g} epochs), momentum {recipe.momentum}, weight decay "
        f"{recipe.weight_decay}",
    ]
    try:  # the iteration count needs the shard size, known without reading the data
        train_samples, _ = split_sizes(dataset, config.synthetic_size)
        steps_per_epoch = (train_samples // config.gpus) // recipe.batch_size
        rounds = isinstance(settings, RoundSettings)
        per_iteration = settings.steps_per_round(steps_per_epoch) if rounds else 1
        iterations = count_iterations(config, steps_per_epoch, per_iteration, recipe)
        lines.append(
            f"schedule    {iterations} iteration(s) of {per_iteration} local step(s); "
            f"{steps_per_epoch} steps per epoch per rank; seed {config.seed}"
        )
    except BenchError:
        pass
    if settings is not None:
        values = settings_dict(settings)
        lines.append("options     " + ", ".join(f"{k}={v}" for k, v in values.items()))
    lines.append(f"run folder  {run_dir}")
    return "\n".join(lines)
