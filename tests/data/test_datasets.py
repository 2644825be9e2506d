"""The data layer: CIFAR-10 and Fashion-MNIST from their on-disk formats (tiny generated
files), clear one-line errors for missing or corrupt data, synthetic data, shards, batches
and augmentation."""

from __future__ import annotations

import gzip
import pickle
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
from torch import nn

from suite.data.datasets import CIFAR_MEAN, CIFAR_STD, FMNIST_DIR, dataset_spec, load_data
from suite.data.sharding import ShardedLoader, eval_slice, random_crop_flip
from suite.data.workload import DatasetSpec, TensorData
from suite.errors import BenchError

CIFAR_PER_BATCH = 20


def write_cifar(root: Path, *, bytes_keys: bool = True, seed: int = 0) -> dict[str, dict]:
    """Tiny CIFAR-10 in the real on-disk format (pickled dicts of uint8 rows and labels)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    key = (lambda k: k.encode()) if bytes_keys else (lambda k: k)
    written = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        entry = {
            key("data"): rng.integers(0, 256, (CIFAR_PER_BATCH, 3072), dtype=np.uint8),
            key("labels"): rng.integers(0, 10, CIFAR_PER_BATCH).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
        written[name] = entry
    meta = {key("label_names"): [f"class{i}" for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return written


def idx_bytes(array: np.ndarray, magic: int) -> bytes:
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_fmnist(folder: Path, *, gz: bool = True, n_train: int = 30, n_test: int = 10) -> None:
    """Tiny Fashion-MNIST as IDX files, gzipped like the originals or not."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = np.arange(n) % 10
        for stem, data in (
            (f"{prefix}-images-idx3-ubyte", idx_bytes(images, 2051)),
            (f"{prefix}-labels-idx1-ubyte", idx_bytes(labels, 2049)),
        ):
            if gz:
                (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
            else:
                (folder / stem).write_bytes(data)


def assert_one_line_naming(exc: pytest.ExceptionInfo, path: Path) -> None:
    message = str(exc.value)
    assert "\n" not in message
    assert str(path) in message


@pytest.mark.parametrize("bytes_keys", [True, False], ids=["py3-bytes-keys", "str-keys"])
def test_tiny_cifar10_loads_normalized(tmp_path, bytes_keys):
    written = write_cifar(tmp_path, bytes_keys=bytes_keys)
    train, test, spec = load_data("cifar10", data_dir=tmp_path)
    assert (spec.in_chans, spec.image_size, spec.num_classes) == (3, 32, 10)
    assert train.images.shape == (5 * CIFAR_PER_BATCH, 3, 32, 32)
    assert test.images.shape == (CIFAR_PER_BATCH, 3, 32, 32)
    assert train.images.dtype == torch.float32 and train.labels.dtype == torch.int64
    assert train.augment and not test.augment
    entry = written["test_batch"]
    raw = torch.tensor(entry[b"data" if bytes_keys else "data"]).view(-1, 3, 32, 32)
    mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(test.images, (raw / 255 - mean) / std)
    assert test.labels.tolist() == entry[b"labels" if bytes_keys else "labels"]


def test_cifar10_missing_directory_says_how_to_fix(tmp_path):
    with pytest.raises(BenchError, match="--data-dir DIR containing cifar-10-batches-py") as exc:
        load_data("cifar10", data_dir=tmp_path / "nowhere")
    assert_one_line_naming(exc, tmp_path / "nowhere" / "cifar-10-batches-py")


def test_cifar10_missing_batch_is_named(tmp_path):
    write_cifar(tmp_path)
    missing = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    missing.unlink()
    with pytest.raises(BenchError, match="missing") as exc:
        load_data("cifar10", data_dir=tmp_path)
    assert_one_line_naming(exc, missing)


@pytest.mark.parametrize(
    "content",
    [
        b"not a pickle at all\n\n",
        pickle.dumps({b"data": np.zeros((4, 3072), np.uint8)}),  # no labels
        pickle.dumps({b"data": np.zeros((4, 1000), np.uint8), b"labels": [0] * 4}),
        pickle.dumps({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2]}),
        pickle.dumps({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0, 1, 2, 10]}),
    ],
    ids=["garbage", "no-labels", "bad-shape", "label-count", "label-range"],
)
def test_cifar10_corrupt_file_is_named(tmp_path, content):
    write_cifar(tmp_path)
    bad = tmp_path / "cifar-10-batches-py" / "test_batch"
    bad.write_bytes(content)
    with pytest.raises(BenchError, match="corrupt") as exc:
        load_data("cifar10", data_dir=tmp_path)
    assert_one_line_naming(exc, bad)


def test_cifar10_download_goes_through_torchvision(tmp_path, monkeypatch):
    calls = []

    def fake_download(url, download_root, filename=None, md5=None):
        calls.append(url)
        write_cifar(Path(download_root))

    monkeypatch.setattr("torchvision.datasets.cifar.download_and_extract_archive", fake_download)
    train, _, _ = load_data("cifar10", data_dir=tmp_path, download=True)
    assert len(calls) == 1 and len(train) == 5 * CIFAR_PER_BATCH
    load_data("cifar10", data_dir=tmp_path, download=True)  # present: no second fetch
    assert len(calls) == 1


@pytest.mark.parametrize("layout", ["flat-gz", "torchvision-raw"])
def test_tiny_fmnist_loads(tmp_path, layout):
    if layout == "flat-gz":
        write_fmnist(tmp_path, gz=True)
    else:
        write_fmnist(tmp_path / "FashionMNIST" / "raw", gz=False)
    train, test, spec = load_data("fmnist", data_dir=tmp_path)
    assert (spec.in_chans, spec.image_size, spec.num_classes) == (1, 28, 10)
    assert train.images.shape == (30, 1, 28, 28) and test.images.shape == (10, 1, 28, 28)
    assert train.labels.tolist() == [i % 10 for i in range(30)]
    assert train.images.dtype == torch.float32 and not train.augment
    assert train.images.min() >= (0 - 0.2860) / 0.3530 - 1e-5
    assert train.images.max() <= (1 - 0.2860) / 0.3530 + 1e-5


def test_fmnist_missing_files_say_how_to_fix(tmp_path):
    with pytest.raises(BenchError, match="apt-get install dataset-fashion-mnist") as exc:
        load_data("fmnist", data_dir=tmp_path)
    assert_one_line_naming(exc, tmp_path)
    assert "--data-dir" in str(exc.value)


def corrupt_truncated(path: Path) -> None:
    path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:-5]))


def corrupt_magic(path: Path) -> None:
    data = bytearray(gzip.decompress(path.read_bytes()))
    data[2] = 0x09  # 2049 -> 2305
    path.write_bytes(gzip.compress(bytes(data)))


def corrupt_gzip(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # gzip stream cut short


def corrupt_count(path: Path) -> None:
    labels = np.zeros(29, np.uint8)  # one label short of the 30 images
    path.write_bytes(gzip.compress(idx_bytes(labels, 2049)))


@pytest.mark.parametrize("corrupt", [corrupt_truncated, corrupt_magic, corrupt_gzip, corrupt_count])
def test_fmnist_corrupt_file_is_named(tmp_path, corrupt):
    write_fmnist(tmp_path)
    bad = tmp_path / "train-labels-idx1-ubyte.gz"
    corrupt(bad)
    with pytest.raises(BenchError, match="corrupt") as exc:
        load_data("fmnist", data_dir=tmp_path)
    assert_one_line_naming(exc, bad)


def test_fmnist_download_goes_through_torchvision(tmp_path, monkeypatch):
    def fake_download(url, download_root, filename=None, md5=None):
        write_fmnist(Path(download_root), gz=False)

    monkeypatch.setattr("torchvision.datasets.mnist.download_and_extract_archive", fake_download)
    train, test, _ = load_data("fmnist", data_dir=tmp_path, download=True)
    assert (tmp_path / "FashionMNIST" / "raw" / "t10k-images-idx3-ubyte").is_file()
    assert (len(train), len(test)) == (30, 10)


@pytest.mark.parametrize("dataset,module", [("cifar10", "cifar"), ("fmnist", "mnist")])
def test_failed_download_is_one_line(tmp_path, monkeypatch, dataset, module):
    def offline(*args, **kwargs):
        raise URLError("Temporary failure in name resolution")

    monkeypatch.setattr(f"torchvision.datasets.{module}.download_and_extract_archive", offline)
    with pytest.raises(BenchError, match="download") as exc:
        load_data(dataset, data_dir=tmp_path, download=True)
    assert_one_line_naming(exc, tmp_path)


@pytest.mark.skipif(not FMNIST_DIR.is_dir(), reason="Debian dataset-fashion-mnist not installed")
def test_debian_fashion_mnist_loads():
    train, test, _ = load_data("fmnist")
    assert train.images.shape == (60000, 1, 28, 28) and test.images.shape == (10000, 1, 28, 28)
    assert torch.bincount(train.labels).tolist() == [6000] * 10
    # the published mean/std standardize the train set
    assert abs(train.images.mean().item()) < 0.01 and abs(train.images.std().item() - 1) < 0.01


def test_synthetic_follows_the_hint_and_the_seed():
    hint = DatasetSpec("anything", in_chans=1, image_size=16, num_classes=4)
    train, test, spec = load_data("synthetic", seed=3, synthetic_size=(64, 32), spec_hint=hint)
    assert spec == DatasetSpec("synthetic", 1, 16, 4)
    assert train.images.shape == (64, 1, 16, 16) and test.images.shape == (32, 1, 16, 16)
    assert set(train.labels.tolist()) <= set(range(4))
    again, _, _ = load_data("synthetic", seed=3, synthetic_size=(64, 32), spec_hint=hint)
    other, _, _ = load_data("synthetic", seed=4, synthetic_size=(64, 32), spec_hint=hint)
    assert torch.equal(train.images, again.images)
    assert not torch.equal(train.images, other.images)
    _, _, default = load_data("synthetic", synthetic_size=(8, 8))
    assert default == DatasetSpec("synthetic", 3, 32, 10)


def test_dataset_specs_and_unknown_dataset():
    assert dataset_spec("fmnist") == DatasetSpec("fmnist", 1, 28, 10)
    assert dataset_spec("cifar10") == DatasetSpec("cifar10", 3, 32, 10)
    assert dataset_spec("synthetic") == DatasetSpec("synthetic", 3, 32, 10)
    with pytest.raises(BenchError, match="known: cifar10, fmnist, synthetic"):
        load_data("imagenet")


def tiny_split(n: int, augment: bool = False) -> TensorData:
    images = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 1, 2, 2).clone()
    return TensorData(images, torch.arange(n), augment=augment)


@pytest.mark.parametrize("n,world", [(103, 4), (64, 8), (10, 3), (7, 7)])
def test_shards_are_disjoint_equal_and_cover_all_but_the_remainder(n, world):
    data = tiny_split(n)
    shards = [ShardedLoader(data, r, world, 4, seed=0).shard_indices() for r in range(world)]
    assert {len(s) for s in shards} == {n // world}
    owned = torch.cat(shards)
    assert len(set(owned.tolist())) == len(owned) == n - n % world


def test_every_rank_computes_the_same_split():
    data = tiny_split(100)
    first = [ShardedLoader(data, r, 4, 8, seed=5).shard_indices() for r in range(4)]
    again = [ShardedLoader(data, r, 4, 8, seed=5).shard_indices() for r in range(4)]
    other = [ShardedLoader(data, r, 4, 8, seed=6).shard_indices() for r in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(a, b) for a, b in zip(first, other))


def test_epochs_reshuffle_within_the_shard():
    loader = ShardedLoader(tiny_split(100), 1, 4, 5, seed=0)
    assert loader.steps_per_epoch == 5
    epochs = []
    for _ in range(2):
        labels = torch.cat([next(loader)[1] for _ in range(loader.steps_per_epoch)])
        epochs.append(labels)
        assert sorted(labels.tolist()) == sorted(loader.shard_indices().tolist())
    assert not torch.equal(epochs[0], epochs[1])
    assert (loader.step, loader.epoch) == (10, 1)
    images, labels = next(loader)
    assert loader.epoch == 2 and torch.equal(images[:, 0, 0, 0], labels.float())


def test_batches_are_reproducible_and_a_small_shard_is_one_batch():
    a = ShardedLoader(tiny_split(40), 2, 4, 3, seed=1)
    b = ShardedLoader(tiny_split(40), 2, 4, 3, seed=1)
    assert a.steps_per_epoch == 3  # 10 samples: three batches of 3, one sample left over
    for _ in range(7):
        assert all(torch.equal(x, y) for x, y in zip(next(a), next(b)))
    small = ShardedLoader(tiny_split(40), 0, 4, 128, seed=1)
    assert small.steps_per_epoch == 1 and len(next(small)[1]) == 10


def test_bad_shard_arguments_raise():
    with pytest.raises(BenchError, match="cannot fill 8 shards"):
        ShardedLoader(tiny_split(5), 0, 8, 4, seed=0)
    with pytest.raises(BenchError, match="outside"):
        ShardedLoader(tiny_split(5), 4, 4, 4, seed=0)


def test_augmentation_crops_and_flips_each_image():
    images = torch.randn(16, 3, 8, 8)
    out = random_crop_flip(images, torch.Generator().manual_seed(0))
    padded = nn.functional.pad(images, (4, 4, 4, 4))
    flipped = 0
    for i in range(len(images)):
        candidates = [
            (f, padded[i, :, dy : dy + 8, dx : dx + 8])
            for dy in range(9)
            for dx in range(9)
            for f in (False, True)
        ]
        matches = [f for f, crop in candidates if torch.equal(out[i], crop.flip(2) if f else crop)]
        assert matches, f"image {i} is no crop of its padded original"
        flipped += matches[0]
    assert 0 < flipped < len(images)


def test_loader_augments_only_when_the_split_asks():
    data = TensorData(torch.randn(32, 3, 8, 8), torch.arange(32), augment=True)
    x, y = next(ShardedLoader(data, 0, 1, 32, seed=0))
    assert x.shape == (32, 3, 8, 8) and not torch.equal(x, data.images[y])
    plain = TensorData(data.images, data.labels)
    x, y = next(ShardedLoader(plain, 0, 1, 32, seed=0))
    assert torch.equal(x, data.images[y])


@pytest.mark.parametrize("n", [0, 1, 5, 10000, 10001])
@pytest.mark.parametrize("world", [1, 3, 4, 64])
def test_eval_slices_cover_the_test_set(n, world):
    slices = [eval_slice(n, r, world) for r in range(world)]
    assert [i for s in slices for i in range(s.start, s.stop)] == list(range(n))
    sizes = [s.stop - s.start for s in slices]
    assert max(sizes) - min(sizes) <= 1
