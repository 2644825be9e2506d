"""The nightly's committed references, one folder per machine class (``reference/<class>/``
at the repository's top): where they live, recording one (``nox -s reference``) and finding
them.

They live outside the default results folder, so that ``bench report results`` reads what
the user ran and nothing else (a fresh clone's ``results/`` is empty). Until issue 44 they were
``results/reference/<class>/``; a command given that old path reads the new one
(``moved_reference``), so scripts written against it keep working.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import torch

from suite.errors import BenchError
from suite.results.compare import load_summaries
from suite.results.folder import hardware, numerics
from suite.results.machine import class_folders, machine_class

#: the committed references, one folder per machine class (relative to the repository's top)
REFERENCE_ROOT = "reference"
#: where they were before issue 44 (read as an alias of REFERENCE_ROOT)
OLD_REFERENCE_ROOT = "results/reference"


def moved_reference(path: str | Path) -> Path | None:
    """Where a path into the old reference location is now: ``results/reference[/...]``
    (anywhere in ``path``) that does not exist, as ``reference[/...]`` where that exists;
    None for any other path.

    Examples:
        ```python
        moved_reference("results/reference/cpu-gloo")  # Path("reference/cpu-gloo")
        moved_reference("results")                      # None
        ```
    """
    path = Path(path)
    if path.exists():
        return None
    old = Path(OLD_REFERENCE_ROOT).parts
    parts = path.parts
    for i in range(len(parts) - len(old) + 1):
        if parts[i : i + len(old)] == old:
            moved = Path(*parts[:i], *Path(REFERENCE_ROOT).parts, *parts[i + len(old) :])
            return moved if moved.exists() else None
    return None


def record_reference(staging: str | Path, root: str | Path) -> Path:
    """Move a freshly recorded result set into ``root/<its class>/``, replacing that class's
    previous reference (``nox -s reference``); returns the new folder."""
    staging, root = Path(staging), Path(root)
    classes = classes_of(staging)
    if len(classes) != 1:
        raise BenchError(f"{staging}: a reference holds runs of one machine class, found "
                         f"{sorted(classes) or 'none'}")
    target = root / classes.pop()
    gate = target / GATE_FILE
    if gate.is_file():  # the class's measured thresholds outlive a re-recorded reference
        shutil.copy(gate, staging / GATE_FILE)
    if target.exists():
        shutil.rmtree(target)
    root.mkdir(parents=True, exist_ok=True)
    shutil.move(str(staging), str(target))
    return target


#: a class's gate thresholds, in its reference folder (``gate.json``)
GATE_FILE = "gate.json"
#: the thresholds of a class that has not measured its own, from cpu-gloo-amd25-avx512-t1's
#: perturbation study (benchmarks/measured/nightly_gate.md): a kernel change (AVX2, the
#: portable kernels, 2 threads per rank) moved the same seed's final training loss by at most
#: 0.05 % and accuracy by up to 2.2 points at a tenth of an epoch, the learning rate off by 10x
#: raised the loss by 43-78 %; bytes are exact; the time ratio's largest deviation over 5
#: nightlies was 8.6 %
DEFAULT_GATE = {
    "max_accuracy_drop": 5.0,
    "max_loss_regression": "2%",
    "max_regression": "5%",
    "max_time_regression": "15%",
}


def gate_thresholds(root: str | Path, machine_class: str) -> dict:
    """The thresholds the nightly of ``machine_class`` is judged with: its reference's
    ``gate.json`` over the defaults."""
    path = Path(root) / machine_class / GATE_FILE
    measured = json.loads(path.read_text()) if path.is_file() else {}
    return {**DEFAULT_GATE, **{k: v for k, v in measured.items() if k in DEFAULT_GATE}}


def classes_of(results: str | Path) -> set[str]:
    """The machine classes of the runs under ``results``."""
    return set(load_summaries(results)[0].machine_class) - {"-"}


def calibrate_gate(root: str | Path, nightlies: list[str | Path]) -> Path:
    """Write the class's ``gate.json`` from repeated nightlies of it (``nox -s
    gate-thresholds``): the time-ratio threshold is 1.5 times the largest deviation of a
    method's time ratio from the reference seen in them (at least 5 %), the accuracy drop
    twice the largest accuracy deviation (at least 1 point), the training-loss threshold five
    times its largest deviation (at least 1 %); each stays what it measured."""
    reference_rows = None
    deviations: dict[str, list[float]] = {"time": [], "accuracy": [], "loss": []}
    classes: set[str] = set()
    for folder in nightlies:
        frame, _ = load_summaries(folder)
        classes |= set(frame.machine_class) - {"-"}
        if reference_rows is None:
            (machine,) = classes
            reference_rows = load_summaries(Path(root) / machine)[0].set_index("method")
        for _, run in frame.set_index("method").iterrows():
            if run.name not in reference_rows.index:
                continue
            ref = reference_rows.loc[run.name]
            deviations["time"].append(abs(run["time_ratio"] / ref["time_ratio"] - 1))
            deviations["accuracy"].append(100 * abs(run["final_accuracy"] - ref["final_accuracy"]))
            deviations["loss"].append(abs(run["final_train_loss"] / ref["final_train_loss"] - 1))
    if len(classes) != 1:
        raise BenchError(f"the nightlies hold runs of {sorted(classes) or 'no'} machine classes; "
                         "calibrate one class at a time")
    worst = {k: max((v for v in values if math.isfinite(v)), default=0.0)
             for k, values in deviations.items()}
    gate = {
        "max_time_regression": f"{max(5.0, math.ceil(150 * worst['time'])):g}%",
        "max_accuracy_drop": max(1.0, round(2 * worst["accuracy"], 1)),
        "max_loss_regression": f"{max(1.0, math.ceil(500 * worst['loss'])):g}%",
        "max_regression": DEFAULT_GATE["max_regression"],
        "measured": {"nightlies": len(nightlies), "largest_deviations": worst},
    }
    path = Path(root) / classes.pop() / GATE_FILE
    path.write_text(json.dumps(gate, indent=2) + "\n")
    return path


def no_reference(missing: set[str], baseline: str, held: set[str]) -> str:
    return (f"no reference for machine class {', '.join(sorted(missing))} in {baseline} (it "
            f"holds {', '.join(sorted(held))}); record one on such a machine with "
            "`nox -s reference` and commit it")


def this_machine_class(gpus: int) -> str:
    """The class a run of ``gpus`` local ranks gets here: CUDA ranks when there is a GPU per
    rank (the local launcher's rule, suite.cluster.ranks.ranks_on_cuda), else CPU ranks of one
    thread each."""
    if torch.cuda.device_count() >= gpus:
        facts = numerics(torch.device("cuda", 0))
        return machine_class({"device": "cuda", "backend": "nccl", "numerics": facts})
    machine = {**hardware(), "threads_per_rank": 1}
    return machine_class({"device": "cpu", "backend": "gloo", "hardware": machine})


def missing_reference(root: str | Path, gpus: int) -> str | None:
    """The one-line refusal a gate gives before it runs anything when ``root`` holds per-class
    references but none of this machine's class (None: it has one, or ``root`` is one set)."""
    folders = class_folders(Path(root))
    here = this_machine_class(gpus)
    if folders and here not in folders:
        return no_reference({here}, str(root), set(folders))
    return None
