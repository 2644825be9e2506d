"""Will a run's ranks fit on this machine? Memory estimates of one rank, on the CPU and on a
GPU, and the guards that refuse, in one line, local ranks that would be killed for memory
one by one, minutes in. Read by preflight for ``--launcher local``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from suite.data.datasets import DATASETS
from suite.data.shared import cache_usable
from suite.errors import BenchError
from suite.results.machine import ranks_per_gpu
from suite.run.plan import RunPlan

#: what one forked CPU rank adds to the machine besides its model's copies, a batch's
#: activations and its share of the data: its own pages of the interpreter, gloo's buffers,
#: the run's bookkeeping. The ranks are forked from one server that imported torch, so they
#: share its pages: this is PSS (a page shared by k processes counts 1/k), measured by
#: benchmarks/rank_memory.py on cnn-fmnist and Fashion-MNIST at 16 ranks (189.6 MiB per rank
#: at the run's peak, less its share of the data, the model's copies and the activations
#: this module charges apart; benchmarks/measured/rank_memory.md). Beyond 16 ranks the PSS
#: per rank only falls (121.9 MiB at 64), so the charge errs toward refusing. RSS, which
#: counts every shared page in every rank, is 4-7x more and was what this charged before.
RANK_BASE_BYTES = 128 * 2**20
#: what a rank of ``--network emulated`` adds instead: its node's torchrun agent starts it as a
#: new interpreter (spawn, not a fork of the server), so it holds torch's pages itself.
#: Measured the same way (benchmarks/rank_memory.py --network emulated, 16 ranks as 2 x 8):
#: 572.6 MiB PSS per rank against the forked rank's 189.6, so the base is 128 + 384 MiB
SPAWNED_RANK_BASE_BYTES = 512 * 2**20
#: one emulated node's torchrun agent: the launcher and two agents measured 1305.9 MiB of PSS
#: beside the forked run's 662.1 for the launcher and fork server, 322 MiB an agent; charged
#: a little more, so the check errs toward refusing
AGENT_BYTES = 336 * 2**20
#: the launcher and the fork server of a local run (PSS, measured with the ranks)
LAUNCHER_BYTES = 1024 * 2**20
#: copies of the parameters a rank keeps (weights, gradients, momentum; PruneX's z, z_i, u,
#: v and consensus; the evaluation copy), an upper bound over the methods
PARAMETER_COPIES = 10
#: what a CUDA context and torch's kernels take on a GPU before any tensor (torch's CUDA
#: context is typically 0.3-0.6 GiB; the upper end, so the guard errs toward refusing)
CUDA_CONTEXT_BYTES = int(0.6 * 2**30)
GIB = 2**30


#: (workload, dataset, image side) -> its model on the meta device, built once in this
#: process (a grid's cells share it: ResNet-152 takes about 1.4 s to build even without
#: storage)
_META_MODELS: dict[tuple, object] = {}


def model_on_meta_device(plan: RunPlan):
    """The run's model with shapes but no storage (for checks, which only read it), or None
    if it cannot be built that way."""
    key = (plan.workload.name, plan.dataset, plan.spec.image_size)
    if key not in _META_MODELS:
        try:
            with torch.device("meta"):
                _META_MODELS[key] = plan.workload.build_model(plan.spec)
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


def sample_bytes(plan: RunPlan) -> int:
    """Bytes of one float32 image of the plan's dataset, as it is held (at its own side: a
    batch is resized only where it is handed to the model)."""
    return plan.spec.in_chans * plan.input_size.dataset_side**2 * 4


def parameter_bytes(model) -> int:
    """PARAMETER_COPIES fp32 copies of ``model``'s parameters (none known: 0)."""
    return (
        PARAMETER_COPIES * 4 * sum(p.numel() for p in model.parameters())
        if model is not None
        else 0
    )


def data_bytes(plan: RunPlan) -> int:
    """The run's decoded dataset (train and test, float32)."""
    return (plan.train_samples + plan.test_samples) * sample_bytes(plan)


def shares_data(plan: RunPlan) -> bool:
    """Whether the ranks of a host map one decoded copy of the data (suite.data.shared):
    synthetic data and datasets that name their source files, where the host's cache can
    take the entry now; a plugin's dataset without sources, or a read-only or full cache,
    has every rank decode its own."""
    if plan.dataset != "synthetic" and DATASETS.get(plan.dataset).sources is None:
        return False
    return cache_usable(data_bytes(plan))


def spawned_ranks(plan: RunPlan) -> bool:
    """Whether the ranks start as new interpreters (``--network emulated``: one torchrun
    agent per emulated node) rather than forks of the launcher's server."""
    return plan.config.network == "emulated"


def rank_memory_estimate(plan: RunPlan, model) -> int:
    """Bytes one CPU rank adds: its base (``RANK_BASE_BYTES``, or ``SPAWNED_RANK_BASE_BYTES``
    for a rank that does not share the server's pages), the parameter copies, the
    activations of a batch and their gradients, and its own copy of the data where the
    dataset is not shared."""
    batch = plan.recipe.batch_size
    activations = 2 * activation_bytes(model, plan, batch) if model is not None else 0
    own_data = 0 if shares_data(plan) else data_bytes(plan)
    base = SPAWNED_RANK_BASE_BYTES if spawned_ranks(plan) else RANK_BASE_BYTES
    return base + parameter_bytes(model) + activations + own_data


def local_memory_estimate(plan: RunPlan, model) -> tuple[int, int]:
    """(bytes the whole local run needs, bytes per rank): the launcher and fork server (or
    the emulated nodes' agents), the host's one copy of a shared dataset, and every rank's
    own."""
    each = rank_memory_estimate(plan, model)
    shared = data_bytes(plan) if shares_data(plan) else 0
    launcher = LAUNCHER_BYTES
    if spawned_ranks(plan):
        launcher += AGENT_BYTES * (plan.config.gpus // plan.config.gpus_per_node)
    return launcher + shared + plan.config.gpus * each, each


def check_memory(plan: RunPlan, model) -> None:
    """Refuse, in one line, local CPU ranks that cannot fit in this machine's memory: they
    would be OOM-killed one by one, minutes in."""
    available = available_memory()
    if available is None:
        return
    gpus = plan.config.gpus
    need, each = local_memory_estimate(plan, model)
    if need > 0.9 * available:
        raise BenchError(
            f"{gpus} local CPU ranks need about {need / GIB:.1f} GiB ({each / GIB:.2f} GiB "
            f"each{', each started by its emulated node' if spawned_ranks(plan) else ''}, "
            "with the launcher and the host's one copy of the data), this machine has "
            f"{available / GIB:.1f} GiB available; use fewer --gpus, --launcher slurm on a "
            "cluster, or --launcher sim to simulate it"
        )


def activation_bytes(model, plan: RunPlan, batch_size: int) -> int:
    """Bytes of every leaf module's output for one batch, from a forward pass on the meta
    device (no storage): what backward keeps of the activations, about."""

    spec = plan.spec
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


def gpu_rank_memory_estimate(plan: RunPlan, model) -> int:
    """Bytes one CUDA rank needs on its GPU: the CUDA context, the parameter copies (weights,
    gradients, momentum and what the method keeps), the activations of a batch and their
    gradients, and the rank's resident data shard."""
    shard = plan.train_samples // plan.config.gpus * sample_bytes(plan)
    batch = plan.recipe.batch_size
    activations = activation_bytes(model, plan, batch) if model is not None else 0
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


def check_gpu_memory(plan: RunPlan, model) -> None:
    """Refuse, in one line, local CUDA ranks that cannot fit in their GPUs' free memory
    (``torch.cuda.mem_get_info``), ranks that share a GPU counted together: they would fail
    with an out-of-memory error after setup, or one by one mid-run."""

    gpus = torch.cuda.device_count()
    if not gpus:
        return  # --device cuda without CUDA is refused by the ranks, in one line
    ranks = plan.config.gpus
    sharing = ranks_per_gpu(ranks, gpus)
    free = min(free_gpu_memory(min(gpus, ranks)))
    each = gpu_rank_memory_estimate(plan, model)
    if sharing * each > 0.95 * free:
        raise BenchError(
            f"{ranks} CUDA ranks ({sharing} per GPU) need about {sharing * each / GIB:.1f} GiB "
            f"per GPU ({each / GIB:.2f} GiB each), the GPUs have {free / GIB:.1f} GiB free; "
            "use fewer --gpus, a smaller --batch-size, or --launcher slurm on a cluster"
        )
