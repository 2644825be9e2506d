"""``bench export``: the physically smaller model of a pruning run (its evaluated model under
its masks, ``suite.structured.export``), measured against the dense one, written beside the
run (``exported.pt``, ``export.json``) and printed as a table."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from suite.data.datasets import dataset_spec, load_data
from suite.data.workload import example_input
from suite.errors import BenchError
from suite.plugins.registry import WORKLOADS
from suite.results import schema
from suite.results.folder import MANIFEST, RunFolder, write_json, write_torch
from suite.results.lock import release, take
from suite.structured.export import (
    CHECK_SAMPLES,
    LATENCY_BATCHES,
    TOLERANCE,
    accuracy,
    count_parameters,
    export_model,
    flops_per_image,
    latency_ms,
    max_abs_diff,
)
from suite.structured.masks import conv_shapes, load_masks, read_masks_file
from suite.structured.units import UnitGroup, load_unit_masks, trace_unit_groups


def export_and_print(run_dir: str, output: str | None, *, data_dir: str | None, repeats: int,
                     echo: Callable) -> dict:
    record = export_run(run_dir, output, data_dir=data_dir, repeats=repeats, echo=echo)
    dense, small = record["dense"], record["exported"]
    echo(f"{'':>12} {'dense':>14} {'exported':>14} {'ratio':>7}")
    for key in dense:
        ratio = record["ratios"].get(key, float("nan"))
        echo(f"{key:>12} {dense[key]:>14.4g} {small[key]:>14.4g} {ratio:>7.3f}")
    echo(f"test accuracy of the exported model: {100 * small['test_accuracy']:.2f} %  "
         f"(max |diff| to the masked dense model {record['max_abs_diff']:.2g} in fp32, "
         f"{record['max_abs_diff_fp64']:.2g} in fp64)")
    echo(f"model: {record['model_file']}  record: {Path(run_dir) / 'export.json'}")
    return record


def load_run_model(run_dir: Path) -> tuple[dict, nn.Module, dict, list[UnitGroup]]:
    """The run's manifest, its evaluated model, its masks and the head and neuron groups
    they prune; a one-line error for a folder that has none of them."""

    folder = RunFolder(run_dir)
    if not folder.has_manifest:
        raise BenchError(f"{run_dir} is not a run folder (no manifest.json)")
    try:
        manifest = folder.manifest() or {}
        config = manifest[schema.CONFIG]
        config[schema.METHOD], config[schema.WORKLOAD], config[schema.DATASET]  # noqa: B018
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{run_dir}: its manifest.json is unreadable or not a run's "
                         f"({type(exc).__name__}: {str(exc)[:100]})") from None
    if not (run_dir / "masks.pt").is_file():
        raise BenchError(
            f"{run_dir}: no masks.pt: {config[schema.METHOD]} trains a dense model; runs of "
            "prunex, prunex-flat, gmp-hier and prune-retrain have masks to export"
        )
    if not (run_dir / "model.pt").is_file():
        raise BenchError(f"{run_dir}: no model.pt (the run did not finish): nothing to export")
    workload = WORKLOADS.build(config[schema.WORKLOAD])  # loads plugins and their datasets
    spec = dataset_spec(config[schema.DATASET])
    spec = replace(spec, image_size=model_side(manifest) or spec.image_size)
    model = workload.build_model(spec)
    try:
        state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
    except Exception as exc:  # unpickling and shape mismatches raise many kinds
        why = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise BenchError(
            f"{run_dir}/model.pt does not fit {config[schema.WORKLOAD]} ({why})") from None
    _, saved = read_masks_file(str(run_dir), "cpu")
    groups = []
    if any("#" in key for key in saved):  # heads or neurons were pruned
        groups = [g for g in trace_unit_groups(model, example_input(spec)) if g.key in saved]
    masks = {**load_masks(str(run_dir), conv_shapes(model), "cpu"),
             **load_unit_masks(str(run_dir), groups, "cpu")}
    return manifest, model.eval(), masks, groups


def export_run(
    run_dir: str | Path,
    output: str | Path | None = None,
    *,
    data_dir: str | None = None,
    repeats: int = 20,
    max_seconds: float = 10.0,
    echo=print,
) -> dict:
    """Export a run's model (see the module docstring); returns what ``export.json`` holds.
    The run folder is taken first (``suite.results.lock.take``: not one in use, nor one
    holding links) and where the files go checked writable, so a read-only folder is one
    line before the minutes of work, not an error after them."""

    run_dir = Path(run_dir)
    path = Path(output) if output is not None else run_dir / "exported.pt"
    if not (run_dir / MANIFEST).is_file():
        raise BenchError(f"{run_dir} is not a run folder (no manifest.json)")
    take(run_dir)
    try:
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise BenchError(f"bench export: {path.parent} is not writable; nothing was done")
        return exported_record(run_dir, path, data_dir=data_dir, repeats=repeats,
                               max_seconds=max_seconds, echo=echo)
    finally:
        release(run_dir)


def exported_record(run_dir: Path, path: Path, *, data_dir: str | None, repeats: int,
                    max_seconds: float, echo) -> dict:
    """``export_run``'s work, in a folder it holds: the model exported to ``path``, measured,
    and the record written to ``export.json``."""
    manifest, model, masks, groups = load_run_model(run_dir)
    config = manifest[schema.CONFIG]
    test = replace(load_test_split(config, data_dir), resize_to=model_side(manifest))
    check = test.for_model(test.images[:CHECK_SAMPLES])
    try:
        masked, exported, live = export_model(model, masks, check, groups)
    except BenchError as exc:
        raise BenchError(f"{run_dir}: {exc}") from None
    diff = max_abs_diff(exported, masked, check)  # fp32, as the model runs
    diff64 = max_abs_diff(exported, masked, check, dtype=torch.float64)  # what is judged
    sample = check[:1]
    threads = torch.get_num_threads()
    echo(f"measuring {config[schema.WORKLOAD]}: dense, then exported ({threads} threads)")
    dense_stats, exported_stats = (measure(model, sample, repeats, max_seconds),
                                   measure(exported, sample, repeats, max_seconds))
    exported_stats["test_accuracy"] = accuracy(exported, test)
    write_torch(path, exported)
    summary = readable_summary(run_dir)
    record = {
        schema.RUN_ID: manifest.get(schema.RUN_ID, run_dir.name),
        schema.METHOD: config[schema.METHOD],
        schema.WORKLOAD: config[schema.WORKLOAD],
        schema.DATASET: config[schema.DATASET],
        "model_file": str(path),
        "max_abs_diff": diff,
        "max_abs_diff_fp64": diff64,
        "tolerance": TOLERANCE,  # on max_abs_diff_fp64
        "checked_samples": len(check),
        schema.TEST_SAMPLES: len(test.labels),
        "live_parameters": live.parameters,
        "live_buffers": live.buffers,  # BN statistics
        "live_fp32_bytes": live.fp32_bytes,  # what a frozen round packs, leader to leader
        "run_final_accuracy": summary.get(schema.FINAL_ACCURACY),
        "threads": torch.get_num_threads(),
        "dense": dense_stats,
        "exported": exported_stats,
        "ratios": ratios(dense_stats, exported_stats),
    }
    write_json(run_dir / "export.json", record)
    return record


def model_side(manifest: dict) -> int | None:
    """The side the run handed its model the images at (its plan's input size), where that
    is not the dataset's; None for a run at the dataset's side or one recorded before sides
    were decided."""
    decided = (manifest.get(schema.PLAN) or {}).get(schema.PLAN_INPUT_SIZE) or {}
    side = decided.get(schema.INPUT_MODEL_SIDE)
    return side if side != decided.get(schema.INPUT_DATASET_SIDE) else None


def load_test_split(config: dict, data_dir: str | None):
    """The run's test split, loaded as the run loaded it (its seed and synthetic size; the
    data folder given here, else the run's own)."""
    _, test, _ = load_data(
        config[schema.DATASET],
        data_dir=data_dir or config.get("data_dir"),
        seed=config.get(schema.SEED, 0),
        synthetic_size=tuple(config.get("synthetic_size") or (4096, 1024)),
    )
    return test


def measure(net: nn.Module, sample: torch.Tensor, repeats: int, max_seconds: float) -> dict:
    """What the export compares between the dense and the exported model: parameters,
    FLOPs per image and the latency at each of ``LATENCY_BATCHES``.

    Args:
        net: the model, in eval mode.
        sample: a batch of one test image, what every number is measured on.
        repeats: timed runs per batch size.
        max_seconds: the most one batch size's timing may take.
    """
    return {
        schema.PARAMETERS: count_parameters(net),
        "flops": flops_per_image(net, sample),
        **{
            f"latency_ms_b{b}": latency_ms(net, sample, b, repeats, max_seconds)
            for b in LATENCY_BATCHES
        },
    }


def readable_summary(run_dir: Path) -> dict:
    """The run's summary.json, or {} where there is none or it is damaged: the record says
    what it can without it."""
    try:
        return RunFolder(run_dir).summary() or {}
    except (OSError, ValueError):  # a damaged summary: the record says what it can
        return {}


def ratios(dense: dict, exported: dict) -> dict:
    """Exported over dense for each number the dense model has (not zero, not NaN)."""
    return {
        key: exported[key] / dense[key]
        for key in dense
        if dense[key] and not math.isnan(dense[key])
    }
