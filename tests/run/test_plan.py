"""One frozen plan per run (issue 43): resolved once, read by preflight, the dry run, every
launcher, the ranks and the simulator, with one run id; nothing completes the configuration
in place afterwards."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import suite.commands.execute as execute
import suite.commands.simulate as simulate
from suite.config import RunConfig
from suite.errors import BenchError
from suite.launchers.local import local_config
from suite.launchers.slurm import SlurmRequest, slurm_config, submission
from suite.plugins.method import Method
from suite.run.build import steps_per_iteration
from suite.run.plan import RunPlan, Schedule, plan_run
from tests.support.runs import ENV, REPO, TINY, bench, bench_here

SMALL_RUN = ["--gpus", "2", "--gpus-per-node", "1", "--iterations", "2", *TINY]


def small_plan(**changes) -> RunPlan:
    config = RunConfig(method="ddp", workload="cnn-fmnist", dataset="synthetic",
                       synthetic_size=(256, 64), batch_size=16, gpus=2, iterations=2)
    return plan_run(local_config(dataclasses.replace(config, **changes)))


def test_a_resolved_configuration_is_frozen():
    plan = small_plan()
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.config.gpus = 8
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.schedule = None
    assert plan.config.run_id and plan.config.launcher == "local"
    assert (plan.config.gpus_per_node, plan.config.device) == (1, "cpu")
    again = plan.restarted(resume=True)
    assert again.config.resume and not plan.config.resume and again.digest == plan.digest
    with pytest.raises(ValueError, match="resolved anew"):
        plan.restarted(workload="resnet18-cifar10")


def config_assignments(root: Path) -> list[str]:
    """``x.config.f = ...``, ``config.f += ...``, ``setattr(config, ...)`` in ``root``'s
    modules, for every field ``f`` of RunConfig."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if (isinstance(leaf, ast.Attribute) and leaf.attr in fields
                            and ast.unparse(leaf.value).split(".")[-1] in ("config", "cfg")):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}")
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "setattr" and "config" in ast.unparse(node.args[0])):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    return found


def test_nothing_assigns_a_field_of_a_run_configuration():
    assert config_assignments(REPO / "suite") == []
    for package in ("methods", "baselines", "workloads"):
        assert config_assignments(REPO / package) == []


@pytest.mark.parametrize("launcher_args, launcher", [
    (["--launcher", "local"], "launch_local"),
    (["--launcher", "local", "--network", "emulated", "--inter-bw", "1gbit"], "launch_emulated"),
    (["--launcher", "torchrun"], "launch_in_job"),
    (["--launcher", "slurm"], "submit_or_print"),
])
def test_one_plan_reaches_preflight_and_the_launcher(monkeypatch, tmp_path, launcher_args,
                                                     launcher):
    seen = []
    monkeypatch.setattr(execute, "validate", lambda plan, **_: seen.append(("preflight", plan)))
    monkeypatch.setattr(execute, launcher,
                        lambda plan, *_, **__: seen.append((launcher, plan)) or tmp_path)
    result = bench_here("run", *SMALL_RUN, *launcher_args, "--results-dir", tmp_path)
    assert result.exit_code == 0, result.output
    (_, planned), (who, launched) = seen
    assert who == launcher and launched is planned  # the very object preflight checked
    assert isinstance(planned, RunPlan) and planned.config.run_id


def test_one_plan_reaches_preflight_and_the_simulator(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(simulate, "validate", lambda plan, **_: seen.append(plan))

    def simulated(plan, *_, **__):
        seen.append(plan)
        raise SystemExit(0)  # what it would write is not this test's business

    monkeypatch.setattr(simulate, "simulate_run", simulated)
    result = bench_here("run", "--launcher", "sim", "--gpus", "8", "--dataset", "synthetic",
                        "--results-dir", tmp_path)
    assert result.exit_code == 0, result.output
    assert len(seen) == 2 and seen[0] is seen[1] and seen[0].run_id.startswith("sim-")
    assert (seen[0].config.gpus_per_node, seen[0].config.launcher) == (4, "sim")


def test_slurm_agents_carry_the_plan_whole(tmp_path):
    config = RunConfig(gpus=8, gpus_per_node=4, dataset="synthetic",
                       results_dir=str(tmp_path), run_id="r8")
    plan = plan_run(slurm_config(config))
    _, agent = submission(plan, SlurmRequest(), preview=True)
    received = RunPlan.from_json(agent.plan_json)
    assert received.digest == plan.digest and received.run_id == "r8"
    assert received.config == plan.config and received.config.device == "cuda"


def test_a_rank_refuses_a_plan_its_launcher_resolved_otherwise():
    plan = small_plan()
    sent = json.loads(plan.to_json())
    sent["facts"]["samples"] = [60000, 10000]
    with pytest.raises(BenchError, match=r"^this rank resolves the run's samples as \[256, 64\], "
                       r"its launcher as \[60000, 10000\]: install the same plugins and suite "
                       r"on every node$"):
        RunPlan.from_json(json.dumps(sent))


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_the_ranks_and_the_dry_run_have_one_plan_and_one_run_id(tmp_path):
    results = tmp_path / "results"
    args = ["run", "--method", "ddp", *SMALL_RUN, "--results-dir", results, "--run-id", "p"]
    dry = bench(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    digest = next(line.split()[1] for line in dry.stdout.splitlines()
                  if line.startswith("plan "))
    ran = bench(*args)
    assert ran.returncode == 0, ran.stderr
    (folder,) = results.iterdir()
    manifest = json.loads((folder / "manifest.json").read_text())
    summary = json.loads((folder / "summary.json").read_text())
    assert manifest["plan"]["digest"] == digest  # what every rank resolved, checked
    assert folder.name == manifest["run_id"] == manifest["plan"]["run_id"] == summary["run_id"]
    assert manifest["config"]["run_id"] == "p" and manifest["steps_per_iteration"] == 1
    assert not manifest["numerics"]["deterministic_algorithms"]  # only with --deterministic


def test_torchrun_ranks_agree_on_one_run_id(tmp_path):
    """Each rank of a torchrun job resolves its own plan (its own generated id); they run
    under rank 0's."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "-m", "suite.cli", "run", "--launcher", "torchrun", "--method", "ddp",
           "--dataset", "synthetic", "--synthetic-size", "256,64", "--iterations", "2",
           "--batch-size", "16", "--results-dir", str(tmp_path)]
    env = {**ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    (folder,) = tmp_path.iterdir()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert folder.name == manifest["run_id"] == manifest["plan"]["run_id"]
    assert manifest["plan"]["layout"] == {"gpus": 2, "gpus_per_node": 2, "nodes": 1}


def test_the_simulator_replays_the_plan(tmp_path):
    from suite.sim.profile import load_profile
    from suite.sim.replay import simulate_run

    config = RunConfig(method="prunex", dataset="synthetic", launcher="sim", gpus=8,
                       gpus_per_node=4, iterations=3, options={"local_steps": 2},
                       results_dir=str(tmp_path))
    plan = plan_run(config)
    path = simulate_run(plan, load_profile("v100-ib100"), replay=2)
    manifest = json.loads((path / "manifest.json").read_text())
    assert path.name == plan.run_id and plan.run_id.startswith("sim-")
    assert manifest["plan"]["digest"] == plan.digest
    assert manifest["steps_per_iteration"] == plan.schedule.round_steps == 2


class Declares(Method):
    steps_per_iteration = 4


class SetsItself(Method):
    def __init__(self):
        self.steps_per_iteration = 3


def test_a_method_that_declares_its_steps_is_scheduled_by_them():
    rounds = Schedule(steps_per_epoch=10, batch_size=8, round_steps=5, epochs=1.0,
                      iterations=None)
    assert steps_per_iteration(Declares(), rounds, "m") == 4
    assert steps_per_iteration(SetsItself(), rounds, "m") == 3
    assert steps_per_iteration(Method(), rounds, "m") == 5  # RoundSettings' H
    plain = dataclasses.replace(rounds, round_steps=None)
    assert steps_per_iteration(Method(), plain, "m") == 1
    broken = SetsItself()
    broken.steps_per_iteration = 0
    with pytest.raises(BenchError, match="steps_per_iteration must be a whole number"):
        steps_per_iteration(broken, plain, "m")


def test_the_dry_run_prints_the_local_steps_against_the_budget(tmp_path):
    rounds = bench_here("run", "--method", "localsgd-hier", "--local-steps", "3", "--epochs",
                        "2", "--gpus", "4", *TINY, "--dry-run", "--results-dir", tmp_path)
    assert rounds.exit_code == 0, rounds.output
    assert ("schedule    3 iteration(s) of 3 local step(s), the last of 2: 8 local steps per "
            "rank, budget 8 (2 epoch(s) x 4 steps per epoch); seed 0") in rounds.stdout
    steps = bench_here("run", "--method", "ddp", "--iterations", "5", "--gpus", "4", *TINY,
                       "--dry-run", "--results-dir", tmp_path)
    assert ("schedule    5 iteration(s) of 1 local step(s) (1 unless the method declares "
            "steps_per_iteration): 5 local steps per rank, budget 5 (--iterations 5 x 1 = 1.25 "
            "epoch(s) of 4 steps)") in steps.stdout
    assert "3x32x32, 10 classes; 256 train, 64 test samples" in steps.stdout


def test_launchers_fill_in_their_facts_without_touching_the_configuration():
    config = RunConfig(gpus=8, device="auto")
    local = local_config(config)
    assert (local.gpus_per_node, local.launcher) == (4, "local")
    assert config.gpus_per_node is None and config.launcher == "local"
    assert slurm_config(dataclasses.replace(config, gpus_per_node=4)).device == "cuda"
    with pytest.raises(BenchError, match="--launcher slurm needs --gpus-per-node"):
        slurm_config(config)
    assert os.environ.get("WORLD_SIZE") is None  # job_config reads the job's world size


def test_the_launcher_decides_the_input_size_and_its_ranks_take_it():
    """FasterNet-T0 refuses Fashion-MNIST's 28x28: the plan hands it 32x32 images, says so in
    its facts, and a rank takes the size its launcher decided without searching (a rank that
    searched would find 32 and refuse the 48 sent here)."""
    plan = small_plan(workload="timm:fasternet_t0", dataset="fmnist")
    assert plan.spec.image_size == 32 and plan.config.image_size is None
    assert plan.facts()["input_size"] == {"dataset_side": 28, "model_side": 32,
                                          "chosen": "found"}
    assert RunPlan.from_json(plan.to_json()).digest == plan.digest
    sent = json.loads(plan.to_json())
    sent["facts"]["input_size"]["model_side"] = sent["facts"]["spec"]["image_size"] = 48
    received = RunPlan.from_json(json.dumps(sent))
    assert received.spec.image_size == 48 and received.input_size.model_side == 48
    given = small_plan(workload="timm:fasternet_t0", dataset="fmnist", image_size=64)
    assert (given.spec.image_size, given.input_size.chosen) == (64, "given")
    with pytest.raises(BenchError, match=r"^--image-size must be in \[8, 1024\]"):
        small_plan(image_size=4)
