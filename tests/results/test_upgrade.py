"""Older run folders are read through the one upgrade (suite.results.upgrade): the committed
references, written before folders said their format, read in the current one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from suite.errors import BenchError
from suite.results import schema
from suite.results.resultset import read_result_set
from suite.results.view import RunView

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "references"
#: a committed class recorded before run folders said their format (format 1)
FORMAT_1 = REFERENCE / "cpu-gloo-amd25-avx512-t1"


def test_a_committed_reference_reads_in_the_current_format():
    folders = sorted(FORMAT_1.glob("prunex-*"))
    raw = json.loads((folders[0] / "summary.json").read_text())
    assert schema.FORMAT_VERSION_KEY not in raw  # written before formats were versioned
    view = RunView.read(folders[0])
    assert view.format_version == 1
    assert view.summary[schema.FORMAT_VERSION_KEY] == schema.FORMAT_VERSION
    assert view.manifest[schema.FORMAT_VERSION_KEY] == schema.FORMAT_VERSION
    assert view.manifest[schema.RUNNER_LOAD] is None  # not recorded then: time judged as before
    rows = view.iterations  # the density of every pruned layer stands for the prunable one
    assert (rows[schema.PRUNABLE_DENSITY] == rows[schema.DENSITY]).all()
    assert not view.table(schema.ITERATIONS_TABLE)[schema.ONE_OFF].any()


def test_a_format_1_summary_without_its_identity_takes_it_from_the_manifest(tmp_path):
    source = next(FORMAT_1.glob("ddp-cnn-*"))
    folder = tmp_path / source.name
    shutil.copytree(source, folder)
    summary = json.loads((folder / "summary.json").read_text())
    killed = {k: v for k, v in summary.items()
              if k not in (schema.METHOD, schema.WORKLOAD, schema.GPUS, schema.FINAL_TRAIN_LOSS)}
    manifest = json.loads((folder / "manifest.json").read_text())
    del manifest[schema.RECIPE][schema.LR_SCHEDULE], manifest[schema.RECIPE][schema.WARMUP_EPOCHS]
    (folder / "summary.json").write_text(json.dumps(killed))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    runs = read_result_set(tmp_path)
    row = runs.runs.iloc[0]
    assert (row[schema.METHOD], row[schema.WORKLOAD], row[schema.GPUS]) == ("ddp", "cnn-fmnist", 4)
    assert row["lr_schedule"] == "constant"  # a recipe without a schedule trained at a constant lr
    # the final training loss of a format-1 summary comes from its rows, read at once
    from suite.gate.compare import load_summaries

    frame, _ = load_summaries(tmp_path)
    assert frame[schema.FINAL_TRAIN_LOSS].iloc[0] == pytest.approx(
        summary[schema.FINAL_TRAIN_LOSS])


def test_a_folder_of_a_newer_format_is_one_line(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(
        {schema.RUN_ID: "run", schema.FORMAT_VERSION_KEY: schema.FORMAT_VERSION + 1}))
    with pytest.raises(BenchError, match="written in format 3; this prunex-bench reads formats"):
        RunView.read(folder)
    assert len(read_result_set(tmp_path).skipped) == 1


def test_a_new_run_writes_the_format_and_the_runner_load(tmp_path):
    """A real (tiny) run: its summary and manifest say the format, its manifest the load."""
    import os
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "suite.cli", "run", "--method", "ddp", "--dataset", "synthetic",
         "--synthetic-size", "256,64", "--gpus", "2", "--gpus-per-node", "1", "--iterations",
         "2", "--batch-size", "16", "--eval-every", "1000", "--results-dir", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "PRUNEX_PROGRESS": "0"})
    assert proc.returncode == 0, proc.stderr
    folder = next(tmp_path.iterdir())
    summary = json.loads((folder / "summary.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    assert summary[schema.FORMAT_VERSION_KEY] == manifest[schema.FORMAT_VERSION_KEY] == 2
    load = manifest[schema.RUNNER_LOAD]
    assert load[schema.CORES] == len(os.sched_getaffinity(0)) and load[schema.SPAN_SECONDS] > 0
    assert load[schema.OUTSIDE_LOAD] >= 0 and len(load[schema.LOAD_AVERAGE_END]) == 3
    assert set(summary) <= set(schema.SUMMARY_FILE_KEYS), set(summary) - set(
        schema.SUMMARY_FILE_KEYS)
    assert set(manifest) <= set(schema.MANIFEST_FILE_KEYS), set(manifest) - set(
        schema.MANIFEST_FILE_KEYS)
