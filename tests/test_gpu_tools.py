"""tools/gpu: the list of wheels prepare carries to the GPU machine covers everything the
code imports that the GPU image lacks, and part 0 (the smoke) runs where there is no GPU."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import platform
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
             "noxfile.py")
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
def test_the_plan_without_cuda_prints_itself_and_exits_2_in_one_line():
    proc = subprocess.run([sys.executable, "tools/gpu/plan", "--time-left", "300"], cwd=REPO,
                          env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "needs a CUDA device" in proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "plan for 300 s of device time:"
    assert [line.split()[0] for line in lines[1:]] == ["resume", "part3", "part4", "reference"]
    assert "next call" in lines[3] and "next call" not in lines[2]  # 120 + 150 s fit in 300


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
    steps, left = plan.chosen(["reference", "resume"], 1000)
    assert [s.name for s in steps] == ["resume", "reference"] and not left


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
