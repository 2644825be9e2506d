"""tools/gpu: the list of wheels prepare carries to the GPU machine covers everything the
code imports that the GPU image lacks, and part 0 (the smoke) runs where there is no GPU."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import platform
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.runs import ENV, REPO

sys.path.insert(0, str(REPO / "tools" / "gpu"))
import wheels  # noqa: E402

#: the code that runs on the GPU machine
RUN_THERE = ("suite", "methods", "baselines", "workloads", "benchmarks", "tests", "tools",
             "noxfile.py", "tools/gpu/plan", "tools/gpu/prepare")
MISTAKES = REPO / "tests" / "plugin_mistakes"
#: what a test imports that the GPU parts never run: the dashboard's browser test, the
#: methods' colours under colour-vision deficiencies (tests/report)
NOT_RUN_THERE = {"playwright", "colorspacious"}
FIRST_PARTY = {"noxfile", "suite", "methods", "baselines", "workloads", "tests", "tools", "wheels",
               "runs", "prunex_overhead", "plugin_example_methods", "plugin_example_workloads"}


def imported_modules() -> set[str]:
    """Top-level names the code imports, the standard library's and the project's left out."""
    stdlib = set(sys.stdlib_module_names)
    found = set()
    for name in RUN_THERE:
        path = REPO / name
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            if MISTAKES in file.parents:
                continue  # the broken plugins import what exists nowhere, on purpose
            for node in ast.walk(ast.parse(file.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    local = {p.stem for folder in ("benchmarks", "tools/gpu") for p in (REPO / folder).glob("*.py")}
    return {m for m in found if m not in stdlib and m not in FIRST_PARTY | local | NOT_RUN_THERE
            and not m.startswith("_")}


def test_every_import_is_in_the_image_or_carried():
    """A module the code imports comes from a distribution that the GPU image has, or that
    pyproject declares, so that prepare derives it; an undeclared one the image lacks (or one
    declared nowhere) fails here."""
    image = wheels.image_packages()
    declared = {canonicalize_name(r.name) for r in wheels.project_requirements()}
    owners = importlib.metadata.packages_distributions()
    lacking = {}
    for module in sorted(imported_modules()):
        dists = {canonicalize_name(d) for d in owners.get(module, [])}
        if not dists:
            lacking[module] = "no installed distribution provides it"
        elif not dists & (image | declared):
            lacking[module] = f"{sorted(dists)}: neither in the GPU image nor in pyproject"
    assert lacking == {}


def test_prepare_carries_every_dependency_the_image_lacks():
    image = wheels.image_packages()
    roots = {canonicalize_name(r.name) for r in wheels.missing_requirements()}
    for requirement in wheels.project_requirements():
        name = canonicalize_name(requirement.name)
        assert (name in image) != (name in roots), name  # one or the other
    # what the image lacks today (KINDS.md, 2026-11-17)
    assert {"torch-pruning", "submitit", "tueplots", "ruptures", "nox"} <= roots
    assert not roots & {"torch", "torchvision", "timm", "pandas", "pytest", "click"}


def test_a_wheels_own_requirements_are_read_for_the_target_python(tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    metadata = "\n".join([
        "Metadata-Version: 2.1", "Name: demo", "Version: 1.0",
        "Requires-Dist: numpy", "Requires-Dist: tomli>=1.1; python_version < '3.11'",
        "Requires-Dist: virtualenv>=21; python_version >= '3.12'",
        "Requires-Dist: pytest; extra == 'test'", "Requires-Dist: pywin32; sys_platform == 'win32'",
    ])
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("demo-1.0.dist-info/METADATA", metadata)
    names = lambda version: [r.name for r in wheels.wheel_requirements(wheel, version)]  # noqa: E731
    assert names("3.12") == ["numpy", "virtualenv"]
    assert names("3.10") == ["numpy", "tomli"]


def test_a_pin_is_this_machines_version_where_it_fits():
    here = importlib.metadata.version("click")
    assert wheels.pinned(Requirement("click")) == f"click=={here}"
    assert wheels.pinned(Requirement("click<1")) == "click<1"


@pytest.mark.slow
@pytest.mark.integration  # a minute of end-to-end runs: nox -s integration
def test_part_0_runs_without_a_gpu(tmp_path):
    """tools/gpu/run's part 0 where there is no GPU: the torch API check and 3 iterations of
    ddp, topk and prunex on CPU ranks, a table headed by the device and versions in $OUT."""
    env = {**ENV, "OUT": str(tmp_path), "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), ENV.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "tools/gpu/parts.py", "0"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "part0.md").read_text()
    assert table.splitlines()[2].startswith("cpu (no CUDA device); torch ")
    assert sum(line.count("| ok ") for line in table.splitlines()) == 3
    facts = json.loads((tmp_path / "environment.json").read_text())
    assert facts["python"] == platform.python_version() and facts["torch_fallbacks"] == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["environment.json", "part0.log",
                                                          "part0.md"]


def planted_table(**changes):
    """gpu_steps.describe's rows of a layout where every check passes, with ``changes``
    (method -> {column: value}) planted."""
    import pandas as pd

    rows = {m: {"method": m, "status": "ok", "backend": "nccl", "ranks": 4,
                "bytes min / max": 1.0, "longest phase / iteration": 0.9}
            for m in ("ddp", "powersgd", "prunex")}
    rows["powersgd"]["bytes min / max"] = 0.1
    for method, planted in changes.items():
        rows[method] = {**rows[method], **planted}
    return pd.DataFrame(list(rows.values()))


@pytest.mark.parametrize("changes, found", [
    ({}, []),
    ({"prunex": {"status": "failed", "error": "rank 0: boom"}}, ["prunex: failed: rank 0: boom"]),
    ({"ddp": {"backend": "gloo"}}, ["ddp: ran on gloo, not NCCL"]),
    ({"powersgd": {"bytes min / max": 1.0}},
     ["powersgd: never compressed (every iteration moved the dense bytes)"]),
    ({"powersgd": {"bytes min / max": None}}, ["powersgd: moved no byte on 4 ranks"]),
    # one rank (part 3 on a one-GPU machine) has no peer: no byte moves, nothing to judge
    ({m: {"ranks": 1, "bytes min / max": None} for m in ("ddp", "powersgd", "prunex")}, []),
    ({"ddp": {"longest phase / iteration": 1.5}}, ["ddp: a phase lasted 1.50x its iteration"]),
])
def test_a_gpu_measurement_fails_on_a_planted_fault(changes, found):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_steps

    methods = ["ddp", "powersgd", "prunex"]
    assert gpu_steps.problems(planted_table(**changes), methods, "nccl") == found
    assert gpu_steps.problems(planted_table(), [*methods, "topk"], "nccl") == ["topk: no run"]
    shared = planted_table(ddp={"backend": "gloo"})
    assert gpu_steps.problems(shared, methods, "shared") == []  # gloo is that layout's


def load_plan():
    """tools/gpu/plan as a module (a script without .py)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("gpu_plan", str(REPO / "tools/gpu/plan"))
    spec = importlib.util.spec_from_loader("gpu_plan", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_plan"] = module  # its dataclasses look their module up
    loader.exec_module(module)
    return module


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the plan without CUDA")
@pytest.mark.parametrize("python", [[sys.executable], [sys.executable, "-S"]],
                         ids=["no CUDA", "no torch"])
def test_the_plan_without_cuda_prints_itself_and_exits_2_in_one_line(python):
    """Where CUDA is absent, and where torch cannot even be imported (``-S``: no
    site-packages), the plan says what it would run and refuses in one line."""
    for time_left, chosen in (("540", ["resume", "reference", "part3", "part4"]),
                              ("300", ["resume", "reference"])):
        proc = subprocess.run([*python, "tools/gpu/plan", "--time-left", time_left], cwd=REPO,
                              env=ENV, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert ("torch cannot be imported" if "-S" in python else "needs a CUDA device") in (
            proc.stderr)
        lines = proc.stdout.splitlines()
        assert lines[0] == f"plan for {time_left} s of device time:"
        assert [line.split()[0] for line in lines[1:]] == ["resume", "reference", "part3",
                                                            "part4"]
        assert [line.split()[0] for line in lines[1:] if "next call" not in line] == chosen


def test_the_plans_steps_fit_the_call_even_where_each_runs_to_its_end():
    """By their estimates (what the H200 measured) the four steps fit 540 s, the reference
    the second; each step's budget leaves the later ones their estimates, so steps that all
    run to their budgets still end before the call's deadline, and steps that take their
    estimates each get at least that."""
    import time

    plan = load_plan()
    steps, left = plan.chosen(list(plan.STEPS_BY_NAME), plan.DEFAULT_TIME_LEFT)
    assert [s.name for s in steps] == ["resume", "reference", "part3", "part4"] and not left
    usable = plan.DEFAULT_TIME_LEFT - plan.PACK_SECONDS
    for took in ("estimate", "budget"):
        spent = 0.0
        for index, step in enumerate(steps):
            seconds = plan.budget(steps, index, time.monotonic() + usable - spent)
            assert seconds > step.seconds - 1, (step.name, seconds)
            spent += step.seconds if took == "estimate" else seconds
        assert spent <= usable, (took, spent)
    alone = plan.chosen(["reference"], plan.DEFAULT_TIME_LEFT)[0]
    assert plan.budget(alone, 0, time.monotonic() + usable) >= 3 * 150  # 3 seeds fit alone


def test_what_a_plan_leaves_is_packed_into_the_8_files_a_call_returns(tmp_path):
    plan = load_plan()
    for name in ("plan.md", "plan.log", "environment.json", "a.md", "b.md", "c.md", "d.md",
                 "e.log", "f.log", "g.json"):
        (tmp_path / name).write_text(name)
    (tmp_path / "staging" / "run").mkdir(parents=True)
    (tmp_path / "staging" / "run" / "summary.json").write_text("{}")
    kept = plan.pack(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)
    assert len(kept) == 8 and "plan.md" in {p.name for p in kept}
    assert {"a.md", "b.md", "c.md", "d.md"} <= {p.name for p in kept}  # the tables stay
    import tarfile

    with tarfile.open(tmp_path / "rest.tar.gz") as tar:
        packed = set(tar.getnames())
    assert "staging/run/summary.json" in packed and len(packed & {"e.log", "f.log", "g.json",
                                                                  "plan.log"}) == 3
    few = tmp_path / "few"
    few.mkdir()
    (few / "plan.md").write_text("x")
    assert [p.name for p in plan.pack(few)] == ["plan.md"]  # nothing to pack
    steps, left = plan.chosen(["part3", "reference", "resume"], 1000)
    assert [s.name for s in steps] == ["resume", "reference", "part3"] and not left


def test_prepare_reports_a_carry_with_fashion_mnist_under_the_limit(tmp_path):
    if not (Path("/usr/share/datasets/fashion-mnist")).is_dir():
        pytest.skip("needs Debian's dataset-fashion-mnist")
    proc = subprocess.run([sys.executable, "tools/gpu/prepare", "--data-only", "-o",
                           str(tmp_path / "wheels"), "--data-dir",
                           str(tmp_path / "data" / "fashion-mnist")], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(line for line in proc.stdout.splitlines() if line.startswith("the carry:"))
    assert "Fashion-MNIST 29.4 MiB" in line and line.endswith("(limit 64 MiB)")
    assert len(list((tmp_path / "data" / "fashion-mnist").glob("*.gz"))) == 4


def test_a_recorded_sweep_with_a_failed_cell_fails_the_parts_check(tmp_path, capsys):
    """`benchmarks/gpu_steps.py --check-results DIR`: the part's checks on runs already
    recorded (here the portable reference's, CPU ranks on gloo as the shared layout runs)."""
    import shutil

    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_steps

    for method in ("ddp", "powersgd", "prunex"):
        run = next((REPO / "reference" / "cpu-gloo-portable-t1").glob(f"{method}-cnn-*"))
        shutil.copytree(run, tmp_path / run.name)
    methods = ["ddp", "powersgd", "prunex"]
    gpu_steps.check_recorded(tmp_path, methods, "shared")  # every check passes
    with pytest.raises(SystemExit, match="ddp: ran on gloo, not NCCL"):
        gpu_steps.check_recorded(tmp_path, methods, "nccl")  # the NCCL layout's backend
    summary = next(tmp_path.glob("prunex-*")) / "summary.json"
    planted = {**json.loads(summary.read_text()), "status": "failed", "error": "rank 2: boom"}
    summary.write_text(json.dumps(planted))
    with pytest.raises(SystemExit, match=r"1 check\(s\) failed: prunex: failed: rank 2: boom"):
        gpu_steps.check_recorded(tmp_path, methods, "shared")


@pytest.fixture(scope="module")
def one_rank_run(tmp_path_factory) -> Path:
    """A real run of PowerSGD on one rank (part 3 on a one-GPU machine: no peer, no byte
    moves), compressing from its second iteration."""
    from tests.support.runs import ONE_RANK, TINY, bench

    root = tmp_path_factory.mktemp("one-rank")
    proc = bench("sweep", "--method", "powersgd", *TINY, *ONE_RANK, "--iterations", "3",
                 "--start-powersgd-iter", "2", "--results-dir", str(root))
    assert proc.returncode == 0, proc.stderr
    return root


def test_a_one_rank_set_that_moved_no_byte_passes_part_3s_checks(one_rank_run, capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_steps

    table = gpu_steps.describe(one_rank_run)
    assert table["ranks"].tolist() == [1] and table["bytes min / max"].isna().all()
    gpu_steps.check_recorded(one_rank_run, ["powersgd"], "shared")  # no finding
    with pytest.raises(SystemExit) as found:  # on NCCL's layout: the backend alone
        gpu_steps.check_recorded(one_rank_run, ["powersgd"], "nccl")
    assert str(found.value) == "1 check(s) failed: powersgd: ran on gloo, not NCCL"


def staged_reference(tmp_path: Path, methods=("ddp", "topk", "prunex")) -> Path:
    """Copies of the portable CPU class's runs of ``methods``: what a GPU class's must match."""
    import shutil

    staging = tmp_path / "staging"
    for method in methods:
        run = next((REPO / "reference" / "cpu-gloo-portable-t1").glob(f"{method}-cnn-*"))
        shutil.copytree(run, staging / run.name)
    return staging


def test_a_planted_wrong_byte_count_fails_the_reference_step(tmp_path):
    """Bytes follow the plan, not the kernels: the AVX-512 class's equal the portable one's
    for every method, and one byte more in a GPU class's run is a finding."""
    sys.path.insert(0, str(REPO / "tools" / "gpu"))
    from reference_checks import bytes_differences

    portable = REPO / "reference" / "cpu-gloo-portable-t1"
    assert bytes_differences(REPO / "reference" / "cpu-gloo-amd25-avx512-t1", portable) == []
    staging = staged_reference(tmp_path)
    assert bytes_differences(staging, portable) == []
    summary_file = next(staging.glob("topk-*")) / "summary.json"
    summary = json.loads(summary_file.read_text())
    sent = summary["inter_node_bytes_total"]
    summary_file.write_text(json.dumps({**summary, "inter_node_bytes_total": sent + 1}))
    assert bytes_differences(staging, portable) == [
        f"topk (seed 0): {sent + 1} inter-node bytes, the portable class {sent}"]


def test_a_twin_that_differs_fails_the_reference_step(one_rank_run, tmp_path):
    """A second seed-0 run must repeat the first bit for bit: a copy does; one ulp in one
    weight, one loss, or the final loss moved is a finding, and so is a twin missing."""
    import shutil

    import pandas as pd
    import torch

    sys.path.insert(0, str(REPO / "tools" / "gpu"))
    from reference_checks import twin_differences

    run = next(one_rank_run.glob("powersgd-*"))
    twin = tmp_path / "twin" / run.name
    shutil.copytree(run, twin)
    assert twin_differences(one_rank_run, twin.parent, ("powersgd",)) == []
    model = torch.load(twin / "model.pt", weights_only=True)
    key = sorted(model)[0]
    model[key].view(-1)[0] = torch.nextafter(model[key].view(-1)[0], torch.tensor(1e9))
    torch.save(model, twin / "model.pt")
    assert twin_differences(one_rank_run, twin.parent, ("powersgd",)) == [
        f"powersgd: the twin's model differs at {key}"]
    shutil.copy(run / "model.pt", twin / "model.pt")
    rows = pd.read_parquet(twin / "iterations.parquet")
    rows.loc[rows["iteration"] == 2, "loss"] += 1e-12
    rows.to_parquet(twin / "iterations.parquet")
    summary = json.loads((twin / "summary.json").read_text())
    (twin / "summary.json").write_text(json.dumps({**summary, "final_train_loss": 0.5}))
    assert twin_differences(one_rank_run, twin.parent, ("powersgd",)) == [
        "powersgd: the twin's training loss differs from iteration 2",
        f"powersgd: the twin's final_train_loss is 0.5, not {summary['final_train_loss']!r}"]
    shutil.rmtree(twin)
    assert twin_differences(one_rank_run, twin.parent, ("powersgd",)) == [
        "powersgd: no finished seed-0 run to compare with its twin"]


#: a step that prints nothing and never ends: it leaves a run's folder (weights and all) in
#: the returned folder, starts a process in a session of its own, as a test's `bench run`
#: does, and sleeps
HANG = """
import pathlib, subprocess, sys, time
run = pathlib.Path(sys.argv[1]) / "reference-staging" / "run"
run.mkdir(parents=True)
(run / "summary.json").write_text("{}")
(run / "model.pt").write_bytes(b"weights")
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
time.sleep(300)
"""
#: the plan's steps and deadline, driven in a process of its own (it becomes the subreaper
#: of what its steps start, which a test's worker must not)
DRIVER = """
import sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_gpu_tools import load_plan

plan = load_plan()
out, hang = Path(sys.argv[1]), sys.argv[2]
def hanging(out, facts, log, seconds):
    return plan.run_logged([sys.executable, hang, str(out)], log, timeout=seconds), []
def quick(out, facts, log, seconds):
    return plan.run_logged([sys.executable, "-c", "print('ran')"], log, timeout=seconds), []
steps = [plan.Step("hang", "prints nothing, never ends", 1, 60, hanging),
         plan.Step("quick", "after it", 2, 60, quick)]
facts = plan.environment()
sys.exit(plan.report(out, facts, plan.run_steps(steps, out, facts, time.monotonic() + 5), []))
"""


def test_a_step_that_hangs_silently_is_stopped_and_the_plan_still_reports(tmp_path):
    """A step that prints nothing is stopped at its budget (5 s less the next step's 2),
    with its process group and the process it started in a session of its own; the next
    step runs, plan.md is written and what the hung step left is packed, its weights
    aside."""
    import tarfile
    import time
    import uuid

    from tests.support.runs import processes_with

    marker = f"PRUNEX_HANG_TEST={uuid.uuid4().hex}"
    (tmp_path / "hang.py").write_text(HANG)
    (tmp_path / "driver.py").write_text(DRIVER.format(tests=str(REPO / "tests")))
    out = tmp_path / "out"
    out.mkdir()
    env = {**ENV, marker.split("=")[0]: marker.split("=")[1], "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), ENV.get("PYTHONPATH")]))}
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(out),
                               str(tmp_path / "hang.py")], env=env, capture_output=True,
                              text=True, timeout=90)
        took = time.monotonic() - started
        assert processes_with(marker) == []  # the sleeping step and its own session's process
    finally:  # where the plan did not stop them, the test does
        for pid in processes_with(marker):
            os.kill(int(pid), signal.SIGKILL)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert took < 30, took
    report = (out / "plan.md").read_text()
    assert "| hang | timed out at 3 s |" in report and "| quick | passed |" in report
    with tarfile.open(out / "rest.tar.gz") as tar:
        packed = set(tar.getnames())
    assert "reference-staging/run/summary.json" in packed
    assert "reference-staging/run/model.pt" not in packed
    log = (out / "plan.log").read_text()
    assert "[stopped after 3 s; 1 process(es) it left were killed]" in log
    assert "ran\n[exit 0]" in log


#: the reference step's recording and checks, on CPU ranks, in a process of its own
CHECKED = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_gpu_tools import load_plan

plan = load_plan()
out = Path(sys.argv[1])
code, findings = plan.recorded_and_checked(out / plan.STAGING, out / plan.TWIN,
                                           out / "plan.log", time.monotonic() + 500,
                                           ("ddp", "prunex"))
print(json.dumps([code, findings]))
"""


@pytest.mark.slow
@pytest.mark.integration  # four nightly runs on CPU ranks: a minute or two
def test_the_reference_steps_checks_pass_on_runs_that_repeat_themselves(tmp_path):
    """The reference step's sweep, its bytes check and its twins, on CPU ranks (whose
    kernels repeat, and whose bytes are the portable class's): no finding; the runs and the
    twins are recorded where the step puts them, under the returned folder."""
    if not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("needs Debian's dataset-fashion-mnist (the nightly's data)")
    (tmp_path / "driver.py").write_text(CHECKED.format(tests=str(REPO / "tests")))
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in ENV.items() if k not in ("NIGHTLY_DEVICE", "NIGHTLY_EPOCHS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), ENV.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [0, []]
    for folder in ("reference-staging", "reference-twin"):
        assert sorted(p.name.split("-cnn")[0] for p in (out / folder).glob("*-cnn-*")) == [
            "ddp", "prunex"]
