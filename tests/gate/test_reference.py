"""`nox -s reference` records into a fixed staging folder per class, so an interrupted
recording resumes: finished cells are kept, not run again; a reduced set (NIGHTLY_METHODS)
becomes the class's reference for exactly those methods."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PORTABLE = REPO / "reference" / "cpu-gloo-portable-t1"


def test_an_interrupted_reference_resumes_without_rerunning_finished_cells(tmp_path):
    staging = tmp_path / "staging" / "cpu-gloo-portable-t1"
    finished = next(PORTABLE.glob("ddp-cnn-*"))  # the nightly's DDP cell, as a sweep names it
    shutil.copytree(finished, staging / finished.name)
    recorded = (staging / finished.name / "summary.json").read_text()
    # what the interruption left of the next cell: a folder that never finished
    (staging / "prunex-cnn-fmnist-4g-51b04d5e").mkdir()
    (staging / "prunex-cnn-fmnist-4g-51b04d5e" / "summary.json").write_text(json.dumps(
        {"run_id": "prunex-cnn-fmnist-4g-51b04d5e", "status": "interrupted", "method": "prunex",
         "error": "interrupted by SIGINT"}))
    root = tmp_path / "reference"
    (root / "cpu-gloo-portable-t1").mkdir(parents=True)
    (root / "cpu-gloo-portable-t1" / "gate.json").write_text('{"max_accuracy_drop": 4.0}\n')
    env = {**os.environ, "PRUNEX_PROGRESS": "0", "NIGHTLY_METHODS": "ddp",
           "NIGHTLY_REFERENCE": str(root), "NIGHTLY_STAGING": str(tmp_path / "staging"),
           "ATEN_CPU_CAPABILITY": "default"}  # the portable class, whatever this CPU
    nox = [sys.executable, "-m", "nox", "-s", "reference"]
    refused = subprocess.run(nox, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0 and "-- --replace` replaces it" in refused.stderr
    assert (staging / finished.name / "summary.json").read_text() == recorded  # nothing ran
    started = time.monotonic()
    proc = subprocess.run([*nox, "--", "--replace"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "1 skipped" in out and "0 done" in out, out  # the finished cell was not run again
    assert time.monotonic() - started < 120  # no training happened
    target = root / "cpu-gloo-portable-t1"
    assert sorted(p.name for p in target.iterdir()) == sorted(["class.json", "gate.json",
                                                                finished.name])
    software = json.loads((target / "class.json").read_text())["versions"]
    assert software["torch"] == json.loads((target / finished.name / "manifest.json").read_text(
    ))["versions"]["torch"]
    assert (target / finished.name / "summary.json").read_text() == recorded
    assert json.loads((target / "gate.json").read_text()) == {"max_accuracy_drop": 4.0}
    assert not staging.exists()  # recorded: the next recording starts afresh
