"""A run folder is input, never code: a checkpoint entry DCP would unpickle (a bytes entry
planted in `.metadata`), an allowed class called on crafted arguments, and a CIFAR-10 batch
whose pickle would run a command are each refused in one line, and nothing of them runs."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from suite.errors import BenchError
from suite.run.checkpoint import latest_checkpoint, read_metadata, tensors_only_planner
from tests.support.runs import ENV, TINY, Planted, bench, finish, one_line_error, start, summary


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A 2-rank run stopped after its second iteration, with a checkpoint to resume."""
    root = tmp_path_factory.mktemp("stopped")
    code, err = finish(start(root, "cut", "--method", "ddp", *TINY, "--gpus", "2",
                             "--gpus-per-node", "1", "--checkpoint-every", "1",
                             "--iterations", "4",
                             env={**ENV, "PRUNEX_STOP_AFTER_ITERATION": "2"}))
    assert code == 1 and summary(root / "cut")["status"] == "interrupted", err
    return root / "cut"


def plant_bytes_entry(folder: Path, target: Path) -> None:
    """The attack of issue 68: one more key in `.metadata`, stored as DCP's
    BytesStorageMetadata (given a size and properties through pickle's BUILD, so the suite's
    request of a tensor reaches it) and pointing at a new `.distcp` file holding a pickle."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        BytesStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )

    _, checkpoint = latest_checkpoint(folder)
    metadata = read_metadata(checkpoint)
    entry = BytesStorageMetadata()
    vars(entry).update(size=torch.Size([1]), properties=TensorProperties(dtype=torch.float32),
                       chunks=[])  # what a tensor's entry has, which DCP's bytes entry lacks
    payload = pickle.dumps(Planted(target))
    (checkpoint / "planted.distcp").write_bytes(payload)
    metadata.state_dict_metadata["rank0/planted"] = entry
    metadata.storage_data[MetadataIndex("rank0/planted")] = _StorageInfo(
        "planted.distcp", 0, len(payload))
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))


def test_a_planted_bytes_entry_is_refused_and_nothing_runs(stopped, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(stopped, folder)
    target = tmp_path / "ran"
    plant_bytes_entry(folder, target)
    line = one_line_error(bench("run", "--resume", folder))
    assert "'rank0/planted' as a BytesStorageMetadata, not a tensor" in line, line
    assert not target.exists()
    _, checkpoint = latest_checkpoint(folder)
    with pytest.raises(BenchError, match="holds tensors only"):
        read_metadata(checkpoint)  # what each rank reads, for --max-restarts too
    assert not target.exists()


def test_dcp_never_unpickles_an_entry_the_suite_loads():
    """The planner the ranks load with refuses bytes whatever a later torch reads as such."""

    class Item:
        class dest_index:  # noqa: N801 -- DCP's ReadItem shape
            fqn = "rank0/x"

    with pytest.raises(BenchError, match="not a tensor"):
        tensors_only_planner().load_bytes(Item, None)


def test_a_storage_path_outside_the_folder_is_refused(stopped, tmp_path):
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    folder = tmp_path / "run"
    shutil.copytree(stopped, folder)
    _, checkpoint = latest_checkpoint(folder)
    metadata = read_metadata(checkpoint)
    index = next(iter(metadata.storage_data))
    metadata.storage_data[index] = _StorageInfo("../../../etc/passwd", 0, 10)
    (checkpoint / ".metadata").write_bytes(pickle.dumps(metadata))
    line = one_line_error(bench("run", "--resume", folder))
    assert "outside its folder" in line, line


def test_an_allowed_global_that_raises_is_one_line(stopped, tmp_path):
    """``torch.serialization._get_layout`` is allowed (DCP writes layouts by name); called
    on a name it does not know it raises KeyError: one line, not a traceback."""
    folder = tmp_path / "run"
    shutil.copytree(stopped, folder)
    _, checkpoint = latest_checkpoint(folder)

    class BadLayout:
        def __reduce__(self):
            from torch.serialization import _get_layout

            return _get_layout, ("torch.nothing",)

    (checkpoint / ".metadata").write_bytes(pickle.dumps(BadLayout()))
    line = one_line_error(bench("run", "--resume", folder))
    assert "unreadable (KeyError" in line, line


# -- CIFAR-10 ----------------------------------------------------------------------------------
def cifar_folder(root: Path, first_batch: bytes | None = None) -> Path:
    """A tiny CIFAR-10 in torchvision's layout (python pickles of numpy arrays and lists);
    ``first_batch`` replaces data_batch_1's bytes."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        entry = {"data": rng.integers(0, 256, (8, 3072), dtype=np.uint8),
                 "labels": [int(x) for x in rng.integers(0, 10, 8)], "batch_label": name}
        (folder / name).write_bytes(pickle.dumps(entry, protocol=2))
    if first_batch is not None:
        (folder / "data_batch_1").write_bytes(first_batch)
    return root


def test_cifar_batches_of_arrays_and_lists_load(tmp_path):
    from suite.data.datasets import load_data

    train, test, _ = load_data("cifar10", data_dir=cifar_folder(tmp_path))
    assert len(train.labels) == 40 and len(test.labels) == 8


@pytest.mark.parametrize("protocol", [2, 5])
def test_a_cifar_batch_that_would_run_code_is_refused(tmp_path, protocol):
    from suite.data.datasets import load_data

    target = tmp_path / "ran"
    root = cifar_folder(tmp_path / "data",
                        pickle.dumps({"data": Planted(target), "labels": []}, protocol=protocol))
    with pytest.raises(BenchError, match="data_batch_1 is corrupt .*names posix.system"):
        load_data("cifar10", data_dir=root)
    assert not target.exists()


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_a_dry_run_of_a_folder_naming_planted_data_reads_none(stopped, tmp_path):
    """A run folder whose manifest names a CIFAR-10 folder inside itself: `bench rerun
    --dry-run` and `bench run --config manifest.json --dry-run` read no data at all (the
    planted batch would run a command if unpickled), and a real run refuses it in one line."""
    folder = tmp_path / "run"
    shutil.copytree(stopped, folder)
    target = tmp_path / "ran"
    data = cifar_folder(folder / "data", pickle.dumps(Planted(target)))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["config"].update(dataset="cifar10", data_dir=str(data), synthetic_size=None)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    for args in (["rerun", folder, "--dry-run", "--results-dir", tmp_path / "out"],
                 ["run", "--config", folder / "manifest.json", "--dry-run",
                  "--results-dir", tmp_path / "out"]):
        proc = bench(*args)
        assert proc.returncode == 0, proc.stderr
        assert "not read (dry run)" in proc.stdout, proc.stdout
        assert not target.exists()
    line = one_line_error(bench("run", "--config", folder / "manifest.json",
                                "--results-dir", tmp_path / "out"))
    assert "corrupt" in line and not target.exists(), line


def test_a_checkpoint_pointer_outside_the_checkpoints_names_none(stopped, tmp_path):
    """latest.json is read as a record: a folder that is a path elsewhere (where a crafted
    `.metadata` could wait) is no checkpoint, and a FIFO in its place is not waited on."""
    import os

    folder = tmp_path / "run"
    shutil.copytree(stopped, folder)
    assert latest_checkpoint(folder) is not None
    pointer = folder / "checkpoints" / "latest.json"
    pointer.write_text(json.dumps({"folder": "../../elsewhere", "iterations_done": 2}))
    assert latest_checkpoint(folder) is None
    pointer.unlink()
    os.mkfifo(pointer)
    assert latest_checkpoint(folder) is None
