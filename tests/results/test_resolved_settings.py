"""A run's identity is its method's resolved settings: a default spelled out on the command
line or left out is the same configuration for `compare`, `report` and sweeps (real runs)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from tests.support.runs import TINY, bench

TWO_NODES = ["--workload", "cnn-fmnist", "--gpus", "2", "--gpus-per-node", "1",
             "--iterations", "2", "--eval-every", "1000", *TINY]


@pytest.mark.integration  # a real run of a minute: nox -s integration
def test_a_default_spelled_out_is_the_same_run(tmp_path):
    left_out, spelled = tmp_path / "left-out", tmp_path / "spelled"
    for results, extra in ((left_out, []), (spelled, ["--topk-ratio", "0.01"])):
        proc = bench("run", "--method", "topk", *TWO_NODES, "--results-dir", results, *extra)
        assert proc.returncode == 0, proc.stderr
    (spelled_run,) = spelled.iterdir()
    recorded = json.loads((spelled_run / "manifest.json").read_text())["config"]["options"]
    assert recorded == {"topk_ratio": 0.01}  # what the user typed stays recorded

    compared = bench("compare", left_out, spelled, "--metric", "accuracy,train-loss,bytes",
                     "--format", "json")  # times differ between any two runs
    assert compared.returncode == 0, compared.stdout + compared.stderr
    verdict = json.loads(compared.stdout)
    assert verdict["matched"] == 1 and not any(verdict["unmatched"].values()), compared.stdout
    metrics = {row["metric"] for row in verdict["rows"]}
    assert {"final_accuracy", "inter_node_bytes_per_iteration"} <= metrics

    both = tmp_path / "both"
    for folder in (*left_out.iterdir(), spelled_run):
        shutil.copytree(folder, both / folder.name)
    report = bench("report", both, "-o", tmp_path / "report")
    assert report.returncode == 0, report.stderr
    summary = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert len(summary[summary.method == "topk"]) == 1, summary.to_string()
