"""The command line end to end: one-line errors, run folders, failures that keep their rows."""

import json

import pandas as pd
import pytest
import torch

from suite import compat
from suite.results.schema import SUMMARY_KEYS
from tests.support.runs import SMALL, bench, one_line_error


def test_list_shows_methods_and_workloads():
    proc = bench("list")
    assert proc.returncode == 0, proc.stderr
    for name in ("prunex", "prunex-flat", "ddp", "cnn-fmnist", "resnet152-cifar10"):
        assert name in proc.stdout
    assert "3x3" in proc.stdout  # the adapted ResNet stem is stated


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--method", "nope"], "unknown method 'nope'; known: "),
        (["--workload", "nope"], "unknown workload 'nope'; known: "),
        (["--gpus", "6", "--gpus-per-node", "4"], "not divisible"),
        (["--workload", "resnet18-cifar10", "--data-dir", "/nonexistent/x"], "cifar-10-batches-py"),
        (["--dataset", "imagenet"], "imagenet"),
        (["--method", "topk", "--topk-ratio", "2"], "--topk-ratio must be in (0, 1], got 2.0"),
        (["--channel-keep", "0"], "--channel-keep must be in (0, 1]"),
    ],
)
def test_bad_input_is_one_line(args, expected, tmp_path):
    line = one_line_error(bench("run", "--results-dir", str(tmp_path), *args))
    assert expected in line
    assert not list(tmp_path.iterdir())  # nothing was started


def test_run_writes_complete_folder(tmp_path):
    proc = bench(
        "run",
        "--method",
        "prunex",
        "--local-steps",
        "2",
        "--tensorboard",
        "--deterministic",
        *SMALL,
        "--iterations",
        "3",
        "--results-dir",
        str(tmp_path),
        "--target-accuracy",
        "0.0",
        "--eval-every",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    (run,) = tmp_path.iterdir()
    names = {p.name for p in run.iterdir()}
    assert {
        "manifest.json",
        "summary.json",
        "iterations.parquet",
        "evals.parquet",
        "model.pt",
    } <= names
    assert "parts" not in names and not any(n.startswith(".") for n in names)
    summary = json.loads((run / "summary.json").read_text())
    assert set(SUMMARY_KEYS) - {"error"} <= set(summary)
    assert summary["status"] == "ok"
    assert (summary["gpus"], summary["nodes"], summary["gpus_per_node"]) == (4, 2, 2)
    assert summary["iterations"] == 3
    assert 0 < summary["time_to_target_seconds"] <= summary["train_seconds"]
    evals = pd.read_parquet(run / "evals.parquet")
    assert evals["iteration"].tolist() == [1, 2]  # every 2nd iteration and the last
    rows = pd.read_parquet(run / "iterations.parquet")
    assert len(rows) == 3 * 4
    assert summary["inter_node_bytes_total"] == rows["bytes_inter"].sum() > 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["topology"]["node_ranks"] == [[0, 1], [2, 3]]
    assert manifest["versions"]["torch"] == torch.__version__
    assert manifest["versions"]["torch_fallbacks"] == compat.fallbacks()
    assert manifest["live_logs"] == {"tensorboard": str(run / "tensorboard")}
    # what a GPU number depends on, and the setup kept out of iteration 0
    assert manifest["numerics"]["device"] == "cpu"
    assert {"tf32_matmul", "cudnn_deterministic", "deterministic_algorithms"} <= set(
        manifest["numerics"]
    )
    # --deterministic reached the ranks before their first kernel (warn only: a run on an op
    # without a deterministic CUDA kernel goes on)
    assert manifest["config"]["deterministic"] is True
    numerics = manifest["numerics"]
    assert numerics["deterministic_algorithms"] and numerics["deterministic_warn_only"]
    assert numerics["cudnn_deterministic"] and not numerics["cudnn_benchmark"]
    assert set(manifest["group_backends"].values()) == {"gloo"}
    # the sharded leaders' peer groups are made only for --leader-mode sharded
    assert set(manifest["group_backends"]) == {"world", "intra", "inter"}
    assert manifest["topology"]["emulated_nodes"] is True  # 2 nodes of 2 on one host
    assert manifest["topology"]["gpus_per_node_matches_hosts"] is False
    assert {"cudnn", "nccl"} <= set(manifest["versions"])
    assert 0 < summary["connect_seconds"] < summary["setup_seconds"]
    assert 0 < summary["warmup_seconds"] < summary["setup_seconds"]  # untimed, before it 0
    slowest = rows.groupby("iteration")["t_iteration"].max()
    assert summary["first_iteration_seconds"] == slowest[0]
    # the attempt's first iteration is a one-off, left out of the mean (prunex declares none)
    assert rows.groupby("iteration")["one_off"].all().tolist() == [True, False, False]
    assert summary["iteration_seconds"] == pytest.approx(slowest[1:].mean())
    assert summary["samples_per_second_per_rank"] > 0
    for artifact in ("model.pt", "masks.pt"):  # device-independent files
        saved = torch.load(run / artifact, weights_only=True)
        tensors = [t for t in tree_leaves(saved) if isinstance(t, torch.Tensor)]
        assert tensors and all(t.device.type == "cpu" for t in tensors)
    scalars = tensorboard_scalars(run / "tensorboard")
    assert len(scalars["train/loss"]) == len(scalars["bytes/inter_node"]) == 3
    assert scalars["train/lr"] == pytest.approx(rows[rows["rank"] == 0]["lr"].tolist())
    assert scalars["eval/accuracy_percent"] == pytest.approx(list(100 * evals["accuracy"]))
    assert {"seconds/local_compute", "seconds/inter_allreduce", "method/density"} <= set(scalars)
    assert any(tag.startswith("rho1/") for tag in scalars)
    # the physically smaller model of that run, with its record
    proc = bench("export", str(run), "--repeats", "3", "-o", str(tmp_path / "small.pt"))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((run / "export.json").read_text())
    assert record["max_abs_diff_fp64"] <= 1e-5
    assert record["model_file"] == str(tmp_path / "small.pt")
    assert record["exported"]["parameters"] < record["dense"]["parameters"]
    assert record["exported"]["flops"] < record["dense"]["flops"]
    assert 0 <= record["exported"]["test_accuracy"] <= 1
    assert set(record["dense"]) == {"parameters", "flops", "latency_ms_b1", "latency_ms_b128"}


def tree_leaves(obj) -> list:
    """Every leaf of nested dicts, lists and tuples."""
    if isinstance(obj, dict):
        return [leaf for value in obj.values() for leaf in tree_leaves(value)]
    if isinstance(obj, (list, tuple)):
        return [leaf for value in obj for leaf in tree_leaves(value)]
    return [obj]


def tensorboard_scalars(logdir) -> dict[str, list[float]]:
    """Every scalar series of the event files in ``logdir``, read back with TensorBoard."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(logdir))
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_nan_loss_marks_failed_and_keeps_rows(tmp_path):
    proc = bench(
        "run",
        "--method",
        "ddp",
        *SMALL,
        "--iterations",
        "6",
        "--lr",
        "1e12",
        "--results-dir",
        str(tmp_path),
    )
    line = one_line_error(proc)
    assert "non-finite loss" in line
    assert proc.returncode == 1  # a run that failed, not bad input (2)
    (run,) = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and "non-finite loss" in summary["error"]
    rows = pd.read_parquet(run / "iterations.parquet")  # complete, readable file
    assert 0 < rows["iteration"].nunique() < 6
    assert set(rows.groupby("iteration").size()) == {4}  # every kept row is whole
    assert "no masks.pt: ddp trains a dense model" in one_line_error(bench("export", str(run)))
