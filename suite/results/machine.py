"""The kind of machine a run's numbers come from (``cpu-gloo-amd25-avx512-t1``,
``cuda-nccl-h100-sm90``).

A class names what makes runs bit-identical, or at least numerically alike: on CPU ranks the
CPU vendor and family, the kernels torch dispatches to (its CPU capability: ``avx512``,
``avx2``, ``default`` under ``ATEN_CPU_CAPABILITY=default``) and the threads per rank; on CUDA
the device model and its compute capability; and the collective backend. A nightly compares
against the reference recorded on its own class (``reference/<class>/``), never a
run against a reference of other kernels: on another CPU generation a tenth of an epoch moves
a method's accuracy by as much as a change of seed. Runs recorded before the class named
these (``cpu-gloo``, ``cuda-nccl-h100``) keep the short name they had.
"""

from __future__ import annotations

import re
from pathlib import Path

#: how a class name starts; a folder whose subfolders are named so is a tree of references
CLASS_PATTERN = re.compile(r"^(cpu|cuda)-[a-z0-9]+(-[a-z0-9._]+)*$")
#: /proc/cpuinfo vendor ids as a class names them
VENDORS = {"authenticamd": "amd", "genuineintel": "intel", "hygongenuine": "hygon",
           "0x41": "arm", "0x61": "apple", "0x48": "hisilicon"}


def machine_class(manifest: dict) -> str:
    """``cpu-gloo-amd25-avx512-t1`` (device kind, backend, CPU vendor and family, torch's CPU
    capability, threads per rank); ``cuda-nccl-h100-sm90`` (device kind, backend, device
    model, compute capability); ``sim-<profile>`` for simulated runs, whose numbers come from
    a profile, not a machine. A manifest recorded before these were (no CPU capability, no
    compute capability) gets the short class it had then."""
    if manifest.get("simulated"):
        profile = (manifest.get("simulated_profile") or {}).get("name") or "profile"
        return f"sim-{slug(str(profile))}"
    device = str(manifest.get("device") or "cpu").split(":")[0]
    backend = str(manifest.get("backend") or "gloo")
    hardware = manifest.get("hardware") or {}
    if device != "cuda":
        if not hardware.get("cpu_capability"):
            return f"{device}-{backend}"
        return (f"{device}-{backend}-{cpu_kind(hardware)}-{slug(hardware['cpu_capability'])}"
                f"-t{hardware.get('threads_per_rank', 1)}")
    numerics = manifest.get("numerics") or {}
    base = f"cuda-{backend}-{device_model(numerics.get('device_name') or '')}"
    capability = numerics.get("compute_capability")
    return f"{base}-sm{capability.replace('.', '')}" if capability else base


def cpu_kind(hardware: dict) -> str:
    """``amd25``: the CPU vendor and family (one microarchitecture generation, roughly)."""
    vendor = str(hardware.get("cpu_vendor") or "cpu").lower()
    vendor = VENDORS.get(vendor, slug(vendor).replace("-", "") or "cpu")
    family = slug(str(hardware.get("cpu_family") or "")).replace("-", "")
    return f"{vendor}{family}"


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
