"""``bench export``: the physically smaller model of a pruning run, and a table of what it
saves against the dense model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from suite.structured.export import export_run


def export_and_print(run_dir: str, output: str | None, *, data_dir: str | None, repeats: int,
                     echo: Callable) -> dict:  # fmt: skip
    record = export_run(run_dir, output, data_dir=data_dir, repeats=repeats, echo=echo)
    dense, small = record["dense"], record["exported"]
    echo(f"{'':>12} {'dense':>14} {'exported':>14} {'ratio':>7}")
    for key in dense:
        ratio = record["ratios"].get(key, float("nan"))
        echo(f"{key:>12} {dense[key]:>14.4g} {small[key]:>14.4g} {ratio:>7.3f}")
    echo(f"test accuracy of the exported model: {100 * small['test_accuracy']:.2f} %  "
         f"(max |diff| to the masked dense model {record['max_abs_diff']:.2g})")  # fmt: skip
    echo(f"model: {record['model_file']}  record: {Path(run_dir) / 'export.json'}")
    return record
