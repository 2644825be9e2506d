"""nox sessions. They run in the current environment (python=False): the pinned torch
build is large, and a fresh virtualenv per session would reinstall it every time."""

import logging
import os
import shutil
import subprocess

import nox
import nox.virtualenv
from packaging.version import Version

nox.options.sessions = ["tests"]
# the suite's modules the sessions import load matplotlib, whose debug lines nox would show
logging.getLogger("matplotlib").setLevel(logging.WARNING)
# Every session runs here (python=False), so no backend is chosen and uv is never needed; nox
# still looks for it before each session and logs "uv binary not found." where it is absent.
# Its own uv state, set here, is what it reads instead of looking.
nox.virtualenv.HAS_UV, nox.virtualenv.UV, nox.virtualenv.UV_VERSION = False, "uv", Version("0")


@nox.session(python=False)
def tests(session):
    """The fast CPU test suite (real gloo processes), two test files at a time: most of a
    multi-rank test is waiting (for ranks to start, a timeout to pass, SLURM to schedule),
    which the other file's work fills. ``nox -s tests -- -n 0`` runs them one by one."""
    session.run("python", "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile",
                "--durations", "25", *session.posargs)  # the slowest, for the 15-minute budget


@nox.session(python=False)
def benchmarks(session):
    """Every benchmarks/ script once on its smallest real configuration (--smoke): 6 minutes
    of CPU, so apart from the fast suite, and run on purpose (before a change to a benchmark
    script lands): with it CI would pass its 45 minutes on 2 cores."""
    session.run("python", "-m", "pytest", "-q", "-m", "benchmarks", "-rs",
                "tests/test_benchmarks.py", *session.posargs)


@nox.session(python=False)
def integration(session):
    """The end-to-end runs of a minute or more: the nox sessions themselves (the nightly
    three times against a reference it records), the quickstart, the torch floor's sweep,
    the activity check, the shaped-link fit, GPU part 0 without a GPU, every command without
    plugins. Apart from the fast suite, which they would push past 15 minutes; CI runs it."""
    session.run("python", "-m", "pytest", "-q", "-m", "integration", "-rs", "-n", "2",
                "--dist", "loadfile", "--durations", "15", *session.posargs)


@nox.session(python=False)
def cluster(session):
    """Runs across several hosts on the SLURM of tools/cluster-up (hosts in namespaces on
    this machine, brought up and down by the tests; root only): on three hosts both launch
    paths, the topology from hostnames, recorded bytes against the links' counters, a lost
    host; then 64 ranks on eight hosts. The one-node SLURM of the other sessions is stopped
    first and left stopped. 64 ranks on eight hosts: ``nox -s scale``."""
    session.run("python", "-m", "pytest", "-q", "-m", "cluster", "-rs",
                "tests/launchers/test_multihost.py", *session.posargs)


@nox.session(python=False)
def scale(session):
    """The mission's scale, run on purpose (minutes of both cores; CI runs the sessions
    above): 64 ranks on the eight hosts of tools/cluster-up through SLURM, every process
    group across the hosts and nothing left behind. What it measured is kept in
    benchmarks/measured/cluster_wire_64.md."""
    session.run("python", "-m", "pytest", "-q", "-m", "scale", "-rs",
                "tests/launchers/test_multihost_scale.py", *session.posargs)


@nox.session(python=False)
def gpu(session):
    """Everything that needs a GPU, in parts that each fit one 10-minute job on one H100
    (``nox -s gpu -- --part 1``; ``nox -s gpu`` runs 1-4): part 0 a smoke that also runs
    without a GPU, 1 and 2 the tests under tests/gpu/, 3 and 4 a short measurement of every
    method per layout (NCCL, one rank per GPU; 2 x 2 sharing the GPUs) written to
    benchmarks/measured/gpu_steps_<device>_<layout>.md (GPU_OUT or $OUT names another
    folder). The parts are tools/gpu/parts.py's, which ``tools/gpu/run PART`` runs on a GPU
    machine without network; arguments after the part go to pytest."""
    args = list(session.posargs)
    parts = ["1", "2", "3", "4"]
    if "--part" in args:
        at = args.index("--part")
        parts, args = [args[at + 1]], args[:at] + args[at + 2 :]
    for part in parts:
        session.run("python", "tools/gpu/parts.py", part, "--", *args)


@nox.session(python=False)
def lint(session):
    session.run("ruff", "check", ".")


@nox.session(python=False)
def smoke(session):
    """A tiny end-to-end run on synthetic data, and its report."""
    tmp = session.create_tmp()
    results, report = f"{tmp}/results", f"{tmp}/report"
    for method in ("ddp", "prunex"):
        session.run("bench", "run", "--method", method, "--workload", "cnn-fmnist",
                    "--dataset", "synthetic", "--gpus", "4", "--gpus-per-node", "2",
                    "--iterations", "4", "--local-steps", "2", "--results-dir",
                    results)
    session.run("bench", "report", results, "-o", report)


#: NIGHTLY_* variables -> the flags that override a class's gate.json (in bench compare and
#: bench trend alike)
OVERRIDES = {"NIGHTLY_TIME_THRESHOLD": "--max-time-regression",
             "NIGHTLY_ACCURACY_DROP": "--max-accuracy-drop",
             "NIGHTLY_LOSS_THRESHOLD": "--max-loss-regression"}


#: the seeds of a reference whose kernels do not repeat themselves (an op without a
#: deterministic CUDA kernel ran): the gate then compares three seeds' distributions
NONDETERMINISTIC_SEEDS = "0,1,2"


def sweep_nightly(session, results: str, methods, env: dict, seeds: str = "0") -> None:
    """The nightly's ``methods`` (suite.commands.nightly: a tenth of an epoch of Fashion-MNIST on
    2 nodes of 2, evaluated once at the end; NIGHTLY_EPOCHS changes the budget) into
    ``results`` (a failed cell is counted by the gate); re-run on the same folder, it resumes:
    finished cells are not run again."""
    from suite.commands.nightly import nightly_flags
    from suite.errors import BenchError

    try:
        flags = nightly_flags()
    except BenchError as exc:
        session.error(str(exc))
    seeds = os.environ.get("NIGHTLY_SEEDS", seeds)
    session.run("bench", "sweep", "--method", ",".join(methods), *flags, "--seed", seeds,
                "--results-dir", results, env=env, success_codes=[0, 1])


def given_flags(*allowed: str) -> list[str]:
    """The NIGHTLY_* overrides set in the environment, as flags (none: gate.json judges)."""
    flags = []
    for variable, flag in OVERRIDES.items():
        if os.environ.get(variable) and (not allowed or flag in allowed):
            flags += [flag, os.environ[variable]]
    return flags


def compare_command(reference: str, results: str) -> list[str]:
    """The nightly's ``bench compare``: what a maintainer types by hand, plus the NIGHTLY_*
    overrides set (the class's gate.json judges both)."""
    extra = []
    if os.environ.get("NIGHTLY_COMPARE_TIME"):
        from suite.gate import DEFAULT_GATE

        extra = ["--metric", ",".join([*DEFAULT_GATE["metrics"], "time"])]
    return ["bench", "compare", reference, results, *extra, *given_flags()]


def plan_or_error(session):
    """This runner's nightly plan (suite.gate.plan_nightly), or the session's one-line end."""
    from suite.commands.nightly import GPUS, nightly_device
    from suite.errors import BenchError
    from suite.gate import plan_nightly, reference_root
    from suite.plugins.registry import METHODS

    try:
        plan = plan_nightly(reference_root(), GPUS, os.environ.get("NIGHTLY_METHODS"),
                            nightly_device(), METHODS.nightly())
    except BenchError as exc:  # before minutes of runs that could be compared with nothing
        session.error(str(exc))
    if plan.note:
        session.log(plan.note)
    from suite.commands.nightly import stale_reference_lines

    for line in stale_reference_lines(plan.reference.parent, [plan.machine_class]):
        if line.split(": ", 1)[1].split(" ", 1)[0] in plan.methods:
            session.warn("stale reference (re-record it with `nox -s reference -- --replace`): "
                         f"{line}")
    return plan


@nox.session(python=False)
def nightly(session):
    """The reference's methods (all eleven, or those a reduced reference holds; NIGHTLY_METHODS
    chooses among them) on a tenth of an epoch of Fashion-MNIST (4 ranks, 2 per node; CUDA
    when there are 4 devices, else CPU), a report, and the regression gate: `bench compare`
    against the reference of this machine's class (reference/<class>/; a CPU runner
    without one runs under the portable kernels against cpu-gloo-portable-t1, saying so in one
    line; else a one-line failure naming `nox -s reference`) at the class's gate.json, exactly
    as `bench compare` by hand (NIGHTLY_TIME_THRESHOLD, NIGHTLY_ACCURACY_DROP,
    NIGHTLY_LOSS_THRESHOLD override it); then the run is added to the history (NIGHTLY_HISTORY,
    default <NIGHTLY_DIR>/history.jsonl) with the gate's verdicts, `bench trend` fails on a
    change point in its last run, and `bench dashboard` writes the history's pages next to the
    report. NIGHTLY_COMPARE_TIME=1 adds absolute times. NIGHTLY_DIR sets where results, report
    and dashboard go. Every nightly trains: its results folder is emptied first (the last
    night's numbers are in the history), so a second nightly of one commit is a night of its
    own, never the last night's runs judged again."""
    from suite.gate import reference_root

    out = os.environ.get("NIGHTLY_DIR", ".nox/nightly")
    results, report, dashboard = f"{out}/results", f"{out}/report", f"{out}/dashboard"
    history = os.environ.get("NIGHTLY_HISTORY", f"{out}/history.jsonl")
    plan = plan_or_error(session)
    if os.path.exists(results):
        session.log(f"{results}: the last night's runs are removed; every nightly trains")
        shutil.rmtree(results)
    sweep_nightly(session, results, plan.methods, plan.env, seeds_text(plan.seeds))
    session.run("bench", "report", results, "-o", report)
    root = str(reference_root())
    compare = compare_command(root, results)
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # the job summary gets the table
        with open(summary, "a") as page:
            subprocess.run([*compare, "--format", "markdown"], stdout=page)
    # both verdicts, whatever the first says: a failed gate still belongs in the history
    trend = ["bench", "trend", history, "--add", results, "--against", root, "--fail-on-last",
             *given_flags("--max-time-regression", "--max-accuracy-drop")]
    failed = [" ".join(cmd[:2]) for cmd in (compare, trend) if subprocess.run(cmd).returncode]
    session.run("bench", "dashboard", history, "-o", dashboard)
    if failed:
        session.error(f"the nightly gate failed: {', '.join(failed)}")


def seeds_text(seeds) -> str:
    return ",".join(str(seed) for seed in seeds)


@nox.session(python=False)
def reference(session):
    """Record the nightly's reference for this machine's class into reference/<class>/ (after
    an intended change of numbers; commit the diff): the methods of NIGHTLY_METHODS (a comma
    list; DDP is always among them; default all eleven) run into a fixed staging folder
    (.nox/reference-staging/<class>/, NIGHTLY_STAGING), so an interrupted recording resumes
    where it stopped, then become the class's reference with the software they ran under
    (class.json). A class that has a reference keeps it unless ``-- --replace`` is given (its
    gate.json stays then). NIGHTLY_DEVICE=cuda records the class of this machine's GPUs
    shared by the 4 ranks (``cuda-gloo-<model>-sm<cc>-x4`` on one GPU), on deterministic
    kernels: one seed where they repeat, three where an op without a deterministic kernel ran.
    Under ATEN_CPU_CAPABILITY=default it records the portable class, cpu-gloo-portable-t1."""
    from suite.commands.nightly import GPUS, nightly_device
    from suite.errors import BenchError
    from suite.gate import (
        chosen_methods,
        kernels_repeat,
        record_reference,
        reference_root,
        staging_root,
        this_machine_class,
    )
    from suite.plugins.registry import METHODS

    unknown = [arg for arg in session.posargs if arg != "--replace"]
    if unknown:
        session.error(f"nox -s reference takes only --replace, not {' '.join(unknown)}")
    try:
        machine = this_machine_class(GPUS, nightly_device())
    except BenchError as exc:
        session.error(str(exc))
    target = reference_root() / machine
    replace = "--replace" in session.posargs
    if target.exists() and not replace:  # before minutes of runs that could not land
        session.error(f"{target} exists: `nox -s reference -- --replace` replaces it")
    methods = chosen_methods(os.environ.get("NIGHTLY_METHODS"), METHODS.nightly())
    staging = staging_root() / machine
    session.log(f"{machine}: {', '.join(methods)} into {staging} (finished cells are kept)")
    sweep_nightly(session, str(staging), methods, {})
    try:
        if machine.startswith("cuda-") and not kernels_repeat(staging):
            session.log("an op without a deterministic kernel ran: three seeds, compared as "
                        "distributions")
            sweep_nightly(session, str(staging), methods, {}, NONDETERMINISTIC_SEEDS)
        recorded = record_reference(staging, reference_root(), methods, expected=machine,
                                    replace=replace)
    except BenchError as exc:
        session.error(str(exc))
    session.log(f"recorded {recorded}")


@nox.session(python=False, name="gate-thresholds")
def gate_thresholds(session):
    """Measure this class's own thresholds: N nightlies (``-- N``; default 5 with the full
    method set, 3 with a reduced one, at least 2) without the gate, each into a fixed folder
    that resumes, then the class's gate.json from their spread around the reference
    (suite.gate.calibrate_gate; nightlies on a busy runner are left out of the time
    threshold). Record the reference first; commit both."""
    from suite.gate import MIN_NIGHTLIES, calibrate_gate, staging_root
    from suite.plugins.registry import METHODS

    plan = plan_or_error(session)
    reduced = set(plan.methods) < set(METHODS.nightly())
    repeats = int(session.posargs[0]) if session.posargs else (3 if reduced else 5)
    if repeats < MIN_NIGHTLIES:
        session.error(f"gate-thresholds needs at least {MIN_NIGHTLIES} nightlies, got {repeats}")
    folders = [str(staging_root() / f"gate-{plan.machine_class}" / f"night{k}")
               for k in range(repeats)]
    for folder in folders:
        sweep_nightly(session, folder, plan.methods, plan.env, seeds_text(plan.seeds))
    session.log(f"wrote {calibrate_gate(plan.reference, folders)}")
    shutil.rmtree(staging_root() / f"gate-{plan.machine_class}")  # measured: the next starts afresh
