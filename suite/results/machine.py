"""The kind of machine a run's numbers come from (``cpu-gloo``, ``cuda-nccl-h100``).

Runs of one class are comparable number for number: the same device kind, collective backend
and device model. A nightly compares against the reference recorded on its own class
(``results/reference/<class>/``), never a GPU run against a CPU-recorded reference.
"""

from __future__ import annotations

import re
from pathlib import Path

#: how a class name starts; a folder whose subfolders are named so is a tree of references
CLASS_PATTERN = re.compile(r"^(cpu|cuda)-[a-z0-9]+(-[a-z0-9._]+)?$")


def machine_class(manifest: dict) -> str:
    """``cpu-gloo``; ``cuda-nccl-h100`` (device kind, backend, device model); ``sim-<profile>``
    for simulated runs, whose numbers come from a profile, not a machine."""
    if manifest.get("simulated"):
        profile = (manifest.get("simulated_profile") or {}).get("name") or "profile"
        return f"sim-{slug(str(profile))}"
    device = str(manifest.get("device") or "cpu").split(":")[0]
    backend = str(manifest.get("backend") or "gloo")
    if device != "cuda":
        return f"{device}-{backend}"
    name = (manifest.get("numerics") or {}).get("device_name") or ""
    return f"cuda-{backend}-{device_model(name)}"


def device_model(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; ``Tesla V100-SXM2-32GB`` -> ``v100``; else the
    name as a slug."""
    match = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", name.replace("-", " "))
    return match.group(1).lower() if match else slug(name) or "gpu"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")


def class_folders(root: Path) -> dict[str, Path]:
    """The per-class reference folders under ``root`` (empty when ``root`` is one set)."""
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and CLASS_PATTERN.match(p.name)}


def record_reference(staging: str | Path, root: str | Path) -> Path:
    """Move a freshly recorded result set into ``root/<its class>/``, replacing that class's
    previous reference (``nox -s reference``); returns the new folder."""
    import shutil

    from suite.errors import BenchError
    from suite.results.compare import load_summaries

    staging, root = Path(staging), Path(root)
    classes = set(load_summaries(staging)[0].machine_class) - {"-"}
    if len(classes) != 1:
        raise BenchError(f"{staging}: a reference holds runs of one machine class, found "
                         f"{sorted(classes) or 'none'}")  # fmt: skip
    target = root / classes.pop()
    if target.exists():
        shutil.rmtree(target)
    root.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), str(target))
    return target
