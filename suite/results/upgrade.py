"""Older run folders read into the current form, in one place (asv's ``Results.update_to_N``):
every reader gets a folder of ``schema.FORMAT_VERSION`` whatever wrote it, so no reader keeps a
"recorded before" fallback of its own.

A folder says which format wrote it (``format_version`` in its summary and manifest; absent:
1, the folders before versions were written, such as the committed references). Reading one
runs ``update_to_N`` for each version after its own, in order, on the summary and manifest
(``upgrade``) and on a table (``upgrade_table``). The files on disk are left as they are.
What needs a run's rows (the final training loss of a version-1 summary that lacks it) is
computed by the one reader of result sets, for all such runs at once
(suite.results.resultset).
"""

from __future__ import annotations

import pandas as pd

from suite.errors import BenchError
from suite.results import schema


def format_version(record: dict) -> int:
    """The format that wrote a summary or manifest (1 where it does not say)."""
    return int(record.get(schema.FORMAT_VERSION_KEY) or 1)


def upgrade(summary: dict, manifest: dict) -> int:
    """Bring a run's summary and manifest (read from disk, changed in place) to the current
    format; returns the version the folder was written in.

    Raises:
        BenchError: the folder was written by a newer format than this code reads.

    Examples:
        ```python
        version = upgrade(summary, manifest)  # 1 for a committed reference
        summary[schema.FORMAT_VERSION_KEY]  # schema.FORMAT_VERSION
        ```
    """
    version = format_version(summary)
    if version > schema.FORMAT_VERSION:
        raise BenchError(f"run {summary.get(schema.RUN_ID)!r} was written in format {version}; "
                         f"this prunex-bench reads formats up to {schema.FORMAT_VERSION} "
                         "(upgrade prunex-bench)")
    for step in range(version, schema.FORMAT_VERSION):
        _UPDATES[step + 1](summary, manifest)
    return version


def upgrade_table(name: str, frame: pd.DataFrame, version: int) -> pd.DataFrame:
    """A table of a folder written in ``version``, in the current format."""
    if version < 2 and name == schema.ITERATIONS_TABLE:
        frame = _iterations_to_2(frame)
    return frame


# -- version 1 -> 2 ----------------------------------------------------------------------------
#: the methods whose all-reduce ran inside local_compute (DDP's comm hooks) when version-1
#: folders were written without saying so (their manifests lack ``overlapped_phases``): a fact
#: of those folders, not a rule of today's methods, which declare it themselves
FORMAT_1_OVERLAPPING = frozenset({"ddp", "ddp-bf16", "ddp-fp16", "powersgd"})
#: the phase they overlapped (suite.cluster.phases.ALLREDUCE's name; tests/results check it)
FORMAT_1_OVERLAPPED = "allreduce"


def _update_to_2(summary: dict, manifest: dict) -> None:
    """Version 2 declared every key and records the runner's load: a version-1 summary killed
    before its identity was written takes it from the manifest; a recipe without a schedule
    trained at a constant rate; the runner's load is unknown (time is judged as before); the
    phases a version-1 run overlapped with local_compute are its method's then
    (``FORMAT_1_OVERLAPPING``)."""
    if summary.get(schema.METHOD) is None and manifest:
        known = identity_from_manifest(manifest)
        summary.update({k: v for k, v in known.items() if summary.get(k) is None})
    recipe = manifest.get(schema.RECIPE)
    if isinstance(recipe, dict):
        recipe.setdefault(schema.LR_SCHEDULE, "constant")
        recipe.setdefault(schema.WARMUP_EPOCHS, 0)
    if manifest:
        manifest.setdefault(schema.RUNNER_LOAD, None)
        method = summary.get(schema.METHOD) or (manifest.get(schema.CONFIG) or {}).get(
            schema.METHOD)
        manifest.setdefault(schema.OVERLAPPED_PHASES, [FORMAT_1_OVERLAPPED] if (
            method in FORMAT_1_OVERLAPPING) else [])
        manifest[schema.FORMAT_VERSION_KEY] = 2
    summary[schema.FORMAT_VERSION_KEY] = 2


def _iterations_to_2(frame: pd.DataFrame) -> pd.DataFrame:
    """Version-1 rows have no density of the prunable tensors alone (the density of every
    pruned layer stands for it) and mark no one-off iterations (every row was steady)."""
    if schema.PRUNABLE_DENSITY not in frame and schema.DENSITY in frame:
        frame = frame.assign(**{schema.PRUNABLE_DENSITY: frame[schema.DENSITY]})
    if schema.ONE_OFF not in frame and schema.ITERATION in frame:
        frame = frame.assign(**{schema.ONE_OFF: False})
    return frame


_UPDATES = {2: _update_to_2}


def identity_from_manifest(manifest: dict) -> dict:
    """The identity keys of a run, from its manifest (for summaries written before them)."""
    config = manifest.get(schema.CONFIG) or {}
    topology = manifest.get(schema.TOPOLOGY) or {}
    return {
        schema.RUN_ID: manifest.get(schema.RUN_ID),
        schema.METHOD: config.get(schema.METHOD),
        schema.WORKLOAD: config.get(schema.WORKLOAD),
        schema.DATASET: config.get(schema.DATASET),
        schema.GPUS: topology.get(schema.WORLD_SIZE, config.get(schema.GPUS)),
        schema.GPUS_PER_NODE: topology.get(schema.GPUS_PER_NODE,
                                           config.get(schema.GPUS_PER_NODE)),
        schema.OPTIONS: config.get(schema.OPTIONS),
        schema.SEED: config.get(schema.SEED),
    }
