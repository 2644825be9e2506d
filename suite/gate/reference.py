"""The reference policy: where the nightly's committed references live (one folder per machine
class), which reference a runner is judged against and with which thresholds (its class's
``gate.json``, read by ``bench compare`` itself through ``suite.gate.thresholds``, so a hand
run and the nightly agree), which
methods the gate runs, recording a reference (``nox -s reference``) and measuring a class's
thresholds (``nox -s gate-thresholds``).

A CPU runner whose class has no reference of its own is judged under torch's portable
kernels (``ATEN_CPU_CAPABILITY=default``) against the portable class's reference: there the
vendor stops mattering at the gate's thresholds (an Intel Xeon against the AMD EPYC's
reference: 0 regressions over the eleven methods, accuracy within 0.58 point, the training
loss within 0.1 %, bytes equal; benchmarks/measured/nightly_gate.md).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from suite.errors import BenchError
from suite.gate.compare import TIME_RATIO, load_summaries
from suite.gate.thresholds import DEFAULT, GATE_FILE, GENERIC, Gate, read_gate, write_gate
from suite.results import schema
from suite.results.catalogue import DENSE_METHOD
from suite.results.folder import hardware, numerics, versions
from suite.results.machine import CLASS_PATTERN, gpu_class, machine_class, ranks_on_cuda
from suite.results.records import DamagedFile, Mapping, read_record, record
from suite.results.resultset import VIEW
from suite.results.runner import busy
from suite.results.schema import Status

#: the committed references, one folder per machine class at the repository's top, outside
#: the default results folder, so that ``bench report results`` reads what the user ran and
#: nothing else (NIGHTLY_REFERENCE overrides)
REFERENCE_ROOT = Path("reference")
#: where they were before issue 44 (a path into it reads REFERENCE_ROOT: moved_reference)
OLD_REFERENCE_ROOT = Path("results/reference")


def moved_reference(path: str | Path) -> Path | None:
    """Where a path into the old reference location is now: ``results/reference[/...]``
    (anywhere in ``path``) that does not exist, as ``reference[/...]`` where that exists;
    None for any other path, so scripts written against the old path keep working.

    Examples:
        ```python
        moved_reference("results/reference/cpu-gloo")  # Path("reference/cpu-gloo")
        moved_reference("results")                      # None
        ```
    """
    path = Path(path)
    if path.exists():
        return None
    old, parts = OLD_REFERENCE_ROOT.parts, path.parts
    for i in range(len(parts) - len(old) + 1):
        if parts[i : i + len(old)] == old:
            moved = Path(*parts[:i], *REFERENCE_ROOT.parts, *parts[i + len(old) :])
            return moved if moved.exists() else None
    return None


#: where ``nox -s reference`` records before the set replaces the class's reference: a fixed
#: folder per class, so an interrupted recording resumes (NIGHTLY_STAGING overrides)
STAGING_ROOT = Path(".nox/reference-staging")
#: the software a class's reference was recorded under, in its folder: a runner of the class
#: under other versions (a re-imaged GPU machine's new driver or torch) is not judged
#: against numbers it would not reproduce
CLASS_FILE = "class.json"
#: the versions ``CLASS_FILE`` records (suite.results.folder.versions' names)
CLASS_VERSIONS = (schema.TORCH_VERSION, schema.CUDA_VERSION, schema.CUDA_DRIVER_VERSION,
                  schema.CUDNN_VERSION, schema.NCCL_VERSION)
DENSE = DENSE_METHOD
#: the environment that makes CPU ranks use torch's portable kernels
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default"}
#: class.json: the software a class's reference was recorded under
ClassFile = record("ClassFile", {schema.VERSIONS: Mapping})


def class_folders(root: Path) -> dict[str, Path]:
    """The per-class reference folders under ``root`` (empty when ``root`` is one set)."""
    root = Path(root)
    if not root.is_dir():
        return {}
    return {p.name: p for p in sorted(root.iterdir()) if p.is_dir() and CLASS_PATTERN.match(p.name)}


def is_reference(path: Path) -> bool:
    """A tree of class folders, one class's folder (named by its class), or a set with a
    ``gate.json``: a baseline the gate's thresholds apply to."""
    path = Path(path)
    return bool(class_folders(path)) or bool(CLASS_PATTERN.match(path.name)) or (
        (path / GATE_FILE).is_file())


def gate_for(baseline: Path, machine: str) -> Gate:
    """The thresholds NEW runs of class ``machine`` are judged with against ``baseline``."""
    folders = class_folders(Path(baseline))
    if machine in folders:
        return read_gate(folders[machine])
    if not folders and is_reference(Path(baseline)):
        return read_gate(Path(baseline))
    return GENERIC


def reference_root() -> Path:
    return Path(os.environ.get("NIGHTLY_REFERENCE") or REFERENCE_ROOT)


def staging_root() -> Path:
    return Path(os.environ.get("NIGHTLY_STAGING") or STAGING_ROOT)


# -- which class, which reference, which methods -------------------------------------------------
def this_machine_class(gpus: int, device: str = "auto") -> str:
    """The class a run of ``gpus`` local ranks asking for ``device`` gets here: CUDA ranks
    where the launcher's placement rule puts them there (suite.results.machine.ranks_on_cuda:
    ``auto`` with a GPU per rank, ``cuda`` on however many there are, shared round-robin),
    else CPU ranks of one thread each (under ATEN_CPU_CAPABILITY=default: the portable class).

    Raises:
        BenchError: ``device`` is ``cuda`` and no CUDA device is visible.
    """
    if ranks_on_cuda(device, gpus):
        if not torch.cuda.is_available():
            raise BenchError("NIGHTLY_DEVICE=cuda (or --device cuda) was asked for but no CUDA "
                             "device is visible")
        facts = numerics(torch.device("cuda", 0))
        return gpu_class(facts, gpus, torch.cuda.device_count())
    machine = {**hardware(), schema.THREADS_PER_RANK: 1}
    return machine_class({schema.DEVICE: "cpu", schema.BACKEND: "gloo", schema.HARDWARE: machine})


def portable_class(threads: int = 1) -> str:
    """``cpu-gloo-portable-t1``: CPU ranks on torch's portable kernels, any vendor."""
    hardware = {schema.CPU_CAPABILITY: "default", schema.THREADS_PER_RANK: threads}
    return machine_class({schema.DEVICE: "cpu", schema.BACKEND: "gloo", schema.HARDWARE: hardware})


def no_reference(missing: set[str], baseline: str, held: set[str]) -> str:
    portable = portable_class()
    hint = ""
    if any(m.startswith("cpu-") for m in missing) and portable in held:
        hint = (f" (a CPU nightly without its own reference runs under the portable kernels "
                f"against {portable}: `nox -s nightly`)")
    return (f"no reference for machine class {', '.join(sorted(missing))} in {baseline} (it "
            f"holds {', '.join(sorted(held)) or 'none'}); record one on such a machine with "
            f"`nox -s reference` and commit it{hint}")


def reference_methods(folder: Path, frame=None, order: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The methods a reference holds (finished runs), in the nightly's ``order`` (the methods
    registered for it: ``suite.plugins.registry.METHODS.nightly()``), the others after them
    by name (``frame``: its summaries, where the caller has read them)."""
    frame = load_summaries(folder)[0] if frame is None else frame
    held = set(frame.loc[frame[schema.STATUS] == Status.OK, schema.METHOD])
    return tuple([m for m in order if m in held] + sorted(held - set(order)))


def chosen_methods(requested: str | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """The methods the NIGHTLY_METHODS variable asks for (``requested``: a comma list) or
    ``default``, with DDP always among them."""
    names = [m for m in (requested or "").split(",") if m.strip()]
    methods = tuple(dict.fromkeys(m.strip() for m in names)) or default
    return methods if DENSE in methods else (DENSE, *methods)


@dataclass(frozen=True)
class NightlyPlan:
    """What a nightly runs here and against what.

    Attributes:
        machine_class: the class its runs will record.
        reference: that class's reference folder.
        methods: the methods it runs (the reference's, or those the NIGHTLY_METHODS variable
            chooses among them).
        env: environment for its ranks (the portable kernels' where it falls back to them).
        note: the one line that says it fell back to the portable kernels (None: native).
        seeds: the seeds it runs, those the reference holds (one where kernels repeat).
    """

    machine_class: str
    reference: Path
    methods: tuple[str, ...]
    env: dict
    note: str | None = None
    seeds: tuple[int, ...] = (0,)


def plan_nightly(root: Path, gpus: int, requested: str | None = None,
                 device: str = "auto", order: tuple[str, ...] = ()) -> NightlyPlan:
    """The nightly of this runner: its native class's reference, else (CPU ranks) the portable
    class's under the portable kernels, else a one-line refusal naming ``nox -s reference``;
    the reference's methods, or those the NIGHTLY_METHODS variable (``requested``) asks for if
    it holds them all, in the nightly's ``order`` (``reference_methods``).

    Raises:
        BenchError: no reference to judge this runner against, one recorded under other
            software (``CLASS_FILE``), or methods the reference lacks (the gate would compare
            them with nothing).
    """
    folders = class_folders(Path(root))
    native = this_machine_class(gpus, device)
    env, note = {}, None
    if native in folders:
        machine = native
    elif native.startswith("cpu-") and portable_class() in folders:
        machine, env = portable_class(), dict(PORTABLE_ENV)
        note = (f"no reference for {native} in {root}: the nightly runs under torch's portable "
                f"kernels (ATEN_CPU_CAPABILITY=default) against {machine}")
    else:
        raise BenchError(no_reference({native}, str(root), set(folders)))
    moved = version_differences(folders[machine], versions())
    if moved:
        raise BenchError(f"{folders[machine]} was recorded under other software than this "
                         f"runner's ({'; '.join(moved)}): its numbers would not repeat here; "
                         "re-record it with `nox -s reference -- --replace`")
    frame, _ = load_summaries(folders[machine])  # read once for its methods and seeds
    held = reference_methods(folders[machine], frame, order)
    methods = chosen_methods(requested, held)
    lacking = [m for m in methods if m not in held]
    if lacking:
        raise BenchError(f"the reference {folders[machine]} holds {', '.join(held)}, not "
                         f"{', '.join(lacking)} (NIGHTLY_METHODS); record them with "
                         f"NIGHTLY_METHODS={','.join(methods)} nox -s reference")
    return NightlyPlan(machine, folders[machine], methods, env, note,
                       reference_seeds(folders[machine], frame))


def version_differences(folder: Path, here: dict) -> list[str]:
    """``torch: recorded 2.11.0, here 2.12.0``: each version a GPU class's reference recorded
    (its ``CLASS_FILE``) that this runner's ``here`` (suite.results.folder.versions) does
    not share (the driver by its branch: ``compared``); empty for a reference recorded
    before classes kept their versions, and for a CPU class, which any CPU runner joins
    whatever its torch build or driver (the portable class); its class.json says what it
    was recorded under all the same."""
    path = Path(folder) / CLASS_FILE
    if not path.is_file() or not Path(folder).name.startswith("cuda-"):
        return []
    try:
        recorded = read_record(path, ClassFile, what="class file").get(schema.VERSIONS) or {}
    except DamagedFile as exc:
        raise BenchError(str(exc)) from None
    return [f"{name}: recorded {recorded[name]}, here {here.get(name)}"
            for name in CLASS_VERSIONS if name in recorded
            and compared(name, recorded[name]) != compared(name, here.get(name))]


def compared(name: str, version: str | None) -> str | None:
    """What of a recorded version must match: all of it, except the driver's branch alone
    (``580`` of ``580.159.04``): one kind of lent machine has served 580.159.03 and .04,
    and cuBLAS, cuDNN and NCCL come with the torch wheel (compared whole), not the driver."""
    if name == schema.CUDA_DRIVER_VERSION and version:
        return str(version).split(".")[0]
    return version


def kernels_repeat(results: str | Path) -> bool:
    """Whether every run under ``results`` repeats itself bit for bit under the same seed:
    none recorded an op without a deterministic kernel (``nondeterministic_ops``, listed by
    ``--deterministic`` runs on CUDA). One seed then judges a method exactly; otherwise
    the gate compares three seeds' distributions."""
    frame, _ = load_summaries(results)
    return not any(view.summary.get(schema.NONDETERMINISTIC_OPS) for view in frame[VIEW])


def reference_seeds(folder: str | Path, frame=None) -> tuple[int, ...]:
    """The seeds a reference's finished runs used: the nightly runs the same (``frame``: its
    summaries, where the caller has read them)."""
    frame = load_summaries(folder)[0] if frame is None else frame
    finished = frame.loc[frame[schema.STATUS] == Status.OK, schema.SEED]
    return tuple(sorted({int(seed) for seed in finished})) or (0,)


def recorded_versions(frame) -> dict:
    """The ``CLASS_VERSIONS`` the runs of ``frame`` were recorded under.

    Raises:
        BenchError: its runs disagree (a reference is one software's numbers).
    """
    seen = {json.dumps({name: (view.manifest.get(schema.VERSIONS) or {}).get(name)
                        for name in CLASS_VERSIONS}, sort_keys=True) for view in frame[VIEW]}
    if len(seen) != 1:
        raise BenchError(f"the runs were recorded under different software "
                         f"({' vs '.join(sorted(seen))}); record the reference in one environment")
    return json.loads(seen.pop())


# -- recording a reference and measuring its thresholds ------------------------------------------
def record_reference(staging: Path, root: Path, methods: tuple[str, ...] | None = None, *,
                     expected: str | None = None, replace: bool = False) -> Path:
    """Copy the finished runs of ``methods`` (default: all) of a recorded set into
    ``root/<its class>/`` with the software they ran under (``CLASS_FILE``), keeping a
    previous reference's ``gate.json``, then remove the staging folder (``nox -s
    reference``); returns the new folder. An existing reference is replaced only when
    ``replace`` says so: a recording never overwrites a committed reference by accident.

    Raises:
        BenchError: the set holds runs of several classes, or of another class than the
            ``expected`` one the recording was started for, or a chosen method has no
            finished run in it, or the class's folder exists and ``replace`` is False
            (nothing is replaced then).
    """
    staging, root = Path(staging), Path(root)
    frame, _ = load_summaries(staging)
    classes = set(frame.machine_class) - {"-"}
    if len(classes) != 1:
        raise BenchError(f"{staging}: a reference holds runs of one machine class, found "
                         f"{sorted(classes) or 'none'}")
    machine = classes.pop()
    if expected is not None and machine != expected:
        raise BenchError(f"{staging}: its runs recorded class {machine}, not the {expected} "
                         "this recording was started for; nothing was replaced")
    wanted = frame if methods is None else frame[frame[schema.METHOD].isin(methods)]
    finished = set(wanted.loc[wanted[schema.STATUS] == Status.OK, schema.METHOD])
    missing = sorted(set(methods or finished) - finished)
    if missing:
        raise BenchError(f"{staging}: no finished run of {', '.join(missing)}; run `nox -s "
                         "reference` again (it resumes) or remove the folder to start over")
    target = root / machine
    if target.exists() and not replace:
        raise BenchError(f"{target} exists: `nox -s reference -- --replace` replaces it (the "
                         f"recorded runs stay in {staging})")
    record = {"class": machine, schema.VERSIONS: recorded_versions(
        wanted[wanted[schema.STATUS] == Status.OK])}
    new = root / f".{target.name}.new"
    shutil.rmtree(new, ignore_errors=True)
    for folder in wanted["folder"]:
        shutil.copytree(folder, new / Path(folder).name,
                        ignore=shutil.ignore_patterns("model.pt", "checkpoints", "parts"))
    (new / CLASS_FILE).write_text(json.dumps(record, indent=2) + "\n")
    if (target / GATE_FILE).is_file():  # measured thresholds outlive a re-recorded reference
        shutil.copy(target / GATE_FILE, new / GATE_FILE)
    if target.exists():
        shutil.rmtree(target)
    new.rename(target)
    shutil.rmtree(staging, ignore_errors=True)
    return target


def classes_of(results: str | Path) -> set[str]:
    """The machine classes of the runs under ``results``."""
    return set(load_summaries(results)[0].machine_class) - {"-"}


#: the fewest nightlies a spread is measured from: 5 for the full method set, as few as 3 with
#: a reduced one (fewer methods, each of its series measured as often), never under 2
MIN_NIGHTLIES = 2


def calibrate_gate(reference: Path, nightlies: list[str | Path]) -> Path:
    """Write a class's ``gate.json`` from repeated nightlies of it (``nox -s
    gate-thresholds``): the time-ratio threshold is 1.5 times the largest deviation of a
    method's time ratio from the reference seen in them (at least 5 %; nightlies on a busy
    runner are left out of it), the accuracy drop twice the largest accuracy deviation (at
    least 1 point), the training-loss threshold five times its largest deviation (at least
    1 %), each at most what a gate.json may hold (``Gate.bounded``: 100 points, 1000 %, so a
    wild spread writes a file that reads back); the methods measured and the nightlies'
    count are written beside them.

    Raises:
        BenchError: fewer than ``MIN_NIGHTLIES``, or nightlies of another class.
    """
    if len(nightlies) < MIN_NIGHTLIES:
        raise BenchError(f"a spread needs at least {MIN_NIGHTLIES} nightlies, got {len(nightlies)}")
    reference = Path(reference)
    ref = load_summaries(reference)[0].set_index(schema.METHOD)
    gate = read_gate(reference)
    # None: every night is quiet (0: only a runner with nothing else on it is)
    quiet_share = math.inf if gate.outside_load is None else gate.outside_load
    deviations: dict[str, list[float]] = {TIME_RATIO: [], schema.FINAL_ACCURACY: [],
                                          schema.FINAL_TRAIN_LOSS: []}
    methods: set[str] = set()
    busy_nights = 0
    for folder in nightlies:
        frame, _ = load_summaries(folder)
        if set(frame.machine_class) - {"-", reference.name}:
            raise BenchError(f"{folder} holds runs of {sorted(set(frame.machine_class))}, not "
                             f"{reference.name}; calibrate one class at a time")
        loads = [busy(load, quiet_share) for load in frame.runner_load]
        busy_nights += any(loads)
        for (_, run), loaded in zip(frame.set_index(schema.METHOD).iterrows(), loads):
            if run.name not in ref.index:
                continue
            methods.add(run.name)
            base = ref.loc[run.name]
            if not loaded:
                deviations[TIME_RATIO].append(abs(run[TIME_RATIO] / base[TIME_RATIO] - 1))
            accuracy = run[schema.FINAL_ACCURACY] - base[schema.FINAL_ACCURACY]
            deviations[schema.FINAL_ACCURACY].append(100 * abs(accuracy))
            loss = run[schema.FINAL_TRAIN_LOSS] / base[schema.FINAL_TRAIN_LOSS] - 1
            deviations[schema.FINAL_TRAIN_LOSS].append(abs(loss))
    worst = {k: max((v for v in values if math.isfinite(v)), default=None)
             for k, values in deviations.items()}
    time_worst, accuracy_worst, loss_worst = (worst[TIME_RATIO], worst[schema.FINAL_ACCURACY],
                                              worst[schema.FINAL_TRAIN_LOSS])
    measured = Gate(
        time_regression=(DEFAULT.time_regression if time_worst is None
                         else max(5.0, math.ceil(150 * time_worst)) / 100),
        accuracy_drop=max(1.0, round(2 * (accuracy_worst or 0.0), 1)),
        loss_regression=max(1.0, math.ceil(500 * (loss_worst or 0.0))) / 100).bounded()
    return write_gate(reference, measured, {
        "nightlies": len(nightlies), "methods": sorted(methods), "busy_nightlies": busy_nights,
        "largest_deviations": worst})
