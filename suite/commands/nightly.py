"""What the nightly runs, declared once: the runs' flags (``noxfile.py`` passes them to
``bench sweep``), each method's configuration as those flags make it, and the check that a
committed reference was recorded under the plan the nightly runs today.

A reference is stale when a method's default, a workload's recipe or the nightly's own flags
changed after it was recorded: its runs then no longer match the nightly's, and a gate that
matched nothing for a method would judge nothing of it. ``stale_runs`` resolves, for each
reference run, the plan the nightly would run today (``suite.run.plan.plan_run``: the same
resolution every run goes through) and names what differs from the plan the run recorded,
so the test suite fails on a default changed without re-recording (``nox -s reference``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from suite.config import RunConfig, flag_of
from suite.errors import BenchError
from suite.gate.reference import class_folders
from suite.plugins.registry import METHODS
from suite.results import schema
from suite.results.machine import ranks_on_cuda
from suite.results.view import RunView, run_folders
from suite.run.plan import plan_run

#: the nightly's ranks: 2 nodes of 2
GPUS = 4
#: the nightly's budget: a tenth of an epoch (NIGHTLY_EPOCHS changes it, e.g. to try the
#: nightly's machinery in seconds; a reference recorded at another budget matches no run)
EPOCHS = 0.1
#: where the nightly's ranks run (NIGHTLY_DEVICE): ``auto`` on CUDA when there is a GPU per
#: rank (the local launcher's rule), else CPU ranks; ``cuda`` on this machine's GPUs, shared
#: round-robin when there are fewer than 4 (a class of its own: ``cuda-gloo-h200-sm90-x4``);
#: ``cpu``. Runs on CUDA use deterministic kernels (``--deterministic``).
DEVICES = ("auto", "cpu", "cuda")
#: RunConfig fields of every nightly run (the budget comes from ``nightly_epochs``, the device
#: from ``nightly_device``): evaluated once at the end
RUN_FIELDS = {schema.WORKLOAD: "cnn-fmnist", schema.GPUS: GPUS, schema.GPUS_PER_NODE: 2,
              "eval_every": 100000}
#: method options of every nightly run, given to the methods that declare them: rounds of 4
#: local steps, so PruneX's masks settle and freeze within a tenth of an epoch
OPTIONS = {"local_steps": 4}
#: the recorded plan's facts a reference run must share with today's nightly
COMPARED_FACTS = (schema.WORKLOAD, schema.MODEL, schema.DATASET, schema.PLAN_SPEC,
                  schema.SAMPLES, schema.PLAN_LAYOUT, schema.RECIPE, schema.PLAN_SCHEDULE)


def nightly_epochs() -> float:
    """The nightly's budget in epochs: ``EPOCHS``, or NIGHTLY_EPOCHS where set.

    Raises:
        BenchError: NIGHTLY_EPOCHS is not a positive number.
    """
    text = os.environ.get("NIGHTLY_EPOCHS")
    if not text:
        return EPOCHS
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1000:
        raise BenchError(f"NIGHTLY_EPOCHS={text!r} must be a number of epochs in (0, 1000]")
    return value


def nightly_device() -> str:
    """NIGHTLY_DEVICE (``auto`` where unset): where the nightly's ranks run.

    Raises:
        BenchError: it is none of ``DEVICES``.
    """
    device = (os.environ.get("NIGHTLY_DEVICE") or "auto").strip().lower()
    if device not in DEVICES:
        raise BenchError(f"NIGHTLY_DEVICE={device!r} must be one of {', '.join(DEVICES)}")
    return device


def nightly_on_cuda() -> bool:
    """Whether tonight's ranks run on CUDA (NIGHTLY_DEVICE, the launcher's placement rule)."""
    return ranks_on_cuda(nightly_device(), GPUS)


def nightly_flags() -> list[str]:
    """The ``bench sweep`` flags of the nightly's runs (``--method`` and ``--seed`` aside):
    ``--device`` where NIGHTLY_DEVICE names one, ``--deterministic`` on CUDA (where kernels
    may not repeat themselves otherwise; on CPU ranks they do, so the CPU references' runs,
    recorded without it, stay today's plan)."""
    flags = []
    fields = {**RUN_FIELDS, schema.EPOCHS: nightly_epochs()}
    for name, value in {**fields, **OPTIONS}.items():
        flags += [flag_of(name), f"{value:g}" if isinstance(value, float)
                  else str(value)]
    if nightly_device() != "auto":
        flags += ["--device", nightly_device()]
    return flags + (["--deterministic"] if nightly_on_cuda() else [])


def nightly_config(method: str, seed: int = 0, **fields) -> RunConfig:
    """The configuration ``bench sweep`` makes of the nightly's flags for ``method``: the
    options go to the methods that declare them, as a sweep gives them."""
    options = {k: v for k, v in OPTIONS.items() if method in METHODS.readers(k)}
    tonight = {schema.DEVICE: nightly_device(), "deterministic": nightly_on_cuda()}
    return RunConfig(method=method, seed=seed, options=options, epochs=nightly_epochs(),
                     **{**RUN_FIELDS, **tonight, **fields})


@dataclass(frozen=True)
class StaleRun:
    """A reference run whose recorded plan is not the one the nightly runs today.

    Attributes:
        method: the run's method.
        folder: the run folder.
        differences: ``freeze_share: recorded 0.5, today 0.25``, one per fact that differs.
    """

    method: str
    folder: Path
    differences: tuple[str, ...]

    def line(self) -> str:
        return f"{self.method} ({self.folder.name}): {'; '.join(self.differences)}"


def stale_runs(folder: str | Path) -> list[StaleRun]:
    """The runs of a reference folder (one class's) that the nightly would not run today,
    with what differs: each method setting (a key recorded before the option existed counts,
    since a new option can change what a run computes), the recipe, the schedule, the
    dataset, the layout. A run of a method not installed here is named as such."""
    stale = []
    for path in run_folders(folder):
        view = RunView.read(path)
        differences = plan_differences(view)
        if differences:
            stale.append(StaleRun(view.method, view.folder, tuple(differences)))
    return stale


def plan_differences(view: RunView) -> list[str]:
    """What differs between the plan ``view`` recorded and today's nightly plan of its
    method and seed (empty: the same plan)."""

    if METHODS.find(view.method) is None:
        return [f"method {view.method!r} is not installed here"]
    seed = int(view.summary.get(schema.SEED) or 0)
    config = nightly_config(view.method, seed, device=str(view.manifest.get(schema.DEVICE)
                                                          or "cpu"), run_id=view.run_id)
    try:
        today = plan_run(config).facts()
    except BenchError as exc:
        return [f"today's nightly cannot plan it: {exc}"]
    recorded = view.manifest.get(schema.PLAN) or {}
    found = setting_differences(recorded.get(schema.PLAN_SETTINGS), view.settings,
                                today[schema.PLAN_SETTINGS])
    if not recorded:
        return found + ["recorded before runs kept their plan (no `plan` in the manifest)"]
    for fact in COMPARED_FACTS:
        if recorded.get(fact) != today.get(fact):
            found.append(f"{fact}: recorded {recorded.get(fact)}, today {today.get(fact)}")
    return found


def setting_differences(planned: dict | None, resolved: dict, today: dict) -> list[str]:
    """Each method setting recorded otherwise than today's plan resolves it. ``planned``:
    the recorded plan's settings (None before plans were recorded: the manifest's
    ``resolved`` settings then, where options the method derives at run time, None in the
    plan, are not compared)."""
    recorded = planned if planned is not None else resolved
    found = []
    for name in sorted(today):
        value = today[name]
        if planned is None and value is None:
            continue  # derived by the method at run time: not in the plan to compare
        if name not in recorded:
            found.append(f"{name}: not recorded (the option is newer), today {value}")
        elif recorded[name] != value:
            found.append(f"{name}: recorded {recorded[name]}, today {value}")
    return found


def stale_reference_lines(root: str | Path, classes: list[str] | None = None) -> list[str]:
    """One line per stale run of every class folder under ``root`` (or those named), each
    naming the class, the method and what differs; empty when every reference is current."""
    lines = []
    for name, folder in class_folders(Path(root)).items():
        if classes is not None and name not in classes:
            continue
        lines += [f"{name}: {stale.line()}" for stale in stale_runs(folder)]
    return lines

