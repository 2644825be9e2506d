"""What a run folder's disk can do to a run: a link in the folder is never written through
(a write lands on a temporary and is renamed; the one write in place opens without following
links) and a folder holding links is refused in one line; a full disk is named once, before
the start and after it, with the right reason on a resume; a read-only folder is refused
before any work; an error line quotes a bounded value. Small tmpfs mounts stand in for full
and read-only disks (root only)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from suite.errors import RunFailed
from suite.results.folder import RunFolder, write_json, write_json_in_place
from suite.results.lock import OWNER
from tests.report.varied_runs import REFERENCE
from tests.support.runs import (
    TINY,
    bench,
    bench_here,
    finish,
    one_line,
    one_line_error,
    start,
    summary,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a file system needs root")
TOPK = ["--method", "topk", *TINY, "--gpus", "2", "--gpus-per-node", "1"]


def test_no_write_goes_through_a_link(tmp_path):
    """A link planted where an atomic write puts its temporary, and a hard link or a symbolic
    link where a file is rewritten in place: the file each leads to is not written."""
    outside = tmp_path / "outside.json"
    outside.write_text("keep")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / f".summary.json.tmp{os.getpid()}").symlink_to(outside)
    write_json(folder / "summary.json", {"status": "ok"})
    assert outside.read_text() == "keep" and not (folder / "summary.json").is_symlink()
    os.link(outside, folder / "manifest.json")
    with pytest.raises(OSError, match="not a file of its own"):
        write_json_in_place(folder / "manifest.json", {})
    (folder / "manifest.json").unlink()
    (folder / "manifest.json").symlink_to(outside)
    with pytest.raises(OSError, match="symbolic link"):
        write_json_in_place(folder / "manifest.json", {})
    assert outside.read_text() == "keep"


def mount_tmpfs(path: Path, size: str) -> Path:
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                   check=True)
    return path


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False)


def fill(mount: Path) -> None:
    """Write ``mount`` full."""
    subprocess.run(["dd", "if=/dev/zero", f"of={mount / 'filler'}", "bs=4k"],
                   capture_output=True, check=False)


@needs_root
def test_a_linked_summary_on_a_full_disk_is_never_written_through(tmp_path):
    """summary.json a link to a file on another file system, the run's disk full (what
    forces the write in place): `bench recover` and `bench run --resume` refuse the folder in
    one line, the launcher's fail path writes nothing, and the file elsewhere is as it was."""
    inside, elsewhere = mount_tmpfs(tmp_path / "inside", "256k"), None
    try:
        elsewhere = mount_tmpfs(tmp_path / "elsewhere", "64k")
        target = elsewhere / "their.json"
        target.write_text(json.dumps({"status": "running", "theirs": "x" * 2000}))
        before = target.read_bytes()
        folder = inside / "run"
        folder.mkdir()
        (folder / "manifest.json").write_text("{}")
        (folder / "summary.json").symlink_to(target)
        fill(inside)
        for args in (("recover", folder), ("run", "--resume", folder)):
            line = one_line(bench_here(*args))
            assert "holds a link, summary.json ->" in line, line
        from suite.config import RunConfig
        from suite.launchers.local import fail_run

        with pytest.raises(RunFailed, match="nothing could be written"):
            fail_run(RunFolder(folder), RunConfig(run_id="run"), signal_name=None)
        assert target.read_bytes() == before
    finally:
        if elsewhere is not None:
            unmount(elsewhere)
        unmount(inside)


@needs_root
def test_a_full_disk_before_the_start_is_one_line_and_leaves_no_owner(tmp_path):
    mount = mount_tmpfs(tmp_path / "full", "64k")
    try:
        fill(mount)
        proc = bench("run", "--results-dir", mount, "--run-id", "r", *TOPK, "--iterations", "2")
        line = one_line_error(proc)
        assert "no space left on device" in line and "Traceback" not in proc.stderr, line
        assert not (mount / "r" / OWNER).exists()
    finally:
        unmount(mount)


@needs_root
def test_a_full_disk_is_named_once_and_a_resume_says_only_a_partial_checkpoint_exists(
        tmp_path):
    """Ranks checkpointing onto a 1 MiB disk: the first checkpoint fills it. One line on
    stderr (not each rank's DCP traceback of every rank's failure), the summary says no
    space, and `--resume` names the unfinished checkpoint instead of blaming a missing
    --checkpoint-every."""
    mount = mount_tmpfs(tmp_path / "small", "1m")
    try:
        proc = start(mount, "full", *TOPK, "--checkpoint-every", "2", "--iterations", "400")
        code, err = finish(proc)
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert code == 1 and len(lines) == 1, err
        assert "no space left on device" in lines[0].lower()
        assert "space" in summary(mount / "full")["error"]
        line = one_line(bench_here("run", "--resume", mount / "full"))
        assert "only an unfinished one, .it-" in line and "without" not in line, line
    finally:
        unmount(mount)


@needs_root
def test_export_of_a_read_only_folder_is_one_line_before_the_work(tmp_path):
    """The committed PruneX reference with its model saved, on a read-only file system:
    `bench export` says so in one line before it loads or measures anything."""
    from suite.data.datasets import dataset_spec
    from suite.plugins.registry import WORKLOADS

    source = next(REFERENCE.glob("prunex-cnn-*"))
    manifest = json.loads((source / "manifest.json").read_text())["config"]
    model = WORKLOADS.build(manifest["workload"]).build_model(dataset_spec(manifest["dataset"]))
    mount = mount_tmpfs(tmp_path / "ro", "16m")
    try:
        shutil.copytree(source, mount / "pruned")
        torch.save(model.state_dict(), mount / "pruned" / "model.pt")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        result = bench_here("export", mount / "pruned", "--repeats", "3")
        line = one_line(result)
        assert "read-only file system" in line and "measuring" not in result.stdout, line
    finally:
        unmount(mount)


def test_an_error_line_quotes_a_bounded_value():
    result = bench_here("recover", "x" * 5000)
    assert result.exit_code == 2
    line = one_line(result)
    assert len(line) < 2200 and "more)" in line, len(line)


def test_links_of_the_slurm_jobs_own_folder_are_its_own(tmp_path):
    """submitit keeps a link in the job's folder (``.submission_file_*.sh``), where the suite
    writes nothing: that folder is not refused, a link anywhere else is, and so is the job's
    folder when it is itself a link."""
    from suite.errors import BenchError

    folder = tmp_path / "run"
    (folder / "slurm-job").mkdir(parents=True)
    (folder / "slurm-job" / "6_submission.sh").write_text("#!/bin/sh\n")
    (folder / "slurm-job" / ".submission_file_60d3.sh").symlink_to(
        folder / "slurm-job" / "6_submission.sh")
    RunFolder(folder).refuse_links()
    (folder / "errors").mkdir()
    (folder / "errors" / "rank0.txt").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(BenchError, match=r"holds a link, errors/rank0.txt ->"):
        RunFolder(folder).refuse_links()
    shutil.rmtree(folder / "errors")
    shutil.move(folder / "slurm-job", tmp_path / "job")
    (folder / "slurm-job").symlink_to(tmp_path / "job")
    with pytest.raises(BenchError, match=r"holds a link, slurm-job ->"):
        RunFolder(folder).refuse_links()


def test_a_fifo_in_the_folder_hangs_no_reader(tmp_path):
    """A FIFO where a rank's error file, the owner file or a checkpoint's metadata belongs
    (no writer ever opens it): each reader goes on at once, as if the file said nothing."""
    from suite.errors import BenchError
    from suite.results.lock import read_owner
    from suite.run.checkpoint import read_metadata

    folder = RunFolder(tmp_path / "run").create()
    folder.errors.mkdir(parents=True)
    (folder.errors / "rank1.txt").write_text("rank 1: connection closed\n")
    os.mkfifo(folder.errors / "rank0.txt")
    os.mkfifo(folder.path / OWNER)
    (folder.path / "checkpoints" / "it-00000010").mkdir(parents=True)
    os.mkfifo(folder.path / "checkpoints" / "it-00000010" / ".metadata")
    assert folder.first_rank_error() == "rank 1: connection closed"
    assert read_owner(folder.path / OWNER) is None
    with pytest.raises(BenchError, match="not a regular file"):
        read_metadata(folder.path / "checkpoints" / "it-00000010")
