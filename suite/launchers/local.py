"""The ranks of a run on this machine, or as they already are inside a job.

``local`` starts N ranks on this machine through torch's elastic launcher (CUDA devices when
there are at least N, else CPU ranks on gloo with one thread each), forked from a fork
server that imported the ranks' libraries once (``suite.cluster.ranks.rank_start_method``).
``torchrun`` means the ranks already exist (RANK/WORLD_SIZE set by torchrun, or SLURM
variables by srun) and this process is one of them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from suite.cluster.netemu import (
    check_privileges,
    emulated_cluster,
    parse_rate,
    run_module_in_cluster,
)
from suite.cluster.ranks import elastic_launch_config, ranks_on_cuda
from suite.config import RunConfig
from suite.errors import BenchError, RunFailed, RunInterrupted
from suite.results.folder import RunFolder, identity_summary
from suite.run.entry import rank_main
from suite.run.plan import RunPlan

LOCAL_GPUS_PER_NODE = 4  # the paper's nodes


def in_distributed_job() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def adopt_slurm_environment() -> bool:
    """Map srun's per-task variables onto torch's, so one srun task per GPU just works.
    ``bench run`` in a multi-node allocation but outside srun and torchrun (it would use the
    first node only) is refused in one line."""
    if in_distributed_job():
        return True
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    if "SLURM_JOB_ID" in os.environ and "SLURM_STEP_ID" not in os.environ and nodes > 1:
        raise BenchError(
            f"inside a SLURM allocation of {nodes} nodes but not in a job step: run it under "
            "srun (one task per GPU) or torchrun, or submit it with --launcher slurm; "
            "--launcher local uses this node only"
        )
    if "SLURM_PROCID" not in os.environ:
        return False
    if int(os.environ.get("SLURM_NTASKS", "1")) < 2:
        return False
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    os.environ["LOCAL_WORLD_SIZE"] = str(slurm_tasks_on_this_node())
    if "MASTER_ADDR" not in os.environ:
        raise BenchError(
            "inside a SLURM allocation without MASTER_ADDR; export MASTER_ADDR=<first node> "
            "and MASTER_PORT before srun, or use the script from --launcher slurm"
        )
    os.environ.setdefault("MASTER_PORT", "29500")
    return True


def slurm_tasks_on_this_node() -> int:
    """srun's tasks on this node: ``SLURM_NTASKS_PER_NODE``, else this node's entry of
    ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE`` (``"4(x2),3"``: 4 on each of the
    first two nodes, 3 on the third), else 1."""
    if os.environ.get("SLURM_NTASKS_PER_NODE"):
        return int(os.environ["SLURM_NTASKS_PER_NODE"])
    spec = os.environ.get("SLURM_STEP_TASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return 1
    counts = []
    for part in spec.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if match is None:
            return 1
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    node = int(os.environ.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else counts[-1]


def default_local_gpus_per_node(gpus: int) -> int:
    """Emulated node size: the paper's 4, or gpus/2 below 8 ranks so there are two nodes."""
    if gpus >= 2 * LOCAL_GPUS_PER_NODE:
        return LOCAL_GPUS_PER_NODE
    return max(1, gpus // 2)


def local_config(config: RunConfig) -> RunConfig:
    """``config`` as the local launcher runs it: emulated nodes of the default size unless
    ``--gpus-per-node`` says otherwise, and the ranks' device (CUDA when there is a GPU per
    rank and ``--device`` allows it; CPU ranks on gloo over emulated links)."""
    if config.device == "cuda" and torch.cuda.device_count() == 0:
        raise BenchError("--device cuda was asked for but no CUDA device is visible")
    if config.network == "emulated":
        device = "cpu"  # gloo over the emulated links
    else:
        device = "cuda" if ranks_on_cuda(config.device, config.gpus) else "cpu"
    return replace(
        config, launcher="local", device=device,
        gpus_per_node=config.gpus_per_node or default_local_gpus_per_node(config.gpus),
    )


def job_config(config: RunConfig) -> RunConfig:
    """``config`` as one rank of an existing torchrun/SLURM job runs it: the job's world
    size (outside a job, for a dry run, ``--gpus``); the node size, where not given,
    discovered by the ranks."""
    gpus = int(os.environ["WORLD_SIZE"]) if adopt_slurm_environment() else config.gpus
    return replace(config, launcher="torchrun", gpus=gpus)


def open_run_folder(plan: RunPlan) -> RunFolder:
    """The run's folder, emptied first with --overwrite, with the run's identity in its
    summary before any rank starts (a run killed at any point is still listed as itself)."""
    config = plan.config
    folder = RunFolder(Path(config.results_dir) / plan.run_id)
    if config.overwrite:
        folder.empty()
    folder.create()
    if not config.resume:
        folder.write_summary(identity_summary(config))
    else:  # keep what the interrupted run said, only flip it back to running
        folder.write_summary({**(folder.summary() or {}), **identity_summary(config)})
    return folder


def launch_local(plan: RunPlan) -> Path:
    """Spawn the plan's ranks here and wait for them; returns the run folder."""
    if plan.config.device != "cuda":
        os.environ["OMP_NUM_THREADS"] = "1"
    return run_agent(plan, shutdown_seconds=shutdown_seconds(plan.config))


def run_agent(
    plan: RunPlan,
    *,
    shutdown_seconds: int,
    nodes: int = 1,
    node: int = 0,
    rendezvous: str = "localhost:0",
    job_id: str | None = None,
) -> Path:
    """This machine's torch elastic agent for its ranks of the run (one of ``nodes``, meeting
    at ``rendezvous``); returns the run folder. Node 0 opens the folder before any rank starts
    and, when the ranks fail or are stopped, marks it with the first reason."""
    config = plan.config
    if node == 0:
        folder = open_run_folder(plan)
    else:
        folder = RunFolder(Path(config.results_dir) / plan.run_id)

    # lazy: ~0.1 s to import; only this path needs it
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    quiet_launcher_logs()
    logs = tempfile.mkdtemp(prefix="prunex-launch-")
    launch = elastic_launch_config(
        config.gpus // nodes, job_id or config.run_id, log_dir=logs, nodes=nodes,
        rendezvous=rendezvous, max_restarts=config.max_restarts,
        shutdown_seconds=shutdown_seconds,
    )
    try:
        elastic_launch(launch, rank_main)(plan.to_json(), str(folder.path))
    except ChildFailedError as exc:
        if node:
            raise RunFailed(f"node {node}: {dead_rank(exc) or 'a rank failed'}") from None
        fail_run(folder, config, signal_name=None, failure=dead_rank(exc))
    except (SignalException, KeyboardInterrupt) as exc:
        name = exc.sigval.name if isinstance(exc, SignalException) else "SIGINT"
        if node:
            raise RunInterrupted(f"node {node}: interrupted by {name}") from None
        fail_run(folder, config, signal_name=name)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    return folder.path


def shutdown_seconds(config: RunConfig) -> int:
    """How long a stopped run's ranks get to finish their iteration, flush and checkpoint
    before SIGKILL: 30 s, or less when collectives time out sooner (a stalled peer would
    hold the others that long)."""
    return int(max(5, min(30, config.collective_timeout)))


def dead_rank(exc) -> str | None:
    """'rank 3 was killed by SIGKILL' when a rank died of a signal it could not handle (the
    others' errors are then knock-on effects), else None. Of several (NCCL aborts every rank
    of a broken communicator), the first to die."""
    for rank, failure in sorted(exc.failures.items(), key=lambda kv: (kv[1].timestamp, kv[0])):
        if failure.exitcode is not None and failure.exitcode < 0:
            try:
                name = failure.signal_name()
            except ValueError:
                name = f"signal {-failure.exitcode}"
            return f"rank {rank} was killed by {name} (exit code {failure.exitcode})"
    return None


def launch_emulated(plan: RunPlan) -> Path:
    """Spawn the ranks in emulated nodes (network namespaces) whose links are rate-limited;
    the namespaces exist only for the run's duration (see suite.cluster.netemu)."""

    config = plan.config
    rate = parse_rate(config.inter_bw)
    check_privileges()
    folder = open_run_folder(plan)
    nodes = config.gpus // config.gpus_per_node
    code = 0
    received = []

    def stop(signum, _frame):  # SIGTERM as Ctrl-C: the agents get it on the way out
        received.append(signal.Signals(signum).name)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        with emulated_cluster(nodes, rate, config.run_id) as cluster:
            (folder.path / "network.json").write_text(json.dumps(cluster.describe()))
            config_file = folder.path / "plan.json"  # what every rank receives
            config_file.write_text(plan.to_json())
            code = run_module_in_cluster(
                cluster,
                config.gpus_per_node,
                "suite.run.entry",
                [str(config_file), str(folder.path)],
                folder.path / "launcher",
                shutdown_seconds=shutdown_seconds(config),
            )
    except KeyboardInterrupt:
        fail_run(folder, config, signal_name=(received or ["SIGINT"])[0])
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code:
        fail_run(folder, config, signal_name=None)
    return folder.path


def fail_run(
    folder: RunFolder, config: RunConfig, *, signal_name: str | None, failure: str | None = None
) -> None:
    """Mark the run failed or interrupted with the first reason (keeping every flushed row),
    raise ``RunFailed`` / ``RunInterrupted``. Signals to this process wait until
    the folder says so."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        own = first_rank_error(folder)
        reason = own if own and not own.startswith("rank ") else failure or own
        interrupted = signal_name is not None or (reason or "").startswith("interrupted")
        reason = reason or (
            f"interrupted by {signal_name}" if interrupted else "a rank exited abnormally"
        )
        known = {k: v for k, v in identity_summary(config).items() if k not in ("status", "error")}
        folder.mark_failed(reason, status="interrupted" if interrupted else "failed", **known)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    error = RunInterrupted if interrupted else RunFailed
    raise error(f"run {config.run_id} {'stopped' if interrupted else 'failed'}: {reason} "
                f"(see {folder.path})") from None


def quiet_launcher_logs() -> None:
    """The elastic agent logs every child failure with a traceback; we report it in one line
    (and keep the traceback in the run folder's errors/), so silence its loggers."""
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def first_rank_error(folder: RunFolder) -> str | None:
    """The first line each rank wrote about its failure; a BenchError beats a knock-on one."""
    messages = [p.read_text().splitlines()[0] for p in sorted(folder.errors.glob("rank*.txt"))]
    own = [m for m in messages if not m.startswith("rank ")]
    return (own or messages or [None])[0]


def launch_in_job(plan: RunPlan) -> None:
    """This process is one rank of an existing torchrun/SLURM job (``job_config``)."""
    if not in_distributed_job():
        raise BenchError(
            "--launcher torchrun needs RANK and WORLD_SIZE (run under torchrun or srun); "
            "use --launcher local to spawn ranks here"
        )
    try:
        rank_main(plan.to_json(), None)
    except RunFailed:
        raise
    except BenchError as exc:  # the ranks had started: a failed run, not bad input
        raise RunFailed(str(exc)) from None
