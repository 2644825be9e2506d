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
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from suite.comm import Communicator
from suite.config import RunConfig
from suite.errors import BenchError
from suite.method import RunContext
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
from suite.topology import build_topology
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
    totals = torch.tensor([correct, loss_sum, float(sl.stop - sl.start)], dtype=torch.float64)
    dist.all_reduce(totals.to(device) if device.type == "cuda" else totals, group=world.pg)
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


def train(config: RunConfig, device: torch.device, folder: RunFolder, recorder: Recorder) -> None:
    rank = dist.get_rank()
    world_size = dist.get_world_size()
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
    eval_every = config.eval_every or max(1, iterations // 10)

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
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if rank == 0:
        write_json(folder.path / "manifest.json", manifest)
        folder.write_summary({"run_id": manifest["run_id"], "status": "running"})

    progress = None
    if rank == 0 and os.environ.get("PRUNEX_PROGRESS", "1") != "0":
        from tqdm import tqdm

        progress = tqdm(total=iterations, desc=f"{config.method}", unit="it", dynamic_ncols=True)

    bookkeeping = torch.zeros(4, dtype=torch.float64, device=device)
    train_seconds = 0.0
    cumulative = {"inter": 0.0, "intra": 0.0}
    time_to_target = None
    accuracy = None
    converged = False
    wall_start = time.perf_counter()
    done = 0
    try:
        for it in range(iterations):
            recorder.begin_iteration(it)
            info = method.step(it)
            loss = float(info["loss"])
            row = recorder.end_iteration(
                loss=loss,
                samples=int(info["samples"]),
                epoch=loader.step / loader.steps_per_epoch,
                **{k: v for k, v in info.items() if k not in ("loss", "samples", "converged")},
            )
            # One small world all-reduce: mean loss, NaN agreement, traffic totals, slowest rank.
            bookkeeping.copy_(
                torch.tensor(
                    [
                        loss if math.isfinite(loss) else 0.0,
                        0.0 if math.isfinite(loss) else 1.0,
                        row["bytes_inter"],
                        row["bytes_intra"],
                    ],
                    dtype=torch.float64,
                )
            )
            dist.all_reduce(bookkeeping)
            mean_loss, nonfinite, inter, intra = bookkeeping.tolist()
            if nonfinite:
                raise NonFiniteLoss(
                    f"non-finite loss at iteration {it} on {int(nonfinite)} rank(s); "
                    "lower --lr or check the data"
                )
            mean_loss /= world_size
            cumulative["inter"] += inter
            cumulative["intra"] += intra
            train_seconds += row["t_iteration"]
            done = it + 1
            converged = bool(info.get("converged", False))
            last = done == iterations or converged
            if done % eval_every == 0 or last:
                accuracy, test_loss = evaluate(
                    method.eval_model(), test_data, topology.world, device
                )
                if (
                    time_to_target is None
                    and config.target_accuracy is not None
                    and accuracy >= config.target_accuracy
                ):
                    time_to_target = train_seconds
                if rank == 0:
                    recorder.add_eval(
                        iteration=it,
                        epoch=row["epoch"],
                        accuracy=accuracy,
                        test_loss=test_loss,
                        train_loss=mean_loss,
                        train_seconds=train_seconds,
                        wall_seconds=time.perf_counter() - wall_start,
                        inter_node_bytes=cumulative["inter"],
                        intra_node_bytes=cumulative["intra"],
                    )
            if progress is not None:
                rate = int(info["samples"]) * world_size / max(row["t_iteration"], 1e-9)
                post = {"loss": f"{mean_loss:.3f}", "samples/s": f"{rate:.0f}"}
                if accuracy is not None:
                    post["acc"] = f"{accuracy:.4f}"
                progress.set_postfix(post, refresh=False)
                progress.update(1)
            if converged:
                break
    finally:
        if progress is not None:
            progress.close()
    wall_seconds = time.perf_counter() - wall_start

    final_model = method.eval_model()  # collective for some methods: every rank calls it
    flush_rank_rows(folder, recorder)
    dist.barrier()
    if rank == 0:
        folder.merge_parts()
        write_torch(folder.path / "model.pt", final_model.state_dict())
        for name, obj in method.artifacts().items():
            write_torch(folder.path / name, obj)
        folder.write_summary(
            summarize(
                config=config,
                manifest=manifest,
                dataset=dataset,
                iterations_done=done,
                iterations=folder.table("iterations"),
                evals=folder.table("evals"),
                wall_seconds=wall_seconds,
                time_to_target=time_to_target,
                converged=converged,
            )
        )
    dist.barrier()
