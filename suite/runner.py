"""The per-rank side of ``bench run``: set up, train, evaluate, record, write results.

Runs inside every rank, whether the ranks came from our local launcher, torchrun or SLURM.
Collectives issued here for bookkeeping (run id, loss/NaN agreement, test accuracy) are not
part of any method's communication and are not recorded as traffic.
"""

from __future__ import annotations

import json
import math
import os
import time
import traceback
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from suite.comm import Communicator
from suite.config import RunConfig
from suite.errors import BenchError
from suite.method import Method, RunContext
from suite.recorder import Recorder
from suite.registry import METHODS, WORKLOADS, load_builtins
from suite.results import (
    RunFolder,
    git_revision,
    hardware,
    make_run_id,
    versions,
    write_json,
    write_torch,
)
from suite.summary import summarize
from suite.topology import Topology, build_topology
from suite.wire import WireCounters
from workloads.base import TensorData
from workloads.datasets import load_data
from workloads.sharding import ShardedLoader, eval_slice


class NonFiniteLoss(BenchError):
    pass


def pick_device(config: RunConfig) -> torch.device:
    want = config.device
    if want == "cuda" or (want == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise BenchError("--device cuda was asked for but no CUDA device is visible")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local % torch.cuda.device_count())
    return torch.device("cpu")


def resolve_recipe(workload, config: RunConfig):
    overrides = {
        k: getattr(config, k)
        for k in ("batch_size", "lr", "momentum", "weight_decay")
        if getattr(config, k) is not None
    }
    return replace(workload.recipe, **overrides)


@torch.no_grad()
def evaluate(model: nn.Module, test, world, device: torch.device) -> tuple[float, float]:
    """Each rank scores a slice of the test set; the counts are summed over the world."""
    sl = eval_slice(len(test), dist.get_rank(), dist.get_world_size())
    was_training = model.training
    model.eval()
    correct = loss_sum = 0.0
    for start in range(sl.start, sl.stop, 1000):
        stop = min(start + 1000, sl.stop)
        x = test.images[start:stop].to(device, non_blocking=True)
        y = test.labels[start:stop].to(device, non_blocking=True)
        logits = model(x)
        loss_sum += nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct += (logits.argmax(1) == y).sum().item()
    totals = torch.tensor(
        [correct, loss_sum, float(sl.stop - sl.start)], dtype=torch.float64, device=device
    )
    dist.all_reduce(totals, group=world.pg)
    model.train(was_training)
    correct, loss_sum, count = totals.tolist()
    return correct / count, loss_sum / count


def count_iterations(config: RunConfig, loader: ShardedLoader, method, recipe) -> int:
    if config.iterations is not None:
        return config.iterations
    epochs = config.epochs if config.epochs is not None else recipe.epochs
    return max(1, math.ceil(epochs * loader.steps_per_epoch / method.steps_per_iteration))


def rank_main(config_json: str, run_dir: str | None = None) -> None:
    """Entry point of one rank (also used by elastic_launch)."""
    config = RunConfig.from_json(config_json)
    device = pick_device(config)
    if device.type == "cpu":
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=timedelta(minutes=10))
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
            folder.create()
        dist.barrier()
        recorder = Recorder(rank, device)
        train(config, device, folder, recorder)
    except BaseException as exc:
        if folder is not None:
            record_failure(folder, recorder, rank, exc, mark=standalone and rank == 0)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def record_failure(folder, recorder, rank: int, exc: BaseException, *, mark: bool) -> None:
    """Keep what this rank recorded and say why it stopped; never raise from here."""
    message = f"{type(exc).__name__}: {exc}".splitlines()[0]
    if not isinstance(exc, BenchError):
        message = f"rank {rank}: {message}"
    try:
        folder.errors.mkdir(parents=True, exist_ok=True)
        (folder.errors / f"rank{rank:05d}.txt").write_text(
            message + "\n\n" + traceback.format_exc()
        )
        if recorder is not None:
            flush_rank_rows(folder, recorder)
        if mark:
            folder.mark_failed(message)
    except OSError:
        pass


def flush_rank_rows(folder: RunFolder, recorder: Recorder) -> None:
    folder.write_rank_rows(recorder.rank, "iterations", recorder.iterations)
    folder.write_rank_rows(recorder.rank, "evals", recorder.evals)
    folder.write_rank_rows(recorder.rank, "layers", recorder.layers)


@dataclass
class Run:
    """Everything one rank set up for a run."""

    config: RunConfig
    device: torch.device
    folder: RunFolder
    recorder: Recorder
    topology: Topology
    loader: ShardedLoader
    test_data: TensorData
    method: Method
    manifest: dict
    iterations: int
    eval_every: int
    wire: WireCounters | None = None  # node's shaped interface, read on local rank 0


@dataclass
class LoopResult:
    done: int = 0
    train_seconds: float = 0.0
    wall_seconds: float = 0.0
    time_to_target: float | None = None
    converged: bool = False


def train(config: RunConfig, device: torch.device, folder: RunFolder, recorder: Recorder) -> None:
    run = setup(config, device, folder, recorder)
    result = training_loop(run)
    finish(run, result)


def setup(config: RunConfig, device: torch.device, folder: RunFolder, recorder: Recorder) -> Run:
    """Topology, data shard, model, method; the manifest and a ``running`` summary."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    load_builtins()
    topology = build_topology(config.gpus_per_node)
    config.gpus = world_size
    config.gpus_per_node = topology.gpus_per_node
    workload = WORKLOADS.get(config.workload).factory()
    method_entry = METHODS.get(config.method)
    dataset = config.dataset or workload.dataset
    train_data, test_data, spec = load_data(
        dataset,
        data_dir=config.data_dir,
        download=config.download and rank == 0,
        seed=config.seed,
        synthetic_size=config.synthetic_size,
    )
    recipe = resolve_recipe(workload, config)
    torch.manual_seed(config.seed)
    model = workload.build_model(spec).to(device)
    loader = ShardedLoader(train_data, rank, world_size, recipe.batch_size, config.seed)
    comm = Communicator(topology, recorder, device)
    ctx = RunContext(config, topology, comm, recorder, workload, recipe, model, loader, device)
    method = method_entry.factory(ctx)
    iterations = count_iterations(config, loader, method, recipe)
    manifest = {
        "run_id": config.run_id or folder.path.name,
        "config": {**json.loads(config.to_json()), "dataset": dataset},
        "recipe": recipe.__dict__,
        "planned_iterations": iterations,
        "steps_per_iteration": method.steps_per_iteration,
        "steps_per_epoch": loader.steps_per_epoch,
        "train_samples": len(train_data),
        "test_samples": len(test_data),
        "parameters": sum(p.numel() for p in model.parameters()),
        "device": str(device),
        "backend": dist.get_backend(),
        "topology": topology.describe(),
        "versions": versions(),
        "git_revision": git_revision(),
        "hardware": hardware(),
        "simulated": False,
        "network": network_description(folder, config),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if rank == 0:
        write_json(folder.path / "manifest.json", manifest)
        folder.write_summary({"run_id": manifest["run_id"], "status": "running"})
    eval_every = config.eval_every or max(1, iterations // 10)
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
        test_data,
        method,
        manifest,
        iterations,
        eval_every,
        wire,
    )


def network_description(folder: RunFolder, config: RunConfig) -> dict:
    """What the links were: loopback, or the emulated cluster's rates (written by the
    launcher beside the run)."""
    described = folder.path / "network.json"
    if config.network == "emulated" and described.exists():
        return {**json.loads(described.read_text()), "inter_bw": config.inter_bw}
    return {"mode": config.network}


def agree(
    loss: float, row: dict, iteration: int, device: torch.device
) -> tuple[float, float, float]:
    """One small world all-reduce per iteration: mean loss, NaN agreement (so every rank stops
    together and nothing recorded is lost), and the iteration's traffic over all ranks."""
    finite = math.isfinite(loss)
    stats = torch.tensor(
        [loss if finite else 0.0, 0.0 if finite else 1.0, row["bytes_inter"], row["bytes_intra"]],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(stats)
    loss_sum, nonfinite, inter, intra = stats.tolist()
    if nonfinite:
        raise NonFiniteLoss(
            f"non-finite loss at iteration {iteration} on {int(nonfinite)} rank(s); "
            "lower --lr or check the data"
        )
    return loss_sum / dist.get_world_size(), inter, intra


def progress_bar(run: Run):
    if dist.get_rank() != 0 or os.environ.get("PRUNEX_PROGRESS", "1") == "0":
        return None
    from tqdm import tqdm

    return tqdm(total=run.iterations, desc=run.config.method, unit="it", dynamic_ncols=True)


def training_loop(run: Run) -> LoopResult:
    config, recorder, loader, method = run.config, run.recorder, run.loader, run.method
    result = LoopResult()
    cumulative = {"inter": 0.0, "intra": 0.0}
    accuracy = None
    progress = progress_bar(run)
    wall_start = time.perf_counter()
    try:
        for it in range(run.iterations):
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
            mean_loss, inter, intra = agree(loss, row, it, run.device)
            cumulative["inter"] += inter
            cumulative["intra"] += intra
            result.train_seconds += row["t_iteration"]
            result.done = it + 1
            result.converged = bool(info.get("converged", False))
            if (
                result.done % run.eval_every == 0
                or result.done == run.iterations
                or result.converged
            ):
                accuracy, test_loss = evaluate(
                    method.eval_model(), run.test_data, run.topology.world, run.device
                )
                target = config.target_accuracy
                if result.time_to_target is None and target is not None and accuracy >= target:
                    result.time_to_target = result.train_seconds
                if dist.get_rank() == 0:
                    recorder.add_eval(
                        iteration=it,
                        epoch=row["epoch"],
                        accuracy=accuracy,
                        test_loss=test_loss,
                        train_loss=mean_loss,
                        train_seconds=result.train_seconds,
                        wall_seconds=time.perf_counter() - wall_start,
                        inter_node_bytes=cumulative["inter"],
                        intra_node_bytes=cumulative["intra"],
                    )
            if progress is not None:
                rate = int(info["samples"]) * dist.get_world_size() / max(row["t_iteration"], 1e-9)
                post = {"loss": f"{mean_loss:.3f}", "samples/s": f"{rate:.0f}"}
                if accuracy is not None:
                    post["acc"] = f"{accuracy:.4f}"
                progress.set_postfix(post, refresh=False)
                progress.update(1)
            if result.converged:
                break
    finally:
        if progress is not None:
            progress.close()
    result.wall_seconds = time.perf_counter() - wall_start
    return result


def finish(run: Run, result: LoopResult) -> None:
    """Merge every rank's rows, save the evaluated model and artifacts, write the summary."""
    final_model = run.method.eval_model()  # collective for some methods: every rank calls it
    flush_rank_rows(run.folder, run.recorder)
    dist.barrier()
    if dist.get_rank() == 0:
        folder = run.folder
        folder.merge_parts()
        write_torch(folder.path / "model.pt", final_model.state_dict())
        for name, obj in run.method.artifacts().items():
            write_torch(folder.path / name, obj)
        folder.write_summary(
            summarize(
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
        )
    dist.barrier()
