"""Checkpoints of a run: everything every rank needs to continue exactly where it stopped.

Each rank's state (its model and optimizer, the method's whole state, the loader position, RNG
states and the training loop's counters) is split into tensors and a JSON skeleton. The tensors
of all ranks go into one PyTorch Distributed Checkpoint under rank-prefixed keys (``rank3/...``):
every rank's state differs (local SGD models, PruneX duals), so nothing is deduplicated, and DCP
writes the ranks' files in parallel with the metadata last. The skeletons hold the rest (ints,
floats, flags, dict keys) as JSON, so no pickle is ever loaded: DCP's own planner would unpickle
non-tensor values with ``weights_only=False``.

A checkpoint is written to a hidden folder that is renamed into place once every rank has
written, and ``latest.json`` names the newest complete one, so a crash mid-save leaves the last
complete checkpoint in charge. Older checkpoints are removed after a new one is complete.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from suite.errors import BenchError
from suite.results import write_json

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"


# -- tensors and skeleton ------------------------------------------------------------------
def split_state(obj, path: str = "") -> tuple[object, dict[str, torch.Tensor]]:
    """(skeleton, tensors): the skeleton is JSON with ``{"__tensor__": key}`` where a tensor
    was; dicts keep their key types (optimizers and PowerSGD key by int)."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(value, where: str):
        if isinstance(value, torch.Tensor):
            tensors[where] = value.detach()
            return {"__tensor__": where}
        if isinstance(value, dict):
            return {"__dict__": [[k, walk(v, f"{where}/{k}")] for k, v in value.items()]}
        if isinstance(value, tuple):
            return {"__tuple__": [walk(v, f"{where}/{i}") for i, v in enumerate(value)]}
        if isinstance(value, list):
            return [walk(v, f"{where}/{i}") for i, v in enumerate(value)]
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"cannot checkpoint a {type(value).__name__} at {where or '/'}")

    return walk(obj, path), tensors


def join_state(skeleton, tensors: dict[str, torch.Tensor]):
    """Inverse of :func:`split_state`."""
    if isinstance(skeleton, list):
        return [join_state(v, tensors) for v in skeleton]
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__tuple__" in skeleton:
            return tuple(join_state(v, tensors) for v in skeleton["__tuple__"])
        return {k: join_state(v, tensors) for k, v in skeleton["__dict__"]}
    return skeleton


# -- where they live -----------------------------------------------------------------------
def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def latest_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """(iterations done, folder) of the newest complete checkpoint, or None."""
    root = checkpoint_root(run_dir)
    try:
        latest = json.loads((root / LATEST).read_text())
        folder = root / latest["folder"]
        if (folder / ".metadata").exists():
            return int(latest["iterations_done"]), folder
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


# -- save and load (collective) ------------------------------------------------------------
def save_checkpoint(run_dir: Path, iterations_done: int, rank_state: dict) -> dict:
    """Every rank calls this at the same iteration; returns {seconds, bytes} (rank 0's view)."""
    import torch.distributed.checkpoint as dcp

    started = time.perf_counter()
    rank = dist.get_rank()
    root = checkpoint_root(run_dir)
    name = f"it-{iterations_done:08d}"
    staging = root / f".{name}.partial"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier()
    skeleton, tensors = split_state(rank_state)
    (staging / f"skeleton-rank{rank:05d}.json").write_text(json.dumps(skeleton))
    dcp.save({f"rank{rank}{k}": t for k, t in tensors.items()}, checkpoint_id=staging)
    dist.barrier()  # every rank's skeleton and tensors are on disk, the metadata last
    stats = {"iterations_done": iterations_done, "seconds": 0.0, "bytes": 0}
    if rank == 0:
        final = root / name
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
        write_json(root / LATEST, {"folder": name, "iterations_done": iterations_done})
        for old in root.glob("it-*"):
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
        stats["bytes"] = sum(f.stat().st_size for f in final.iterdir())
    stats["seconds"] = time.perf_counter() - started
    return stats


def load_checkpoint(folder: Path) -> dict:
    """This rank's state from a complete checkpoint folder (collective over the world)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    rank = dist.get_rank()
    try:
        skeleton = json.loads((folder / f"skeleton-rank{rank:05d}.json").read_text())
        metadata = FileSystemReader(folder).read_metadata()
    except (OSError, ValueError) as exc:
        raise BenchError(f"checkpoint {folder} is unreadable ({exc})") from None
    prefix = f"rank{rank}"
    wanted = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(prefix + "/"):
            wanted[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    dcp.load(wanted, checkpoint_id=folder)
    return join_state(skeleton, {k[len(prefix) :]: t for k, t in wanted.items()})
