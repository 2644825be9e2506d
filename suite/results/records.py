"""The files the suite reads back, each read through one validated reader (asv validates a
results file once where it is loaded; readers here trusted whatever a field held).

A run folder, a history, a reference's ``gate.json`` and ``class.json``, a simulator profile
and an experiment file are input: copied, edited by hand, damaged by a full disk, or crafted.
Each file the suite reads back is declared as a typed record (pydantic, strict: a JSON string
is never read as a number) whose fields are the schema's names (``suite.results.schema``;
tests/results/test_records.py holds every declared key to a type), and read by
``read_record``: regular files only (a FIFO would hang a report, ``/dev/zero`` would never
end), a bounded size, JSON text, then the record's types and ranges. What is wrong is one
line naming the file, the field and what it should be (``DamagedFile``, a ValueError, so the
readers that list a damaged file and go on keep doing so). The record's dict is returned as
the file holds it: readers keep reading by the schema's names.

This module declares the run folder's files; the gate's files (``suite.gate.reference``,
``suite.gate.trend``) and the simulator's profiles (``suite.sim.profile``) declare theirs with
the same pieces.
"""

from __future__ import annotations

import json
import math
import os
import stat
import types
import typing
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    create_model,
)

from suite.config import MAX_RANKS, MAX_SEED, RunConfig
from suite.errors import QUOTE_LIMIT, one_line, os_reason
from suite.results import schema
from suite.results.schema import Status

#: the largest file each kind of record may be (a summary of 64 ranks is ~10 kB, a manifest
#: ~20 kB, a history of years of nightlies a few MB): beyond it a file is not what it claims
MAX_RECORD_BYTES = 16 << 20
MAX_HISTORY_BYTES = 256 << 20
#: the longest name (method, workload, host, run id) a record may hold: a file name's limit
MAX_NAME = 255
#: the longest free text (an error, a warning, a path)
MAX_TEXT = 10_000


class DamagedFile(ValueError):
    """A file the suite reads back is not what it should be: ``path: problem``, one line
    naming the file, the field and what it should hold.

    Attributes:
        path: the file.
        problem: what is wrong with it (``gpus: should be a valid integer (got 'abc')``).
    """

    def __init__(self, path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


# -- the kinds of values a record holds ----------------------------------------------------------
def _finite_or_nan_at_least(least: float, *, above: bool = False):
    """A number at least (above) ``least``, or NaN (a mean of no rows is written as NaN)."""

    def check(value: float) -> float:
        if math.isnan(value):
            return value
        if math.isinf(value) or value < least or (above and value == least):
            raise ValueError(f"should be a finite number {'above' if above else 'of at least'} "
                             f"{least:g}")
        return value

    return AfterValidator(check)


Text = Annotated[str, StringConstraints(max_length=MAX_TEXT)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]
Count = Annotated[int, Field(ge=0, le=2**62)]
Positive = Annotated[int, Field(ge=1, le=2**62)]
Ranks = Annotated[int, Field(ge=1, le=MAX_RANKS)]
Rank = Annotated[int, Field(ge=0, lt=MAX_RANKS)]
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
Number = float  # any float, NaN and infinities included (a loss may diverge)
NonNegative = Annotated[float, _finite_or_nan_at_least(0.0),
                        Field(json_schema_extra={"minimum": 0})]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Seconds = NonNegative
Texts = Annotated[list[Text], Field(max_length=MAX_RANKS)]
Names = Annotated[list[Name], Field(max_length=MAX_RANKS)]
Mapping = dict[Annotated[str, StringConstraints(max_length=MAX_NAME)], JsonValue]
#: local steps between exchanges inside a node and across nodes
Exchange = dict[Name, Positive | None]


def record(name: str, fields: dict[str, Any], *, required: tuple[str, ...] = ()) -> type:
    """A strict record type of ``fields`` (key -> annotation): every field may be absent
    (an older format, a run killed before it wrote a key) or null, except ``required``;
    keys not declared are kept (a newer format's, a plugin's)."""
    declared = {key: ((kind, ...) if key in required else (kind | None, None))
                for key, kind in fields.items()}
    return create_model(name, __config__=ConfigDict(strict=True, extra="allow"), **declared)


# -- summary.json ---------------------------------------------------------------------------------
#: summary.json's keys and what each holds (every key of ``schema.SUMMARY_FILE_KEYS``)
SUMMARY_FIELDS: dict[str, Any] = {
    schema.FORMAT_VERSION_KEY: Positive,
    schema.RUN_ID: Name,
    schema.STATUS: Status,
    schema.ERROR: Text,
    schema.METHOD: Name,
    schema.WORKLOAD: Name,
    schema.DATASET: Name,
    schema.GPUS: Ranks,
    schema.NODES: Ranks,
    schema.GPUS_PER_NODE: Ranks,
    schema.OPTIONS: Mapping,
    schema.SEED: Seed,
    schema.LAUNCHER: record("Launcher", {schema.LAUNCHER_HOST: Name,
                                         schema.LAUNCHER_PID: Positive,
                                         schema.LAUNCHER_STARTED: Count}),
    schema.STARTED: Text,
    schema.ENDED_AT: Text,
    # per rank [host, pid, the kernel's start time] ([host, pid] in older folders)
    schema.PROCESSES: Annotated[list[Annotated[list[Name | Count | None], Field(
        min_length=2, max_length=3)]], Field(max_length=MAX_RANKS)],
    schema.ATTEMPTS: Annotated[list[Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8}$")]],
                               Field(max_length=100_000)],
    schema.HOSTS: Names,
    schema.ITERATIONS: Count,
    schema.ITERATIONS_RECORDED: Count,
    schema.STEPS_PER_ITERATION: Positive,
    schema.EXCHANGE_EVERY: Exchange,
    schema.EPOCHS: NonNegative,
    schema.SAMPLES_PER_RANK: Count,
    schema.FINAL_ACCURACY: Fraction,
    schema.FINAL_TRAIN_LOSS: Number,
    schema.BEST_ACCURACY: Fraction,
    schema.TARGET_ACCURACY: Fraction,
    schema.TIME_TO_TARGET_SECONDS: Seconds,
    schema.CONVERGED: bool,
    schema.SIMULATED: bool,
    schema.INTER_NODE_BYTES_TOTAL: NonNegative,
    schema.INTRA_NODE_BYTES_TOTAL: NonNegative,
    schema.HIDDEN_INTER_NODE_BYTES: NonNegative,
    schema.HIDDEN_INTRA_NODE_BYTES: NonNegative,
    schema.INTER_NODE_BYTES_PER_ITERATION: NonNegative,
    schema.WIRE_INTER_BYTES_TOTAL: NonNegative,
    schema.WIRE_TO_ALGORITHMIC_RATIO: NonNegative,
    schema.WIRE_PAYLOAD_TO_ALGORITHMIC_RATIO: Number,
    schema.WALL_SECONDS: Seconds,
    schema.TRAIN_SECONDS: Seconds,
    schema.ITERATION_SECONDS: Seconds,
    schema.PHASE_SECONDS: dict[Name, Number],
    schema.ONE_OFF_SECONDS: dict[Name, Number],
    schema.SETUP_SECONDS: Seconds,
    schema.CONNECT_SECONDS: Seconds,
    schema.WARMUP_SECONDS: Seconds,
    schema.FIRST_ITERATION_SECONDS: Seconds,
    schema.EVALUATION_SECONDS: Seconds,
    schema.SAMPLES_PER_SECOND_PER_RANK: NonNegative,
    schema.WARNINGS: Texts,
    schema.NONDETERMINISTIC_OPS: Texts,
    schema.RESTARTS: Count,
    schema.RESUMED_AT_ITERATION: Count,
    schema.CHECKPOINTS_WRITTEN: Count,
    schema.CHECKPOINT_SECONDS_MEAN: Seconds,
    schema.CHECKPOINT_BYTES: NonNegative,
    schema.MASKS_FROZEN_AT: Mapping,
    schema.ACCURACY_FROM: Text,
}
#: what a summary must say for any reader to place the run (a version-1 summary killed before
#: its identity was written takes these from its manifest first: suite.results.upgrade)
SUMMARY_REQUIRED = (schema.STATUS, schema.METHOD)
Summary = record("Summary", SUMMARY_FIELDS)


# -- manifest.json --------------------------------------------------------------------------------
def _config_fields() -> dict[str, Any]:
    """The manifest's ``config``: RunConfig's fields with their declared types (a tuple is a
    JSON list), so a field RunConfig gains is typed here without a second declaration; the
    fields ``bench run`` bounds (suite.config) within the same bounds."""
    hints = typing.get_type_hints(RunConfig)
    bounded = {schema.SEED: Seed, schema.GPUS: Ranks, schema.GPUS_PER_NODE: Ranks | None}
    fields = {}
    for name, hint in hints.items():
        kind = bounded.get(name, hint)
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            kind = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        if typing.get_origin(kind) is tuple:
            kind = Annotated[list[int], Field(min_length=2, max_length=2)]
        elif kind is dict:
            kind = Mapping
        elif kind is str:
            kind = Text
        fields[name] = kind
    return fields


Recipe = record("Recipe", {
    schema.BATCH_SIZE: Positive, schema.LR: Annotated[float, Field(gt=0, allow_inf_nan=False)],
    schema.MOMENTUM: Annotated[float, Field(ge=0, lt=1)], schema.WEIGHT_DECAY: NonNegative,
    schema.EPOCHS: Annotated[float, Field(gt=0, allow_inf_nan=False)],
    schema.LR_SCHEDULE: Name, schema.WARMUP_EPOCHS: NonNegative,
})
Topology = record("Topology", {
    schema.WORLD_SIZE: Ranks, schema.NUM_NODES: Ranks, schema.GPUS_PER_NODE: Ranks,
    schema.EMULATED_NODES: bool, schema.NODE_RANKS: list[list[Rank]], schema.LEADERS: list[Rank],
    schema.HOSTNAMES: Names, schema.HOSTS: Names, schema.RANKS_PER_HOST: Ranks | Mapping,
    schema.GPUS_PER_NODE_MATCHES_HOSTS: bool,
})
Hardware = record("Hardware", {
    schema.PLATFORM: Text, schema.PROCESSOR: Text, schema.CPU_COUNT: Positive,
    schema.CPU_VENDOR: Text, schema.CPU_FAMILY: Text, schema.CPU_MODEL_NAME: Text,
    schema.CPU_CAPABILITY: Text, schema.THREADS_PER_RANK: Positive, schema.CUDA_DEVICES: Texts,
})
Network = record("Network", {
    schema.NETWORK_MODE: Name, schema.NETWORK_HOSTS: Positive | Names,
    schema.NETWORK_INTERFACE: Text, schema.INTER_BW: Text,
})
Simulation = record("Simulation", {schema.PROFILE: Mapping})
GpuSharing = record("GpuSharing", {schema.LOCAL_RANKS: Ranks, schema.RANKS_PER_GPU: Ranks})
Budget = record("Budget", {schema.BATCH_SIZE: Positive, schema.LOCAL_STEPS_PER_RANK: Count,
                           schema.SAMPLES_PER_RANK: Count})
#: manifest.json's keys and what each holds (every key of ``schema.MANIFEST_FILE_KEYS``)
MANIFEST_FIELDS: dict[str, Any] = {
    schema.FORMAT_VERSION_KEY: Positive,
    schema.RUN_ID: Name,
    schema.CONFIG: record("Config", _config_fields(),
                          required=(schema.METHOD, schema.WORKLOAD, schema.GPUS)),
    schema.PLAN: Mapping,
    schema.METHOD_SETTINGS: Mapping,
    schema.RECIPE: Recipe,
    schema.PLANNED_ITERATIONS: Count,
    schema.BUDGET: Budget,
    schema.STEPS_PER_ITERATION: Positive,
    schema.EXCHANGE_EVERY: Exchange,
    schema.OVERLAPPED_PHASES: Names,
    schema.STEPS_PER_EPOCH: Positive,
    schema.TRAIN_SAMPLES: Count,
    schema.TEST_SAMPLES: Count,
    schema.PARAMETERS: Count,
    schema.MODEL: Text,
    schema.VERSIONS: Mapping,
    schema.GIT_REVISION: Text,
    schema.DEVICE: Name,
    schema.BACKEND: Name,
    schema.TOPOLOGY: Topology,
    schema.NUMERICS: Mapping,
    schema.GROUP_BACKENDS: dict[Name, Name],
    schema.GPU_SHARING: GpuSharing,
    schema.LIVE_LOGS: Mapping,
    schema.HARDWARE: Hardware,
    schema.SIMULATED: bool,
    schema.NETWORK: Network,
    schema.SIMULATION: Simulation,
    schema.RUNNER_LOAD: Mapping,
    schema.STARTED: Text,
    schema.HOSTS_PER_ATTEMPT: list[Names],
}
Manifest = record("Manifest", MANIFEST_FIELDS)

#: export.json (``bench export``): the dense and the exported model, measured alike
Measured = record("Measured", {schema.PARAMETERS: Count, "flops": NonNegative})
Export = record("Export", {"dense": Measured, "exported": Measured},
                required=("dense", "exported"))

#: checkpoints/latest.json: the newest complete checkpoint (suite.run.checkpoint)
LatestCheckpoint = record("LatestCheckpoint", {
    # a folder of the checkpoints' own (``it-00000012``), never a path elsewhere
    "folder": Annotated[str, StringConstraints(pattern=r"^it-[0-9]{8,12}$")],
    "iterations_done": Count,
}, required=("folder", "iterations_done"))


# -- reading --------------------------------------------------------------------------------------
def read_bytes(path: str | Path, *, what: str = "file", limit: int = MAX_RECORD_BYTES,
               head: bool = False) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; ``head``: its first ``limit``
    bytes, however long it is (an error file's first line).

    Opened without blocking (a FIFO has no writer: it would hang the reader) and checked on
    the open descriptor, so what is read is what was checked.

    Raises:
        FileNotFoundError: there is no such file (the callers' "absent" case).
        DamagedFile: not a regular file, larger than ``limit`` (unless ``head``), or
            unreadable.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise DamagedFile(path, f"cannot read it ({os_reason(exc)})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise DamagedFile(path, f"not a regular file "
                              f"({_file_kind(info.st_mode)})")
        if info.st_size > limit and not head:
            raise DamagedFile(path, f"{info.st_size} bytes, more than a "
                              f"{what} holds ({limit} at most)")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(limit if head else limit + 1)
    except OSError as exc:
        raise DamagedFile(path, f"cannot read it ({os_reason(exc)})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise DamagedFile(path, f"grew past {limit} bytes while read")
    return data


def read_text(path: str | Path, *, what: str = "file", limit: int = MAX_RECORD_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes (``read_bytes``' checks).

    Raises:
        FileNotFoundError: there is no such file (the callers' "absent" case).
        DamagedFile: not a regular file, larger than ``limit``, unreadable or not UTF-8.
    """
    data = read_bytes(path, what=what, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DamagedFile(path, "not text (UTF-8 JSON)") from None


def read_json_file(path: str | Path, *, what: str = "file", limit: int = MAX_RECORD_BYTES):
    """The JSON value in a regular file (``read_text``'s checks first).

    Raises:
        FileNotFoundError: there is no such file.
        DamagedFile: the file fails ``read_text``'s checks or is not JSON.
    """
    return parse_json(read_text(path, what=what, limit=limit), path, what)


def parse_json(text: str, path, what: str):
    """``text`` as JSON, or DamagedFile naming ``path`` and where the JSON breaks."""
    try:
        return json.loads(text)
    except RecursionError:
        raise DamagedFile(path, "nested too deeply to be JSON data") from None
    except ValueError as exc:
        where = f" at line {exc.lineno}, column {exc.colno}" if hasattr(exc, "lineno") else ""
        raise DamagedFile(path, f"not JSON{where}") from None


def validate(value, kind, *, where: str, text: str | None = None) -> None:
    """``value`` (a JSON value; ``text``, its JSON text where the caller has it) checked
    against the record type ``kind`` as JSON is: strictly (a string is never a number), with
    enumerations by their values.

    Raises:
        DamagedFile: one line, ``where`` (the file), the first wrong field and what it
            should hold.
    """
    try:
        text = json.dumps(value) if text is None else text
        _validator(kind)(text)
    except ValidationError as exc:
        raise DamagedFile(where, first_problem(exc)) from None
    except RecursionError:  # too deep to dump
        raise DamagedFile(where, "nested too deeply to be a record") from None
    except ValueError as exc:  # pydantic's own limits (its recursion, a number's size)
        raise DamagedFile(where, f"not a record ({one_line(exc, QUOTE_LIMIT)})") from None


def read_record(path: str | Path, kind, *, what: str, limit: int = MAX_RECORD_BYTES) -> dict:
    """A JSON object from a regular file, validated as ``kind``; returned as the file holds
    it (what ``kind`` declares is known to be of its type; other keys are as found).

    Raises:
        FileNotFoundError: there is no such file.
        DamagedFile: one line naming the file, and the field and what it should hold.
    """
    text = read_text(path, what=what, limit=limit)
    value = parse_json(text, path, what)
    if not isinstance(value, dict):
        raise DamagedFile(path, f"a JSON {_json_type(value)}, not an object")
    validate(value, kind, where=str(path), text=text)
    return value


def check_required(value: dict, keys: tuple[str, ...], *, where: str) -> None:
    """Each of ``keys`` is present and not null (after an older format was upgraded).

    Raises:
        DamagedFile: naming the first missing key.
    """
    for key in keys:
        if value.get(key) is None:
            raise DamagedFile(where, f"{key}: missing (every such file says it)")


def first_problem(exc: ValidationError) -> str:
    """pydantic's first error as ``gpus: should be an integer of at least 1 (got 'abc')``."""
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "the record"
    message = error["msg"].replace("Input should be", "should be")
    message = message.replace("Value error, ", "")
    if error["type"] == "missing":
        return f"{where}: missing"
    shown = repr(error.get("input"))
    shown = shown if len(shown) <= 60 else f"{shown[:57]}..."
    return f"{where}: {message[0].lower()}{message[1:]} (got {shown})"


_VALIDATORS: dict[int, object] = {}


def _validator(kind):
    """The JSON validator of a record type, built once (building one costs milliseconds)."""
    found = _VALIDATORS.get(id(kind))
    if found is None:
        is_model = isinstance(kind, type) and issubclass(kind, BaseModel)
        found = kind.model_validate_json if is_model else TypeAdapter(kind).validate_json
        _VALIDATORS[id(kind)] = found
    return found


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device"),
             (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))
    return next((word for test, word in kinds if test(mode)), "not a file")


def _json_type(value) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")
