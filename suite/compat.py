"""The torch releases the suite supports, and the one place where their differences live.

The suite supports torch from ``FLOOR`` (2.11) on, with no upper pin: a GPU machine or a
cluster's container brings its own torch, and the suite runs on it. Every torch API newer
than the floor is reached through this module only, detected where it is used (``hasattr``,
a dataclass's fields, a signature) and replaced by what the floor has. A torch older than the
floor is refused in one line when ``bench`` starts (``require_supported_torch``).

Newer than 2.11, with their fallbacks (``NEWER_APIS``; tests/test_compat.py hides each one
in every process of a run and checks the results are the same):

- ``torch.distributed.all_gather_single`` (2.13): ``all_gather_into_tensor``, the same
  collective on a flat output of n pieces (``all_gather_single``).
- ``torch.distributed.set_timeout`` (2.14): ``distributed_c10d._set_pg_timeout``, the same
  function under its older, private name (``set_timeout``).
- ``LaunchConfig(shutdown_timeout=...)`` (2.12; read from ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``
  when not given): left out, so the agent gives stopped ranks its fixed 30 s before SIGKILL
  (2.11's LocalElasticAgent reads neither the field nor the variable)
  (``elastic_launch_config``).
- ``DistributedDataParallel(forward_sync_buffers=False)`` (after 2.11; present in 2.13):
  ``broadcast_buffers=False``, which 2.14 deprecates. Both keep BN statistics local in the
  forward; 2.11's also skips the buffers' broadcast at construction, where every rank's
  buffers are equal anyway (built from one seed) (``ddp_local_buffers``).

Checked against 2.11.0+cu130 (the wheel the lent GPU machines run, its Python sources and
signatures): every torch and torchvision name below, which is every one the code of suite/,
methods/, baselines/, workloads/, benchmarks/, tests/, tools/ and noxfile.py names (found by
``python tools/torch_apis.py --list``; ``python tools/torch_apis.py`` under a torch checks
each name's presence and the keywords passed to it). Result: all present, with every keyword
passed, except the four above. The check follows keywords passed through ``**`` (a dict
literal, a local dict, a project function's returned dict, a function's ``**kwargs`` from its
callers) and the methods called on what a torch call returned, where torch declares its
type (``torch.cuda.Event().record``, ``all_reduce().get_future().then``); under the floor's
look-alike (tests/support/torch_floor) it lists exactly the four above.

    torch: Generator, Size, Tensor, __version__, _foreach_add, _foreach_add_, _foreach_copy_,
        _foreach_div, _foreach_lerp_, _foreach_mul_, _foreach_norm, _foreach_sub,
        _foreach_sub_, allclose,
        arange, are_deterministic_algorithms_enabled, as_tensor, bfloat16, bincount, bool,
        cat, channels_last, device, div, dtype, empty, empty_like, equal, float16, float32,
        float64, from_numpy, full, get_float32_matmul_precision, get_num_threads, get_rng_state,
        inference_mode, int8, int32, int64, is_deterministic_algorithms_warn_only_enabled,
        is_tensor, isin, linspace, load, long, manual_seed,
        maximum, nextafter, no_grad, nonzero, ones, ones_like, rand, randint, randn, randperm, relu,
        save, set_num_threads, set_rng_state, sigmoid, sin, sort, split, stack, tensor, topk,
        uint8, unique, use_deterministic_algorithms, where, zeros, zeros_like
    torch._utils: _flatten_dense_tensors, _unflatten_dense_tensors
    torch.autograd: grad
    torch.backends.cpu: get_cpu_capability
    torch.backends.cuda.matmul: allow_tf32
    torch.backends.cudnn: allow_tf32, benchmark, deterministic, is_available, version
    torch.cuda: Event, _sleep, current_stream, device, device_count, get_device_name,
        get_device_properties, get_rng_state, is_available, set_device, set_rng_state,
        Stream, stream, synchronize
    torch.cuda.nccl: version
    torch.distributed: HashStore, PrefixStore, TCPStore, all_gather, all_gather_into_tensor,
        all_gather_object, all_gather_single (2.13: fallback), all_reduce, barrier,
        broadcast, broadcast_object_list, destroy_process_group, get_backend,
        get_process_group_ranks, get_rank, get_world_size, init_process_group,
        is_initialized, new_group, set_timeout (2.14: fallback)
    torch.distributed.ReduceOp: MAX, SUM
    torch.distributed.algorithms.ddp_comm_hooks.default_hooks: allreduce_hook, bf16_compress_hook,
        fp16_compress_hook
    torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook: PowerSGDState, _should_compress,
        powerSGD_hook
    torch.distributed.algorithms.model_averaging.hierarchical_model_averager:
        HierarchicalModelAverager
    torch.distributed.algorithms.model_averaging.utils: get_params_to_average
    torch.distributed.checkpoint: DefaultLoadPlanner, FileSystemReader, load, save
    torch.distributed.checkpoint.api: CheckpointException
    torch.distributed.checkpoint.filesystem: _StorageInfo
    torch.distributed.checkpoint.metadata: BytesStorageMetadata, ChunkStorageMetadata, Metadata,
        MetadataIndex, StorageMeta, TensorProperties, TensorStorageMetadata (read from torch's
        sources, not yet on a 2.11 wheel: StorageMeta is in DCP since 2.4, the others and
        DefaultLoadPlanner, CheckpointException, _StorageInfo since 2.0; ``load(storage_reader=,
        checkpoint_id=)`` since 2.2)
    torch.distributed.distributed_c10d: _set_pg_timeout, default_pg_nccl_timeout,
        default_pg_timeout
    torch.distributed.elastic.multiprocessing: DefaultLogsSpecs
    torch.distributed.elastic.multiprocessing.api: SignalException
    torch.distributed.elastic.multiprocessing.errors: ChildFailedError
    torch.distributed.group: WORLD
    torch.distributed.launcher.api: LaunchConfig (shutdown_timeout: 2.12, fallback),
        elastic_launch
    torch.futures: Future
    torch.fx.experimental.optimization: fuse
    torch.multiprocessing: set_forkserver_preload, spawn, start_processes
    torch.nn: AdaptiveAvgPool2d, BatchNorm2d, Conv2d, CrossEntropyLoss, CrossMapLRN2d,
        Flatten, GroupNorm, Hardswish, Identity, InstanceNorm2d, LayerNorm, Linear,
        LocalResponseNorm, MaxPool2d, Module, ModuleList, Parameter, ReLU, RMSNorm,
        Sequential, Conv2d.forward
    torch.nn.functional: conv2d, cross_entropy, interpolate, pad, relu
    torch.nn.init: kaiming_normal_
    torch.nn.modules.batchnorm: _BatchNorm
    torch.nn.parallel: DistributedDataParallel (forward_sync_buffers: after 2.11, fallback)
    torch.optim: LBFGS, Optimizer, SGD
    torch.optim.swa_utils: update_bn
    torch.random: fork_rng
    torch.serialization: _get_layout (read from torch's sources: in torch/serialization.py since
        1.x, the name DCP's metadata unpickles layouts by)
    torch.testing: assert_close
    torch.utils.flop_counter: FlopCounterMode
    torch.utils.tensorboard: SummaryWriter
    torch.version: cuda
    torchvision: __version__
    torchvision.datasets: CIFAR10, FashionMNIST
    torchvision.datasets.VisionDataset: __init__
    torchvision.models: get_model, get_model_weights, list_models (in torchvision since 0.14;
        2.11's is 0.26)

A name the code starts to use must be added here after it is checked under the floor's torch
(tests/test_compat.py fails until it is); one the floor lacks gets a function here.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import sys
from functools import cache

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

#: the oldest torch release the suite supports (pyproject.toml's ``torch>=`` says the same)
FLOOR = (2, 11)

def release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string: ``2.11.0+cu130``, ``2.11.0a0+git12ab``
    (a container's build of the 2.11 branch counts as 2.11)."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def unsupported_torch(version: str | None = None) -> str | None:
    """The one line that refuses a torch older than ``FLOOR`` (``version``, default the one
    imported); None when it is supported."""
    version = version or torch.__version__
    if release(version) >= FLOOR:
        return None
    floor = ".".join(map(str, FLOOR))
    return (f"torch {version} is older than {floor}, the oldest the suite supports: install "
            f"torch>={floor} (pip install -c constraints.txt -e . gives this machine's pins)")


def require_supported_torch() -> None:
    """``bench`` starts with this: a torch older than the floor is one line on stderr and
    exit 2, not a TypeError from deep inside a rank."""
    line = unsupported_torch()
    if line is not None:
        print(f"Error: {line}", file=sys.stderr)
        sys.exit(2)


# -- torch.distributed ------------------------------------------------------------------------
def has_all_gather_single() -> bool:
    """Whether torch.distributed has ``all_gather_single`` (2.13)."""
    return hasattr(dist, "all_gather_single")


def all_gather_single(output: torch.Tensor, tensor: torch.Tensor, group=None) -> None:
    """Gather every rank's ``tensor`` into ``output`` (n pieces, flat), blocking.

    ``dist.all_gather_single`` where torch has it (2.13); else ``all_gather_into_tensor``,
    the same collective (NCCL and gloo gather into one flat buffer) under its older name.
    """
    if has_all_gather_single():
        dist.all_gather_single(output, tensor, group=group)
    else:
        dist.all_gather_into_tensor(output, tensor, group=group)


def has_set_timeout() -> bool:
    """Whether torch.distributed has ``set_timeout`` (2.14)."""
    return hasattr(dist, "set_timeout")


def set_timeout(timeout, group=None) -> None:
    """Change a process group's collective timeout (the default group's when ``group`` is
    None): ``dist.set_timeout`` where torch has it (2.14, which deprecates the older name),
    else ``distributed_c10d._set_pg_timeout``, the same function before it was public."""
    if has_set_timeout():
        dist.set_timeout(timeout, group)
    else:
        # the floor's private name, read only where the public one is missing
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timeout, group)


# -- torch elastic -----------------------------------------------------------------------------
@cache
def has_launch_shutdown_timeout() -> bool:
    """Whether torch elastic's ``LaunchConfig`` takes ``shutdown_timeout`` (2.12)."""
    # lazy: ~0.1 s to import; only the local launcher needs it
    from torch.distributed.launcher.api import LaunchConfig

    return any(f.name == "shutdown_timeout" and f.init for f in dataclasses.fields(LaunchConfig))


def elastic_launch_config(*, shutdown_timeout: int, **settings):
    """torch elastic's ``LaunchConfig(**settings)``, with ``shutdown_timeout`` (seconds the
    agent gives stopped ranks before SIGKILL) where torch takes it (2.12); on 2.11 the agent's
    fixed 30 s applies (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` is set too, for a release that
    reads the variable but lacks the field)."""
    # lazy: ~0.1 s to import; only the local launcher needs it
    from torch.distributed.launcher.api import LaunchConfig

    if has_launch_shutdown_timeout():
        settings["shutdown_timeout"] = shutdown_timeout
    else:
        os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(shutdown_timeout)
    return LaunchConfig(**settings)


# -- DistributedDataParallel -------------------------------------------------------------------
@cache
def has_ddp_forward_sync_buffers() -> bool:
    """Whether DistributedDataParallel takes ``forward_sync_buffers`` (after 2.11)."""
    return "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters


def ddp_local_buffers() -> dict:
    """DistributedDataParallel's keyword that keeps buffers (BN statistics) rank-local in the
    forward, on every supported torch: ``forward_sync_buffers=False`` where torch has it
    (``broadcast_buffers`` is deprecated there), else ``broadcast_buffers=False``.

    Returns:
        Keyword arguments for ``DistributedDataParallel``.

    Examples:
        ```python
        model = DistributedDataParallel(ctx.model, process_group=ctx.topology.world.pg,
                                        **ddp_local_buffers())
        ```
    """
    if has_ddp_forward_sync_buffers():
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


#: every API newer than the floor that the suite uses: the release that brought it, and how
#: it is detected (each has a fallback above)
NEWER_APIS = {
    "torch.distributed.all_gather_single": ("2.13", has_all_gather_single),
    "torch.distributed.set_timeout": ("2.14", has_set_timeout),
    "torch.distributed.launcher.api.LaunchConfig.shutdown_timeout": (
        "2.12", has_launch_shutdown_timeout),
    "torch.nn.parallel.DistributedDataParallel.forward_sync_buffers": (
        "2.13", has_ddp_forward_sync_buffers),
}


def fallbacks() -> list[str]:
    """The newer APIs this torch lacks, whose fallbacks a run uses (for the manifest)."""
    return [name for name, (_, present) in NEWER_APIS.items() if not present()]
