"""Method-owned options: declarations, one validation path, plugins, experiment files,
re-runs, dry runs and exit codes."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd
import pytest

from suite.commands.listing import options_markdown
from suite.errors import BenchError
from suite.plugins.options import FRACTION, option, options_of, resolve_settings
from suite.plugins.registry import WORKLOADS
from suite.run.build import evaluation_points
from tests.support.runs import BENCH, ONE_RANK, TINY, bench, bench_here, one_line, one_line_error

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Example:
    keep: float | None = option(None, "kept fraction", check=FRACTION)
    mode: Literal["a", "b"] = option("a", "a mode")
    steps: int = option(3, "steps")
    on: bool = option(True, "switch", off_flag="no-on")


def test_declarations_give_types_choices_and_flags():
    opts = {o.name: o for o in options_of(Example)}
    assert (opts["keep"].kind, opts["mode"].choices, opts["steps"].kind) == (float, ("a", "b"), int)
    assert opts["on"].declaration == "--on/--no-on" and opts["keep"].flag == "--keep"
    settings = resolve_settings(Example, {"keep": "0.25", "steps": 5.0, "on": "false"}, "ex")
    assert (settings.keep, settings.steps, settings.on, settings.mode) == (0.25, 5, False, "a")


@pytest.mark.parametrize(
    "given, message",
    [
        ({"keep": 1.5}, "--keep must be in (0, 1], got 1.5"),
        ({"keep": "nan"}, "--keep must be finite"),
        ({"mode": "c"}, "--mode must be one of a, b, got 'c'"),
        ({"steps": 2.5}, "--steps takes INT, got 2.5"),
        ({"bogus": 1}, "--bogus is not an option of ex (its options: --keep, --mode"),
    ],
)
def test_bad_values_name_the_flag(given, message):
    with pytest.raises(BenchError) as exc:
        resolve_settings(Example, given, "ex")
    assert message in str(exc.value)


def test_default_evaluations_are_about_ten_and_never_every_iteration():
    assert evaluation_points(100, None) == set(range(10, 101, 10))
    assert evaluation_points(15, None) == {3, 6, 9, 12, 15}
    assert evaluation_points(1, None) == {1}
    assert evaluation_points(7, 3) == {3, 6, 7}
    for n in range(2, 60):
        points = sorted(evaluation_points(n, None))
        assert points[-1] == n and len(points) <= max(1, min(10, n // 3))
        assert all(b - a >= 3 for a, b in zip(points, points[1:])) or n < 6


def docs_tables():
    """tools/docs_tables.py, which writes the docs' tables from the registry."""
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "tools" / "docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_tables_match_the_registry():
    """Every option (docs/options.md), every method and workload --method and --workload
    take (docs/commands/run.md) and every built-in workload (docs/index.md) are the
    registry's own (installed plugins are not documented)."""
    module = docs_tables()
    for (page, marker), generated in module.tables().items():
        found = module.section((REPO / page).read_text(), marker)
        assert found, f"{page} lacks its generated {marker} table"
        assert found.group(1) == generated, f"{page}: regenerate with python tools/docs_tables.py"
    assert generated.count("\n| `") == len(WORKLOADS.builtin_entries()) >= 14
    assert options_markdown(builtin_only=True) in (REPO / "docs" / "options.md").read_text()


def install_plugin(tmp_path: Path) -> dict:
    """The example method as a real installed distribution (dist-info + entry point)."""
    shutil.copy(REPO / "tests" / "plugin_example" / "benchplugin.py", tmp_path)
    dist_info = tmp_path / "benchplugin-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: benchplugin\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(
        "[prunex_bench.methods]\nscaled-sgd = benchplugin\n"
    )
    return {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}", "PRUNEX_PROGRESS": "0"}


def bench_env(env, *args):
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.integration  # a plugin installed and run by five commands: nox -s integration
def test_plugin_method_brings_its_own_option(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    env = install_plugin(site)
    listed = bench_env(env, "list", "scaled-sgd")
    assert listed.returncode == 0, listed.stderr
    assert "--grad-scale" in listed.stdout and "--bucket-cap-mb" not in listed.stdout

    bad = bench_env(env, "run", "--method", "scaled-sgd", "--grad-scale", "-1", *TINY)
    assert one_line_error(bad) == "Error: --grad-scale must be positive, got -1.0"
    assert bad.returncode == 2

    results = tmp_path / "results"
    ran = bench_env(env, "run", "--method", "scaled-sgd", "--grad-scale", "0.5", *TINY,
                    *ONE_RANK, "--iterations", "1", "--results-dir", str(results))
    assert ran.returncode == 0, ran.stderr
    (run,) = results.iterdir()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["options"] == {"grad_scale": 0.5}
    assert manifest["method_settings"] == {"grad_scale": 0.5}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["phase_seconds"]["grad_scale"] > 0  # the plugin's own declared phase

    report = bench_env(env, "report", str(results), "-o", str(tmp_path / "report"))
    assert report.returncode == 0, report.stderr
    table = (tmp_path / "report" / "table.md").read_text()
    assert "Scaled SGD" in table  # the label it declared at registration

    sweep = bench_env(env, "sweep", "--method", "scaled-sgd,ddp", "--grad-scale", "0.5,2",
                      *TINY, *ONE_RANK, "--iterations", "1", "--dry-run")
    assert sweep.returncode == 0, sweep.stderr
    cells = sweep.stdout.splitlines()
    assert len(cells) == 3  # two scaled-sgd cells, one ddp cell: ddp does not read it
    assert sum("'grad_scale': 0.5" in c for c in cells) == 1
    assert sum(c.startswith("ddp-") and c.endswith("{}") for c in cells) == 1
    bad_sweep = bench_env(env, "sweep", "--method", "scaled-sgd", "--grad-scale", "1,x", *TINY,
                          "--dry-run")
    assert one_line_error(bad_sweep) == "Error: --grad-scale takes FLOAT, got 'x'"


@pytest.mark.integration  # a real run and its replay: nox -s integration
def test_sim_honours_fixed_rho(tmp_path):
    """`bench sim --fixed-rho` used to simulate adaptive rho (falsy options were dropped)."""
    rhos = {}
    for flag in ("--fixed-rho", "--adaptive-rho"):
        out = tmp_path / flag.strip("-")
        proc = bench("sim", "--method", "prunex", "--workload", "cnn-fmnist", "--gpus", "4",
                     "--profile", "cpu-2x2-1gbit", "--iterations", "4", "--replay", "4",
                     "--local-steps", "2", "--freeze-share", "1", flag, "--results-dir",
                     str(out))  # no freeze by share: rho adapts over rounds, not one
        assert proc.returncode == 0, proc.stderr
        (run,) = out.iterdir()
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["method_settings"]["adaptive_rho"] is (flag == "--adaptive-rho")
        layers = pd.read_parquet(run / "layers.parquet")
        rhos[flag] = layers.groupby("iteration")["rho1"].mean().tolist()
    assert len(set(rhos["--fixed-rho"])) == 1
    assert len(set(rhos["--adaptive-rho"])) > 1


@pytest.mark.integration  # three real runs: nox -s integration
def test_config_file_flags_override_and_rerun_reproduces(tmp_path):
    config = tmp_path / "f.yaml"
    config.write_text(
        "method: topk\ndataset: synthetic\nsynthetic-size: [256, 64]\nbatch_size: 16\n"
        "gpus: 1\ngpus-per-node: 1\niterations: 1\nlr: 0.01\noptions:\n  topk-ratio: 0.1\n"
    )
    results = tmp_path / "results"
    proc = bench("run", "--config", str(config), "--lr", "0.1", "--results-dir", str(results))
    assert proc.returncode == 0, proc.stderr
    (first,) = results.iterdir()
    recorded = json.loads((first / "manifest.json").read_text())["config"]
    assert recorded["lr"] == 0.1 and recorded["batch_size"] == 16  # flag over file
    assert recorded["options"] == {"topk_ratio": 0.1} and recorded["method"] == "topk"

    again = bench("rerun", str(first))
    assert again.returncode == 0, again.stderr
    second = next(p for p in results.iterdir() if p != first)
    assert re.fullmatch(r"\d{8}-\d{6}-topk-cnn-fmnist-1g-[0-9a-f]{4}", second.name)
    rerun = json.loads((second / "manifest.json").read_text())["config"]
    assert {**rerun, "run_id": None} == {**recorded, "run_id": None}

    # the manifest is an experiment file itself; bad keys and values are one line
    dry = bench_here("run", "--config", str(first / "manifest.json"), "--dry-run")
    assert dry.exit_code == 0 and "topk_ratio=0.1" in dry.stdout, dry.stderr
    config.write_text("method: ddp\ndeterministic: true\n")  # a run flag, not an option
    dry = bench_here("run", "--config", str(config), "--dry-run")
    assert dry.exit_code == 0 and "(deterministic kernels)" in dry.stdout, dry.stderr
    config.write_text("method: topk\nlrr: 0.1\n")
    assert "unknown key 'lrr'" in one_line(bench_here("run", "--config", str(config)))
    config.write_text("method: topk\ntopk-ratio: 3\n")
    line = one_line(bench_here("run", "--config", str(config)))
    assert line.endswith("--topk-ratio must be in (0, 1], got 3.0")
    config.write_text("method: prunex\nfixed-rho: [true, false]\n")
    assert "fixed_rho takes one value" in one_line(bench_here("run", "--config", str(config)))


@pytest.mark.parametrize(
    "launcher_args, expected",
    [
        (["--launcher", "local"], "run folder"),
        (["--launcher", "torchrun"], "launcher torchrun"),
        (["--launcher", "slurm", "--gpus", "8", "--gpus-per-node", "4"], "#SBATCH --nodes=2"),
        (["--launcher", "sim", "--gpus", "8,16"], "16 GPUs on v100-ib100"),
    ],
)
def test_dry_run_starts_nothing(tmp_path, launcher_args, expected):
    result = bench_here("run", *TINY, *launcher_args, "--dry-run", "--results-dir", str(tmp_path))
    assert result.exit_code == 0, result.stderr
    assert expected in result.stdout
    assert not list(tmp_path.iterdir())


def test_flags_of_another_launcher_are_refused(tmp_path):
    result = bench_here("run", "--slurm-partition", "gpu", "--results-dir", str(tmp_path))
    assert one_line(result) == "Error: --slurm-partition only applies to --launcher slurm, not auto"
    assert result.exit_code == 2
    result = bench_here("run", "--launcher", "slurm", "--profile", "v100-ib100")
    assert one_line(result) == "Error: --profile only applies to --launcher sim, not slurm"


@pytest.mark.parametrize("run_id", ["../escaped-run", "a/b", ".hidden", ""])
def test_run_id_is_one_safe_folder_name(tmp_path, run_id):
    result = bench_here("run", *TINY, "--run-id", run_id, "--results-dir", str(tmp_path / "r"))
    assert "must be one folder name" in one_line(result) and result.exit_code == 2
    assert not (tmp_path / "escaped-run").exists() and not (tmp_path / "r").exists()


def test_help_shows_the_workloads_true_recipe():
    out = bench_here("run", "--help").stdout
    flat = "".join(out.split())  # click wraps at any width, and at hyphens inside names
    assert "0.05(cnn-fmnist,convmixer-fmnist," in flat and "resnet18-fmnist);0.001(" in flat
    assert "0.001(mobilenet-cifar10,resnet152-cifar10" in flat and "0.01(vit-fmnist)" in flat
    assert "32(cnn-fmnist,convmixer-fmnist," in flat and "resnet18-fmnist,vit-fmnist)" in flat


def test_every_flag_of_run_sweep_and_sim_is_reserved_from_method_options():
    """Registration refuses an option named like a flag of these commands; the list it reads
    (suite.config.reserved_flags) must hold every flag they take, or a plugin could shadow one."""
    import click

    from suite.cli import main
    from suite.config import reserved_flags
    from suite.plugins.registry import METHODS

    options = set(METHODS.option_catalogue())
    ctx = click.Context(main)
    for name in ("run", "sweep", "sim"):
        command = main.get_command(ctx, name)
        params = command.get_params(click.Context(command, parent=ctx))
        own = {p.name for p in params if not p.name.startswith("_click")}  # click's --help aside
        assert own - options - reserved_flags() == set(), name


def test_deterministic_kernels_make_another_sweep_cell():
    """A cell run with --deterministic is another configuration (the nightly's cells, run
    without it, kept their ids: the re-recorded portable reference has the same folder names)."""
    from dataclasses import replace

    from suite.commands.sweep import cell_id
    from suite.config import RunConfig

    plain = RunConfig(method="ddp", workload="cnn-fmnist", gpus=4, epochs=0.1)
    assert cell_id(replace(plain, deterministic=True)) != cell_id(plain)
