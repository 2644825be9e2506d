"""The per-rank side of ``bench run``: set up, train, evaluate, record, write results.

Runs inside every rank, whether the ranks came from our local launcher, torchrun or SLURM.
Collectives issued here for bookkeeping (run id, loss/NaN agreement, test accuracy) are not
part of any method's communication and are not recorded as traffic.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import socket
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from suite.checkpoint import checkpoint_root, latest_checkpoint, load_checkpoint, save_checkpoint
from suite.comm import Communicator, flatten, unflatten_into
from suite.config import RunConfig
from suite.context import (
    build_method,
    evaluation_points,
    make_manifest,
    resolve_workload,
)
from suite.errors import BenchError
from suite.livelog import FOLDER as TENSORBOARD_FOLDER
from suite.livelog import TensorBoardLog
from suite.method import Method
from suite.ranks import collective_timeout, gpu_sharing, join_process_group
from suite.recorder import Recorder
from suite.results import (
    RunFolder,
    hardware,
    identity_summary,
    make_run_id,
    write_json,
    write_torch,
)
from suite.stopping import StopRequest
from suite.summary import summarize
from suite.topology import Topology, build_topology
from suite.wire import WireCounters
from workloads.base import TensorData
from workloads.datasets import load_data
from workloads.sharding import ShardedLoader, eval_slice


class NonFiniteLoss(BenchError):
    """Every rank stops after the same iteration (agreed in :func:`agree`)."""


class RunInterrupted(BenchError):
    """A signal asked the run to stop; every rank stopped after the same iteration."""


AGREED_STOPS = (NonFiniteLoss, RunInterrupted)
EVAL_BATCH = 256
#: a rank writes its new rows to the run folder at the end of an iteration once this many
#: seconds have passed since its last write (``PRUNEX_FLUSH_SECONDS`` overrides): a SIGKILL
#: loses at most these last seconds of rows
FLUSH_SECONDS = float(os.environ.get("PRUNEX_FLUSH_SECONDS", "5"))


def restart_count() -> int:
    """How many times torch elastic has restarted this run's ranks (0 on the first try)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


class Evaluator:
    """Scores the evaluated model on this rank's slice of the test set; the counts are summed
    over the world.

    It scores an inference copy of the model: BatchNorm folded into the convolutions (torch.fx
    ``fuse``, where the model traces), channels-last memory, inference mode, batches of 256.
    On cnn-fmnist with 4 CPU ranks on 2 cores that cuts an evaluation of 2,500 images per rank
    from 4.8 s to 2.1 s (channels-last alone: 2.8 s), and the training model is never touched.
    """

    def __init__(
        self, test: TensorData, world, device: torch.device, calibration: torch.Tensor | None = None
    ):
        self.test, self.world, self.device = test, world, device
        self.slice = eval_slice(len(test), dist.get_rank(), dist.get_world_size())
        self.traceable = True
        self.calibration = calibration  # (batches, B, C, H, W) training images, or None

    def inference_copy(self, model: nn.Module) -> nn.Module:
        from torch.fx.experimental.optimization import fuse

        scored = copy.deepcopy(model)
        if self.calibration is not None:
            recalibrate_batchnorm(scored, self.calibration, self.world, self.device)
        scored.eval()
        if self.traceable:
            try:
                scored = fuse(scored, inplace=True)
            except Exception:  # fx cannot trace every model; it is only an optimization
                self.traceable = False
        return scored.to(memory_format=torch.channels_last)

    def __call__(self, model: nn.Module) -> tuple[float, float]:
        scored = self.inference_copy(model)
        correct = loss_sum = 0.0
        with torch.inference_mode():
            for start in range(self.slice.start, self.slice.stop, EVAL_BATCH):
                stop = min(start + EVAL_BATCH, self.slice.stop)
                x = self.test.images[start:stop].to(self.device, non_blocking=True)
                y = self.test.labels[start:stop].to(self.device, non_blocking=True)
                logits = scored(x.contiguous(memory_format=torch.channels_last))
                loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").item()
                correct += (logits.argmax(1) == y).sum().item()
        count = float(self.slice.stop - self.slice.start)
        totals = torch.tensor([correct, loss_sum, count], dtype=torch.float64, device=self.device)
        dist.all_reduce(totals, group=self.world.pg)
        correct, loss_sum, count = totals.tolist()
        return correct / count, loss_sum / count


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, batches: torch.Tensor, world, device) -> None:
    """Recompute BN running statistics of ``model`` on ``batches`` with torch's
    ``swa_utils.update_bn`` (cumulative averages), then average them over the world
    (``--bn-recalibrate``).

    Why: an averaged model, such as PruneX's consensus z or a local-SGD average, has BN
    statistics averaged from the local models, which describe other activations than its
    own (torch's SWA needs the same step); PruneX's z is also pruned after averaging.
    """
    from torch.optim.swa_utils import update_bn

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    update_bn(list(batches), model, device=device)
    stats = [t for norm in norms for t in (norm.running_mean, norm.running_var)]
    flat = flatten(stats)
    dist.all_reduce(flat, group=world.pg)
    unflatten_into(stats, flat.div_(world.size))


def calibration_batches(
    train: TensorData, loader: ShardedLoader, count: int
) -> torch.Tensor | None:
    """The first ``count`` batches of this rank's shard in a fixed order, unaugmented: the
    same images at every evaluation, and the training stream is not touched."""
    count = min(count, loader.steps_per_epoch)  # a small shard has fewer whole batches
    if count <= 0:
        return None
    take = loader.shard_indices()[: count * loader.batch_size]
    images = train.images[take]
    return images.reshape(count, loader.batch_size, *images.shape[1:])


def rank_main(config_json: str, run_dir: str | None = None) -> None:
    """Entry point of one rank (also used by elastic_launch)."""
    config = RunConfig.from_json(config_json)
    stop = StopRequest().install()
    device = join_process_group(config.device, config.collective_timeout)
    rank = dist.get_rank()
    standalone = run_dir is None  # no parent launcher to mark the folder on failure
    folder = None
    recorder = None
    try:
        if run_dir is None:
            ident = [config.run_id or make_run_id(config.method, config.workload, config.gpus)]
            dist.broadcast_object_list(ident, src=0)
            run_dir = str(Path(config.results_dir) / ident[0])
            config.run_id = ident[0]
        folder = RunFolder(run_dir)
        if rank == 0:
            if standalone and config.overwrite and restart_count() == 0:
                folder.empty()
            folder.create()
            prepare_attempt(folder, config)
        dist.barrier()
        recorder = Recorder(rank, device)
        train(config, device, folder, recorder, stop)
    except BaseException as exc:
        if folder is not None:
            record_failure(folder, recorder, rank, exc, stop, standalone=standalone)
        raise  # without destroying the process group: that waits on peers that may be gone
    dist.destroy_process_group()


def prepare_attempt(folder: RunFolder, config: RunConfig) -> None:
    """Rank 0, before any rank trains: a resumed or restarted run keeps the rows up to its
    latest checkpoint (all of them are written again after it) and files the previous
    attempt's errors under ``attempts/``."""
    if not (config.resume or restart_count()):
        return
    found = latest_checkpoint(folder.path)
    if folder.errors.exists():
        attempts = folder.path / "attempts"
        attempts.mkdir(exist_ok=True)
        folder.errors.rename(attempts / f"{len(list(attempts.iterdir())):02d}")
    folder.truncate(found[0] if found else 0)


def record_failure(
    folder, recorder, rank: int, exc: BaseException, stop: StopRequest, *, standalone: bool
) -> None:
    """Keep what this rank recorded and say why it stopped; never raise from here.

    After an agreed stop every rank is healthy, so they wait for each other's last rows and
    a standalone run's rank 0 marks the folder; after any other failure a peer may be gone,
    so nobody waits (the parent launcher, or ``bench recover``, merges what was written).
    A collective timeout is marked at once by rank 0 even under a launcher: the stalled peer
    may take the launcher another 30 s to kill."""
    message = failure_message(exc, rank, stop)
    timed_out = message.startswith("a collective timed out")
    try:
        with stop.held():
            folder.errors.mkdir(parents=True, exist_ok=True)
            (folder.errors / f"rank{rank:05d}.txt").write_text(
                message + "\n\n" + traceback.format_exc()
            )
            if recorder is not None:
                flush_rows(folder, recorder)
        if isinstance(exc, AGREED_STOPS):
            dist.barrier()
        if (standalone or timed_out) and rank == 0:
            stopped = isinstance(exc, (RunInterrupted, KeyboardInterrupt))
            with stop.held():
                folder.mark_failed(message, status="interrupted" if stopped else "failed")
    except Exception:
        pass


def failure_message(exc: BaseException, rank: int, stop: StopRequest) -> str:
    """One line: our own errors as they are; a peer's death or a timeout named as such."""
    if isinstance(exc, BenchError):
        return str(exc).splitlines()[0]
    if isinstance(exc, KeyboardInterrupt):
        return f"interrupted by {stop.name if stop.requested else 'SIGINT'} (second signal)"
    message = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if "timed out" in message.lower():
        seconds = collective_timeout().total_seconds()
        return (
            f"a collective timed out on rank {rank} after {seconds:g} s (--collective-timeout):"
            f" a peer stalled or died ({message[:160]})"
        )
    return f"rank {rank}: {message}"


def flush_rows(folder: RunFolder, recorder: Recorder) -> None:
    """Write this rank's rows that are not on disk yet (one atomic file per table)."""
    chunk, tables = recorder.take_unflushed()
    if tables:
        folder.write_rank_chunk(recorder.rank, chunk, tables)


@dataclass
class Run:
    """Everything one rank set up for a run."""

    config: RunConfig
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
    checkpoints: list[dict] = field(default_factory=list)  # seconds and bytes of each save

    @property
    def node(self) -> int:
        """This rank's node: the scope of the method's ``shared_node`` checkpoint state."""
        return self.topology.node_of(self.topology.rank)


@dataclass
class LoopResult:
    """The training loop's counters: what a checkpoint must carry to continue exactly."""

    done: int = 0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    time_to_target: float | None = None
    converged: bool = False
    inter_bytes: float = 0.0
    intra_bytes: float = 0.0


def train(
    config: RunConfig, device: torch.device, folder: RunFolder, recorder: Recorder,
    stop: StopRequest,
) -> None:  # fmt: skip
    run = setup(config, device, folder, recorder, stop)
    result = LoopResult()
    found = latest_checkpoint(folder.path) if (config.resume or restart_count()) else None
    if found is not None:
        result = restore(run, load_checkpoint(found[1], node=run.node))
    run.attempt = {"restarts": restart_count(), "resumed_at_iteration": result.done or None}
    training_loop(run, result)
    finish(run, result)


def rank_state(run: Run, result: LoopResult) -> dict:
    """Everything this rank needs to continue exactly from here."""
    rng = {"torch": torch.get_rng_state()}
    if run.device.type == "cuda":
        rng["cuda"] = torch.cuda.get_rng_state(run.device)
    return {
        "method": run.method.state_dict(),
        "loader": run.loader.state_dict(),
        "rng": rng,
        "loop": asdict(result),
    }


def restore(run: Run, state: dict) -> LoopResult:
    run.method.load_state_dict(state["method"])
    run.loader.load_state_dict(state["loader"])
    torch.set_rng_state(state["rng"]["torch"])
    if "cuda" in state["rng"]:
        torch.cuda.set_rng_state(state["rng"]["cuda"], run.device)
    return LoopResult(**state["loop"])


def checkpoint(run: Run, result: LoopResult) -> None:
    """Flush the rows so far, then save (collective); signals wait until both are whole."""
    with run.stop.held():
        flush_rows(run.folder, run.recorder)
        stats = save_checkpoint(
            run.folder.path, result.done, rank_state(run, result), node=run.node
        )
    run.checkpoints.append(stats)


def setup(
    config: RunConfig, device: torch.device, folder: RunFolder, recorder: Recorder,
    stop: StopRequest,
) -> Run:  # fmt: skip
    """Topology, data shard, model, method; the manifest and a ``running`` summary."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    topology = build_topology(config.gpus_per_node)
    config.gpus = world_size
    config.gpus_per_node = topology.gpus_per_node
    config.run_id = config.run_id or folder.path.name
    workload, recipe, dataset = resolve_workload(config)
    train_data, test_data, spec = load_data(
        dataset,
        data_dir=config.data_dir,
        download=config.download and rank == 0,
        seed=config.seed,
        synthetic_size=config.synthetic_size,
    )
    loader = ShardedLoader(train_data, rank, world_size, recipe.batch_size, config.seed)
    comm = Communicator(topology, recorder, device)
    ctx, method, iterations = build_method(
        config, topology=topology, comm=comm, recorder=recorder, workload=workload,
        recipe=recipe, spec=spec, loader=loader, device=device,
    )  # fmt: skip
    manifest = make_manifest(
        config, ctx, method, dataset=dataset, iterations=iterations,
        train_samples=len(train_data), test_samples=len(test_data),
        device=str(device), backend=dist.get_backend(), topology=topology.describe(),
        gpu_sharing=gpu_sharing(device, dist.get_backend()),
        live_logs=live_logs_of(config, folder),
        hardware=hardware(), simulated=False, network=network_description(folder, config),
    )  # fmt: skip
    processes: list = [None] * world_size
    dist.all_gather_object(processes, [socket.gethostname(), os.getpid()])
    if rank == 0:
        write_json(folder.path / "manifest.json", manifest)
        folder.write_summary(
            {
                **(folder.summary() or {}),
                **identity_summary(config),
                "dataset": dataset,
                "nodes": topology.num_nodes,
                "status": "running",
                "processes": processes,
                "restarts": restart_count(),
            }
        )
    wire = None
    if config.network == "emulated" and topology.local_rank == 0:
        from suite.netemu import INTERFACE

        wire = WireCounters(INTERFACE)
    return Run(
        config,
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
            calibration_batches(train_data, loader, config.bn_recalibrate),
        ),
        stop,
        wire,
    )


def live_logs_of(config: RunConfig, folder: RunFolder) -> dict:
    """Where the run's live logs go, for the manifest."""
    return {"tensorboard": str(folder.path / TENSORBOARD_FOLDER)} if config.tensorboard else {}


def network_description(folder: RunFolder, config: RunConfig) -> dict:
    """What the links were: loopback, or the emulated cluster's rates (written by the
    launcher beside the run)."""
    described = folder.path / "network.json"
    if config.network == "emulated" and described.exists():
        return {**json.loads(described.read_text()), "inter_bw": config.inter_bw}
    return {"mode": config.network}


@dataclass
class Agreement:
    mean_loss: float
    inter_bytes: float
    intra_bytes: float
    stop: bool  # a rank was asked to stop
    checkpoint_due: bool  # rank 0's clock says a timed checkpoint is due


def agree(
    loss: float, row: dict, iteration: int, device: torch.device, *, stop: bool, due: bool
) -> Agreement:
    """One small world all-reduce per iteration: mean loss, NaN agreement, stop requests and
    timed checkpoints (so every rank stops or saves after the same iteration and nothing
    recorded is lost), and the iteration's traffic over all ranks."""
    finite = math.isfinite(loss)
    stats = torch.tensor(
        [loss if finite else 0.0, 0.0 if finite else 1.0, row["bytes_inter"], row["bytes_intra"],
         float(stop), float(due)],
        dtype=torch.float64,
        device=device,
    )  # fmt: skip
    dist.all_reduce(stats)
    loss_sum, nonfinite, inter, intra, stops, dues = stats.tolist()
    if nonfinite:
        raise NonFiniteLoss(
            f"non-finite loss at iteration {iteration} on {int(nonfinite)} rank(s); "
            "lower --lr or check the data"
        )
    return Agreement(loss_sum / dist.get_world_size(), inter, intra, stops > 0, dues > 0)


def progress_bar(run: Run):
    if dist.get_rank() != 0 or os.environ.get("PRUNEX_PROGRESS", "1") == "0":
        return None
    from tqdm import tqdm

    return tqdm(total=run.iterations, desc=run.config.method, unit="it", dynamic_ncols=True)


def training_loop(run: Run, result: LoopResult) -> None:
    """Iterations ``result.done`` .. the end (or convergence); ``result`` is updated in place.

    At the end of every iteration the ranks agree on the loss, on stop requests and on timed
    checkpoints; then come the evaluation, the row flush, the checkpoint and the stop, in that
    order, so a checkpoint holds every row before it."""
    config, recorder, loader, method = run.config, run.recorder, run.loader, run.method
    accuracy = None
    progress = progress_bar(run)
    live = TensorBoardLog(run.folder.path, result.done) if live_logging(run) else None
    wall_start = time.perf_counter() - result.wall_seconds
    last_checkpoint = time.monotonic()
    try:
        for it in range(result.done, run.iterations):
            recorder.begin_iteration(it)
            if run.wire is not None:
                run.wire.start()
            info = method.step(it)
            wire = run.wire.stop() if run.wire is not None else {}
            loss = float(info["loss"])
            row = recorder.end_iteration(
                **wire,
                loss=loss,
                samples=int(info["samples"]),
                epoch=loader.step / loader.steps_per_epoch,
                **{k: v for k, v in info.items() if k not in ("loss", "samples", "converged")},
            )
            minutes = config.checkpoint_minutes
            timed_due = minutes is not None and time.monotonic() - last_checkpoint >= 60 * minutes
            agreed = agree(loss, row, it, run.device, stop=run.stop.requested, due=timed_due)
            result.inter_bytes += agreed.inter_bytes
            result.intra_bytes += agreed.intra_bytes
            result.train_seconds += row["t_iteration"]
            result.done = it + 1
            result.converged = bool(info.get("converged", False))
            if live is not None:
                live.iteration(row, agreed.mean_loss, agreed.inter_bytes, agreed.intra_bytes)
                live.layers(recorder.layers)
            finished = result.converged or result.done == run.iterations
            if result.done in run.eval_points or result.converged:
                accuracy, test_loss = run.evaluate(method.eval_model())
                target = config.target_accuracy
                if result.time_to_target is None and target is not None and accuracy >= target:
                    result.time_to_target = result.train_seconds
                if dist.get_rank() == 0:
                    recorder.add_eval(
                        iteration=it,
                        epoch=row["epoch"],
                        accuracy=accuracy,
                        test_loss=test_loss,
                        train_loss=agreed.mean_loss,
                        train_seconds=result.train_seconds,
                        wall_seconds=time.perf_counter() - wall_start,
                        inter_node_bytes=result.inter_bytes,
                        intra_node_bytes=result.intra_bytes,
                    )
                if live is not None:
                    live.evaluation(it, accuracy, test_loss)
            if progress is not None:
                rate = int(info["samples"]) * dist.get_world_size() / max(row["t_iteration"], 1e-9)
                post = {"loss": f"{agreed.mean_loss:.3f}", "samples/s": f"{rate:.0f}"}
                if accuracy is not None:
                    post["acc"] = f"{accuracy:.4f}"
                progress.set_postfix(post, refresh=False)
                progress.update(1)
            every = config.checkpoint_every
            checkpointing = every is not None or minutes is not None
            due = agreed.checkpoint_due or (every is not None and result.done % every == 0)
            if checkpointing and not finished and (due or agreed.stop):
                result.wall_seconds = time.perf_counter() - wall_start
                checkpoint(run, result)
                last_checkpoint = time.monotonic()
            elif recorder.flush_due(FLUSH_SECONDS):
                with run.stop.held():
                    flush_rows(run.folder, recorder)
            if agreed.stop and not finished:
                raise RunInterrupted(interruption_message(run, result, checkpointing))
            if result.converged:
                break
    finally:
        if progress is not None:
            progress.close()
        if live is not None:
            live.close()
    result.wall_seconds = time.perf_counter() - wall_start


def live_logging(run: Run) -> bool:
    """Rank 0 writes the live log (``--tensorboard``)."""
    return run.config.tensorboard and dist.get_rank() == 0


def interruption_message(run: Run, result: LoopResult, checkpointed: bool) -> str:
    how = f"interrupted by {run.stop.name if run.stop.requested else 'a peer'}"
    where = f"after iteration {result.done} of {run.iterations}"
    if checkpointed:
        return f"{how} {where}; continue with: bench run --resume {run.folder.path}"
    return f"{how} {where} (no checkpoint: use --checkpoint-every to make runs resumable)"


def finish(run: Run, result: LoopResult) -> None:
    """Merge every rank's rows, save the evaluated model and artifacts, write the summary.
    The checkpoints go: a finished run has nothing left to continue."""
    final_model = run.method.eval_model()  # collective for some methods: every rank calls it
    with run.stop.held():
        flush_rows(run.folder, run.recorder)
    dist.barrier()
    if dist.get_rank() == 0:
        folder = run.folder
        folder.merge_parts()
        write_torch(folder.path / "model.pt", final_model.state_dict())
        for name, obj in run.method.artifacts().items():
            write_torch(folder.path / name, obj)
        summary = summarize(
            config=run.config,
            manifest=run.manifest,
            dataset=run.manifest["config"]["dataset"],
            iterations_done=result.done,
            iterations=folder.table("iterations"),
            evals=folder.table("evals"),
            wall_seconds=result.wall_seconds,
            time_to_target=result.time_to_target,
            converged=result.converged,
        )
        summary.update(run.attempt or {}, processes=(folder.summary() or {}).get("processes"))
        warnings = getattr(run.method, "warnings", None)
        if warnings:
            summary["warnings"] = list(warnings)
        if run.checkpoints:
            summary.update(
                checkpoints_written=len(run.checkpoints),
                checkpoint_seconds_mean=sum(c["seconds"] for c in run.checkpoints)
                / len(run.checkpoints),
                checkpoint_bytes=run.checkpoints[-1]["bytes"],
            )
        with run.stop.held():
            folder.write_summary(summary)
        shutil.rmtree(checkpoint_root(folder.path), ignore_errors=True)
    dist.barrier()
