"""Run folders: manifest, tables and summary, all written atomically.

Layout of ``results/<run_id>/``:

```text
manifest.json        config, versions, git revision, hardware, topology
iterations.parquet   one row per (iteration, rank): phase seconds, bytes per link, loss, ...
evals.parquet        one row per evaluation: accuracy, elapsed seconds, cumulative bytes
layers.parquet       (PruneX) per-layer residuals, penalties, density per round
summary.json         the keys ``bench compare`` and ``bench report`` read
parts/               per-rank rows streamed while a run is live (a chunk file every few
                     seconds, named with its attempt's token); merged into the tables and
                     removed at the end
refused/             chunks of another attempt or run found in parts/: kept, never merged
errors/              on failure: one file per failing rank, first line = the reason
checkpoints/         with --checkpoint-every/--checkpoint-minutes: the newest complete
                     checkpoint (suite.run.checkpoint) and latest.json naming it
```

Every file is written to a temporary name and renamed, so a reader never sees half a file,
and a link in the folder is replaced, never written through: the one write in place (a summary
on a disk too full for a second copy) opens the file without following links. A folder
holding links is refused (``refuse_links``) by whatever would write into it.
The summary carries the run's identity (method, workload, ranks, options) and ``running``
from before the ranks start, then ``ok``, ``failed`` or ``interrupted`` (with the reason). A
run killed too hard to say anything keeps ``running``; ``bench recover`` finalizes it once its
processes are gone (``suite.results.recover``), and readers treat it as failed.
"""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import platform
import re
import secrets
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Collection
from pathlib import Path

import pandas as pd
import torch

from suite import compat
from suite.errors import LINE_LIMIT, BenchError, clipped, os_reason
from suite.processes import start_time
from suite.results import records, schema
from suite.results.chunks import REFUSED, chunk_attempt, combined, foreign_line
from suite.results.ending import Ending
from suite.results.records import read_bytes, read_json_file, read_record
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
                          schema.LAUNCHER_PID: os.getpid(),
                          schema.LAUNCHER_STARTED: start_time(os.getpid())},
        schema.STARTED: time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def atomic_write(path: Path, write) -> None:
    """``write(tmp)`` into a hidden temporary beside ``path``, renamed into place once
    whole; a write that fails (a full disk) leaves ``path`` as it was and no temporary. The
    temporary is made anew (a leftover, or a link planted under its name, removed first), so
    nothing is written through a link; the rename replaces a link at ``path`` itself."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666))
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
    temporary: the old file's blocks are freed by the truncation and taken by the new. Only a
    regular file with no other name is rewritten: a symbolic link is not followed
    (``O_NOFOLLOW``) and a hard link not written through, since either would rewrite a file
    elsewhere, outside the run folder.

    Raises:
        OSError: the file is a link (or not there, or not writable); nothing was written.
    """
    data = (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode()
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(f"{path} is a symbolic link: not written through") from None
        raise
    with os.fdopen(fd, "r+b") as handle:
        facts = os.fstat(fd)
        if not stat.S_ISREG(facts.st_mode) or facts.st_nlink != 1:
            raise OSError(f"{path} is not a file of its own (a link or a device): not "
                          "written through")
        handle.truncate(0)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def write_table(path: Path, rows: list[dict] | pd.DataFrame) -> None:
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(rows)
    atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))


def write_arrow(path: Path, rows) -> None:
    """An Arrow table (``combined``) as a parquet file, atomically."""
    # lazy: pyarrow's own import is pandas' to pay where it writes parquet; here only merges
    import pyarrow.parquet as pq

    atomic_write(path, lambda tmp: pq.write_table(rows, tmp))


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
        #: the token of the attempt this process writes for (``open_attempt``), which the rows
        #: it streams carry; None where it writes no rows
        self.attempt: str | None = None

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

    def refuse_links(self) -> None:
        """Refuse a folder that holds a symbolic link anywhere inside it: a write to one of its
        files would land wherever the link points, outside the run (the folder itself may be
        reached through links: its path is the user's). Inside the SLURM job's folders
        (``slurm-*``) submitit keeps links of its own (``.submission_file_*.sh``): the suite
        writes nothing there, so only the folders themselves are checked.

        Raises:
            BenchError: naming the first link found and where it points.
        """
        for root, folders, files in os.walk(self.path):
            for name in (*folders, *files):
                entry = Path(root) / name
                if entry.is_symlink():
                    target = clipped(os.readlink(entry), 120)
                    raise BenchError(
                        f"run folder {self.path} holds a link, {entry.relative_to(self.path)} "
                        f"-> {target}: refused, nothing is written through it (a run folder's "
                        "files are its own; put the file itself there)")
            if Path(root) == self.path:
                folders[:] = [name for name in folders if not name.startswith("slurm-")]

    # -- attempts ---------------------------------------------------------------------------
    def attempts(self) -> list[str]:
        """The tokens of the attempts that opened this folder, the latest last; [] for a
        folder from before attempts were recorded, or whose summary cannot say."""
        found = self.liveness().get(schema.ATTEMPTS)
        return [t for t in found if isinstance(t, str)] if isinstance(found, list) else []

    def open_attempt(self, opening: dict, *, keep: bool) -> str:
        """A new attempt of the run opens the folder (its launcher, or a job's rank 0, holding
        the folder once the earlier attempt's processes are known to be gone): with ``keep``
        (a resume, a restart) the rows earlier attempts left in ``parts/`` are merged, their
        errors filed (``file_errors``) and the summary is kept under ``opening``'s keys; the
        recorded processes are cleared (none of them may be signalled for this attempt) and
        a new token is added, which this attempt's rows carry. Returns the token."""
        earlier: dict = {}
        history = self.attempts() if keep else []
        if keep:
            try:
                earlier = self.summary() or {}
            except (OSError, ValueError):  # damaged: kept aside, the attempt opens anew
                self.set_damaged_summary_aside()
            self.merge_parts(accept=history)
            self.file_errors()
        self.attempt = secrets.token_hex(4)
        self.write_summary({**earlier, **opening, schema.PROCESSES: [],
                            schema.ATTEMPTS: [*history, self.attempt]})
        return self.attempt

    def foreign_parts(self, accept: Collection[str]) -> list[Path]:
        """The chunks in ``parts/`` whose rows are not of ``accept``'s attempts (a rank of an
        earlier attempt writing late, another run's rows); none where ``accept`` is empty (a
        folder from before attempts, whose chunks carry none)."""
        if not accept or not self.parts.is_dir():
            return []
        return [file for file in sorted(self.parts.glob("*-rank*.parquet"))
                if chunk_attempt(file.name) not in accept]

    def describe_foreign(self, files: list[Path]) -> str:
        """One line about ``files`` (``foreign_parts``): how many, of whose attempt."""
        return foreign_line(files, self.attempts())

    # -- per-rank parts -----------------------------------------------------------------
    def write_rank_chunk(self, rank: int, chunk: int, tables: dict[str, list[dict]]) -> None:
        """One flush of one rank: a whole parquet file per table, named so that no two
        processes (restarts, resumes) ever write the same file."""
        self.parts.mkdir(parents=True, exist_ok=True)
        attempt = f"-a{self.attempt}" if self.attempt else ""
        for table, rows in tables.items():
            name = f"{table}-rank{rank:05d}{attempt}-p{os.getpid()}-{chunk:06d}.parquet"
            write_table(self.parts / name, rows)

    def flush_rows(self, recorder) -> None:
        """Write ``recorder``'s rows that are not on disk yet (one atomic file per table)."""
        chunk, tables = recorder.take_unflushed()
        if tables:
            self.write_rank_chunk(recorder.rank, chunk, tables)

    def merge_parts(self, accept: Collection[str] | None = None) -> list[str]:
        """Fold the per-rank chunks of ``accept``'s attempts (default: the latest) into the
        final tables, after the rows already there (idempotent, re-runnable). A chunk of any
        other attempt is refused, moved to ``refused/``: a rank of an earlier attempt that
        went on writing, or another run's rows, never become this run's duplicates.

        Returns:
            A line per chunk that could not be read, and one about the refused chunks.

        Raises:
            BenchError: the rows do not fit one table (nothing was changed).
        """
        if not self.parts.exists():
            return []
        accept = self.attempts()[-1:] if accept is None else accept
        refused = self.foreign_parts(accept)
        lines = [f"{self.describe_foreign(refused)}: refused, kept in refused/"] if refused else []
        if refused:
            (self.path / REFUSED).mkdir(exist_ok=True)
            for file in refused:
                os.replace(file, self.path / REFUSED / file.name)
        merged, unreadable = {}, []
        for table in TABLES:
            frames = [self.table(table)] if (self.path / f"{table}.parquet").exists() else []
            for file in sorted(self.parts.glob(f"{table}-rank*.parquet")):
                try:
                    frames.append(pd.read_parquet(file))
                except (OSError, ValueError) as exc:
                    unreadable.append(f"{file}: {type(exc).__name__}")
            frames = [f for f in frames if f is not None]
            if frames:
                merged[table] = combined(frames, table)
        for table, rows in merged.items():
            write_arrow(self.path / f"{table}.parquet", rows)
        shutil.rmtree(self.parts, ignore_errors=True)
        return unreadable + lines

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

    def liveness(self) -> dict:
        """The summary as JSON, not validated: what says which processes may still write the
        folder (launcher, processes, attempts; each caller checks the entries it uses). A
        summary damaged elsewhere (a bad metric) must not hide a live run. {} when there is
        no readable JSON object."""
        try:
            found = read_json_file(self.path / SUMMARY, what="summary")
        except (OSError, ValueError):
            return {}
        return found if isinstance(found, dict) else {}

    def set_damaged_summary_aside(self) -> None:
        """Move a damaged summary to ``summary.json.damaged`` (kept for whoever looks), so
        the next write starts a valid one."""
        try:
            os.replace(self.path / SUMMARY, self.path / f"{SUMMARY}.damaged")
        except OSError:
            pass

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

    def record_ending(self, ending: Ending, **known) -> list[str]:
        """Record how a run that did not finish ended (the one writer of an ``Ending``, for
        ranks, launchers and ``bench recover`` alike) without losing rows the ranks flushed;
        returns what could not be written (a full disk: the rows stay in ``parts/``, counted,
        and the summary is rewritten in the place of the old one). A summary that already
        says how the run ended, and why, is kept: the first to say it is right.

        ``known`` adds identifying keys (method, workload, gpus, ...) so a failed run still
        shows up, as failed, in listings and comparisons.

        Raises:
            OSError: not even the summary could be written (a read-only folder).
        """
        unwritten = []
        try:
            unwritten += [line for line in self.merge_parts() if line.endswith("refused/")]
        except OSError as exc:
            unwritten.append(f"the rows in {self.parts.name}/ stay unmerged ({os_reason(exc)})")
        except BenchError as exc:
            unwritten.append(f"the rows in {self.parts.name}/ stay unmerged ({exc})")
        try:
            current = self.summary() or {}
        except (OSError, ValueError):  # damaged: kept aside, the failure recorded anew
            current = {}
            self.set_damaged_summary_aside()
        summary = {**known, **current}
        if summary.get(schema.STATUS) in ENDED and summary.get(schema.ERROR):
            return unwritten  # the ranks already said why
        summary.update({schema.STATUS: ending.status, schema.ERROR: ending.reason,
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

    def file_errors(self) -> None:
        """The earlier attempt's ``errors/`` filed under ``attempts/NN``: a new attempt's
        failure is said in its own words, never in those of the attempt before it."""
        if self.errors.exists():
            attempts = self.path / "attempts"
            attempts.mkdir(exist_ok=True)
            self.errors.rename(attempts / f"{len(list(attempts.iterdir())):02d}")

    def write_rank_error(self, rank: int, text: str) -> None:
        """``errors/rankNNNNN.txt``: why a rank ended, its first line the reason (written
        atomically: never through a link, never half)."""
        self.errors.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(self.errors / f"rank{rank:05d}.txt", text.encode())

    def first_rank_error(self) -> str | None:
        """The first line each rank wrote about its ending (``errors/rank*.txt``); a rank's
        own words (a BenchError, an interruption) beat a knock-on ``rank N: ...``. An empty
        or unreadable file (a rank that could not write: a full disk) says nothing; a line is
        read from the file's start only and bounded (it becomes the run's one error line)."""
        messages = []
        for path in sorted(self.errors.glob("rank*.txt")):
            try:  # a FIFO planted there must not hang the run's ending
                head = read_bytes(path, limit=ERROR_HEAD_BYTES, head=True).decode(
                    errors="replace")
            except (OSError, ValueError):
                continue
            lines = [line for line in head.splitlines() if line.strip()]
            if lines:
                messages.append(clipped(lines[0], LINE_LIMIT))
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


#: how much of a rank's errors file is read for its first line
ERROR_HEAD_BYTES = 64 * 1024
