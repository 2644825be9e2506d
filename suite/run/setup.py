"""Everything one rank sets up before its first iteration: topology, data shard, model,
method, evaluator; the manifest and a ``running`` summary in the run folder."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial

import torch
import torch.distributed as dist

from suite.cluster.audit import AUDIT
from suite.cluster.comm import Communicator
from suite.cluster.netemu import INTERFACE
from suite.cluster.ranks import connect_groups, gpu_sharing
from suite.cluster.recorder import Recorder
from suite.cluster.topology import Topology, build_topology
from suite.cluster.watchdog import store_client, watched
from suite.cluster.wire import WireCounters, host_interface
from suite.config import RunConfig
from suite.data.datasets import load_data
from suite.data.sharding import ShardedLoader
from suite.errors import BenchError
from suite.plugins.method import Method
from suite.processes import identity
from suite.results import schema
from suite.results.folder import RunFolder, hardware, identity_summary, numerics
from suite.results.runner import own_pids, sample
from suite.results.schema import Status
from suite.run.build import build_method, evaluation_points, make_manifest
from suite.run.evaluation import Evaluator, calibration_batches
from suite.run.livelog import FOLDER as TENSORBOARD_FOLDER
from suite.run.plan import RunPlan
from suite.run.stopping import StopRequest
from suite.run.warmup import warm_up


def restart_count() -> int:
    """How many times torch elastic has restarted this run's ranks (0 on the first try)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


@dataclass
class Run:
    """Everything one rank set up for a run."""

    plan: RunPlan
    device: torch.device
    folder: RunFolder
    recorder: Recorder
    topology: Topology
    loader: ShardedLoader
    method: Method
    manifest: dict
    iterations: int
    eval_points: set[int]
    evaluate: Evaluator
    stop: StopRequest
    wire: WireCounters | None = None  # node's shaped interface, read on local rank 0
    attempt: dict | None = None  # restarts and resumes, for the summary
    setup_seconds: dict = field(default_factory=dict)  # before the first iteration, for the summary
    checkpoints: list[dict] = field(default_factory=list)  # seconds and bytes of each save
    steps_per_iteration: int = 1  # local steps of one of the method's iterations
    #: rank 0: the runner's counters when the ranks started (suite.results.runner)
    runner_start: dict | None = None

    @property
    def config(self) -> RunConfig:
        return self.plan.config

    @property
    def node(self) -> int:
        """This rank's node: the scope of the method's ``shared_node`` checkpoint state."""
        return self.topology.node


#: how long the other ranks wait for rank 0's download before it is a stall
DOWNLOAD_SECONDS = 3600.0


def load_data_once(load: Callable, *, download: bool, key: str = "data"):
    """``load(download=...)`` on every rank, each decoding the data once. With ``--download``
    rank 0 fetches and prepares the files first while the others wait (one download, not one
    per rank into the same folder), then they read what it wrote; its failure is every rank's
    one-line error. The folder must be shared by the nodes, as clusters' data folders are.

    The others wait on the job's store (``key`` names the wait), up to ``DOWNLOAD_SECONDS``
    and watched for that long: a collective would be cut at the backend's timeout
    (``--collective-timeout`` and its margin), minutes before a large download ends."""
    if not download:
        return load(download=False)
    outcome = None
    if dist.get_rank() == 0:
        try:
            data = load(download=True)
        except Exception as exc:  # any failure, so the others never wait for nothing
            text = str(exc) if isinstance(exc, BenchError) else f"{type(exc).__name__}: {exc}"
            outcome = (text.strip().splitlines() or [type(exc).__name__])[0]
    outcome = rank0_outcome(outcome, f"prunex-download/{key}")
    if outcome is not None:
        raise BenchError(outcome)
    return data if dist.get_rank() == 0 else load(download=False)


def rank0_outcome(outcome: str | None, key: str) -> str | None:
    """Rank 0's ``outcome`` (None: it went well) on every rank: through the job's store where
    there is one, waited on for ``DOWNLOAD_SECONDS``; else by a broadcast."""
    store = store_client(DOWNLOAD_SECONDS)
    with watched("wait", "world (rank 0 downloads the data)", timeout=DOWNLOAD_SECONDS):
        if store is None:  # no job store (a process group made by hand): the world waits
            shared = [outcome]
            dist.broadcast_object_list(shared, src=0)
            return shared[0]
        if dist.get_rank() == 0:
            store.set(key, json.dumps(outcome))
            return outcome
        store.wait([key], timedelta(seconds=DOWNLOAD_SECONDS))
        return json.loads(store.get(key))


def setup(
    plan: RunPlan, device: torch.device, folder: RunFolder, recorder: Recorder,
    stop: StopRequest,
) -> Run:
    """Topology, data shard, model, method, every process group connected; the manifest and
    a ``running`` summary."""
    started = time.perf_counter()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    plan, topology = joined_plan(plan, world_size)
    config = plan.config
    train_data, test_data, loader = load_shard(plan, rank, world_size, device)
    comm = Communicator(topology, recorder, device)
    # the collectives of a method's construction are watched where they are issued (DDP's
    # constructor: ctx.comm.watching; broadcast_initial_state), not its whole build, which
    # may trace a large model for longer than --collective-timeout
    ctx, method, iterations, steps = build_method(
        plan, topology=topology, comm=comm, recorder=recorder, loader=loader, device=device,
    )
    groups, fabric = audited_groups(topology, method)
    connect = connect_groups(list(groups.values()), device)
    warmup = warm_up(ctx.model, train_data, loader, plan.recipe, groups, device)
    manifest = make_manifest(
        plan, ctx, method, iterations=iterations, steps_per_iteration=steps,
        device=str(device), backend=dist.get_backend(), topology=topology.describe(),
        numerics=numerics(device),
        group_backends={name: dist.get_backend(pg) for name, pg in groups.items()},
        gpu_sharing=gpu_sharing(device, dist.get_backend()),
        live_logs=live_logs_of(config, folder),
        hardware=hardware(), simulated=False,
        network=network_description(folder, config, topology, fabric),
    )
    processes = gather_processes(world_size)
    runner_start = sample(own_pids(processes)) if rank == 0 else None
    if rank == 0:
        write_running(plan, folder, topology, manifest, processes)
    wire = wire_counters(config, topology, fabric)
    return Run(
        plan,
        device,
        folder,
        recorder,
        topology,
        loader,
        method,
        manifest,
        iterations,
        evaluation_points(iterations, config.eval_every),
        Evaluator(
            test_data,
            topology.world,
            device,
            calibration_batches(loader, config.bn_recalibrate),
        ),
        stop,
        wire,
        setup_seconds={schema.SETUP_SECONDS: time.perf_counter() - started,
                       schema.CONNECT_SECONDS: connect, schema.WARMUP_SECONDS: warmup},
        steps_per_iteration=steps,
        runner_start=runner_start,
    )


def joined_plan(plan: RunPlan, world_size: int) -> tuple[RunPlan, Topology]:
    """The plan as the ranks that joined run it, and their topology: a world of another size
    than planned is an error; the job's own ranks per node (discovered) replace the plan's.

    Args:
        plan: the run's plan.
        world_size: how many ranks joined.

    Returns:
        The plan (restarted with the discovered ranks per node where they differ) and the
        topology built for it.
    """
    topology = build_topology(plan.config.gpus_per_node)
    if world_size != plan.config.gpus:
        raise BenchError(f"the run was planned for {plan.config.gpus} ranks but {world_size} "
                         "joined")
    if plan.config.gpus_per_node != topology.gpus_per_node:  # discovered by the job
        plan = plan.restarted(gpus_per_node=topology.gpus_per_node)
    return plan, topology


def load_shard(
    plan: RunPlan, rank: int, world_size: int, device: torch.device,
) -> tuple:
    """The train and test data, loaded once per rank and checked against the plan's sizes,
    and this rank's shard of the train data (on the GPU for a CUDA run, where it stays); a
    batch of either is resized where it is handed to the model when the plan's model takes
    another side than the stored one (``TensorData.resize_to``).

    Returns:
        ``(train_data, test_data, loader)``.
    """
    config = plan.config
    train_data, test_data, _ = load_data_once(
        partial(load_data, plan.dataset, data_dir=config.data_dir, seed=config.seed,
                synthetic_size=config.synthetic_size),
        download=config.download, key=config.run_id,
    )
    check_planned_data(plan, len(train_data), len(test_data))
    side = plan.input_size.model_side if plan.input_size.resized else None
    train_data, test_data = (replace(data, resize_to=side) for data in (train_data, test_data))
    resident = device if device.type == "cuda" else None  # the shard lives on the GPU
    loader = ShardedLoader(
        train_data, rank, world_size, plan.recipe.batch_size, config.seed, device=resident
    )
    return train_data, test_data, loader


def audited_groups(topology: Topology, method: Method) -> tuple[dict, str | None]:
    """The run's process groups, each watched by the collective audit (reset to this
    topology first), and the hosts' fabric interface where the run spans hosts (else None):
    what the network description and the wire counters read."""
    groups = run_groups(topology, method)
    fabric = host_interface() if spans_hosts(topology) else None
    AUDIT.reset(topology.node_of)
    for name, pg in groups.items():
        AUDIT.watch(pg, name)
    return groups, fabric


def gather_processes(world_size: int) -> list:
    """Every rank's ``[host, pid, start time]`` (``suite.processes.identity``), in rank
    order, on every rank (a watched collective): the summary lists them (a launcher signals
    only a process that still has that identity), and rank 0 samples the counters of the
    processes on its host."""
    processes: list = [None] * world_size
    with watched("all_gather_object", "world (the ranks' processes)"):
        dist.all_gather_object(processes, identity())
    return processes


def write_running(plan: RunPlan, folder: RunFolder, topology: Topology, manifest: dict,
                  processes: list) -> None:
    """Rank 0's part of the start: the manifest (with the hosts of every start so far) and a
    ``running`` summary over whatever summary an earlier start left."""
    manifest[schema.HOSTS_PER_ATTEMPT] = hosts_per_attempt(folder, topology)
    folder.write_manifest(manifest)
    earlier = folder.summary() or {}
    named = identity_summary(plan.config)
    # the process that opened the folder (a launcher; a job's rank 0 is its own) stays named
    named[schema.LAUNCHER] = earlier.get(schema.LAUNCHER) or named[schema.LAUNCHER]
    folder.write_summary(
        {
            **earlier,
            **named,
            schema.DATASET: plan.dataset,
            schema.NODES: topology.num_nodes,
            schema.STATUS: Status.RUNNING,
            schema.PROCESSES: processes,
            schema.RESTARTS: restart_count(),
        }
    )


def wire_counters(config: RunConfig, topology: Topology,
                  fabric: str | None) -> WireCounters | None:
    """The counters of the interface whose bytes are the run's inter-node traffic (the
    emulated one, or the hosts' fabric), read on each node's local rank 0; None elsewhere."""
    if topology.local_rank == 0 and (config.network == "emulated" or fabric):
        return WireCounters(INTERFACE if config.network == "emulated" else fabric)
    return None


def check_planned_data(plan: RunPlan, train: int, test: int) -> None:
    """The data this rank loaded is the size the plan scheduled (a dataset registered with
    other sizes than its loader returns would make every count of the run wrong)."""
    if (train, test) != (plan.train_samples, plan.test_samples):
        raise BenchError(
            f"dataset {plan.dataset!r} is registered with {plan.train_samples} train and "
            f"{plan.test_samples} test samples, but its loader returned {train} and {test}; "
            "register the sizes it loads (DATASETS.register(name, spec, sizes))"
        )


def run_groups(topology: Topology, method: Method) -> dict:
    """Every process group this rank uses, by name (world, its node, the leaders, the
    method's own), in an order every rank shares."""
    mine = {"world": topology.world, "intra": topology.intra, "inter": topology.inter}
    groups = {name: g.pg for name, g in mine.items() if g is not None}
    groups.update({f"method_{i}": pg for i, pg in enumerate(method.process_groups())})
    return groups


def live_logs_of(config: RunConfig, folder: RunFolder) -> dict:
    """Where the run's live logs go, for the manifest."""
    return {"tensorboard": str(folder.path / TENSORBOARD_FOLDER)} if config.tensorboard else {}


def hosts_per_attempt(folder: RunFolder, topology: Topology) -> list[list[str]]:
    """The hosts of every start of the run, this one last: a resumed or requeued run keeps
    the earlier starts' (read from the manifest they wrote), so a job that moved is seen."""
    try:
        earlier = (folder.manifest() or {}).get(schema.HOSTS_PER_ATTEMPT) or []
    except (OSError, ValueError):  # a damaged manifest: this start is the one known
        earlier = []
    return [*earlier, topology.describe()[schema.HOSTS]]


def spans_hosts(topology: Topology) -> bool:
    """The run's nodes are real hosts, more than one: inter-node bytes cross a real link."""
    return not topology.emulated and len(set(topology.hostnames)) > 1


def network_description(folder: RunFolder, config: RunConfig, topology: Topology,
                        fabric: str | None) -> dict:
    """What the links were: loopback (one host), the hosts' fabric (the interface rank 0's
    host reaches the others on), or the emulated cluster's rates (written by the launcher
    beside the run)."""
    described = folder.path / "network.json"
    if config.network == "emulated" and described.exists():
        return {**json.loads(described.read_text()), schema.INTER_BW: config.inter_bw}
    if spans_hosts(topology):
        return {schema.NETWORK_MODE: schema.NETWORK_HOSTS, schema.NETWORK_INTERFACE: fabric,
                schema.NETWORK_HOSTS: len(set(topology.hostnames))}
    return {schema.NETWORK_MODE: config.network}
