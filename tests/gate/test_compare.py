"""`bench compare`: like with like, direction-aware verdicts, repeats and intervals,
unmatched keys, failed runs, and the formats for people and CI."""

import json
import os
import subprocess
import sys

import pytest

BENCH = [sys.executable, "-m", "suite.cli"]


BASE = {"status": "ok", "workload": "cnn-fmnist", "options": {}, "final_accuracy": 0.80,
        "iteration_seconds": 0.10, "time_to_target_seconds": None,
        "inter_node_bytes_per_iteration": 1e6}


def bench(*args):
    env = {**os.environ, "PRUNEX_PROGRESS": "0"}
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, env=env, timeout=120)


def write_set(root, runs):
    for i, changes in enumerate(runs):
        folder = root / f"run{i}"
        folder.mkdir(parents=True)
        summary = {**BASE, "run_id": f"run{i}", **changes}
        (folder / "summary.json").write_text(json.dumps(summary))
    return str(root)


RUNS = [{"method": "ddp", "gpus": 4}, {"method": "prunex", "gpus": 4,
                                       "options": {"channel_keep": 0.5}}]


def test_identical_sets_pass(tmp_path):
    base = write_set(tmp_path / "a", RUNS)
    proc = bench("compare", base, write_set(tmp_path / "b", RUNS))
    assert proc.returncode == 0, proc.stdout
    assert "0 regression(s)" in proc.stdout and "n/a" in proc.stdout  # no time-to-target


@pytest.mark.parametrize(
    "change, code",
    [
        ({"final_accuracy": 0.70}, 1),  # accuracy down 12.5%
        ({"final_accuracy": 0.90}, 0),  # up: improved
        ({"iteration_seconds": 0.12}, 1),  # 20% slower
        ({"iteration_seconds": 0.104}, 0),  # 4% slower: inside 5%
        ({"inter_node_bytes_per_iteration": 0.5e6}, 0),  # fewer bytes: improved
        ({"inter_node_bytes_per_iteration": 2e6}, 1),
        ({"status": "failed", "error": "NonFiniteLoss: boom"}, 1),
        ({"status": "running"}, 1),  # killed too hard to say so: a failure
        ({"status": "interrupted", "error": "interrupted by SIGTERM"}, 1),
    ],
)
def test_direction_aware_regressions(tmp_path, change, code):
    base = write_set(tmp_path / "a", RUNS)
    new = write_set(tmp_path / "b", [RUNS[0], {**RUNS[1], **change}])
    proc = bench("compare", base, new, "--max-regression", "5%")
    assert proc.returncode == code, proc.stdout
    if code:
        assert "REGRESSION" in proc.stdout and "prunex" in proc.stdout


def test_metric_filter_unmatched_runs_and_bad_input(tmp_path):
    base = write_set(tmp_path / "a", RUNS)
    new = write_set(tmp_path / "b", [{**RUNS[0], "iteration_seconds": 1.0},
                                     {"method": "topk", "gpus": 8}])
    proc = bench("compare", base, new, "--metric", "accuracy,bytes")
    assert proc.returncode == 0, proc.stdout  # the slower time is not compared
    assert "unmatched (only in baseline): prunex" in proc.stdout
    assert "unmatched (only in new): topk" in proc.stdout
    bad = bench("compare", base, new, "--max-regression", "lots")
    assert bad.returncode == 2 and "not a fraction or percentage" in bad.stderr
    missing = bench("compare", base, str(tmp_path / "nope"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_a_failed_run_without_a_baseline_twin_still_fails_the_gate(tmp_path):
    base = write_set(tmp_path / "a", RUNS)
    killed = {"method": "topk", "gpus": 8, "status": "running"}
    proc = bench("compare", base, write_set(tmp_path / "b", [*RUNS, killed]))
    assert proc.returncode == 1, proc.stdout
    assert "REGRESSION: status running" in proc.stdout and "still says running" in proc.stderr


def test_compare_matches_like_with_like(tmp_path):
    base = write_set(tmp_path / "a", RUNS)
    sim = {**RUNS[0], "simulated": True}  # a simulated ddp run never meets the real one
    short = {**RUNS[1], "epochs": 0.1}  # nor a 0.1-epoch run a full one
    proc = bench("compare", base, write_set(tmp_path / "b", [sim, short]))
    assert proc.returncode == 1, proc.stdout  # a gate that compared nothing does not pass
    # no metric row: each method gets one line saying what differs from its baseline's runs
    assert "accuracy" not in proc.stdout.split("unmatched")[0]
    assert "ddp ran under other settings than its baseline: setting real in the baseline, " \
        "sim ? in NEW" in proc.stdout
    assert "nothing compared: none of the 2 NEW run(s) matches" in proc.stderr
    assert "unmatched (only in new): ddp cnn-fmnist on - 4 ranks {} (sim ?;" in proc.stdout
    assert "0.1 epochs" in proc.stdout


@pytest.mark.parametrize("accuracy, code", [(0.795, 0), (0.785, 1)])
def test_accuracy_drop_is_in_points(tmp_path, accuracy, code):
    base = write_set(tmp_path / "a", RUNS)
    new = write_set(tmp_path / "b", [RUNS[0], {**RUNS[1], "final_accuracy": accuracy}])
    proc = bench("compare", base, new, "--metric", "accuracy")  # default: 1.0 point
    assert proc.returncode == code, proc.stdout
    assert f"{100 * (accuracy - 0.80):+.2f} pts" in proc.stdout


@pytest.mark.parametrize(
    "before, after, code",
    [
        ([0.80, 0.82, 0.78], [0.77, 0.80, 0.79], 0),  # 1.3 points down, intervals overlap
        ([0.800, 0.801, 0.799], [0.780, 0.781, 0.779], 1),  # 2 points down, apart
    ],
)
def test_repeats_count_only_beyond_their_intervals(tmp_path, before, after, code):
    def seeds(values):
        return [{**RUNS[0], "seed": i, "final_accuracy": v} for i, v in enumerate(values)]

    base = write_set(tmp_path / "a", seeds(before))
    proc = bench("compare", base, write_set(tmp_path / "b", seeds(after)), "--metric",
                 "accuracy", "--format", "json")
    assert proc.returncode == code, proc.stdout
    report = json.loads(proc.stdout)
    (row,) = report["rows"]
    assert row["repeats"] == "3/3" and row["baseline_ci"] > 0
    assert abs(row["baseline"] - sum(before) / 3) < 1e-12  # the mean, as reported
    assert report["regressions"] == code


def test_markdown_format_for_ci_summaries(tmp_path):
    base = write_set(tmp_path / "a", RUNS)
    proc = bench("compare", base, write_set(tmp_path / "b", RUNS), "--format", "markdown")
    assert proc.returncode == 0
    assert "| method" in proc.stdout and "|:--" in proc.stdout.replace(" ", "")


LONG = [{"method": "ddp", "gpus": 4, "exchange_every": {"intra_node": 1, "inter_node": 1}},
        {"method": "prunex", "gpus": 4, "exchange_every": {"intra_node": 4, "inter_node": 32},
         "options": {"channel_keep": 0.5, "rho1": 9.906975624424414, "local_steps": 32,
                     "freeze_share": 0.3, "after_freeze": "admm"}}]


def test_the_text_table_fits_120_columns_and_wide_shows_everything(tmp_path):
    """Options printed in full made the table 262 columns wide (issue 44)."""
    base, new = write_set(tmp_path / "a", LONG), write_set(tmp_path / "b", LONG)
    proc = bench("compare", base, new)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert max(map(len, lines)) <= 120, "\n".join(lines)
    assert lines[0] == "cnn-fmnist, 4 GPUs, real:"  # what every row shares, once
    header = lines[1].split()
    assert header[:4] == ["method", "options", "exch", "metric"]
    prunex = [line for line in lines if line.startswith("prunex ")]
    assert prunex and all("…" in line and " 4/32 " in line for line in prunex)
    assert all(" 1/1 " in line for line in lines if line.startswith("ddp "))
    assert "nan" not in proc.stdout.lower()
    wide = bench("compare", base, new, "--wide").stdout
    assert "rho1=9.907" in wide and "after_freeze=admm" in wide and "4 / 32" in wide
    assert max(map(len, wide.splitlines())) > 120
    rows = json.loads(bench("compare", base, new, "--format", "json").stdout)["rows"]
    assert {row["method"]: row["exchange"] for row in rows} == {"ddp": "1 / 1",
                                                               "prunex": "4 / 32"}


def test_runs_recorded_before_the_exchange_schedule_show_a_dash(tmp_path):
    base = write_set(tmp_path / "a", RUNS)
    proc = bench("compare", base, write_set(tmp_path / "b", RUNS), "--format", "markdown")
    assert "| exchange" in proc.stdout.replace("  ", " ")
    rows = json.loads(bench("compare", base, base, "--format", "json").stdout)["rows"]
    assert {row["exchange"] for row in rows} == {"-"}
