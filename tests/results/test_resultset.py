"""The one reader of a result set (suite.results.resultset): every run read once into a
frame, only the asked columns of the tables, the same numbers as reading run by run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from suite.gate.compare import load_summaries
from suite.plugins.registry import METHODS
from suite.results import schema
from suite.results.resultset import (
    CONFIGURATION,
    RUN_INDEX,
    SHOWN_OPTIONS,
    VIEW,
    VIEW_COLUMNS,
    read_result_set,
)
from suite.results.summary import final_train_loss, final_train_losses
from suite.results.view import RunView

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "tests" / "fixtures" / "references"
PERTURBED = Path(__file__).resolve().parents[1] / "gate" / "data" / "kernel_perturbations"


def test_every_run_is_one_row_with_its_summary_and_view_columns():
    runs = read_result_set(REFERENCE, METHODS.defaults)
    frame = runs.runs
    assert len(runs) == 22 and runs.skipped == [] and runs.tables == {}
    assert set(VIEW_COLUMNS) <= set(frame.columns)
    for _, row in frame.iterrows():
        view: RunView = row[VIEW]
        declared = METHODS.defaults(view.method)
        assert row[CONFIGURATION] == json.dumps(view.configuration(declared), sort_keys=True)
        assert row[SHOWN_OPTIONS] == json.dumps(view.shown_options(declared), sort_keys=True)
        assert row["machine_class"] == view.machine_class and row["setting"] == view.setting
        for key, value in view.summary.items():
            assert row[key] == value or (row[key] != row[key] and value != value), key
    # a key no summary of the set has is absent; one some lack is None there, never NaN
    assert frame[schema.GPUS].map(type).eq(int).all()
    assert frame[schema.TIME_TO_TARGET_SECONDS].isna().all()
    assert frame[schema.TIME_TO_TARGET_SECONDS].map(lambda v: v is None).all()


def test_tables_hold_only_the_asked_columns_of_each_run_in_its_order(tmp_path):
    shutil.copytree(REFERENCE / "cpu-gloo", tmp_path / "set")
    asked = (schema.ITERATION, schema.BYTES_INTER, schema.DENSITY, "no-such-column")
    runs = read_result_set(tmp_path / "set", tables={"iterations": asked,
                                                     "layers": lambda c: c.startswith("rho")})
    iterations, layers = runs.table("iterations"), runs.table("layers")
    assert set(iterations.columns) == {schema.ITERATION, schema.BYTES_INTER, schema.DENSITY,
                                       RUN_INDEX}
    assert set(layers.columns) == {"rho1", "rho2", RUN_INDEX}
    for position, view in enumerate(runs.runs[VIEW]):
        own = pd.read_parquet(view.folder / "iterations.parquet")
        mine = iterations[iterations[RUN_INDEX] == position]
        columns = [c for c in own.columns if c in asked]
        assert runs.columns["iterations"][position] == tuple(columns)
        for name in columns:  # the very numbers, in the file's row order
            np.testing.assert_array_equal(mine[name].to_numpy(), own[name].to_numpy())
        if schema.DENSITY not in own:
            assert mine[schema.DENSITY].isna().all()
        has_layers = (view.folder / "layers.parquet").exists()
        assert (runs.columns["layers"][position] is not None) == has_layers


def test_a_damaged_table_is_listed_and_its_run_kept(tmp_path):
    shutil.copytree(REFERENCE / "cpu-gloo", tmp_path / "set")
    damaged = next((tmp_path / "set").glob("ddp-cnn*")) / "evals.parquet"
    damaged.write_bytes(damaged.read_bytes()[:100])
    (next((tmp_path / "set").glob("topk-cnn*")) / "summary.json").write_text("{not json")
    runs = read_result_set(tmp_path / "set", tables={"evals": ["accuracy"]})
    assert len(runs) == 10 and len(runs.skipped) == 1 and "unreadable summary.json" in (
        runs.skipped[0])
    position = next(i for i, v in enumerate(runs.runs[VIEW]) if v.folder == damaged.parent)
    assert runs.columns["evals"][position] is None
    assert position not in set(runs.table("evals")[RUN_INDEX])
    assert [line.split(":")[0] for line in runs.unreadable] == [str(damaged)]


def test_finished_only_leaves_out_runs_that_did_not_end_ok(tmp_path):
    shutil.copytree(REFERENCE / "cpu-gloo", tmp_path / "set")
    failed = next((tmp_path / "set").glob("powersgd*"))
    summary = json.loads((failed / "summary.json").read_text())
    (failed / "summary.json").write_text(json.dumps({**summary, "status": "failed"}))
    assert len(read_result_set(tmp_path / "set")) == 11
    runs = read_result_set(tmp_path / "set", finished_only=True)
    assert len(runs) == 10 and runs.skipped == [f"{failed}: status 'failed'"]


@pytest.mark.parametrize("root", [REFERENCE, PERTURBED], ids=["reference", "perturbed"])
def test_final_train_losses_at_once_are_those_of_each_run(root):
    runs = read_result_set(root, tables={"iterations": (schema.ITERATION, schema.LOSS)})
    at_once = final_train_losses(runs.table("iterations"), RUN_INDEX)
    for position, view in enumerate(runs.runs[VIEW]):
        alone = final_train_loss(pd.read_parquet(view.folder / "iterations.parquet"))
        assert at_once[position] == alone  # bit for bit
        if schema.FINAL_TRAIN_LOSS in view.summary:  # recorded from the run's rows
            assert view.summary[schema.FINAL_TRAIN_LOSS] == pytest.approx(alone, rel=1e-12)
    frame, _ = load_summaries(root)  # what bench compare reads, key recorded or not
    assert frame[schema.FINAL_TRAIN_LOSS].tolist() == [
        v.summary.get(schema.FINAL_TRAIN_LOSS, v.final_train_loss) for v in frame[VIEW]]
