"""Run folders: manifest, tables and summary, all written atomically.

Layout of ``results/<run_id>/``:

```text
manifest.json        config, versions, git revision, hardware, topology
iterations.parquet   one row per (iteration, rank): phase seconds, bytes per link, loss, ...
evals.parquet        one row per evaluation: accuracy, elapsed seconds, cumulative bytes
layers.parquet       (PruneX) per-layer residuals, penalties, density per round
summary.json         the keys ``bench compare`` and ``bench report`` read
parts/               per-rank rows streamed while a run is live (a chunk file every few
                     seconds); merged into the tables and removed at the end
errors/              on failure: one file per failing rank, first line = the reason
checkpoints/         with --checkpoint-every/--checkpoint-minutes: the newest complete
                     checkpoint (suite.run.checkpoint) and latest.json naming it
```

Every file is written to a temporary name and renamed, so a reader never sees half a file.
The summary carries the run's identity (method, workload, ranks, options) and ``running``
from before the ranks start, then ``ok``, ``failed`` or ``interrupted`` (with the reason). A
run killed too hard to say anything keeps ``running``; ``bench recover`` finalizes it once its
processes are gone (``suite.results.recover``), and readers treat it as failed.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pandas as pd
import torch

from suite import compat
from suite.results import records, schema
from suite.results.records import read_record
from suite.results.schema import ENDED, Status

TABLES = schema.TABLES


def setting_of(summary: dict, manifest: dict) -> str:
    """Where a run's times come from: ``real``, ``emulated RATE`` or ``sim PROFILE``. Runs of
    different settings are never compared or drawn as one line."""
    if summary.get(schema.SIMULATED):
        profile = (manifest.get(schema.SIMULATION) or {}).get(schema.PROFILE) or {}
        return f"sim {profile.get(schema.PROFILE_NAME, '?')}"
    network = manifest.get(schema.NETWORK) or {}
    if network.get(schema.NETWORK_MODE) == "emulated":
        return f"emulated {network.get(schema.INTER_BW, '?')}"
    return "real"


def make_run_id(method: str, workload: str, gpus: int) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{method}-{id_part(workload)}-{gpus}g-{secrets.token_hex(2)}"


def id_part(name: str) -> str:
    """``timm:cspresnet50`` as a run id shows it (``timm_cspresnet50``): a folder name of
    letters, digits, '.', '_' and '-'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def identity_summary(config) -> dict:
    """The keys that say which run a folder holds, written before any rank starts, so a run
    killed at any point is still listed and compared (as failed) under its own name."""
    return {
        schema.FORMAT_VERSION_KEY: schema.FORMAT_VERSION,
        schema.RUN_ID: config.run_id,
        schema.STATUS: Status.RUNNING,
        schema.ERROR: None,
        schema.METHOD: config.method,
        schema.WORKLOAD: config.workload,
        schema.GPUS: config.gpus,
        schema.GPUS_PER_NODE: config.gpus_per_node,
        schema.OPTIONS: config.options,
        schema.SEED: config.seed,
        schema.LAUNCHER: {schema.LAUNCHER_HOST: socket.gethostname(),
                          schema.LAUNCHER_PID: os.getpid()},
        schema.STARTED: time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` into a hidden temporary beside ``path``, renamed into place once
    whole; a write that fails (a full disk) leaves ``path`` as it was and no temporary."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise


def atomic_write_bytes(path: Path, data: bytes) -> None:
    atomic_write(path, lambda tmp: tmp.write_bytes(data))


def write_json(path: Path, obj) -> None:
    atomic_write_bytes(
        path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    )


def write_json_in_place(path: Path, obj) -> None:
    """``obj`` into ``path`` over its old content, for a disk too full for ``write_json``'s
    temporary: the old file's blocks are freed by the truncation and taken by the new."""
    data = (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    with open(path, "r+b") as handle:
        handle.truncate(0)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def os_reason(exc: OSError) -> str:
    """``no space left on device``: an OSError's reason in words."""
    if exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__


def write_table(path: Path, rows: list[dict] | pd.DataFrame) -> None:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def write_torch(path: Path, obj) -> None:
    atomic_write(path, lambda tmp: torch.save(obj, tmp))


def git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def hardware() -> dict:
    """The machine a rank ran on, with what makes its numbers bit-identical to another's: the
    CPU (vendor, family, model name), the CPU kernels torch dispatches to
    (``torch.backends.cpu.get_cpu_capability()``, which ``ATEN_CPU_CAPABILITY`` lowers), and
    the threads of this rank (suite.results.machine names the class from them)."""
    info = {
        schema.PLATFORM: platform.platform(),
        schema.PROCESSOR: platform.processor() or platform.machine(),
        schema.CPU_COUNT: os.cpu_count(),
        **cpu_identity(),
        schema.CPU_CAPABILITY: torch.backends.cpu.get_cpu_capability(),
        schema.THREADS_PER_RANK: torch.get_num_threads(),
        schema.CUDA_DEVICES: [],
    }
    if torch.cuda.is_available():
        info[schema.CUDA_DEVICES] = [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ]
    return info


def cpu_identity() -> dict:
    """``cpu_vendor``, ``cpu_family`` and ``cpu_model_name`` of the first processor in
    /proc/cpuinfo (x86: vendor_id, cpu family, model name; Arm: CPU implementer, CPU part);
    the machine's architecture where there is no /proc/cpuinfo."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if not key and fields:
                break  # the end of the first processor
            fields.setdefault(key, value.strip())
    except OSError:
        pass
    vendor = fields.get("vendor_id") or fields.get("CPU implementer") or platform.machine()
    family = fields.get("cpu family") or fields.get("CPU part") or ""
    name = fields.get("model name") or fields.get("Model name") or platform.processor()
    return {schema.CPU_VENDOR: vendor, schema.CPU_FAMILY: family, schema.CPU_MODEL_NAME: name}


def versions() -> dict:
    """The software a number depends on. timm and torchvision are read from their installed
    metadata, not imported: importing them costs each rank ~1.7 s of CPU (timm pulls in
    torch._dynamo), and a run of a built-in CNN needs neither."""
    return {
        schema.PYTHON_VERSION: platform.python_version(),
        schema.TORCH_VERSION: torch.__version__,
        schema.TORCHVISION_VERSION: installed_version("torchvision"),
        schema.TIMM_VERSION: installed_version("timm"),
        schema.PANDAS_VERSION: pd.__version__,
        schema.CUDA_VERSION: torch.version.cuda,
        schema.CUDA_DRIVER_VERSION: driver_version(),
        schema.CUDNN_VERSION: (torch.backends.cudnn.version()
                               if torch.backends.cudnn.is_available() else None),
        schema.NCCL_VERSION: nccl_version(),
        # the APIs newer than the supported floor that this torch lacks (suite.compat)
        schema.TORCH_FALLBACKS: compat.fallbacks(),
    }


def installed_version(distribution: str) -> str | None:
    """A distribution's installed version, or None where it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver's version (``570.124.06``), or None without a GPU: a re-imaged
    machine's new driver can move a GPU class's numbers as a new torch does. Read from
    ``nvidia-smi``, which every driver installs (torch exposes only the CUDA API level)."""
    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        return None
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        found = subprocess.run(query, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = found.stdout.split()
    return lines[0] if found.returncode == 0 and lines else None


def nccl_version() -> str | None:
    """The NCCL torch was built with, or None where it has none."""
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return None


def numerics(device: torch.device) -> dict:
    """What a GPU number depends on beyond the code: the device, and the switches that trade
    exactness for speed (TF32) or speed for reproducibility (determinism)."""
    facts = {
        schema.DEVICE: str(device),
        schema.DETERMINISTIC_ALGORITHMS: torch.are_deterministic_algorithms_enabled(),
        schema.DETERMINISTIC_WARN_ONLY: torch.is_deterministic_algorithms_warn_only_enabled(),
        schema.FLOAT32_MATMUL_PRECISION: torch.get_float32_matmul_precision(),
        schema.TF32_MATMUL: torch.backends.cuda.matmul.allow_tf32,
        schema.TF32_CUDNN: torch.backends.cudnn.allow_tf32,
        schema.CUDNN_DETERMINISTIC: torch.backends.cudnn.deterministic,
        schema.CUDNN_BENCHMARK: torch.backends.cudnn.benchmark,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts.update(device_name=props.name, device_memory_bytes=props.total_memory,
                     compute_capability=f"{props.major}.{props.minor}")
    return facts


#: the files of a run folder that say what the run was and how it ended
MANIFEST, SUMMARY = "manifest.json", "summary.json"


class RunFolder:
    """A run's folder: every reader and writer of its files goes through here."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @property
    def parts(self) -> Path:
        return self.path / "parts"

    @property
    def errors(self) -> Path:
        return self.path / "errors"

    def empty(self) -> None:
        """Remove the run's records (--overwrite); a SLURM job's script and log stay, and so
        does its owner file (suite.results.lock: the process emptying it holds it)."""
        if not self.path.is_dir():
            return
        for entry in self.path.iterdir():
            if entry.name in ("job.sbatch", "owner.json") or entry.name.startswith("slurm-"):
                continue  # the job's own files; the owner, who empties it
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def create(self) -> RunFolder:
        self.parts.mkdir(parents=True, exist_ok=True)
        return self

    # -- per-rank parts -----------------------------------------------------------------
    def write_rank_chunk(self, rank: int, chunk: int, tables: dict[str, list[dict]]) -> None:
        """One flush of one rank: a whole parquet file per table, named so that no two
        processes (restarts, resumes) ever write the same file."""
        self.parts.mkdir(parents=True, exist_ok=True)
        for table, rows in tables.items():
            name = f"{table}-rank{rank:05d}-p{os.getpid()}-{chunk:06d}.parquet"
            write_table(self.parts / name, rows)

    def flush_rows(self, recorder) -> None:
        """Write ``recorder``'s rows that are not on disk yet (one atomic file per table)."""
        chunk, tables = recorder.take_unflushed()
        if tables:
            self.write_rank_chunk(recorder.rank, chunk, tables)

    def merge_parts(self) -> list[str]:
        """Fold the per-rank chunks into the final tables, after the rows already there
        (idempotent, re-runnable); returns a line per chunk that could not be read."""
        if not self.parts.exists():
            return []
        unreadable = []
        for table in TABLES:
            frames = [self.table(table)] if (self.path / f"{table}.parquet").exists() else []
            for file in sorted(self.parts.glob(f"{table}-rank*.parquet")):
                try:
                    frames.append(pd.read_parquet(file))
                except (OSError, ValueError) as exc:
                    unreadable.append(f"{file}: {type(exc).__name__}")
            frames = [f for f in frames if f is not None]
            if frames:
                write_table(self.path / f"{table}.parquet", sort_rows(pd.concat(frames)))
        shutil.rmtree(self.parts, ignore_errors=True)
        return unreadable

    def truncate(self, iterations_done: int) -> None:
        """Drop every row of iteration ``iterations_done`` or later: a resumed run writes
        them again, as an uninterrupted run would have."""
        self.merge_parts()
        for table in TABLES:
            frame = self.table(table)
            if frame is not None and schema.ITERATION in frame:
                write_table(
                    self.path / f"{table}.parquet", frame[frame.iteration < iterations_done]
                )

    # -- summary and manifest -------------------------------------------------------------
    def summary(self) -> dict | None:
        """The summary, None when there is none; one that is not a valid summary
        (suite.results.records) raises DamagedFile, a ValueError naming the field."""
        try:
            return read_record(self.path / SUMMARY, records.Summary, what="summary")
        except FileNotFoundError:
            return None

    def manifest(self) -> dict | None:
        """The manifest, None when there is none; one that is not a valid manifest raises
        DamagedFile, a ValueError naming the field."""
        try:
            return read_record(self.path / MANIFEST, records.Manifest, what="manifest")
        except FileNotFoundError:
            return None

    @property
    def has_manifest(self) -> bool:
        return (self.path / MANIFEST).is_file()

    def write_manifest(self, manifest: dict) -> None:
        write_json(self.path / MANIFEST, manifest)

    def write_summary(self, summary: dict) -> None:
        write_json(self.path / SUMMARY, summary)

    def mark_failed(self, error: str, status: str = Status.FAILED, **known) -> list[str]:
        """Record a failure (or an interruption) without losing rows the ranks flushed;
        returns what could not be written (a full disk: the rows stay in ``parts/``, counted,
        and the summary is rewritten in the place of the old one).

        ``known`` adds identifying keys (method, workload, gpus, ...) so a failed run still
        shows up, as failed, in listings and comparisons.

        Raises:
            OSError: not even the summary could be written (a read-only folder).
        """
        unwritten = []
        try:
            self.merge_parts()
        except OSError as exc:
            unwritten.append(f"the rows in {self.parts.name}/ stay unmerged ({os_reason(exc)})")
        try:
            current = self.summary() or {}
        except (OSError, ValueError):  # damaged: kept aside, the failure recorded anew
            current = {}
            try:
                os.replace(self.path / SUMMARY, self.path / f"{SUMMARY}.damaged")
            except OSError:
                pass
        summary = {**known, **current}
        if summary.get(schema.STATUS) in ENDED and summary.get(schema.ERROR):
            return unwritten  # the ranks already said why
        summary.update({schema.STATUS: status, schema.ERROR: error,
                        schema.ENDED_AT: time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        recorded = self.iterations_recorded()
        if recorded:
            summary[schema.ITERATIONS_RECORDED] = recorded
        try:
            self.write_summary(summary)
        except OSError as exc:  # no room for a second copy: the old file's own blocks
            write_json_in_place(self.path / SUMMARY, summary)
            unwritten.append(f"the summary was rewritten in place ({os_reason(exc)})")
        return unwritten

    def first_rank_error(self) -> str | None:
        """The first line each rank wrote about its ending (``errors/rank*.txt``); a rank's
        own words (a BenchError, an interruption) beat a knock-on ``rank N: ...``. An empty
        or unreadable file (a rank that could not write: a full disk) says nothing."""
        messages = []
        for path in sorted(self.errors.glob("rank*.txt")):
            try:
                lines = [line for line in path.read_text(errors="replace").splitlines() if line]
            except OSError:
                continue
            if lines:
                messages.append(lines[0])
        own = [m for m in messages if not m.startswith("rank ")]
        return (own or messages or [None])[0]

    def iterations_recorded(self) -> int:
        """Iterations with rows on disk, merged or still in ``parts/``."""
        frames = []
        if (self.path / "iterations.parquet").exists():
            frames.append(pd.read_parquet(self.path / "iterations.parquet",
                                          columns=[schema.ITERATION]))
        for file in sorted(self.parts.glob("iterations-rank*.parquet")) if self.parts.exists() \
                else []:
            try:
                frames.append(pd.read_parquet(file, columns=[schema.ITERATION]))
            except (OSError, ValueError):
                pass
        return int(pd.concat(frames)[schema.ITERATION].nunique()) if frames else 0

    def table(self, name: str) -> pd.DataFrame | None:
        path = self.path / f"{name}.parquet"
        return pd.read_parquet(path) if path.exists() else None


def sort_rows(frame: pd.DataFrame) -> pd.DataFrame:
    keys = [k for k in (schema.ITERATION, schema.RANK) if k in frame.columns]
    if keys:
        frame = frame.sort_values(keys, kind="stable")
    return frame.reset_index(drop=True)
