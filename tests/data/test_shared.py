"""A host's ranks share one decoded copy of their dataset (suite.data.shared): the first
process decodes and writes it, every other maps the same file; the bits are the decoder's;
a changed source file is decoded anew; without a writable cache each process keeps its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from suite.data import datasets
from suite.data.datasets import load_data
from suite.data.shared import CACHE_VARIABLE, cache_root

IDX = Path("/usr/share/datasets/fashion-mnist")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(CACHE_VARIABLE, str(root))
    return root


def mapped_files(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
            if line.split()[-1].startswith("/")}


def test_synthetic_splits_are_written_once_and_mapped(cache):
    first, first_test, _ = load_data("synthetic", seed=5, synthetic_size=(64, 16))
    entries = [p for p in cache.iterdir() if p.is_dir()]
    assert len(entries) == 1
    again, _, _ = load_data("synthetic", seed=5, synthetic_size=(64, 16))
    assert torch.equal(first.images, again.images) and torch.equal(first.labels, again.labels)
    images = str(entries[0] / "train-images.f32")
    assert images in mapped_files(os.getpid())  # read through the page cache, not copied
    decoded = datasets._synthetic(datasets.SYNTHETIC, 5, (64, 16))
    assert torch.equal(decoded[0].images, first.images)  # the decoder's bits
    assert torch.equal(decoded[1].labels, first_test.labels)
    load_data("synthetic", seed=6, synthetic_size=(64, 16))  # another key, another entry
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2


def test_processes_of_a_host_map_one_copy(cache):
    """Four processes load the same split at once: one entry is written, all four map it."""
    code = ("import os, time, sys; from suite.data.datasets import load_data; "
            "t, _, _ = load_data('synthetic', seed=1, synthetic_size=(512, 64)); "
            "print(float(t.images.sum())); sys.stdout.flush(); time.sleep(3)")
    env = {**os.environ, CACHE_VARIABLE: str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    sums = {proc.stdout.readline() for proc in procs}
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    images = str(entry / "train-images.f32")
    assert all(images in mapped_files(proc.pid) for proc in procs)
    for proc in procs:
        proc.wait(timeout=60)
    assert len(sums) == 1


@pytest.mark.skipif(not IDX.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_a_changed_source_file_is_decoded_again(cache, tmp_path):
    data = tmp_path / "fmnist"
    data.mkdir()
    for file in IDX.iterdir():
        (data / file.name).symlink_to(file)
    train, _, _ = load_data("fmnist", data_dir=data)
    assert train.images.dtype == torch.float32 and len(train) == 60000
    labels = sorted(data.glob("train-labels*"))[0]
    raw = labels.read_bytes()
    labels.unlink()
    labels.write_bytes(raw)  # the same bytes, a new file: another identity
    load_data("fmnist", data_dir=data)
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2


def test_without_a_writable_cache_each_process_decodes_its_own(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("in the way")
    monkeypatch.setenv(CACHE_VARIABLE, str(blocked / "cache"))
    train, _, _ = load_data("synthetic", seed=2, synthetic_size=(32, 8))
    assert len(train) == 32 and cache_root() == blocked / "cache"


def test_a_damaged_entry_is_decoded_again(cache):
    load_data("synthetic", seed=3, synthetic_size=(32, 8))
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    with (entry / "train-images.f32").open("r+b") as handle:
        handle.truncate(100)
    train, _, _ = load_data("synthetic", seed=3, synthetic_size=(32, 8))
    assert train.images.shape == (32, 3, 32, 32)
    assert np.isfinite(train.images.numpy()).all()


def test_a_changed_loader_is_decoded_anew(cache):
    """The same source, another decoder (a fixed loader, a new torch): a new entry, never the
    old decode served."""
    from suite.data import shared

    load_data("synthetic", seed=4, synthetic_size=(32, 8))
    shared.decoder_version.cache_clear()
    real = shared.decoder_version
    try:
        shared.decoder_version = lambda module: real(module) + "-fixed"
        load_data("synthetic", seed=4, synthetic_size=(32, 8))
    finally:
        shared.decoder_version = real
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 2


def test_the_memory_estimate_charges_each_rank_where_the_cache_cannot_take_the_data(
        cache, tmp_path, monkeypatch):
    """A cache that cannot be written (here: its folder behind a file) has every rank decode
    its own copy: the capacity check charges each rank the data then."""
    from suite.commands.capacity import data_bytes, local_memory_estimate, shares_data
    from suite.config import RunConfig
    from suite.run.plan import plan_run

    plan = plan_run(RunConfig(method="ddp", dataset="synthetic", gpus=4, gpus_per_node=2,
                                results_dir=str(tmp_path / "runs")))
    assert shares_data(plan)
    shared_total, _ = local_memory_estimate(plan, None)
    blocked = tmp_path / "file"
    blocked.write_text("in the way")
    monkeypatch.setenv(CACHE_VARIABLE, str(blocked / "cache"))
    assert not shares_data(plan)
    own_total, _ = local_memory_estimate(plan, None)
    assert own_total - shared_total == 3 * data_bytes(plan)


def test_pruning_keeps_every_lock_file(cache, monkeypatch):
    """An entry pruned keeps its lock file: one removed while a process waits on it would let
    the next lock a new file and decode beside it."""
    from suite.data import shared

    load_data("synthetic", seed=5, synthetic_size=(32, 8))
    monkeypatch.setattr(shared, "CACHE_LIMIT_BYTES", 0)
    load_data("synthetic", seed=6, synthetic_size=(32, 8))
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1
    assert len(list(cache.glob(".*.lock"))) == 2
