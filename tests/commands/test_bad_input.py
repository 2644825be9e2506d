"""The fault campaign's bad inputs and damaged folders as tests: every one is refused in one
line (exit 2, before any rank starts) or read for what it still holds, and none is a
traceback or accepted silently. Commands run in this process (no rank starts), so the matrix
costs seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from suite.cli import main

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "reference" / "cpu-gloo-portable-t1" / "prunex-cnn-fmnist-4g-51b04d5e"
DRY = ["run", "--dry-run", "--method", "ddp", "--dataset", "synthetic", "--gpus", "2",
       "--gpus-per-node", "1"]


def invoke(args, env=None):
    """``bench ARGS`` in this process with ``env`` added; a traceback fails the test."""
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad")
    made = {
        "random": os.urandom(300),
        "empty": b"",
        "list.json": b"[1, 2]\n",
        "dup.yaml": b"method: prunex\nmethod: ddp\n",
        "broken.yaml": b"method: prunex\nlr: [1\n",
        "type.yaml": b"lr: abc\n",
        "twice.yaml": b"channel_keep: 0.3\noptions:\n  channel_keep: 0.5\n",
        "unknown.yaml": b"lrr: 0.1\n",
        "history.jsonl": b'{"a": 1}\n',
        "history-list.jsonl": b"[1]\n",
    }
    paths = {}
    for name, data in made.items():
        (root / name).write_bytes(data)
        paths[name] = root / name
    return paths


#: (id, arguments, environment, what the one line says)
BAD_FLAGS = [
    ("seed-2**70", [*DRY, "--seed", str(2**70)], {}, "--seed must be in [0,"),
    ("seed-negative", [*DRY, "--seed", "-1"], {}, "--seed must be in [0,"),
    ("gpus-0", [*DRY[:-4], "--gpus", "0"], {}, "give integers of at least 1"),
    ("gpus-per-node-0", [*DRY, "--gpus-per-node", "0"], {}, "--gpus-per-node must be at least 1"),
    ("gpus-per-node-uneven", [*DRY[:-4], "--gpus", "3", "--gpus-per-node", "2"], {}, "3"),
    ("iterations-1e23", [*DRY, "--iterations", str(10**23)], {}, "--iterations must be in"),
    ("iterations-0", [*DRY, "--iterations", "0"], {}, "--iterations must be in"),
    ("epochs-0", [*DRY, "--epochs", "0"], {}, "--epochs must be positive"),
    ("epochs-nan", [*DRY, "--epochs", "nan"], {}, "--epochs must be finite"),
    ("target-2", [*DRY, "--target-accuracy", "2"], {}, "--target-accuracy must be a fraction"),
    ("target-150%", [*DRY, "--target-accuracy", "150%"], {}, "--target-accuracy must be a frac"),
    ("target-words", [*DRY, "--target-accuracy", "high"], {}, "not a fraction (0.85)"),
    ("batch-1e8", [*DRY, "--batch-size", "100000000"], {}, "larger than a rank's shard"),
    ("batch-0", [*DRY, "--batch-size", "0"], {}, "--batch-size must be positive"),
    ("lr-negative", [*DRY, "--lr", "-1"], {}, "--lr must be positive"),
    ("momentum-1", [*DRY, "--momentum", "1"], {}, "--momentum must be in [0, 1)"),
    ("run-id-dots", [*DRY, "--run-id", "../x"], {}, "--run-id '../x' must be one folder"),
    ("method-unknown", [*DRY[:2], "--method", "dpp", "--dataset", "synthetic"], {},
     "unknown method 'dpp'"),
    ("workload-unknown", [*DRY, "--workload", "nope"], {}, "unknown workload 'nope'"),
    ("dataset-unknown", [*DRY[:4], "--dataset", "imagenet9"], {}, "imagenet9"),
    ("keep-above-1", ["run", "--dry-run", "--dataset", "synthetic", "--channel-keep", "2"], {},
     "--channel-keep must be"),
    ("inter-bw-alone", [*DRY, "--inter-bw", "1gbit"], {}, "--inter-bw needs --network emulated"),
    ("slurm-time-abc", ["run", "--dry-run", "--launcher", "slurm", "--slurm-time", "abc",
                        "--dataset", "synthetic", "--gpus", "2", "--gpus-per-node", "1"], {},
     "--slurm-time 'abc' is not a SLURM time"),
    ("slurm-time-hours", ["run", "--dry-run", "--launcher", "slurm", "--slurm-time", "2h",
                          "--dataset", "synthetic", "--gpus", "2", "--gpus-per-node", "1"], {},
     "is not a SLURM time"),
    ("sim-flag-local", [*DRY, "--replay", "3"], {}, "--replay"),
    *((f"emulated-{launcher}", [*DRY[:-2], "--gpus-per-node", "1", "--network", "emulated",
                                "--inter-bw", "1gbit", "--launcher", launcher], {},
       "--network emulated runs with --launcher local") for launcher in ("torchrun", "slurm")),
    ("sweep-seed-negative", ["sweep", "--dry-run", "--method", "ddp", "--dataset", "synthetic",
                             "--gpus", "2", "--seed", "-1"], {}, "-1"),
    ("compare-threshold", ["compare", RUN, RUN, "--max-regression", "lots"], {},
     "is not a fraction or percentage"),
    ("compare-time-threshold", ["compare", RUN, RUN, "--max-time-regression", "lots"], {},
     "--max-time-regression 'lots' is not a fraction or percentage"),
    ("compare-accuracy-drop", ["compare", RUN, RUN, "--max-accuracy-drop", "-3"], {},
     "--max-accuracy-drop must be in [0, 100]"),
    ("compare-metric", ["compare", RUN, RUN, "--metric", "speed"], {}, "unknown metric 'speed'"),
]
BAD_ENVIRONMENT = [
    ("flush-abc", {"PRUNEX_FLUSH_SECONDS": "abc"}, "PRUNEX_FLUSH_SECONDS='abc' must be a number"),
    ("flush-negative", {"PRUNEX_FLUSH_SECONDS": "-1"}, "PRUNEX_FLUSH_SECONDS='-1'"),
    ("stop-abc", {"PRUNEX_STOP_AFTER_ITERATION": "abc"}, "PRUNEX_STOP_AFTER_ITERATION='abc'"),
    ("agree-negative", {"PRUNEX_AGREE_SECONDS": "-1"}, "PRUNEX_AGREE_SECONDS='-1' must be a "
     "number above 0"),
    ("agree-inf", {"PRUNEX_AGREE_SECONDS": "inf"}, "PRUNEX_AGREE_SECONDS='inf'"),
    ("strict-maybe", {"PRUNEX_STRICT_PLUGINS": "maybe"}, "PRUNEX_STRICT_PLUGINS='maybe' must be"),
    ("progress-maybe", {"PRUNEX_PROGRESS": "maybe"}, "PRUNEX_PROGRESS='maybe'"),
    ("world-size", {"WORLD_SIZE": "x", "RANK": "0"}, "WORLD_SIZE='x' must be an integer"),
    ("rank-negative", {"RANK": "-2"}, "RANK='-2' must be an integer of at least 0"),
    ("slurm-nodes", {"SLURM_JOB_NUM_NODES": "x"}, "SLURM_JOB_NUM_NODES='x'"),
    ("slurm-tasks-per-node", {"SLURM_NTASKS_PER_NODE": "x"}, "SLURM_NTASKS_PER_NODE='x'"),
    ("master-port", {"MASTER_PORT": "70000"}, "MASTER_PORT='70000' must be an integer in"),
    ("threads", {"OMP_NUM_THREADS": "0"}, "OMP_NUM_THREADS='0'"),
]
BAD_FILES = [
    ("config-random", lambda f: [*DRY, "--config", f["random"]], "not a text file"),
    ("config-empty", lambda f: [*DRY, "--config", f["empty"]], "expected a mapping"),
    ("config-list", lambda f: [*DRY, "--config", f["list.json"]], "expected a mapping"),
    ("config-duplicate-key", lambda f: [*DRY, "--config", f["dup.yaml"]],
     "key 'method' given twice"),
    ("config-broken", lambda f: [*DRY, "--config", f["broken.yaml"]], "at line 3, column"),
    ("config-type", lambda f: [*DRY, "--config", f["type.yaml"]], "type.yaml: lr:"),
    ("config-twice-in-options", lambda f: [*DRY, "--config", f["twice.yaml"]],
     "'channel_keep' given twice"),
    ("config-unknown-key", lambda f: [*DRY, "--config", f["unknown.yaml"]],
     "unknown key 'lrr'"),
    ("config-missing", lambda f: [*DRY, "--config", f["random"].parent / "none.yaml"],
     "cannot read it"),
    ("trend-random", lambda f: ["trend", f["random"]], "is not text"),
    ("trend-empty", lambda f: ["trend", f["empty"]], "is empty"),
    ("trend-not-lines", lambda f: ["trend", f["history.jsonl"]], "not a history line"),
    ("trend-list", lambda f: ["trend", f["history-list.jsonl"]], "not a history line"),
    ("dashboard-random", lambda f: ["dashboard", f["random"], "-o", f["random"].parent / "d"],
     "is not text"),
    ("compare-file", lambda f: ["compare", f["random"], f["random"]], "no run folders"),
]


def refused_in_one_line(result, said: str) -> None:
    """Exit 2 and one line on stderr that says ``said``."""
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and said in lines[0], result.stderr


@pytest.mark.parametrize(("args", "env", "said"), [c[1:] for c in BAD_FLAGS],
                         ids=[c[0] for c in BAD_FLAGS])
def test_a_bad_flag_is_one_line_before_any_rank(args, env, said):
    refused_in_one_line(invoke(args, env), said)


@pytest.mark.parametrize(("env", "said"), [c[1:] for c in BAD_ENVIRONMENT],
                         ids=[c[0] for c in BAD_ENVIRONMENT])
def test_a_bad_environment_variable_is_one_line(env, said):
    refused_in_one_line(invoke(DRY, env), said)


@pytest.mark.parametrize(("make", "said"), [c[1:] for c in BAD_FILES],
                         ids=[c[0] for c in BAD_FILES])
def test_a_bad_file_is_one_line(files, make, said):
    refused_in_one_line(invoke(make(files)), said)


def test_flags_given_with_resume_are_refused_unless_a_resume_takes_them(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(RUN, folder)
    result = invoke(["run", "--resume", folder, "--lr", "0.1", "--channel-keep", "0.3"])
    assert result.exit_code == 2
    assert "--channel-keep, --lr would change it" in result.stderr


#: how a folder is damaged: file -> its new bytes (None: removed)
DAMAGE = {
    "summary-truncated": ("summary.json", lambda data: data[:40]),
    "summary-garbage": ("summary.json", lambda data: os.urandom(100)),
    "summary-list": ("summary.json", lambda data: b"[1, 2]"),
    "summary-empty": ("summary.json", lambda data: b""),
    "summary-missing": ("summary.json", None),
    "manifest-binary": ("manifest.json", lambda data: os.urandom(200)),
    "manifest-list": ("manifest.json", lambda data: b"[]"),
    "manifest-missing": ("manifest.json", None),
    "iterations-garbage": ("iterations.parquet", lambda data: os.urandom(500)),
}
COMMANDS = {
    "report": lambda run, out: ["report", run.parent, "-o", out],
    "compare": lambda run, out: ["compare", run.parent, run.parent],
    "trend": lambda run, out: ["trend", out / "h.jsonl", "--add", run.parent],
    "recover": lambda run, out: ["recover", run],
    "rerun": lambda run, out: ["rerun", run, "--dry-run"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_folder_is_never_a_traceback(tmp_path, damage, command):
    """Every command on every damage: no traceback (a raise fails the test here), an error
    is one line, and what the folder still holds is read."""
    run = tmp_path / "set" / RUN.name
    shutil.copytree(RUN, run)
    name, change = DAMAGE[damage]
    if change is None:
        (run / name).unlink()
    else:
        (run / name).write_bytes(change((run / name).read_bytes()))
    result = invoke(COMMANDS[command](run, tmp_path))
    assert result.exit_code in (0, 1, 2), result.output
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a read-only file system needs root")
@pytest.mark.parametrize("command", ["recover", "report"])
def test_a_read_only_folder_is_read_and_says_what_it_could_not_write(tmp_path, command):
    """`bench recover` and `bench report -o` on a read-only file system: one line naming what
    could not be written, nothing half written."""
    mount = tmp_path / "ro"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], check=True)
    try:
        run = mount / RUN.name
        shutil.copytree(RUN, run)
        if command == "recover":  # killed: it still says running
            summary = json.loads((run / "summary.json").read_text())
            (run / "summary.json").write_text(json.dumps({**summary, "status": "running"}))
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        args = ["recover", run] if command == "recover" else ["report", mount, "-o",
                                                               mount / "report"]
        result = invoke(args)
        assert result.exit_code in (1, 2), result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, result.stderr
        assert "read-only file system" in lines[0].lower(), lines[0]
    finally:
        subprocess.run(["umount", str(mount)], check=False)
