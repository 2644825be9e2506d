"""Checkpoints of a run: everything every rank needs to continue exactly where it stopped.

Each rank's state (its model and optimizer, the method's whole state, the loader position, RNG
states and the training loop's counters) is split into tensors and a JSON skeleton. The tensors
of all ranks go into one PyTorch Distributed Checkpoint, which writes the ranks' files in
parallel with the metadata last. Most state differs per rank (local models, PruneX's u) and is
keyed ``rank3/...``; what a method files under a ``shared_node`` or ``shared_world`` key is the
same on every rank of a node (PruneX's z_i, v_i) or of the world (z) and is keyed ``node1/...``
or ``world/...``, so DCP writes it once (it keeps one copy of a key every rank saves): a PruneX
checkpoint of 64 ranks on 16 nodes holds 3.6 instead of 7 copies of the model per rank. The
skeletons hold the rest (ints, floats, flags, dict keys) as JSON, so no pickle is ever loaded:
DCP's own planner would unpickle non-tensor values with ``weights_only=False``.

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

from suite.cluster.watchdog import barrier, watched
from suite.errors import BenchError
from suite.results.folder import write_json

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
    """Inverse of ``split_state``."""
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
SHARED = {"/shared_world/": "world", "/shared_node/": "node"}


def storage_key(path: str, rank: int, node: int) -> str:
    """Where a tensor of this rank's state is stored: once per rank, node or world."""
    for marker, scope in SHARED.items():
        if marker in path:
            return f"{scope}{node if scope == 'node' else ''}{path}"
    return f"rank{rank}{path}"


def save_checkpoint(run_dir: Path, iterations_done: int, rank_state: dict, *, node: int) -> dict:
    """Every rank calls this at the same iteration; returns {seconds, bytes} (rank 0's view).
    ``node``: this rank's node, the scope of its ``shared_node`` state."""
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    import torch.distributed.checkpoint as dcp

    started = time.perf_counter()
    rank = dist.get_rank()
    root = checkpoint_root(run_dir)
    name = f"it-{iterations_done:08d}"
    staging = root / f".{name}.partial"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    barrier("checkpoint folder made")
    skeleton, tensors = split_state(rank_state)
    (staging / f"skeleton-rank{rank:05d}.json").write_text(json.dumps(skeleton))
    with watched("save", "world (torch.distributed.checkpoint)"):
        dcp.save({storage_key(k, rank, node): t for k, t in tensors.items()},
                 checkpoint_id=staging)
    barrier("checkpoint written")  # every rank's skeleton and tensors are on disk, the metadata
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


def load_checkpoint(folder: Path, *, node: int) -> dict:
    """This rank's state from a complete checkpoint folder (collective over the world)."""
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    rank = dist.get_rank()
    try:
        skeleton = json.loads((folder / f"skeleton-rank{rank:05d}.json").read_text())
        metadata = FileSystemReader(folder).read_metadata()
    except (OSError, ValueError) as exc:
        raise BenchError(f"checkpoint {folder} is unreadable ({exc})") from None
    prefixes = (f"rank{rank}/", f"node{node}/", "world/")
    wanted = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(prefixes):
            wanted[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with watched("load", "world (torch.distributed.checkpoint)"):
        dcp.load(wanted, checkpoint_id=folder)
    return join_state(skeleton, {k[k.index("/") :]: t for k, t in wanted.items()})
