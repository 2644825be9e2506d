"""The nightly gate beyond `bench compare`'s matching: a reference per machine class, each
method's activity check on real runs, and change points over a history built from real
summaries (`bench trend`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from suite.results.machine import device_model, machine_class
from suite.results.reference import DEFAULT_GATE

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "reference" / "cpu-gloo"
BENCH = [sys.executable, "-m", "suite.cli"]
ENV = {**os.environ, "PRUNEX_PROGRESS": "0"}


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *map(str, args)], capture_output=True, text=True, env=ENV,
                          cwd=REPO)


def copy_set(target: Path, methods: tuple[str, ...] = ("ddp", "prunex", "topk")) -> Path:
    """Real runs of the committed CPU reference."""
    for folder in REFERENCE.iterdir():
        summary = folder / "summary.json"
        if summary.is_file() and json.loads(summary.read_text())["method"] in methods:
            shutil.copytree(folder, target / folder.name)
    return target


def test_machine_classes():
    assert machine_class({"device": "cpu", "backend": "gloo"}) == "cpu-gloo"  # recorded before
    h100 = {"device": "cuda:0", "backend": "nccl",
            "numerics": {"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}}
    assert machine_class(h100) == "cuda-nccl-h100-sm90"
    epyc = {"cpu_vendor": "AuthenticAMD", "cpu_family": "25", "cpu_capability": "AVX512",
            "threads_per_rank": 2}
    assert machine_class({"device": "cpu", "backend": "gloo", "hardware": epyc}) == (
        "cpu-gloo-amd25-avx512-t2")
    assert device_model("Tesla V100-SXM2-32GB") == "v100"
    assert device_model("NVIDIA A100-SXM4-80GB") == "a100"


def recorded_class(**env: str) -> str:
    """The class a run on this machine records, under ``env``."""
    code = ("import json; from suite.results.folder import hardware; "
            "print(json.dumps(hardware()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True).stdout
    return machine_class({"device": "cpu", "backend": "gloo", "hardware": json.loads(out)})


def test_the_class_names_the_cpu_kernels_torch_dispatches_to():
    native = recorded_class()
    if native.split("-")[-2] == "default":
        pytest.skip("this CPU's native kernels are torch's portable ones already")
    portable = recorded_class(ATEN_CPU_CAPABILITY="default")
    assert portable != native and "-default-t" in portable, (native, portable)


def as_gpu_runner(data: dict) -> None:
    data.update(device="cuda:0", backend="nccl",
                numerics={"device_name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"})


def as_avx2_runner(data: dict) -> None:
    """The issue's runner: the same CPU family, torch dispatching to AVX2 kernels (this
    machine's references are AVX-512 and the portable kernels)."""
    data["hardware"] = {**data.get("hardware", {}), "cpu_vendor": "AuthenticAMD",
                        "cpu_family": "25", "cpu_capability": "AVX2", "threads_per_rank": 1}


@pytest.mark.parametrize(("recorded_as", "klass"), [(as_gpu_runner, "cuda-nccl-h100-sm90"),
                                                   (as_avx2_runner, "cpu-gloo-amd25-avx2-t1")])
def test_a_set_of_a_class_without_reference_fails_in_one_line(tmp_path, recorded_as, klass):
    new = copy_set(tmp_path / "new")
    for manifest in new.rglob("manifest.json"):  # the same runs, as another runner records them
        data = json.loads(manifest.read_text())
        recorded_as(data)
        manifest.write_text(json.dumps(data))
    for baseline in (REFERENCE.parent, REFERENCE):  # the tree of classes, and one flat set
        proc = bench("compare", baseline, new)
        assert proc.returncode == 1, proc.stdout
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and f"no reference for machine class {klass}" in lines[0]
        assert "nox -s reference" in lines[0] and "cpu-gloo" in lines[0]
        assert "REGRESSION" not in proc.stdout + proc.stderr


def test_the_nightly_refuses_a_class_without_reference_before_it_runs(tmp_path):
    """What `nox -s nightly` asks before its sweep: this machine's class, as its runs will
    record it (in a process under ATEN_CPU_CAPABILITY=default, the portable kernels' class)."""
    code = ("import json; from suite.results.reference import missing_reference, "
            "this_machine_class; print(json.dumps([this_machine_class(4), "
            f"missing_reference({str(tmp_path)!r}, 4)]))")

    def ask(**env):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, **env}, check=True).stdout
        return json.loads(out)

    (tmp_path / "cpu-gloo").mkdir()
    here, refusal = ask()
    assert here == recorded_class(OMP_NUM_THREADS="1")  # the class its ranks record
    assert f"no reference for machine class {here}" in refusal and "nox -s reference" in refusal
    (tmp_path / here).mkdir()
    assert ask() == [here, None]
    portable, refusal = ask(ATEN_CPU_CAPABILITY="default")
    assert portable == recorded_class(ATEN_CPU_CAPABILITY="default", OMP_NUM_THREADS="1")
    assert (refusal is None) == (portable == here)


def test_the_tree_of_references_is_read_for_the_runs_class(tmp_path):
    proc = bench("compare", REFERENCE.parent, copy_set(tmp_path / "new"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 regression(s)" in proc.stdout and "time_ratio" in proc.stdout
    assert "unmatched (only in new)" not in proc.stdout


# -- accuracy and training loss across kernels ----------------------------------------------
PERTURBATIONS = Path(__file__).resolve().parent / "data" / "kernel_perturbations"
#: the nightly's quality metrics at its default thresholds (time is judged within a class)
QUALITY_GATE = ["--metric", "accuracy,train-loss,bytes",
                "--max-accuracy-drop", str(DEFAULT_GATE["max_accuracy_drop"]),
                "--max-loss-regression", DEFAULT_GATE["max_loss_regression"],
                "--max-regression", DEFAULT_GATE["max_regression"]]


@pytest.mark.parametrize("perturbed", ["default-s0", "avx2-s0", "threads2-s0"])
def test_the_gate_passes_the_same_runs_on_other_kernels(perturbed):
    """Recorded nightlies of the same seed under other CPU kernels and threads: no alarm."""
    proc = bench("compare", PERTURBATIONS / "native-s0", PERTURBATIONS / perturbed,
                 *QUALITY_GATE, "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    methods = {row["method"] for row in rows}
    assert len(methods) == 11, methods
    assert {row["metric"] for row in rows} >= {"final_accuracy", "final_train_loss"}


def test_the_gate_fails_a_learning_rate_off_by_ten_on_every_method():
    proc = bench("compare", PERTURBATIONS / "native-s0", PERTURBATIONS / "lr10x-s0",
                 *QUALITY_GATE, "--format", "json")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = json.loads(proc.stdout)["rows"]
    caught = {row["method"] for row in rows
              if row["metric"] == "final_train_loss" and row["regression"]}
    assert len(caught) == 11, caught


# -- activity checks on real runs ------------------------------------------------------------
TINY = ["--workload", "cnn-fmnist", "--dataset", "synthetic", "--synthetic-size", "512,128",
        "--gpus", "2", "--gpus-per-node", "1", "--iterations", "3", "--local-steps", "2",
        "--batch-size", "16", "--eval-every", "1000"]


def test_a_method_that_does_not_do_its_job_fails_its_activity_check(tmp_path):
    keep_all, done = tmp_path / "keep-all", tmp_path / "done"
    runs = [
        (keep_all, "ddp", ["--run-id", "ddp"]),  # the dense twin of both sets
        (keep_all, "prunex", ["--channel-keep", "1", "--run-id", "keep1"]),
        (done, "prunex", []),
    ]
    for results, method, extra in runs:
        proc = bench("run", "--method", method, *TINY, "--results-dir", results, *extra)
        assert proc.returncode == 0, proc.stderr
    shutil.copytree(keep_all / "ddp", done / "ddp")
    # PruneX on masks that keep everything: it trains, sends, and prunes nothing
    masked = ["--masks-from", keep_all / "keep1", "--run-id", "masked"]
    proc = bench("run", "--method", "prunex", *TINY, "--results-dir", keep_all, *masked)
    assert proc.returncode == 0, proc.stderr
    shutil.rmtree(keep_all / "keep1")  # asked to keep everything: its job is not in question

    failing = bench("compare", keep_all, keep_all)
    assert failing.returncode == 1, failing.stdout
    assert "REGRESSION: prunex density of the prunable layers ended at 1.000" in failing.stdout
    passing = bench("compare", done, done)
    assert passing.returncode == 0, passing.stdout
    assert "REGRESSION" not in passing.stdout and "prunex did its job" in passing.stdout


# -- change points over a history ----------------------------------------------------------
def history_from_reference(path: Path, nights: int, step_at: int | None, factor: float = 1.2):
    """A history of ``nights`` nightlies of the real reference summaries, each a commit of
    its own; from night ``step_at`` on PruneX sends ``factor`` times the bytes."""
    from suite.results.trend import history_rows

    rows = history_rows(REFERENCE)
    with path.open("w") as out:
        for night in range(nights):
            for row in rows:
                row = {**row, "commit": f"c{night:03d}", "when": f"2026-11-{night + 1:02d}"}
                if step_at is not None and night >= step_at and row["method"] == "prunex":
                    row["inter_node_bytes_per_iteration"] *= factor
                out.write(json.dumps(row) + "\n")
    return path


def test_trend_finds_a_planted_step_and_none_without_one(tmp_path):
    flat = bench("trend", history_from_reference(tmp_path / "flat.jsonl", 10, None))
    assert flat.returncode == 0 and "0 change point(s)" in flat.stdout, flat.stdout
    stepped = bench("trend", history_from_reference(tmp_path / "step.jsonl", 10, 6))
    assert stepped.returncode == 0, stepped.stderr
    lines = [line for line in stepped.stdout.splitlines() if "change at run" in line]
    assert len(lines) == 1, stepped.stdout
    assert "prunex" in lines[0] and "inter_node_bytes_per_iteration" in lines[0]
    assert "run 7 (commit c006" in lines[0] and "(-20.0%, worse)" in lines[0]
    last = bench("trend", history_from_reference(tmp_path / "last.jsonl", 10, 9),
                 "--fail-on-last")
    assert last.returncode == 1 and "1 worse in the last run" in last.stdout, last.stdout


def test_a_short_history_says_how_many_runs_a_verdict_needs(tmp_path):
    proc = bench("trend", tmp_path / "h.jsonl", "--add", REFERENCE)
    assert proc.returncode == 0, proc.stderr
    assert "added 11 series point(s)" in proc.stdout
    assert "fewer than 6 runs, the least a verdict needs (longest here: 1)" in proc.stdout


@pytest.mark.parametrize("text", ["not json\n", ""])
def test_a_bad_history_is_one_line(tmp_path, text):
    path = tmp_path / "h.jsonl"
    path.write_text(text)
    proc = bench("trend", path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
