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

from suite.gate.thresholds import DEFAULT_GATE
from suite.results.machine import device_model, machine_class

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "tests" / "fixtures" / "references" / "cpu-gloo"
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
    if native.split("-")[-2] == "portable":
        pytest.skip("this CPU's native kernels are torch's portable ones already")
    portable = recorded_class(ATEN_CPU_CAPABILITY="default")
    threads = native.rsplit("-", 1)[1]  # this process's threads
    assert portable != native and portable == f"cpu-gloo-portable-{threads}", (native, portable)


def test_the_portable_class_names_no_vendor():
    """Under the portable kernels any CPU joins one class; native kernels keep their vendor."""
    for vendor, family in (("AuthenticAMD", "25"), ("GenuineIntel", "6"), ("0x41", "0xd0c")):
        hardware = {"cpu_vendor": vendor, "cpu_family": family, "cpu_capability": "DEFAULT",
                    "threads_per_rank": 1}
        assert machine_class({"device": "cpu", "backend": "gloo", "hardware": hardware}) == (
            "cpu-gloo-portable-t1")
    intel = {"cpu_vendor": "GenuineIntel", "cpu_family": "6", "cpu_capability": "AVX512",
             "threads_per_rank": 1}
    assert machine_class({"device": "cpu", "backend": "gloo", "hardware": intel}) == (
        "cpu-gloo-intel6-avx512-t1")


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


def plan(root: Path, methods: str = "", **env: str) -> dict:
    """What `nox -s nightly` decides before its sweep (suite.gate.plan_nightly, handed the
    nightly's order as noxfile.py hands it), in a process of ``env``: the class, reference,
    methods, environment and note, or the refusal."""
    code = ("import json, sys; from suite.errors import BenchError; "
            "from suite.gate import plan_nightly; from suite.plugins.registry import METHODS\n"
            f"try: p = plan_nightly({str(root)!r}, 4, {methods!r} or None, "
            "order=METHODS.nightly())\n"
            "except BenchError as e: print(json.dumps({'refusal': str(e)})); sys.exit()\n"
            "print(json.dumps({'class': p.machine_class, 'reference': str(p.reference), "
            "'methods': list(p.methods), 'env': p.env, 'note': p.note}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True).stdout
    return json.loads(out)


@pytest.mark.integration  # nightlies run for real: nox -s integration
def test_the_nightly_plans_its_class_or_refuses_before_it_runs(tmp_path):
    """The class its ranks will record; a CPU runner without its own reference falls back to
    the portable kernels' reference, in one line; without either, a one-line refusal."""
    here = recorded_class(OMP_NUM_THREADS="1")
    copy_set(tmp_path / "cpu-gloo-amd25-avx512-t1")
    refused = plan(tmp_path)
    if here == "cpu-gloo-amd25-avx512-t1":
        pytest.skip("this machine is the reference's own class")
    assert f"no reference for machine class {here}" in refused["refusal"]
    assert "nox -s reference" in refused["refusal"]
    copy_set(tmp_path / "cpu-gloo-portable-t1", ("ddp", "prunex", "localsgd-hier"))
    portable = plan(tmp_path)
    assert portable["class"] == "cpu-gloo-portable-t1"
    assert portable["env"] == {"ATEN_CPU_CAPABILITY": "default"}
    # the reduced reference's, in the order they registered for the nightly
    assert portable["methods"] == ["ddp", "localsgd-hier", "prunex"]
    assert portable["note"] == (f"no reference for {here} in {tmp_path}: the nightly runs under "
                                "torch's portable kernels (ATEN_CPU_CAPABILITY=default) against "
                                "cpu-gloo-portable-t1")
    chosen = plan(tmp_path, "prunex")  # DDP joins: time ratios and activity checks need it
    assert chosen["methods"] == ["ddp", "prunex"]
    lacking = plan(tmp_path, "ddp,topk")
    assert "holds ddp, localsgd-hier, prunex, not topk" in lacking["refusal"]
    copy_set(tmp_path / here, ("ddp",))
    native = plan(tmp_path)
    assert (native["class"], native["env"], native["note"]) == (here, {}, None)


def test_the_tree_of_references_is_read_for_the_runs_class(tmp_path):
    proc = bench("compare", REFERENCE.parent, copy_set(tmp_path / "new"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 regression(s)" in proc.stdout and "time-ratio" in proc.stdout
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


@pytest.mark.integration  # a minute of end-to-end runs: nox -s integration
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
    passing = bench("compare", done, done, "--wide")
    assert passing.returncode == 0, passing.stdout
    assert "REGRESSION" not in passing.stdout and "prunex did its job" in passing.stdout


# -- change points over a history ----------------------------------------------------------
def history_from_reference(path: Path, nights: int, step_at: int | None, factor: float = 1.2):
    """A history of ``nights`` nightlies of the real reference summaries, each a commit of
    its own; from night ``step_at`` on PruneX sends ``factor`` times the bytes."""
    from suite.gate.trend import history_rows

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


# -- one gate: the class's gate.json judges a hand run and the nightly alike ------------------
PORTABLE = REPO / "reference" / "cpu-gloo-portable-t1"


def portable_set(target: Path, methods=("ddp", "prunex", "localsgd-hier")) -> Path:
    """Real runs of the committed portable reference."""
    for folder in PORTABLE.iterdir():
        summary = folder / "summary.json"
        if summary.is_file() and json.loads(summary.read_text())["method"] in methods:
            shutil.copytree(folder, target / folder.name)
    return target


def edit(root: Path, method: str, file: str, **changes) -> None:
    """Change keys of ``file`` (summary.json or manifest.json) of ``method``'s run."""
    for path in root.rglob(file):
        data = json.loads(path.read_text())
        summary = json.loads((path.parent / "summary.json").read_text())
        if summary["method"] == method:
            path.write_text(json.dumps({**data, **changes}))


@pytest.mark.integration  # a nightly run for real: nox -s integration
def test_a_hand_compare_and_the_nightly_give_one_verdict(tmp_path, monkeypatch):
    """The nightly's `bench compare` (noxfile.compare_command) and a maintainer's by hand, on
    the same sets: the same rows and exit code, judged at the class's gate.json (a drop of 3
    accuracy points passes its 5, where bench compare's own 1-point default would fail)."""
    import noxfile

    for variable in (*noxfile.OVERRIDES, "NIGHTLY_COMPARE_TIME"):
        monkeypatch.delenv(variable, raising=False)
    tree = tmp_path / "reference"
    portable_set(tree / "cpu-gloo-portable-t1")
    (tree / "cpu-gloo-portable-t1" / "gate.json").write_text(json.dumps(
        {"max_accuracy_drop": 5.0, "max_loss_regression": "2%"}))
    new = portable_set(tmp_path / "new")
    accuracy = json.loads(next(PORTABLE.glob("prunex-*/summary.json")).read_text())
    edit(new, "prunex", "summary.json", final_accuracy=accuracy["final_accuracy"] - 0.03)
    verdicts = []
    for baseline in (tree, tree / "cpu-gloo-portable-t1"):
        nightly = noxfile.compare_command(str(baseline), str(new))
        assert nightly[:4] == ["bench", "compare", str(baseline), str(new)], nightly
        for command in (nightly[1:], ["compare", baseline, new]):
            proc = bench(*command, "--format", "json")
            assert proc.returncode == 0, proc.stdout + proc.stderr
            verdicts.append(json.loads(proc.stdout))
    assert all(v["rows"] == verdicts[0]["rows"] for v in verdicts)
    assert verdicts[0]["thresholds"]["cpu-gloo-portable-t1"].endswith(
        "(cpu-gloo-portable-t1/gate.json)")
    text = bench("compare", tree, new).stdout  # the verdict, the table's last line(s)
    verdict = text[text.rindex("0 regression(s)"):]
    assert " ".join(verdict.split()) == (
        "0 regression(s); cpu-gloo-portable-t1 judged at accuracy 5 points, training loss 2.0%, "
        "bytes 5.0%, time 15.0% on a runner at most 25% busy (cpu-gloo-portable-t1/gate.json)")
    assert max(map(len, text.splitlines())) <= 120
    flagged = bench("compare", tree, new, "--max-accuracy-drop", "1")
    assert flagged.returncode == 1 and "--max-accuracy-drop from the command line" in (
        flagged.stdout), flagged.stdout


def runner_load(outside: float, cores: int = 2) -> dict:
    return {"cores": cores, "outside_load": outside, "others_cores": outside, "steal_cores": 0.0,
            "own_cores": 1.0, "span_seconds": 9.0, "load_average_start": [6.0, 6.0, 6.0],
            "load_average_end": [7.5, 7.0, 6.5]}


def slower_prunex(tmp_path: Path) -> tuple[Path, Path, dict]:
    """(a reference tree of the portable class, a copy of its runs where PruneX's iterations
    take 45 % longer, PruneX's reference summary)."""
    tree = tmp_path / "reference"
    portable_set(tree / "cpu-gloo-portable-t1")
    new = portable_set(tmp_path / "new")
    prunex = json.loads(next(PORTABLE.glob("prunex-*/summary.json")).read_text())
    edit(new, "prunex", "summary.json", iteration_seconds=1.455 * prunex["iteration_seconds"])
    return tree, new, prunex


@pytest.mark.parametrize(("outside", "code"), [(1.5, 0), (0.1, 1)])
def test_time_on_a_busy_runner_is_not_judged(tmp_path, outside, code):
    """PruneX 45 % slower on a runner whose other processes took 1.5 of its 2 cores: its time
    says "not judged", while its loss is judged as always; on a quiet runner the same numbers
    are a REGRESSION."""
    tree, new, prunex = slower_prunex(tmp_path)
    for method in ("ddp", "prunex", "localsgd-hier"):
        edit(new, method, "manifest.json", runner_load=runner_load(outside))
    proc = bench("compare", tree, new, "--format", "json")
    assert proc.returncode == code, proc.stdout + proc.stderr
    rows = {(r["method"], r["metric"]): r for r in json.loads(proc.stdout)["rows"]}
    time = rows[("prunex", "time_ratio")]
    if code == 0:
        assert time["verdict"] == "not judged: runner busy (load 1.5 on 2 cores)"
        assert not time["regression"] and time["change"] > 0.3
    else:
        assert time["verdict"] == "REGRESSION" and time["regression"]
    assert rows[("prunex", "final_train_loss")]["verdict"] == "ok"
    # loss is judged on a busy runner as always
    edit(new, "prunex", "summary.json", final_train_loss=1.1 * prunex["final_train_loss"])
    loss = bench("compare", tree, new, "--format", "json")
    assert loss.returncode == 1
    judged = {(r["method"], r["metric"]): r for r in json.loads(loss.stdout)["rows"]}
    assert judged[("prunex", "final_train_loss")]["verdict"] == "REGRESSION"


def test_time_on_another_processor_is_not_judged(tmp_path):
    """A runner judged against the portable class's reference recorded on another vendor's
    processor (here an AMD EPYC, whichever CPU recorded the committed one): its numbers travel
    across vendors, its speed does not, so a time ratio 45 % off on an Intel Xeon says "not
    judged" (measured: localsgd-hier's 0.88 of DDP's on the EPYC was 1.1 on a quiet Xeon),
    while bytes and loss are judged as always."""
    tree, new, prunex = slower_prunex(tmp_path)
    processors = {new: ("GenuineIntel", "6", "Intel(R) Xeon(R) Processor"),
                  tree: ("AuthenticAMD", "25", "AMD EPYC")}
    for root, (vendor, family, name) in processors.items():
        for method in ("ddp", "prunex", "localsgd-hier"):
            manifest = json.loads(next(root.rglob(f"{method}-cnn*/manifest.json")).read_text())
            hardware = {**manifest["hardware"], "cpu_vendor": vendor, "cpu_family": family,
                        "cpu_model_name": name}
            edit(root, method, "manifest.json", hardware=hardware)
    proc = bench("compare", tree, new, "--format", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {(r["method"], r["metric"]): r for r in json.loads(proc.stdout)["rows"]}
    time = rows[("prunex", "time_ratio")]
    assert time["verdict"] == ("not judged: timed on GenuineIntel 6 Intel(R) Xeon(R) Processor; "
                               "the baseline on AuthenticAMD 25 AMD EPYC")
    assert rows[("prunex", "final_train_loss")]["verdict"] == "ok"
    edit(new, "prunex", "summary.json", inter_node_bytes_per_iteration=2 * prunex[
        "inter_node_bytes_per_iteration"])
    assert bench("compare", tree, new).returncode == 1  # bytes are judged as always


def test_thresholds_from_fewer_nightlies_of_a_reduced_set(tmp_path):
    """gate-thresholds' arithmetic on recorded nightlies of three methods: two suffice, a busy
    night's times are left out, one night is refused."""
    from suite.errors import BenchError
    from suite.gate import calibrate_gate

    reference = portable_set(tmp_path / "cpu-gloo-portable-t1")
    nights = []
    for k, perturbed in enumerate(("default-s0", "avx2-s0")):
        night = tmp_path / f"night{k}"
        for folder in (PERTURBATIONS / perturbed).iterdir():
            if json.loads((folder / "summary.json").read_text())["method"] in (
                    "ddp", "prunex", "localsgd-hier"):
                shutil.copytree(folder, night / folder.name)
                data = json.loads((night / folder.name / "manifest.json").read_text())
                data["hardware"]["cpu_capability"] = "DEFAULT"  # the class of the reference
                data["runner_load"] = runner_load(1.5 if k else 0.0)
                (night / folder.name / "manifest.json").write_text(json.dumps(data))
        nights.append(night)
    with pytest.raises(BenchError, match="at least 2 nightlies"):
        calibrate_gate(reference, nights[:1])
    gate = json.loads(calibrate_gate(reference, nights).read_text())
    assert gate["measured"]["methods"] == ["ddp", "localsgd-hier", "prunex"]
    assert gate["measured"]["nightlies"] == 2 and gate["measured"]["busy_nightlies"] == 1
    assert gate["max_accuracy_drop"] >= 1.0 and gate["max_time_regression"].endswith("%")


@pytest.mark.parametrize(("verdict", "found"), [
    ("not judged: runner busy (load 1.2 on 2 cores)", 0), ("REGRESSION", 1)])
def test_trend_leaves_out_times_the_gate_did_not_judge(tmp_path, verdict, found):
    """PruneX's time ratio steps up 40 % from night 7: a change point where the gate judged
    those times, none where it did not (the runner was busy)."""
    path = history_from_reference(tmp_path / "h.jsonl", 10, None)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for number, line in enumerate(lines):
        if line["method"] == "prunex" and number // 11 >= 6:
            line["time_ratio"] *= 1.4
            line["verdicts"] = {"time_ratio": verdict}
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    proc = bench("trend", path, "--max-time-regression", "15%")
    assert proc.returncode == 0, proc.stderr
    assert f"{found} change point(s)" in proc.stdout, proc.stdout


def test_a_wild_spread_calibrates_a_gate_that_reads_back(tmp_path):
    """Nightlies whose PruneX ends at no accuracy (70 points below its reference) and at 4x
    its training loss: the thresholds measured from them (139 points, 1500 %) are written at
    the bounds a gate.json may hold, 100 points and 1000 %, so the class's gate.json reads
    back instead of refusing every later compare."""
    from suite.gate import calibrate_gate
    from suite.gate.thresholds import read_gate

    reference = portable_set(tmp_path / "cpu-gloo-portable-t1")
    prunex = json.loads(next(PORTABLE.glob("prunex-*/summary.json")).read_text())
    assert prunex["final_accuracy"] > 0.5  # twice its drop to 0 is over 100 points
    nights = []
    for k in range(2):
        night = portable_set(tmp_path / f"night{k}")
        edit(night, "prunex", "summary.json", final_accuracy=0.0,
             final_train_loss=4 * prunex["final_train_loss"])
        nights.append(night)
    written = json.loads(calibrate_gate(reference, nights).read_text())
    assert (written["max_accuracy_drop"], written["max_loss_regression"]) == (100.0, "1000%")
    assert written["measured"]["largest_deviations"]["final_accuracy"] > 50
    gate = read_gate(reference)
    assert (gate.accuracy_drop, gate.loss_regression) == (100.0, 10.0)
