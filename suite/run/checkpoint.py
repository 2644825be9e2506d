"""Checkpoints of a run: everything every rank needs to continue exactly where it stopped.

Each rank's state (its model and optimizer, the method's whole state, the loader position, RNG
states and the training loop's counters) is split into tensors and a JSON skeleton. The tensors
of all ranks go into one PyTorch Distributed Checkpoint, which writes the ranks' files in
parallel with the metadata last. Most state differs per rank (local models, PruneX's u) and is
keyed ``rank3/...``; what a method files under a ``shared_node`` or ``shared_world`` key is the
same on every rank of a node (PruneX's z_i, v_i) or of the world (z) and is keyed ``node1/...``
or ``world/...``, so DCP writes it once (it keeps one copy of a key every rank saves): a PruneX
checkpoint of 64 ranks on 16 nodes holds 3.6 instead of 7 copies of the model per rank. The
skeletons hold the rest (ints, floats, flags, dict keys) as JSON, since DCP's own planner
would unpickle non-tensor values with ``weights_only=False``. DCP writes its ``.metadata`` with
pickle and reads it with ``pickle.load`` (torch 2.11 to 2.14 have no safe path for it), so the
suite reads it itself (``read_metadata``) with an unpickler that resolves only the classes DCP
writes there (its metadata records, torch dtypes and sizes, a path): a ``.metadata`` naming
anything else is refused in one line before anything of it runs, by ``bench run --resume``'s
preflight, a sweep's resume and the ranks alike (a run folder travels: it is input). The
tensors are read by DCP with ``torch.load(weights_only=True)``.

A checkpoint is written to a hidden folder that is renamed into place once every rank has
written, and ``latest.json`` names the newest complete one, so a crash mid-save leaves the last
complete checkpoint in charge. Older checkpoints are removed after a new one is complete.
"""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist

from suite.cluster.watchdog import barrier, watched
from suite.errors import QUOTE_LIMIT, BenchError, one_line, os_reason
from suite.results.folder import write_json
from suite.results.records import (
    DamagedFile,
    LatestCheckpoint,
    read_bytes,
    read_json_file,
    read_record,
)

CHECKPOINTS = "checkpoints"
LATEST = "latest.json"
#: the most a checkpoint's ``.metadata`` or a rank's skeleton may hold: far above a real one
#: (64 ranks' entries of ResNet-152 are tens of MB), far below what would exhaust memory
METADATA_BYTES = 1 << 30


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
    try:  # a damaged or crafted latest.json names no checkpoint (DamagedFile: a ValueError)
        latest = read_record(root / LATEST, LatestCheckpoint, what="checkpoint pointer")
    except (OSError, ValueError):
        return None
    folder = root / latest["folder"]
    if (folder / ".metadata").is_file():
        return int(latest["iterations_done"]), folder
    return None


def unfinished_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoints begun and never completed (``.it-*.partial``: a save that failed, on a
    full disk, or was killed), oldest first."""
    return sorted(checkpoint_root(run_dir).glob(".it-*.partial"))


def checked_checkpoint(run_dir: Path) -> tuple[int, Path] | None:
    """``latest_checkpoint`` with its metadata read safely first (``read_metadata``): what
    a resume checks before any rank starts. Raises BenchError on a refused metadata."""
    found = latest_checkpoint(run_dir)
    if found is not None:
        read_metadata(found[1])
    return found


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
    with watched("save", "world (torch.distributed.checkpoint)"), dcp_failure_said(
            f"checkpoint {staging.name} could not be written"):
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


@contextlib.contextmanager
def dcp_failure_said(what: str):
    """DCP's failure as one line: its ``CheckpointException`` is a BaseException carrying
    every rank's traceback (a full disk printed 20 of them, one per rank and rank seen),
    which the ranks' process would print whole; it becomes a BenchError naming the cause
    (a rank's OSError first: ``no space left on device``).

    Raises:
        BenchError: ``what`` and the cause.
    """
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as exc:
        failures = [pair[0] for _, pair in sorted(exc.failures.items())
                    if isinstance(pair, tuple) and pair and isinstance(pair[0], BaseException)]
        cause = next((f for f in failures if isinstance(f, OSError)), None)
        if cause is not None:
            why = os_reason(cause)
        else:
            first = failures[0] if failures else exc
            why = one_line(f"{type(first).__name__}: {first}".splitlines()[0], QUOTE_LIMIT)
        raise BenchError(f"{what} ({why})") from None


#: the globals a DCP ``.metadata`` names (module, name): its records, the torch types inside
#: them (dtypes are checked apart: any ``torch.<dtype>``) and the path it may keep of itself
METADATA_GLOBALS = {
    *(("torch.distributed.checkpoint.metadata", name) for name in (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
        "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    # where releases before DCP kept its own copy wrote the properties of a tensor
    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
    ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout from its name ("torch.strided")
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class ForeignGlobal(pickle.UnpicklingError):
    """A ``.metadata`` names something outside ``METADATA_GLOBALS``."""


class MetadataUnpickler(pickle.Unpickler):
    """pickle's Unpickler that resolves only ``METADATA_GLOBALS`` and torch's dtypes: the
    allow-list pattern of Python's pickle documentation ("Restricting Globals"), as torch's
    ``weights_only`` loader does for tensors. Nothing else can be called while loading."""

    def find_class(self, module: str, name: str):
        if (module, name) in METADATA_GLOBALS or (
            module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        ):
            return super().find_class(module, name)
        raise ForeignGlobal(f"{module}.{name}")


def read_metadata(folder: Path):
    """A checkpoint's DCP metadata, read without running anything it names.

    Raises:
        BenchError: it names a class DCP never writes there (a crafted or foreign file:
            nothing of it ran), or it is missing, damaged or not DCP's.
    """
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(folder) / ".metadata"
    try:
        data = read_bytes(path, what="checkpoint's metadata", limit=METADATA_BYTES)
    except (OSError, ValueError) as exc:
        why = exc.problem if isinstance(exc, DamagedFile) else one_line(exc, QUOTE_LIMIT)
        raise BenchError(f"checkpoint {path} is unreadable ({why})") from None
    try:
        metadata = MetadataUnpickler(io.BytesIO(data)).load()
    except ForeignGlobal as exc:
        raise BenchError(f"checkpoint {path} names {exc}, which DCP's metadata never holds: "
                         "refused, nothing of it was run (a run folder is input; resume from "
                         "a checkpoint you wrote)") from None
    except Exception as exc:  # an allowed global called on crafted arguments
        # (``_get_layout("x")`` raises KeyError) or garbage can raise almost anything
        raise BenchError(f"checkpoint {path} is unreadable ({type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:120]})") from None
    if type(metadata) is not Metadata:
        raise BenchError(f"checkpoint {path} holds a {type(metadata).__name__}, not DCP's "
                         "Metadata")
    check_tensors_only(metadata, path)
    return metadata


def check_tensors_only(metadata, path: Path) -> None:
    """Every entry of a checkpoint of this suite is a tensor stored in a file of its folder.

    DCP reads an entry recorded as bytes with ``torch.load(weights_only=False)``
    (``DefaultLoadPlanner.load_bytes``), which runs whatever pickle it holds, and its reader
    opens whatever path an entry's storage names: an entry of any other kind, or a storage
    outside the folder, is refused before DCP reads anything.

    Raises:
        BenchError: naming the first entry that is not a tensor, or a storage path that
            leaves the folder.
    """
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        TensorProperties,
        TensorStorageMetadata,
    )

    entries = metadata.state_dict_metadata
    if not isinstance(entries, dict):
        raise BenchError(f"checkpoint {path} is unreadable (its entries are not a mapping)")
    for key, entry in entries.items():
        kind = type(entry).__name__
        fine = (type(entry) is TensorStorageMetadata and isinstance(key, str)
                and isinstance(getattr(entry, "properties", None), TensorProperties)
                and isinstance(entry.properties.dtype, torch.dtype)
                and isinstance(entry.size, torch.Size)
                and isinstance(entry.chunks, list)
                and all(type(chunk) is ChunkStorageMetadata for chunk in entry.chunks))
        if not fine:
            shown = str(key)[:80]
            raise BenchError(f"checkpoint {path} holds {shown!r} as a {kind}, not a tensor: "
                             "a checkpoint of this suite holds tensors only; refused, nothing "
                             "of it was read")
    storage = getattr(metadata, "storage_data", None) or {}
    for info in storage.values() if isinstance(storage, dict) else [None]:
        name = getattr(info, "relative_path", None)
        if not (isinstance(name, str) and name and "/" not in name and "\\" not in name
                and name not in (".", "..")):
            raise BenchError(f"checkpoint {path} stores a tensor at {str(name)[:80]!r}, "
                             "outside its folder: refused, nothing of it was read")


def safe_reader(folder: Path):
    """DCP's FileSystemReader of ``folder`` whose metadata is read by ``read_metadata``."""
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_metadata(folder)
            if getattr(metadata, "storage_meta", None) is None:  # as DCP's own reader does
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(folder)


def tensors_only_planner():
    """DCP's default load planner that refuses to unpickle: ``read_metadata`` already
    refuses a non-tensor entry, and this keeps ``load_bytes`` (``torch.load`` with
    ``weights_only=False``) unreachable whatever a later torch reads as bytes."""
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class TensorsOnly(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            raise BenchError(f"checkpoint entry {read_item.dest_index.fqn!r} is not a tensor: "
                             "refused, nothing of it was read")

    return TensorsOnly()


def load_checkpoint(folder: Path, *, node: int) -> dict:
    """This rank's state from a complete checkpoint folder (collective over the world)."""
    # lazy: torch.distributed.checkpoint costs ~0.7 s to import; only this path needs it
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    try:
        skeleton = read_json_file(folder / f"skeleton-rank{rank:05d}.json", what="skeleton",
                                  limit=METADATA_BYTES)
    except (OSError, ValueError) as exc:
        raise BenchError(f"checkpoint {folder} is unreadable ({exc})") from None
    reader = safe_reader(folder)
    metadata = reader.read_metadata()
    prefixes = (f"rank{rank}/", f"node{node}/", "world/")
    wanted = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith(prefixes):
            wanted[key] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with watched("load", "world (torch.distributed.checkpoint)"), dcp_failure_said(
            f"checkpoint {folder} could not be read"):
        dcp.load(wanted, checkpoint_id=folder, storage_reader=reader,
                 planner=tensors_only_planner())
    return join_state(skeleton, {k[k.index("/") :]: t for k, t in wanted.items()})
