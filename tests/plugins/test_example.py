"""The example plugin the docs show whole (docs/plugins.md includes tests/plugin_example/*.py):
installed as a real distribution with entry points, it is listed, and its method runs on its
own workload and dataset as written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support.runs import ENV, REPO, bench

EXAMPLE = REPO / "tests" / "plugin_example"


def install_example(site: Path) -> dict:
    for module in ("benchplugin.py", "benchworkload.py"):
        shutil.copy(EXAMPLE / module, site)
    dist_info = site / "benchexample-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: benchexample\nVersion: 0.1\n")
    (dist_info / "entry_points.txt").write_text(
        "[prunex_bench.methods]\nscaled-sgd = benchplugin\n\n"
        "[prunex_bench.workloads]\nstripes = benchworkload\n"
    )
    return {**ENV, "PYTHONPATH": f"{site}{os.pathsep}{REPO}"}


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_the_documented_example_plugin_runs_as_written(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    env = install_example(site)
    listed = bench("list", env=env)
    assert listed.returncode == 0 and not listed.stderr.strip(), listed.stderr
    assert "scaled-sgd" in listed.stdout and "mlp-stripes" in listed.stdout

    results = tmp_path / "results"
    ran = bench("run", "--method", "scaled-sgd", "--workload", "mlp-stripes", "--gpus", "2",
                "--gpus-per-node", "1", "--iterations", "3", "--results-dir", results,
                env=env)
    assert ran.returncode == 0, ran.stderr
    (run,) = results.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["dataset"] == "stripes"
    assert summary["inter_node_bytes_per_iteration"] > 0
    compared = bench("compare", results, results, "--metric", "accuracy,bytes", "--wide",
                     env=env)
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "scaled-sgd did its job" in compared.stdout
    report = tmp_path / "report"
    reported = bench("report", results, "-o", report, env=env)
    assert reported.returncode == 0, reported.stderr
    page = (report / "report.md").read_text()
    assert "## Scaled SGD: training loss per iteration" in page  # the plugin's own figure
    assert (report / "scaled_sgd_loss.png").is_file()
    table = (report / "scaled_sgd_loss.csv").read_text().splitlines()
    assert table[0] == "run_id,iteration,loss" and len(table) == 1 + 3  # the mean over ranks
