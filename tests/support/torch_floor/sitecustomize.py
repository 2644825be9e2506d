"""Makes the torch of this process look like the floor release (2.11) that the suite
supports: the APIs named in ``PRUNEX_HIDE_TORCH_APIS`` (comma-separated keys of ``HIDERS``,
or ``all``) are removed when Python starts.

Why a ``sitecustomize``: Python imports it at the start of every process whose path holds
its folder, so a test that puts this folder on ``PYTHONPATH`` hides the APIs in the ``bench``
process, the elastic agent and every rank it spawns alike, before any of them imports the
suite. Without the variable it does nothing; a ``sitecustomize`` it shadows is still run.
Self-contained (the test's processes may not have the repository on their path).
"""

from __future__ import annotations

import os


def _hide_all_gather_single() -> None:
    """Gone from ``torch.distributed``, the namespace the suite calls; torch's own modules
    import it from ``distributed_c10d``, where it stays (they are newer than 2.11 too)."""
    import torch.distributed as dist

    if hasattr(dist, "all_gather_single"):
        delattr(dist, "all_gather_single")


def _hide_set_timeout() -> None:
    import torch.distributed as dist

    if hasattr(dist, "set_timeout"):
        delattr(dist, "set_timeout")


def _hide_launch_shutdown_timeout() -> None:
    """2.11's LaunchConfig has no ``shutdown_timeout``; its agent waits a fixed 30 s. Newer
    agents read the field, so it stays, but no longer as an argument (it takes 2.12's
    default, ``TORCH_ELASTIC_SHUTDOWN_TIMEOUT`` else 30)."""
    import dataclasses

    import torch.distributed.launcher as launcher
    from torch.distributed.launcher import api

    @dataclasses.dataclass
    class LaunchConfig(api.LaunchConfig):
        shutdown_timeout: int | None = dataclasses.field(default=None, init=False)

    LaunchConfig.__module__ = api.LaunchConfig.__module__
    api.LaunchConfig = launcher.LaunchConfig = LaunchConfig


def _hide_ddp_forward_sync_buffers() -> None:
    import inspect

    import torch.nn.parallel as parallel
    from torch.nn.parallel import distributed

    original = distributed.DistributedDataParallel
    signature = inspect.signature(original)

    class DistributedDataParallel(original):
        def __init__(self, *args, **kwargs):
            if "forward_sync_buffers" in kwargs:
                raise TypeError("DistributedDataParallel.__init__() got an unexpected keyword "
                                "argument 'forward_sync_buffers'")
            super().__init__(*args, **kwargs)

    DistributedDataParallel.__signature__ = signature.replace(parameters=[
        p for p in signature.parameters.values() if p.name != "forward_sync_buffers"])
    parallel.DistributedDataParallel = DistributedDataParallel
    distributed.DistributedDataParallel = DistributedDataParallel


#: suite.compat.NEWER_APIS key -> what removes it (tests/test_compat.py checks they match)
HIDERS = {
    "torch.distributed.all_gather_single": _hide_all_gather_single,
    "torch.distributed.set_timeout": _hide_set_timeout,
    "torch.distributed.launcher.api.LaunchConfig.shutdown_timeout": _hide_launch_shutdown_timeout,
    "torch.nn.parallel.DistributedDataParallel.forward_sync_buffers":
        _hide_ddp_forward_sync_buffers,
}


def _hide(names: str) -> None:
    chosen = list(HIDERS) if names.strip() == "all" else [n.strip() for n in names.split(",")]
    for name in chosen:
        HIDERS[name]()  # an unknown name fails the process at start: the test is wrong


def _run_shadowed() -> None:
    """The ``sitecustomize`` this one shadows (the next on the path), if any."""
    import importlib.machinery
    import importlib.util
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("PRUNEX_HIDE_TORCH_APIS"):
    _hide(os.environ["PRUNEX_HIDE_TORCH_APIS"])
_run_shadowed()
