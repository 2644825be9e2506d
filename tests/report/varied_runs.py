"""A small result set that takes every branch of the report's labels and tables: the
committed ``cpu-gloo`` reference runs (eleven methods, cnn-fmnist, 4 CPU ranks) and copies of
some with their identity changed (more seeds, an option, 8 ranks, another lr, another workload,
an emulated link, a simulated run, CUDA ranks, a failed run). The numbers are the reference
runs' own; only what a label or a grouping reads is changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "references" / "cpu-gloo"

#: (copy's run id, source run's method, summary changes, manifest changes)
VARIANTS = [
    ("prunex-s1", "prunex", {"seed": 1}, {"config": {"seed": 1}}),
    ("prunex-s2", "prunex", {"seed": 2}, {"config": {"seed": 2}}),
    ("ddp-s1", "ddp", {"seed": 1}, {"config": {"seed": 1}}),
    ("prunex-keep25", "prunex", {"options": {"local_steps": 4, "channel_keep": 0.25}},
     {"method_settings": {"channel_keep": 0.25},
      "config": {"options": {"local_steps": 4, "channel_keep": 0.25}}}),
    ("ddp-8g", "ddp", {"gpus": 8, "nodes": 4},
     {"topology": {"world_size": 8, "num_nodes": 4}, "config": {"gpus": 8}}),
    ("ddp-lr01", "ddp", {}, {"recipe": {"lr": 0.1}}),
    ("topk-cifar", "topk", {"workload": "cnn-cifar10", "dataset": "cifar10"},
     {"config": {"workload": "cnn-cifar10", "dataset": "cifar10"}}),
    ("ddp-emulated", "ddp", {}, {"network": {"mode": "emulated", "inter_bw": "1gbit"}}),
    ("ddp-sim", "ddp", {"simulated": True, "final_accuracy": None, "best_accuracy": None},
     {"simulated": True, "simulation": {"profile": {"name": "v100-ib100"}}}),
    ("localsgd-cuda", "localsgd-hier", {}, {"device": "cuda"}),
    ("powersgd-failed", "powersgd", {"status": "failed", "error": "rank 1: killed"}, {}),
]


def merged(base: dict, changes: dict) -> dict:
    """``base`` with ``changes`` written in, nested dictionaries key by key."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def varied_runs(root: Path) -> Path:
    """Write the set into ``root`` (a new folder); returns it."""
    sources = {}
    for folder in sorted(p for p in REFERENCE.iterdir() if p.is_dir()):
        shutil.copytree(folder, root / folder.name)
        sources[json.loads((folder / "summary.json").read_text())["method"]] = folder
    for run_id, method, summary, manifest in VARIANTS:
        target = root / run_id
        shutil.copytree(sources[method], target)
        for name, changes in (("summary.json", summary), ("manifest.json", manifest)):
            data = merged(json.loads((target / name).read_text()), {"run_id": run_id, **changes})
            (target / name).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return root
