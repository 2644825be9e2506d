"""The kind of machine a run's numbers come from (``cpu-gloo-amd25-avx512-t1``,
``cuda-nccl-h100-sm90``).

A class names what makes runs bit-identical, or at least numerically alike: on CPU ranks the
CPU vendor and family, the kernels torch dispatches to (its CPU capability: ``avx512``,
``avx2``) and the threads per rank; on CUDA the device model and its compute capability; and
the collective backend. Under torch's portable kernels (``ATEN_CPU_CAPABILITY=default``) the
vendor stops mattering at the gate's thresholds (an Intel Xeon's nightly against an AMD
EPYC's: 0 regressions over eleven methods), so that class names no vendor:
``cpu-gloo-portable-t1``, a class any CPU runner can join. Ranks sharing one GPU (a lent
machine of one GPU running the nightly's 4 ranks) are a class of their own, ``-x<ranks per
GPU>`` after the compute capability: their collectives run on gloo through the host and their
kernels contend for one device. A nightly compares
against the reference recorded on its own class (``reference/<class>/``), never a
run against a reference of other kernels: on another CPU generation a tenth of an epoch moves
a method's accuracy by as much as a change of seed. Runs recorded before the class named
these (``cpu-gloo``, ``cuda-nccl-h100``) keep the short name they had.
"""

from __future__ import annotations

import re

import torch

from suite.results import schema

#: how a class name starts; a folder whose subfolders are named so is a tree of references
CLASS_PATTERN = re.compile(r"^(cpu|cuda)-[a-z0-9]+(-[a-z0-9._]+)*$")
#: torch's portable CPU kernels, as ``get_cpu_capability()`` names them (lowered)
PORTABLE_CAPABILITY = "default"
#: /proc/cpuinfo vendor ids as a class names them
VENDORS = {"authenticamd": "amd", "genuineintel": "intel", "hygongenuine": "hygon",
           "0x41": "arm", "0x61": "apple", "0x48": "hisilicon"}


def machine_class(manifest: dict) -> str:
    """``cpu-gloo-amd25-avx512-t1`` (device kind, backend, CPU vendor and family, torch's CPU
    capability, threads per rank); ``cuda-nccl-h100-sm90`` (device kind, backend, device
    model, compute capability); ``cuda-gloo-h200-sm90-x4`` for 4 ranks sharing each GPU;
    ``sim-<profile>`` for simulated runs, whose numbers come from
    a profile, not a machine; ``cpu-gloo-portable-t1`` for CPU ranks on the portable kernels,
    whatever the vendor. A manifest recorded before these were (no CPU capability, no compute
    capability) gets the short class it had then."""
    if manifest.get(schema.SIMULATED):
        profile = ((manifest.get(schema.SIMULATION) or {}).get(schema.PROFILE) or {}).get(
            schema.PROFILE_NAME) or "profile"
        return f"sim-{slug(str(profile))}"
    device = str(manifest.get(schema.DEVICE) or "cpu").split(":")[0]
    backend = str(manifest.get(schema.BACKEND) or "gloo")
    hardware = manifest.get(schema.HARDWARE) or {}
    if device != "cuda":
        capability = slug(str(hardware.get(schema.CPU_CAPABILITY) or ""))
        if not capability:
            return f"{device}-{backend}"
        threads = f"t{hardware.get(schema.THREADS_PER_RANK, 1)}"
        if capability == PORTABLE_CAPABILITY:
            return f"{device}-{backend}-portable-{threads}"
        return f"{device}-{backend}-{cpu_kind(hardware)}-{capability}-{threads}"
    numerics = manifest.get(schema.NUMERICS) or {}
    base = f"cuda-{backend}-{device_model(numerics.get(schema.DEVICE_NAME) or '')}"
    capability = numerics.get(schema.COMPUTE_CAPABILITY)
    if capability:
        base = f"{base}-sm{capability.replace('.', '')}"
    sharing = int((manifest.get(schema.GPU_SHARING) or {}).get(schema.RANKS_PER_GPU) or 1)
    return f"{base}-x{sharing}" if sharing > 1 else base


def ranks_on_cuda(device: str, gpus: int, visible: int | None = None) -> bool:
    """Where ``gpus`` local ranks asking for ``device`` (auto, cpu, cuda) run, the one rule
    the launcher, the preflight, the simulator's calibration and the nightly's class share:
    ``cuda`` on the GPUs (shared round-robin when fewer), ``auto`` on CUDA only when there
    is a GPU per rank. ``visible``: the GPUs to count (default: this machine's)."""
    if device != "auto":
        return device == "cuda"
    return (torch.cuda.device_count() if visible is None else visible) >= gpus


def ranks_per_gpu(local_ranks: int, gpus: int) -> int:
    """How many of a machine's ranks share one GPU when they are placed round-robin (rank
    ``r`` on GPU ``r % gpus``): 1 means every rank has its own."""
    return -(-local_ranks // max(gpus, 1))


def backend_for(device: torch.device, sharing: int) -> str:
    """NCCL when the rank's GPU is its own (``sharing`` 1); gloo on CPU ranks and on shared
    GPUs (NCCL refuses two ranks on one device; gloo moves CUDA tensors through the host)."""
    return "nccl" if device.type == "cuda" and sharing == 1 else "gloo"


def gpu_class(facts: dict, local_ranks: int, gpus: int) -> str:
    """The class of ``local_ranks`` CUDA ranks placed round-robin on ``gpus`` GPUs described
    by ``facts`` (``suite.results.folder.numerics`` of one of them): NCCL when each rank has
    its own GPU, gloo (and ``-x<ranks per GPU>``) when they share."""
    sharing = ranks_per_gpu(local_ranks, gpus)
    backend = backend_for(torch.device("cuda"), sharing)
    return machine_class({schema.DEVICE: "cuda", schema.BACKEND: backend, schema.NUMERICS: facts,
                          schema.GPU_SHARING: {schema.RANKS_PER_GPU: sharing}})


def cpu_kind(hardware: dict) -> str:
    """``amd25``: the CPU vendor and family (one microarchitecture generation, roughly)."""
    vendor = str(hardware.get(schema.CPU_VENDOR) or "cpu").lower()
    vendor = VENDORS.get(vendor, slug(vendor).replace("-", "") or "cpu")
    family = slug(str(hardware.get(schema.CPU_FAMILY) or "")).replace("-", "")
    return f"{vendor}{family}"


def device_model(name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100``; ``Tesla V100-SXM2-32GB`` -> ``v100``; else the
    name as a slug."""
    match = re.search(r"\b([A-Z]{1,3}\d{2,4}[A-Z]?)\b", name.replace("-", " "))
    return match.group(1).lower() if match else slug(name) or "gpu"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-")
