"""Datasets held once per host: a split is decoded once, written to a cache file, and
memory-mapped by every rank of the host, so the page cache holds one copy however many ranks
map it (64 ranks of Fashion-MNIST held 64 float32 copies, 13 GB, where one is 0.2 GB).

A cache entry is named by what it was decoded from (the source files' paths, sizes and
modification times; a synthetic split's spec, seed and sizes) and by what decoded it (the
loader's module source, torch's and numpy's versions), so a changed file or a changed loader
is decoded anew, never served stale. The first process of the host to need an entry decodes
and writes it under a file lock while the others wait; every write goes to a temporary folder
renamed into place. Entries are mapped copy-on-write (``numpy.memmap`` mode ``c``): a rank
that wrote to its images would change its own pages, never the file or another rank's. The
cache keeps at most ``CACHE_LIMIT_BYTES`` (least recently used entries go first). Where the
cache cannot be written (a read-only home, a full disk), each process decodes its own copy,
as before.

``PRUNEX_DATA_CACHE`` names the cache folder (default: ``$XDG_CACHE_HOME/prunex-bench/data``,
else ``~/.cache/prunex-bench/data``); on a cluster it is per host unless home is shared, in
which case the hosts share the entries (written atomically all the same).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import torch

from suite.data.workload import TensorData

CACHE_VARIABLE = "PRUNEX_DATA_CACHE"
#: the most the cache keeps on disk; older entries are removed when a new one is written
CACHE_LIMIT_BYTES = 8 << 30
#: the layout of an entry (a change makes every entry new)
FORMAT = 1
SPLITS = ("train", "test")
META = "meta.json"

Splits = tuple[TensorData, TensorData]


def cache_root() -> Path:
    """Where the host's decoded datasets live (read when asked, never at import)."""
    given = os.environ.get(CACHE_VARIABLE)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "prunex-bench" / "data"


def file_identity(paths: list[Path]) -> list[list]:
    """What names a decoded copy of ``paths``: each file's real path, size and modification
    time (a file replaced or edited is decoded again)."""
    found = []
    for path in paths:
        info = path.stat()
        found.append([str(path.resolve()), info.st_size, info.st_mtime_ns])
    return found


@cache
def decoder_version(module_name: str) -> str:
    """What names the code that decodes: the source of the loader's module (a plugin's, or
    suite.data.datasets) and torch's and numpy's versions."""
    path = getattr(sys.modules.get(module_name), "__file__", None)
    try:
        source = Path(path).read_bytes() if path else module_name.encode()
    except OSError:
        source = module_name.encode()
    versions = f"{torch.__version__} {np.__version__}".encode()
    return hashlib.sha256(source + versions).hexdigest()[:16]


def cache_usable(needed_bytes: int) -> bool:
    """Whether an entry of ``needed_bytes`` can be written to the cache now (its folder, or
    the nearest existing parent, writable, with room on its disk). Where not, every process
    decodes its own copy, and a memory estimate must charge each."""
    probe = cache_root()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return os.access(probe, os.W_OK | os.X_OK) and shutil.disk_usage(probe).free >= needed_bytes
    except OSError:
        return False


def shared_splits(key: dict, build: Callable[[], Splits], *,
                  decoder: Callable | None = None) -> Splits:
    """The (train, test) splits ``build`` makes, decoded once per host and memory-mapped.

    Args:
        key: what the splits are made of (JSON); equal keys mean equal data.
        build: decodes the splits (normalized float32 images, int64 labels).
        decoder: the function whose module decodes (default ``build``): its source is part
            of the entry's name.

    Returns:
        The splits, their images and labels mapped from the host's cache (or, where the
        cache cannot be used, ``build()``'s own).
    """
    decoding = {"format": FORMAT, "decoder": decoder_version((decoder or build).__module__)}
    digest = hashlib.sha256(json.dumps({**key, **decoding}, sort_keys=True).encode())
    name = digest.hexdigest()[:32]
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / f".{name}.lock", "a+")  # noqa: SIM115 -- held below
    except OSError:  # no cache here: this process keeps its own copy
        return build()
    with lock:  # the first process of the host decodes; the others wait, then map its copy
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        entry = root / name
        mapped = _mapped(entry)
        if mapped is not None:
            try:
                os.utime(entry)  # recently used: pruned last
            except OSError:  # a read-only cache still serves its entries
                pass
            return mapped
        splits = build()
        try:
            _write(entry, splits)
        except OSError:  # a full disk: the data is in memory already
            return splits
        try:
            _prune(root, keep=name)
        except OSError:  # another host pruning the same shared folder: its turn
            pass
        return _mapped(entry) or splits


def _write(entry: Path, splits: Splits) -> None:
    """The splits as raw arrays and their shapes, in a temporary folder renamed into place
    (a reader sees a whole entry or none)."""
    staging = entry.with_name(f".{entry.name}.tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        meta = {}
        for name, data in zip(SPLITS, splits, strict=True):
            images = data.images.detach().to(torch.float32).contiguous().numpy()
            labels = data.labels.detach().to(torch.int64).contiguous().numpy()
            images.tofile(staging / f"{name}-images.f32")
            labels.tofile(staging / f"{name}-labels.i64")
            meta[name] = {"shape": list(images.shape), "augment": bool(data.augment)}
        (staging / META).write_text(json.dumps(meta))
        shutil.rmtree(entry, ignore_errors=True)  # a damaged entry of the same name
        os.replace(staging, entry)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _mapped(entry: Path) -> Splits | None:
    """An entry's splits mapped copy-on-write, or None where it is absent or not whole (its
    files' sizes disagree with its shapes: decoded again)."""
    try:
        meta = json.loads((entry / META).read_text())
        splits = []
        for name in SPLITS:
            shape = tuple(int(d) for d in meta[name]["shape"])
            count = shape[0]
            images_file, labels_file = entry / f"{name}-images.f32", entry / f"{name}-labels.i64"
            if (images_file.stat().st_size != 4 * int(np.prod(shape))
                    or labels_file.stat().st_size != 8 * count):
                return None
            images = np.memmap(images_file, dtype=np.float32, mode="c", shape=shape) \
                if count else np.zeros(shape, np.float32)
            labels = np.fromfile(labels_file, dtype=np.int64)
            splits.append(TensorData(torch.from_numpy(images), torch.from_numpy(labels),
                                     augment=bool(meta[name]["augment"])))
        return splits[0], splits[1]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _prune(root: Path, keep: str) -> None:
    """Remove the least recently used entries beyond ``CACHE_LIMIT_BYTES`` (never ``keep``;
    a rank that maps a removed entry keeps reading it: the files live until unmapped). The
    entries' lock files stay (empty): one removed while a process waits on it would let the
    next process lock a new file and decode beside it."""
    entries = []
    for entry in root.iterdir():
        if entry.is_dir() and not entry.name.startswith("."):
            try:
                size = sum(f.stat().st_size for f in entry.iterdir() if f.is_file())
                entries.append((entry.stat().st_mtime, size, entry))
            except OSError:  # removed meanwhile (another host's prune)
                continue
    total = sum(size for _, size, _ in entries)
    for _, size, entry in sorted(entries):
        if total <= CACHE_LIMIT_BYTES:
            break
        if entry.name != keep:
            shutil.rmtree(entry, ignore_errors=True)
            total -= size
