"""Issue 68's examples, each a test: files, flags and environment variables that ended in a
traceback or were accepted silently now end in one line and a non-zero exit (or, for text
that is only text, are drawn as typed). Commands run in this process where no rank starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from suite.cli import main

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference" / "cpu-gloo-portable-t1"
RUN = REFERENCE / "prunex-cnn-fmnist-4g-51b04d5e"
DRY = ["run", "--dry-run", "--method", "ddp", "--dataset", "synthetic", "--gpus", "2",
       "--gpus-per-node", "1"]


def invoke(*args, env=None):
    """``bench ARGS`` in this process: a traceback raises (and fails the test)."""
    return CliRunner().invoke(main, [str(a) for a in args], env=env, catch_exceptions=False)


def refused(result, said: str = "") -> str:
    """A non-zero exit and one line on stderr (that says ``said``); the line."""
    assert result.exit_code in (1, 2), result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr[:2000]
    assert said in lines[0], lines[0]
    assert len(lines[0]) <= 2100
    return lines[0]


@pytest.fixture
def run(tmp_path) -> Path:
    """A copy of a committed run, alone in its set."""
    folder = tmp_path / "set" / RUN.name
    shutil.copytree(RUN, folder)
    return folder


def edit(folder: Path, file: str, **changes) -> None:
    path = folder / file
    document = json.loads(path.read_text())
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = document
        for parent in parents:
            node = node.setdefault(parent, {})
        node[key] = value
    path.write_text(json.dumps(document))


@pytest.mark.parametrize(("field", "value", "said"), [
    ("format_version", "abc", "format_version: should be a valid integer"),
    ("format_version", -1, "format_version: should be greater than or equal to 1"),
    ("format_version", 10**30, "format_version: should be less than or equal to"),
    ("format_version", 3, "was written in format 3"),
    ("gpus", "4", "gpus: should be a valid integer"),
    ("iterations", [12], "iterations: should be a valid integer"),
    ("warmup_seconds", "fast", "warmup_seconds: should be a valid number"),
    ("status", "done", "status: should be 'running', 'ok', 'failed' or 'interrupted'"),
    ("method", None, "method: missing"),
])
def test_a_wrong_summary_field_is_one_line(run, field, value, said):
    edit(run, "summary.json", **{field: value})
    refused(invoke("compare", run.parent, run.parent), said)
    report = invoke("report", run.parent, "-o", run.parent.parent / "r")
    assert report.exit_code in (0, 2) and said in report.output + report.stderr


@pytest.mark.parametrize(("field", "value", "said"), [
    ("gpu_sharing", "2", "gpu_sharing: should be an object"),
    ("recipe", [32, 0.05], "recipe: should be an object"),
    ("config__gpus", "4", "config.gpus: should be a valid integer"),
    ("topology__world_size", 0, "topology.world_size: should be greater than or equal to 1"),
])
def test_a_wrong_manifest_field_is_named(run, tmp_path, field, value, said):
    """The manifest is read by `bench rerun` (refused in one line) and by the result-set
    reader (listed as unreadable, the run kept with what its summary says)."""
    edit(run, "manifest.json", **{field: value})
    refused(invoke("rerun", run, "--dry-run", "--results-dir", tmp_path / "out"), said)
    result = invoke("compare", run.parent, run.parent)
    assert result.exit_code == 0 and said in result.output, result.output


@pytest.mark.parametrize(("content", "said"), [
    ([1, 2], "a JSON list, not an object"),
    ("5%", "a JSON string, not an object"),
    ({"max_regression": "lots"}, "max_regression 'lots' is not a fraction"),
    ({"max_accuracy_drop": "5"}, "max_accuracy_drop: should be a valid number"),
    ({"metrics": ["speed"]}, "unknown metric 'speed'"),
])
def test_a_bad_gate_file_is_one_line(tmp_path, content, said):
    reference = tmp_path / "cpu-gloo-portable-t1"
    shutil.copytree(RUN, reference / RUN.name)
    (reference / "gate.json").write_text(json.dumps(content))
    line = refused(invoke("compare", reference, reference), said)
    assert "gate.json" in line


@pytest.fixture(scope="module")
def history_line(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("history")
    shutil.copytree(RUN, root / "set" / RUN.name)
    history = root / "h.jsonl"
    assert invoke("trend", history, "--add", root / "set").exit_code == 0
    return json.loads(history.read_text().splitlines()[0])


@pytest.mark.parametrize(("field", "value", "said"), [
    ("machine_class", ["cpu"], "line 1: machine_class: should be a valid string"),
    ("night", {"at": 1}, "line 1: night: should be a valid string"),
    ("repeats", -1, "line 1: repeats: should be greater than or equal to 0"),
])
def test_a_wrong_history_field_is_one_line(history_line, tmp_path, field, value, said):
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps({**history_line, field: value}) + "\n")
    refused(invoke("trend", history), said)
    refused(invoke("dashboard", history, "-o", tmp_path / "site"), said)


def test_a_summary_that_is_not_a_regular_file_is_skipped_in_one_line(run, tmp_path):
    """/dev/zero would be read forever, a FIFO would hang the reader: neither is read."""
    (run / "summary.json").unlink()
    (run / "summary.json").symlink_to("/dev/zero")
    line = refused(invoke("compare", run.parent, run.parent))
    assert "no run" in line or "not a regular file" in line
    report = invoke("report", run.parent, "-o", tmp_path / "r")
    assert "not a regular file (a device)" in report.output + report.stderr
    (run / "summary.json").unlink()
    os.mkfifo(run / "summary.json")
    code = subprocess.run([sys.executable, "-m", "suite.cli", "report", str(run.parent), "-o",
                           str(tmp_path / "r2")], capture_output=True, text=True, timeout=120)
    assert "not a regular file (a FIFO)" in code.stdout + code.stderr, code.stderr


def test_a_yaml_of_nested_aliases_is_one_short_line(tmp_path):
    """A 'billion laughs' file: refused before it is expanded, the error line bounded."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]")
    lines.append("method: *a8")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    assert bomb.stat().st_size < 600
    line = refused(invoke(*DRY, "--config", bomb), "expands to more than")
    assert len(line) < 300


def test_a_list_for_one_value_is_said_in_bounded_words(tmp_path):
    config = tmp_path / "list.yaml"
    config.write_text("lr: [" + ", ".join(["0.1"] * 10000) + "]\n")
    line = refused(invoke(*DRY, "--config", config), "lr takes one value, got the list")
    assert len(line) < 300


def test_a_profile_that_is_a_list_is_one_line(tmp_path):
    profile = tmp_path / "p.json"
    profile.write_text("[1, 2]")
    refused(invoke("run", "--launcher", "sim", "--profile", profile, "--method", "ddp",
                   "--gpus", "8", "--dry-run"), "a JSON list, not an object")


@pytest.mark.parametrize(("env", "said"), [
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": ""}, "MASTER_ADDR is empty"),
    ({"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"},
     "RANK=2 and WORLD_SIZE=2: a rank is one of 0..1"),
    ({"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "2", "RANK": "0", "WORLD_SIZE": "2",
      "MASTER_ADDR": "127.0.0.1"}, "a local rank is one of 0..1"),
    ({"PRUNEX_FLUSH_SECONDS": "1e300"}, "PRUNEX_FLUSH_SECONDS='1e300' must be a number in"),
    ({"PRUNEX_AGREE_SECONDS": "1e9"}, "PRUNEX_AGREE_SECONDS='1e9'"),
    ({"PRUNEX_STRICT_DETERMINISM": "maybe"}, "PRUNEX_STRICT_DETERMINISM='maybe' must be 1"),
])
def test_a_bad_process_environment_is_one_line(env, said):
    refused(invoke(*DRY, env=env), said)


def test_no_environment_variable_is_read_at_import():
    """Importing every module of a rank's run with malformed variables raises nothing: they
    are read when a run starts, after `bench` checked them."""
    env = {**os.environ, "PRUNEX_FLUSH_SECONDS": "abc", "PRUNEX_AGREE_SECONDS": "abc",
           "PRUNEX_STOP_AFTER_ITERATION": "abc", "PRUNEX_HOST_MEMORY_BANDWIDTH": "abc"}
    code = "import suite.run.loop, suite.run.agreement, suite.commands.simulate, suite.cli"
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_strict_determinism_takes_the_flag_words(monkeypatch):
    from suite.run.determinism import strict

    monkeypatch.setenv("PRUNEX_STRICT_DETERMINISM", "yes")
    assert strict()
    monkeypatch.setenv("PRUNEX_STRICT_DETERMINISM", "0")
    assert not strict()


@pytest.mark.parametrize(("flags", "said"), [
    (["--collective-timeout", "1e-9"], "--collective-timeout must be in [1,"),
    (["--checkpoint-minutes", "1e-300"], "--checkpoint-minutes must be at least 1/60"),
    (["--run-id", "r" * 300], "--run-id of 300 characters: at most 200"),
    (["--results-dir", "/tmp/" + "d" * 5000], "--results-dir of 5005 characters"),
])
def test_a_number_out_of_its_sane_range_is_one_line(flags, said):
    refused(invoke(*[a for a in DRY if a not in ("--method", "ddp")], *flags), said)


@pytest.mark.parametrize("steps", [str(10**30), "1e30"])
def test_local_steps_beyond_any_run_are_one_line(tmp_path, steps):
    """10**30 local steps per round: no run ends; refused by the plan (1e30 by the option)."""
    config = tmp_path / "steps.yaml"
    config.write_text(f"local_steps: {steps}\n")
    said = "rounds of 10" if steps.isdigit() else "--local-steps takes INT, got '1e30'"
    for how in (["--local-steps", steps], ["--config", config]):
        refused(invoke("run", "--dry-run", "--method", "prunex", "--dataset", "synthetic",
                       "--gpus", "2", "--gpus-per-node", "1", *how), said)


def test_a_long_run_id_on_a_real_run_is_one_line(tmp_path):
    refused(invoke("run", "--method", "ddp", "--dataset", "synthetic", "--gpus", "1",
                   "--gpus-per-node", "1", "--run-id", "r" * 300, "--results-dir", tmp_path),
            "--run-id of 300 characters")
    assert not any(tmp_path.iterdir())


def test_dashboard_output_that_is_a_file_is_one_line(history_line, tmp_path):
    history = tmp_path / "h.jsonl"
    history.write_text(json.dumps(history_line) + "\n")
    taken = tmp_path / "taken"
    taken.write_text("mine")
    refused(invoke("dashboard", history, "-o", taken), "is a file")
    refused(invoke("dashboard", history, "-o", taken / "site"), "could not write")
    assert taken.read_text() == "mine"


@pytest.mark.parametrize("damage", ["garbage", "not-a-mapping", "bad-shapes", "channels-2d"])
def test_export_of_damaged_masks_is_one_line(run, damage):
    from suite.data.datasets import dataset_spec
    from suite.plugins.registry import WORKLOADS

    model = WORKLOADS.build("cnn-fmnist").build_model(dataset_spec("fmnist"))
    torch.save(model.state_dict(), run / "model.pt")  # the references commit no model
    masks = run / "masks.pt"
    saved = torch.load(masks, weights_only=True)
    layer = next(iter(saved))
    if damage == "garbage":
        masks.write_bytes(os.urandom(300))
    elif damage == "not-a-mapping":
        torch.save([1, 2], masks)
    elif damage == "bad-shapes":
        saved[layer] = {**saved[layer], "filters": torch.ones(3, dtype=torch.bool)}
        torch.save(saved, masks)
    else:
        saved[layer] = {**saved[layer], "channels": torch.ones(2, 2, dtype=torch.bool)}
        torch.save(saved, masks)
    line = refused(invoke("export", run, "--repeats", "3"))
    assert "masks.pt" in line, line


def test_math_text_from_a_run_folder_is_drawn_as_text(tmp_path):
    """A workload and a run id with matplotlib's math markers (a '$' pair around TeX that
    does not parse): the report draws them as typed, where it ended in a parse traceback."""
    root = tmp_path / "set"
    for source, name in ((RUN, "a$x^2$b"), (REFERENCE / "ddp-cnn-fmnist-4g-4d0bbca3", "c$d")):
        shutil.copytree(source, root / name)
        edit(root / name, "summary.json", run_id=name, workload="w$\\frac$")
    result = invoke("report", root, "-o", tmp_path / "r")
    assert result.exit_code == 0, result.output
    assert "a$x^2$b" in (tmp_path / "r" / "report.md").read_text()


def test_a_damaged_summary_lent_to_the_simulator_is_one_line(run):
    """Every command that reads a run folder back says a damaged file in one line, exit 2:
    here `bench sim --accuracy-from` (read where no record type was checked before)."""
    edit(run, "summary.json", final_accuracy="high")
    refused(invoke("sim", "--method", "ddp", "--gpus", "8", "--workload", "cnn-fmnist",
                   "--accuracy-from", run, "--results-dir", run.parent.parent / "sim"),
            "final_accuracy: should be a valid number")
