"""The measurement scripts under ``benchmarks/``: they talk to the project only through
``suite.api`` or the ``bench`` CLI, and each one runs here once on its smallest real
configuration (``--smoke``: synthetic data, 1-2 ranks, 1-4 iterations), so none rots. The
smoke runs cost minutes of CPU (about 27 ``bench`` processes), so they carry the
``benchmarks`` marker that the fast suite (``nox -s tests``) leaves out; ``nox -s benchmarks``
runs them, and CI runs both sessions.

A smoke run is one subprocess of a few ``bench`` processes, each of which pays the start of
an interpreter, torch and the plugins; so the runs the session selected start together when
the first of them is asked for (``PRUNEX_SMOKE_WORKERS`` at a time, 3 by default), and each
test waits for its own. ``capacity_control.py`` repeats the PruneX run of
``fair_comparison.py``'s smoke run, as it repeats that script's runs in a measurement, and
``runs.py`` tabulates that script's runs."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.py"))
SHELL_SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("*.sh"))
#: the project's packages a script must not import (``suite`` only as ``suite.api``)
PLUGIN_PACKAGES = ("methods", "baselines", "workloads", "tests")
ENV = {**os.environ, "PRUNEX_PROGRESS": "0"}
ROOT_AND_IPROUTE = os.geteuid() == 0 and shutil.which("ip") and shutil.which("tc")
WORKERS = int(os.environ.get("PRUNEX_SMOKE_WORKERS", "3"))
TIMEOUT = 600


# -- what the scripts import -------------------------------------------------------------------
def forbidden(module: str) -> bool:
    top = module.split(".")[0]
    return (top == "suite" and module != "suite.api") or top in PLUGIN_PACKAGES


def import_violations(source: str, name: str) -> list[str]:
    """Every import (function-local ones and ``importlib.import_module("...")`` included) of
    the project other than ``suite.api``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        modules = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "suite":  # ``from suite import api`` is suite.api
                modules = [f"suite.{alias.name}" for alias in node.names]
            else:
                modules = [node.module]
        elif isinstance(node, ast.Call) and node.args:
            func = ast.unparse(node.func)
            first = node.args[0]
            dynamic = func.endswith("import_module") or func == "__import__"
            if dynamic and isinstance(first, ast.Constant) and isinstance(first.value, str):
                modules = [first.value]
        found += [f"{name}:{node.lineno} imports {m}" for m in modules if forbidden(m)]
    return found


def embedded_python(shell: str) -> list[str]:
    """The Python programs a shell script feeds to ``python - <<'PY'``."""
    return re.findall(r"<<'?PY'?\n(.*?)\nPY\n", shell, re.S)


@pytest.mark.parametrize("script", SCRIPTS + SHELL_SCRIPTS)
def test_benchmarks_import_only_the_plugin_api(script):
    text = (BENCHMARKS / script).read_text()
    sources = embedded_python(text) if script.endswith(".sh") else [text]
    assert [v for source in sources for v in import_violations(source, script)] == []


def test_the_import_check_sees_what_it_forbids():
    bad = (
        "import suite.cli\n"
        "from suite.report.tables import mean_pm\n"
        "from suite import config\n"
        "from workloads.models import small_cnn\n"
        "def f():\n"
        "    from suite.run.checkpoint import save_checkpoint\n"
        "    import methods.prunex\n"
        "    importlib.import_module('baselines.topk')\n"
        "from suite.api import mean_ci\n"
        "from suite import api\n"
        "import torch.distributed\n"
    )
    assert [v.split(" imports ")[1] for v in import_violations(bad, "bad.py")] == [
        "suite.cli", "suite.report.tables", "suite.config", "workloads.models",
        "suite.run.checkpoint", "methods.prunex", "baselines.topk",
    ]
    shell = "bench run\npython3 - x <<'PY'\nfrom suite.results import stats\nPY\necho\n"
    assert import_violations(embedded_python(shell)[0], "x.sh") == ["x.sh:1 imports suite.results"]


# -- the smoke runs --------------------------------------------------------------------------
@dataclass
class Smoke:
    """How a script's smoke run is started (``args(folder, dependencies' folders)``) and what
    it must show (``check(stdout, folder)``)."""

    args: Callable[[Path, dict[str, Path]], list[str]]
    check: Callable[[str, Path], None]
    needs: tuple[str, ...] = ()
    env: dict = field(default_factory=dict)
    skip: str | None = None  # why it cannot run here


@dataclass
class Finished:
    code: int
    stdout: str
    stderr: str
    folder: Path
    seconds: float


def markdown_header(stdout: str, *columns: str) -> None:
    headers = [line for line in stdout.splitlines() if line.startswith("|") and columns[0] in line]
    assert headers, stdout
    assert all(column in headers[0] for column in columns), headers[0]


def check_capacity(out: str, folder: Path) -> None:
    markdown_header(out, "arm", "seeds", "final accuracy %", "density")
    for arm in ("prunex (z)", "masks-from", "all-ones"):
        assert f"| {arm} " in out, out
    assert "--synthetic-size 256,64" in (folder / "capacity_control.md").read_text()


def check_checkpoints(out: str, folder: Path) -> None:
    result = json.loads((folder / "checkpoint_cost.json").read_text())
    state = result["resnet152_64_ranks"]
    assert state["model"] == "cnn-fmnist" and state["seconds_one_rank"] > 0
    assert state["MB_rank_own"] > 0 and state["MB_node_shared"] > 0 and state["MB_world_shared"] > 0
    (row,) = result["cnn_fmnist_2x2"]
    assert row["method"] == "prunex" and row["checkpoints"] == 1 and row["MB_on_disk"] > 0


def check_emulated(out: str, folder: Path) -> None:
    assert "2 nodes x 1 ranks, links shaped to 200mbit" in out, out
    markdown_header(out, "method", "inter_ms_per_iteration", "inter_MB_per_step")
    table = (folder / "emulated_comm.csv").read_text().splitlines()
    assert len(table) == 2 and table[1].startswith("prunex,")


def check_fair(out: str, folder: Path) -> None:
    markdown_header(out, "method", "lr (best of sweep)", "final accuracy %", "inter-node MB/epoch")
    assert "| prunex " in (folder / "fair_comparison.md").read_text()
    assert list((folder / "best").iterdir()) and list((folder / "report").glob("*.png"))


def check_families(out: str, folder: Path) -> None:
    markdown_header(out, "arm", "seeds", "final accuracy %", "inter-node MB/epoch")
    text = (folder / "families.md").read_text()
    assert "### cnn-fmnist" in text
    assert "| prunex keep 1.0 " in text and "| gmp-hier keep 0.5 " in text
    assert "- prunex keep 1.0 - localsgd-hier: " in text


def check_frontier(out: str, folder: Path) -> None:
    markdown_header(out, "arm", "keep", "final accuracy %", "inter-node MB/epoch")
    assert "| prunex (sgd) " in (folder / "frontier.md").read_text()
    assert list((folder / "report").glob("fig12_pareto.*"))


def check_gpu_steps(out: str, folder: Path) -> None:
    assert "PruneX overhead ratio over localsgd-hier" in out, out
    assert (folder / "gpu_steps.md").read_text().startswith("# Every method on")


def check_tax(out: str, folder: Path) -> None:
    assert "| bare torch DDP | 0 |" in out and "| bench run --method ddp | 0 |" in out, out
    assert "instrumentation tax ratio" in (folder / "tax.md").read_text()


def check_live_weights(out: str, folder: Path) -> None:
    markdown_header(out, "model", "keep", "before (dense-masks)", "after (live)", "live limit")
    assert re.search(r"\| resnet18 +\| channel 0.5 +\|", (folder / "table.md").read_text())


def check_zoo(out: str, folder: Path) -> None:
    assert re.search(r"^torchvision:resnet18: ok ", out, re.M), out
    assert re.search(r"^timm:mixnet_s: ok ", out, re.M), out  # split at stored sizes
    assert "- timm: 1 models: 1 ok, 0 refused, 0 crash, 0 hang" in out, out


def check_inspect_timing(out: str, folder: Path) -> None:
    assert re.search(r"^timm:resnet10t: ok at 28 px, wall [0-9.]+ s, CPU [0-9.]+ s, load ", out,
                     re.M), out
    assert re.search(r"^\| timm:resnet10t \| 4\.9 \| 28 \(dataset\) \| ok \| 1 \| [0-9.]+ \| ", out,
                     re.M), out


def check_overhead(out: str, folder: Path) -> None:
    assert re.search(r"\*\*steady ratio: [0-9.]+ \(median [0-9.]+\); training time ratio, "
                     r"one-offs included: [0-9.]+ \(median [0-9.]+\)\*\*", out), out
    table = (folder / "overhead.md").read_text()
    assert "prunex s/step (work)" in table and "freeze " in table  # the one-offs apart


def check_recipe(out: str, folder: Path) -> None:
    batch, lr, steps, accuracy, seconds = out.split()
    assert (batch, lr, steps) == ("32", "0.05", "3")
    assert 0 <= float(accuracy) <= 1 and float(seconds) > 0


def check_resume(out: str, folder: Path) -> None:
    row = json.loads(out.strip().splitlines()[-1])
    assert row["method"] == "prunex" and row["stopped_status"] == "interrupted"
    assert row["resumed_at"] == 2
    assert row["bitwise"] and row["losses_equal"], row  # on CPU ranks, as documented


def check_report_scale(out: str, folder: Path) -> None:
    markdown_header(out, "runs", "command", "wall (s)", "peak memory (MB)", "exit", "load")
    for runs in ("12", "24"):
        for command in ("report", "compare", "trend"):
            assert re.search(rf"^\| {runs} \| `bench {command}` \| [0-9.]+ \| [0-9]+ \| 0 \|",
                             out, re.M), out
    assert "Growth of the wall time from 12 to 24 runs" in out
    assert (folder / "report_scale.md").read_text() + "\n" == out
    assert not (folder / "runs").exists()  # the copies are deleted


def check_runs(out: str, folder: Path) -> None:
    markdown_header(out, "method", "seed", "lr", "accuracy", "inter_MB_per_epoch")
    assert "| prunex " in out, out  # fair_comparison.py's run (and its copy in best/: once)


def check_validation(out: str, folder: Path) -> None:
    text = (folder / "validation.md").read_text()
    assert "## Time per iteration" in text and "| 2x1 " in text
    assert '"cells_within_15%"' in out, out


def check_scaling(out: str, folder: Path) -> None:
    markdown_header(out, "method", "paper, 8 -> 64", "`v100-ib100`, 8 -> 16",
                    "`v100-paper-fig7`, 8 -> 16")
    assert re.search(r"^\| prunex \| 6\.75x \(84\.4 %\) \| [0-9.]+x \(", out, re.M), out
    for profile in ("v100-ib100", "v100-paper-fig7"):
        for method in ("prunex", "ddp", "topk"):
            assert re.search(rf"^\| `{profile}` \| {method} \| [0-9.]+ = ", out, re.M), out
    assert (folder / "paper_scaling.md").read_text() == out


def cuda_session() -> bool:
    """A GPU session (``nox -s gpu``) on a machine with CUDA: only then are devices visible."""
    if os.environ.get("PRUNEX_GPU_TESTS") != "1":
        return False
    import torch  # only a GPU session asks

    return torch.cuda.is_available()


def check_rank_memory(out: str, folder: Path) -> None:
    markdown_header(out, "ranks", "peak ranks' PSS GiB", "PSS per rank MiB (at peak)")
    (row,) = json.loads((folder / "memory.json").read_text())
    assert row["status"] == "ok" and row["samples"] > 0 and row["rank_pss_mib_at_peak"] > 10


def check_orchestration(out: str, folder: Path) -> None:
    markdown_header(out, "ranks", "to first iteration s", "store ops per rank per s")
    text = (folder / "orchestration.md").read_text()
    assert "| 2 | 2 | ok |" in text and "no row grows faster than linearly" in text


def check_rank_kill(out: str, folder: Path) -> None:
    assert re.search(r"\| 2 \| rank 1 \(pid \d+\) \| [\d.]+ \| failed \| True \| 0 \|", out), out


NEEDS_ROOT = None if ROOT_AND_IPROUTE else "emulated nodes need root and iproute2"
SMOKES: dict[str, Smoke] = {
    "capacity_control.py": Smoke(
        lambda d, deps: ["--smoke", "--prunex-runs", str(deps["fair_comparison.py"] / "best"),
                         "--results-dir", str(d)],
        check_capacity, needs=("fair_comparison.py",)),
    "checkpoint_cost.py": Smoke(lambda d, _: ["--smoke", "--out", str(d)], check_checkpoints),
    "emulated_comm.py": Smoke(lambda d, _: ["--smoke", "--out", str(d)], check_emulated,
                              skip=NEEDS_ROOT),
    "fair_comparison.py": Smoke(lambda d, _: ["--smoke", "--results-dir", str(d)], check_fair),
    "families.py": Smoke(lambda d, _: ["--smoke", "--results-dir", str(d)], check_families),
    "frontier.py": Smoke(lambda d, _: ["--smoke", "--results-dir", str(d)], check_frontier),
    "gpu_steps.py": Smoke(lambda d, _: ["--smoke", "-o", str(d / "gpu_steps.md")],
                          check_gpu_steps, skip=None),  # decided when asked: see smoke_skip
    "instrumentation_tax.py": Smoke(lambda d, _: ["--smoke", "-o", str(d / "tax.md")], check_tax),
    "live_weights.py": Smoke(lambda d, _: ["--smoke", "-o", str(d)], check_live_weights),
    "model_zoo.py": Smoke(lambda d, _: ["--smoke"], check_zoo),
    "inspect_timing.py": Smoke(lambda d, _: ["--smoke"], check_inspect_timing),
    "prunex_overhead.py": Smoke(lambda d, _: ["--smoke", "-o", str(d / "overhead.md")],
                                check_overhead),
    "recipe_check.py": Smoke(lambda d, _: ["--smoke"], check_recipe),
    "report_scale.py": Smoke(lambda d, _: ["--smoke", "--work", str(d)], check_report_scale),
    "resume_equality.py": Smoke(lambda d, _: ["--smoke"], check_resume),
    "runs.py": Smoke(lambda d, deps: ["--smoke", str(deps["fair_comparison.py"])], check_runs,
                     needs=("fair_comparison.py",)),
    "validate_sim.py": Smoke(lambda d, _: ["--smoke", "--out", str(d)], check_validation,
                             skip=NEEDS_ROOT),
    "paper_scaling.py": Smoke(lambda d, _: ["--smoke", "--out", str(d)], check_scaling),
    "rank_memory.py": Smoke(lambda d, _: ["--smoke", "--json", str(d / "memory.json")],
                            check_rank_memory),
    "orchestration.py": Smoke(lambda d, _: ["--smoke", "--out", str(d / "orchestration.md")],
                              check_orchestration),
    "rank_kill.py": Smoke(lambda d, _: ["--smoke"], check_rank_kill),
}
#: longest first, so the slowest chains start at once
ORDER = ["validate_sim.py", "checkpoint_cost.py", "fair_comparison.py", "resume_equality.py",
         "capacity_control.py", "live_weights.py", "model_zoo.py",
         "prunex_overhead.py", "frontier.py",
         "families.py", "report_scale.py", "instrumentation_tax.py", "emulated_comm.py",
         "paper_scaling.py", "runs.py", "gpu_steps.py", "recipe_check.py", "rank_memory.py",
         "orchestration.py", "rank_kill.py", "inspect_timing.py"]


def smoke_skip(name: str) -> str | None:
    if name == "gpu_steps.py" and not cuda_session():
        return "needs CUDA (a GPU session: nox -s gpu); its options are checked without"
    return SMOKES[name].skip


def run_smoke(name: str, root: Path, started: dict[str, Future]) -> Finished:
    smoke = SMOKES[name]
    deps = {dep: started[dep].result().folder for dep in smoke.needs}
    for dep in smoke.needs:
        finished = started[dep].result()
        assert finished.code == 0, f"{dep} failed, so {name} cannot run"
    folder = root / Path(name).stem
    folder.mkdir()
    script = str(BENCHMARKS / name)
    command = ["bash", script] if name.endswith(".sh") else [sys.executable, script]
    begin = time.perf_counter()
    env = {**ENV, **smoke.env}
    proc = subprocess.run([*command, *smoke.args(folder, deps)], cwd=REPO, text=True,
                          capture_output=True, timeout=TIMEOUT, env=env)
    return Finished(proc.returncode, proc.stdout, proc.stderr, folder, time.perf_counter() - begin)


@pytest.fixture(scope="session")
def smoke_runs(request, tmp_path_factory):
    """The selected scripts' smoke runs (and what they need), started together."""
    selected = {item.callspec.params["script"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_smoke"}
    root = tmp_path_factory.mktemp("benchmarks")
    started: dict[str, Future] = {}
    pool = ThreadPoolExecutor(max_workers=WORKERS)

    def start(name: str) -> None:
        if name in started or smoke_skip(name):
            return
        for dep in SMOKES[name].needs:
            start(dep)
        started[name] = pool.submit(run_smoke, name, root, started)

    for name in sorted(selected, key=ORDER.index):
        start(name)
    yield started
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.benchmarks  # minutes of CPU: `nox -s benchmarks` (and CI), not `nox -s tests`
@pytest.mark.parametrize("script", ORDER)
def test_smoke(script, smoke_runs):
    why = smoke_skip(script)
    if why:
        pytest.skip(why)
    run = smoke_runs[script].result()
    assert run.code == 0, f"{script} --smoke exited {run.code}:\n{run.stderr[-3000:]}"
    SMOKES[script].check(run.stdout, run.folder)


def test_every_script_has_a_smoke_run():
    assert sorted(SMOKES) == sorted(ORDER) == sorted(SCRIPTS)


def test_gpu_steps_parses_its_options_without_cuda():
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_steps.py"), "--help"], cwd=REPO,
                          text=True, capture_output=True, env=ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--smoke" in proc.stdout and "--layout {nccl,shared,both}" in proc.stdout


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shell_scripts_parse(script):
    proc = subprocess.run(["bash", "-n", str(BENCHMARKS / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_paper_fig7_profile_is_shipped():
    from suite.sim.profile import load_profile, shipped_profiles

    assert "v100-paper-fig7" in shipped_profiles()
    profile = load_profile("v100-paper-fig7")
    assert profile.name == "v100-paper-fig7"
    assert profile.inter.bandwidth < load_profile("v100-ib100").inter.bandwidth


# -- the bare DDP loop of instrumentation_tax.py draws a run's data and batches -------------
def load_script(name: str):
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import their neighbour runs.py
    try:
        spec = importlib.util.spec_from_file_location(Path(name).stem, BENCHMARKS / name)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_the_bare_loop_draws_the_batches_of_a_run():
    """instrumentation_tax.py writes out the suite's synthetic data and sharded batches (it
    may not import them): the same tensors as suite/data/, over an epoch boundary, with and
    without crop and flip."""
    import torch

    from suite.data.datasets import load_data
    from suite.data.sharding import ShardedLoader
    from suite.data.workload import TensorData

    tax = load_script("instrumentation_tax.py")
    train, _, spec = load_data("synthetic", seed=3, synthetic_size=(100, 10))
    ours = tax.synthetic(tax.SYNTHETIC, 3, (100, 10))
    assert torch.equal(ours.images, train.images) and torch.equal(ours.labels, train.labels)
    for augment in (False, True):
        data = TensorData(train.images, train.labels, augment=augment)
        for rank in (0, 2):
            suite_batches = ShardedLoader(data, rank, 3, 8, seed=5)
            bare_batches = tax.shard_batches(data, rank, 3, 8, 5)
            for _ in range(9):  # 4 batches per epoch of a 33-sample shard: over two epochs
                (x, y), (bx, by) = next(suite_batches), next(bare_batches)
                assert torch.equal(x, bx) and torch.equal(y, by)
