"""Datasets as whole tensors, normalized once when decoded, held once per host.

The benchmark datasets are small (Fashion-MNIST 190 MB, CIFAR-10 620 MB as float32), so
holding a split as one tensor lets every rank slice its shard and batches without a
DataLoader's worker processes, which would compete with the ranks for CPU cores. A split is
decoded once per host and memory-mapped by every rank (suite.data.shared): the host holds one
copy, not one per rank.

``fmnist``, ``cifar10`` and ``synthetic`` are built in; a plugin adds its own with
``@DATASETS.register(name, spec, sizes)`` on a loader (``suite.api.DATASETS``), in the module
its ``prunex_bench.workloads`` entry point names, so the dataset exists whenever the
workloads are loaded (every command resolves the workload before it reads data).
"""

from __future__ import annotations

import functools
import gzip
import pickle
import tarfile
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from suite.data.shared import file_identity, shared_splits
from suite.data.workload import DatasetSpec, TensorData
from suite.errors import BenchError

DEFAULT_ROOT = Path("data")  # where --download puts data when --data-dir is not given
FMNIST_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
FMNIST_MEAN, FMNIST_STD = (0.2860,), (0.3530,)
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
IDX_IMAGES, IDX_LABELS = 2051, 2049  # IDX magic numbers: unsigned bytes, 3 and 1 dims

#: ``load(data_dir, download) -> (train, test)``: a dataset's splits, normalized
Loader = Callable[[str | Path | None, bool], tuple[TensorData, TensorData]]


#: ``sources(data_dir) -> files``: the files a dataset's splits are decoded from (None where
#: they are not all there yet): what names its decoded copy in the host's cache
Sources = Callable[[str | Path | None], "list[Path] | None"]


@dataclass(frozen=True)
class Dataset:
    """A named dataset: its shape, its split sizes (read without loading it, e.g. by the
    simulator), how to load it, and (optionally) the files it is decoded from, which let
    the ranks of a host share one decoded copy (suite.data.shared)."""

    spec: DatasetSpec
    sizes: tuple[int, int]
    load: Loader
    sources: Sources | None = None


class DatasetRegistry:
    """Name -> dataset (``suite.api.DATASETS``); ``synthetic`` is not in it (it is generated
    to fit the model). ``register`` is the decorator a plugin uses."""

    def __init__(self):
        self._datasets: dict[str, Dataset] = {}

    def register(self, name: str, spec: DatasetSpec, sizes: tuple[int, int],
                 sources: Sources | None = None):
        """Decorator on a loader ``load(data_dir, download) -> (train, test)`` of
        ``TensorData`` (images float32, normalized, (N, C, H, W)); errors it raises for
        missing or corrupt data should be one-line ``BenchError`` naming the fix.

        Args:
            name: the ``--dataset`` name.
            spec: its images' channels and size, and its class count.
            sizes: (train, test) sample counts.
            sources: the files the splits are decoded from (``sources(data_dir)``, None
                while missing): given, a host decodes them once and its ranks share the copy
                (suite.data.shared); else every rank loads its own.

        Examples:
            ```python
            @DATASETS.register("mnist", DatasetSpec("mnist", 1, 28, 10), (60000, 10000))
            def load_mnist(data_dir, download):
                return train, test
            ```
        """

        def decorate(load: Loader) -> Loader:
            if name in self._datasets or name == "synthetic":
                raise BenchError(f"dataset {name!r} is registered twice")
            self._datasets[name] = Dataset(replace(spec, name=name), tuple(sizes), load,
                                           sources)
            return load

        return decorate

    def names(self) -> list[str]:
        return sorted([*self._datasets, "synthetic"])

    def get(self, name: str) -> Dataset:
        if name not in self._datasets:
            raise BenchError(f"unknown dataset {name!r}; known: {', '.join(self.names())}")
        return self._datasets[name]


DATASETS = DatasetRegistry()
SYNTHETIC = DatasetSpec("synthetic", in_chans=3, image_size=32, num_classes=10)


def dataset_spec(name: str) -> DatasetSpec:
    """Shape of a dataset's images and its class count, for building a matching model."""
    if name == "synthetic":
        return replace(SYNTHETIC)
    return replace(DATASETS.get(name).spec)  # a copy: callers may not edit the table


def split_sizes(name: str, synthetic_size: tuple[int, int] = (4096, 1024)) -> tuple[int, int]:
    """(train, test) sample counts of a dataset, without reading it."""
    return tuple(synthetic_size) if name == "synthetic" else DATASETS.get(name).sizes


def load_data(
    dataset: str,
    *,
    data_dir: str | Path | None = None,
    download: bool = False,
    seed: int = 0,
    synthetic_size: tuple[int, int] = (4096, 1024),
    spec_hint: DatasetSpec | None = None,
) -> tuple[TensorData, TensorData, DatasetSpec]:
    """Train split, test split and spec of a dataset; problems raise a one-line BenchError.

    ``spec_hint`` shapes ``synthetic`` data (channels, size, classes) to fit a given model;
    ``seed`` only matters for ``synthetic``.
    """
    spec = dataset_spec(dataset)
    if dataset == "synthetic":
        if spec_hint is not None:
            spec = replace(spec_hint, name="synthetic")
        key = {"dataset": "synthetic", "spec": asdict(spec), "seed": seed,
               "sizes": list(synthetic_size)}
        train, test = shared_splits(key, lambda: _synthetic(spec, seed, synthetic_size),
                                    decoder=_synthetic)
        return train, test, spec
    entry = DATASETS.get(dataset)
    files = entry.sources(data_dir) if entry.sources is not None else None
    if not files:  # unknown or not there yet (a download, a clear error): loaded here
        train, test = entry.load(data_dir, download)
    else:
        key = {"dataset": dataset, "files": file_identity(files)}
        train, test = shared_splits(key, lambda: entry.load(data_dir, False), decoder=entry.load)
    return train, test, spec


def _normalized(
    pixels: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]
) -> torch.Tensor:
    """uint8 (N, C, H, W) -> float32 standardized per channel."""
    images = torch.tensor(pixels, dtype=torch.float32).div_(255)
    shape = (1, -1, 1, 1)
    return images.sub_(torch.tensor(mean).view(shape)).div_(torch.tensor(std).view(shape))


def _root(data_dir: str | Path | None) -> Path:
    """Absolute, so error messages say where exactly the files were expected."""
    return Path(data_dir if data_dir is not None else DEFAULT_ROOT).absolute()


def _one_line(exc: BaseException) -> str:
    """The exception in one line: BenchError messages must stay single-line."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# --- Fashion-MNIST --------------------------------------------------------------------------

FMNIST_SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
FMNIST_FIX = (
    "apt-get install dataset-fashion-mnist (and drop --data-dir), or pass --data-dir DIR "
    "holding the four IDX files (gzipped or not), or --download on a machine with a network"
)


def _fmnist_dirs(data_dir: str | Path | None) -> list[Path]:
    """Where to look: the given directory as is and in torchvision's layout."""
    if data_dir is None:
        return [FMNIST_DIR, _root(None) / "FashionMNIST" / "raw"]
    return [_root(data_dir), _root(data_dir) / "FashionMNIST" / "raw"]


def _find_idx(dirs: list[Path], stem: str) -> Path | None:
    for folder in dirs:
        for name in (f"{stem}.gz", stem):
            if (folder / name).is_file():
                return folder / name
    return None


def _fmnist_files(data_dir) -> list[Path] | None:
    """The four IDX files where the loader would find them, None while one is missing."""
    dirs = _fmnist_dirs(data_dir)
    found = [_find_idx(dirs, stem) for pair in FMNIST_SPLITS.values() for stem in pair]
    return None if None in found else found


@DATASETS.register("fmnist", DatasetSpec("fmnist", 1, 28, 10), (60000, 10000),
                   sources=_fmnist_files)
def _load_fmnist(data_dir, download: bool) -> tuple[TensorData, TensorData]:
    dirs = _fmnist_dirs(data_dir)
    stems = [stem for pair in FMNIST_SPLITS.values() for stem in pair]
    found = {stem: _find_idx(dirs, stem) for stem in stems}
    if download and None in found.values():
        root = _root(data_dir)
        # lazy: torchvision costs ~1.3 s to import; only this path needs it
        from torchvision import datasets

        try:  # torchvision fetches into root/FashionMNIST/raw, the second place we look
            datasets.FashionMNIST(str(root), train=True, download=True)
        except (RuntimeError, OSError) as exc:
            why = _one_line(exc)
            raise BenchError(f"Fashion-MNIST download to {root} failed: {why}") from exc
        found = {stem: _find_idx(dirs, stem) for stem in stems}
    missing = [stem for stem, path in found.items() if path is None]
    if missing:
        where = " or ".join(str(d) for d in dirs)
        raise BenchError(
            f"Fashion-MNIST not found: no {missing[0]}.gz (or unzipped) in {where}; {FMNIST_FIX}"
        )
    train, test = (
        _fmnist_split(found[images], found[labels]) for images, labels in FMNIST_SPLITS.values()
    )
    return train, test


def _fmnist_split(images_path: Path, labels_path: Path) -> TensorData:
    images = _read_idx(images_path, IDX_IMAGES)
    labels = _read_idx(labels_path, IDX_LABELS)
    if images.shape[1:] != (28, 28):
        raise _idx_corrupt(images_path, f"images are {images.shape[1:]}, not 28x28")
    if len(images) != len(labels):
        raise _idx_corrupt(
            labels_path, f"{len(labels)} labels for {len(images)} images in {images_path.name}"
        )
    if len(labels) and labels.max() >= 10:
        raise _idx_corrupt(labels_path, f"label {labels.max()} is not a class in 0..9")
    return TensorData(
        _normalized(images[:, None], FMNIST_MEAN, FMNIST_STD),
        torch.tensor(labels, dtype=torch.int64),
    )


def _idx_corrupt(path: Path, why: str) -> BenchError:
    return BenchError(
        f"Fashion-MNIST file {path} is corrupt ({why}); replace it, e.g. "
        "apt-get install --reinstall dataset-fashion-mnist"
    )


def _read_idx(path: Path, magic: int) -> np.ndarray:
    """Parse an IDX file (big-endian header: magic, then one int32 per dimension)."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":  # gzip magic: accept files gzipped whatever their name
            raw = gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
        raise _idx_corrupt(path, _one_line(exc)) from exc
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise _idx_corrupt(path, f"{len(raw)} bytes is shorter than the IDX header")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise _idx_corrupt(path, f"magic number {found}, expected {magic}")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">i4", count=ndim, offset=4))
    expected = header + int(np.prod(dims))
    if len(raw) != expected:
        raise _idx_corrupt(path, f"{len(raw)} bytes, the header {dims} implies {expected}")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


# --- CIFAR-10 -------------------------------------------------------------------------------

CIFAR_FIX = (
    "pass --data-dir DIR containing cifar-10-batches-py, or --download on a machine with a network"
)


@functools.cache
def _cifar10_files_class() -> type:
    """torchvision's CIFAR-10 layout and downloader; loading is ours.

    torchvision's md5 check of each batch would reject small test sets, and its loader
    cannot say which file is bad, so this only downloads and reading detects corruption.
    torchvision is imported here, not with the module: importing it costs a process about
    3 s, and most runs never read CIFAR-10.
    """
    # lazy: torchvision costs ~1.3 s to import; only this path needs it
    from torchvision import datasets

    class Cifar10Files(datasets.CIFAR10):
        def __init__(self, root: Path):
            datasets.VisionDataset.__init__(self, str(root))  # not CIFAR10's: it would load

        def _check_integrity(self) -> bool:  # download() skips the fetch when this holds
            paths = self.batch_paths(train=True) + self.batch_paths(train=False)
            return all(path.is_file() for path in paths)

        def batch_paths(self, *, train: bool) -> list[Path]:
            names = self.train_list if train else self.test_list
            return [Path(self.root, self.base_folder, name) for name, _md5 in names]

    return Cifar10Files


def _cifar10_files(data_dir) -> list[Path] | None:
    """The six batch files where the loader would read them, None while one is missing."""
    files = _cifar10_files_class()(_root(data_dir))
    paths = files.batch_paths(train=True) + files.batch_paths(train=False)
    return paths if all(path.is_file() for path in paths) else None


@DATASETS.register("cifar10", DatasetSpec("cifar10", 3, 32, 10), (50000, 10000),
                   sources=_cifar10_files)
def _load_cifar10(data_dir, download: bool) -> tuple[TensorData, TensorData]:
    root = _root(data_dir)
    files = _cifar10_files_class()(root)
    if download:
        try:
            files.download()
        except (RuntimeError, OSError, tarfile.TarError) as exc:
            raise BenchError(f"CIFAR-10 download to {root} failed: {_one_line(exc)}") from exc
    folder = root / files.base_folder
    if not folder.is_dir():
        raise BenchError(f"CIFAR-10 not found at {folder}; {CIFAR_FIX}")
    train = _cifar_split(files.batch_paths(train=True), augment=True)
    test = _cifar_split(files.batch_paths(train=False), augment=False)
    return train, test


def _cifar_split(paths: list[Path], augment: bool) -> TensorData:
    batches = [_read_cifar_batch(path) for path in paths]
    pixels = np.concatenate([data for data, _ in batches]).reshape(-1, 3, 32, 32)
    labels = np.concatenate([labels for _, labels in batches])
    return TensorData(
        _normalized(pixels, CIFAR_MEAN, CIFAR_STD),
        torch.tensor(labels, dtype=torch.int64),
        augment=augment,
    )


#: the globals a CIFAR-10 batch names: numpy's array reconstruction under its old and new
#: module names (pickle protocol 2, as the files ship, and 5) and protocol 2's bytes; lists,
#: dicts, numbers and strings need none
CIFAR_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
})


class CifarBatchUnpickler(pickle.Unpickler):
    """pickle's Unpickler that resolves only ``CIFAR_GLOBALS`` (the allow-list of Python's
    pickle documentation, "Restricting Globals"): a batch file is data a user downloaded or
    copied, and a pickle naming anything else would run it while loading."""

    def find_class(self, module: str, name: str):
        if (module, name) in CIFAR_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"names {module}.{name}, which a CIFAR-10 batch never "
                                     "holds: refused, nothing of it was run")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    if not path.is_file():
        raise BenchError(f"CIFAR-10 file {path} is missing; {CIFAR_FIX}")
    try:
        with path.open("rb") as f:  # the files were pickled by Python 2: latin1 strings
            entry = CifarBatchUnpickler(f, encoding="latin1").load()
        data, labels = _field(entry, "data"), np.asarray(_field(entry, "labels"))
    except Exception as exc:  # unpickling garbage can raise almost any exception type
        raise _cifar_corrupt(path, _one_line(exc)) from exc
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2):
        raise _cifar_corrupt(path, "'data' is not a 2-d uint8 array")
    if data.shape[1] != 3 * 32 * 32 or len(data) == 0:
        raise _cifar_corrupt(path, f"'data' has shape {data.shape}, expected (n, 3072)")
    if labels.shape != (len(data),) or not np.issubdtype(labels.dtype, np.integer):
        raise _cifar_corrupt(path, f"'labels' has shape {labels.shape}, expected ({len(data)},)")
    if labels.min() < 0 or labels.max() >= 10:
        raise _cifar_corrupt(path, "'labels' holds values outside 0..9")
    return data, labels


def _field(entry: dict, key: str):
    """Python 2 pickles give str keys under latin1; files written by Python 3 may use bytes."""
    return entry[key] if key in entry else entry[key.encode()]


def _cifar_corrupt(path: Path, why: str) -> BenchError:
    return BenchError(
        f"CIFAR-10 file {path} is corrupt ({why}); delete {path.parent} and rerun with "
        "--download, or pass --data-dir DIR containing an intact cifar-10-batches-py"
    )


# --- synthetic ------------------------------------------------------------------------------


def _synthetic(
    spec: DatasetSpec, seed: int, sizes: tuple[int, int]
) -> tuple[TensorData, TensorData]:
    """Each class is a fixed smooth random pattern plus pixel noise: any model can learn it,
    so smoke runs show accuracy rising, and the noise keeps it from being solved at once."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(spec.num_classes, spec.in_chans, 4, 4, generator=g)
    size = (spec.image_size, spec.image_size)
    means = F.interpolate(coarse, size=size, mode="bilinear", align_corners=False)

    def split(n: int) -> TensorData:
        labels = torch.randint(0, spec.num_classes, (n,), generator=g)
        noise = torch.randn(n, spec.in_chans, *size, generator=g)
        return TensorData(means[labels] + noise, labels)

    train_size, test_size = sizes
    return split(train_size), split(test_size)
