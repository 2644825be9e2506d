"""nox sessions. They run in the current environment (python=False): the pinned torch
build is large, and a fresh virtualenv per session would reinstall it every time."""

import os
import subprocess

import nox
import nox.virtualenv
from packaging.version import Version

nox.options.sessions = ["tests"]
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
                *session.posargs)


@nox.session(python=False)
def benchmarks(session):
    """Every benchmarks/ script once on its smallest real configuration (--smoke): minutes
    of CPU, so apart from the fast suite; CI runs both."""
    session.run("python", "-m", "pytest", "-q", "-m", "benchmarks", "-rs",
                "tests/test_benchmarks.py", *session.posargs)


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


ALL_METHODS = (
    "prunex,prunex-flat,ddp,ddp-bf16,ddp-fp16,powersgd,topk,topk-hier,localsgd-hier,"
    "gmp-hier,prune-retrain"
)
#: the committed references, one folder per machine class (suite.results.reference's
#: REFERENCE_ROOT)
REFERENCE = "reference"
# a tenth of an epoch, evaluated once at the end: minutes on CPU, seconds on GPUs; rounds of 4
# local steps, so PruneX's masks settle and freeze within it (its evaluated consensus is only
# meaningful once they do)
NIGHTLY = ["--workload", "cnn-fmnist", "--gpus", "4", "--gpus-per-node", "2", "--epochs", "0.1",
           "--eval-every", "100000", "--local-steps", "4"]
#: what the gate judges: the final training loss (a tenth of an epoch resolves it: a kernel
#: change moves it at most 0.05 %, a regression tens of %), accuracy (coarsely: a kernel change
#: moves it by points at this budget), inter-node bytes (exact), and time as a ratio to DDP's
GATE_METRICS = "accuracy,train-loss,bytes,time-ratio"


def nightly_seeds() -> str:
    """Repeats: one seed where runs are deterministic (CPU ranks on gloo: the same seed gives
    the same bits on the same class, so the gate is exact); three on CUDA, where cuDNN and
    TF32 are not, so the gate compares distributions. NIGHTLY_SEEDS overrides."""
    import torch

    default = "0,1,2" if torch.cuda.device_count() >= 4 else "0"
    return os.environ.get("NIGHTLY_SEEDS", default)


def sweep_nightly(session, results: str, *extra: str) -> None:
    """Every method of the nightly into ``results`` (a failed cell is counted by the gate)."""
    session.run("bench", "sweep", "--method", ALL_METHODS, *NIGHTLY, "--seed", nightly_seeds(),
                "--results-dir", results, *extra, success_codes=[0, 1])


def thresholds(results: str) -> dict:
    """The gate's thresholds for the class the nightly ran on: its reference's gate.json
    over the defaults (suite.results.reference), each overridden by its NIGHTLY_* variable."""
    from suite.results.reference import DEFAULT_GATE, classes_of, gate_thresholds

    classes = classes_of(results)
    gate = gate_thresholds(REFERENCE, classes.pop()) if len(classes) == 1 else dict(DEFAULT_GATE)
    overrides = {"max_time_regression": "NIGHTLY_TIME_THRESHOLD",
                 "max_accuracy_drop": "NIGHTLY_ACCURACY_DROP",
                 "max_loss_regression": "NIGHTLY_LOSS_THRESHOLD"}
    return {k: os.environ.get(overrides.get(k, ""), v) for k, v in gate.items()}


@nox.session(python=False)
def nightly(session):
    """Every method on a tenth of an epoch of Fashion-MNIST (4 ranks, 2 per node; CUDA when
    there are 4 devices, else CPU), a report, and the regression gate: `bench compare`
    against the reference of this machine's class (reference/<class>/; a class that
    has none is a one-line failure naming `nox -s reference`) on the final training loss,
    accuracy, inter-node bytes and time as a ratio to DDP's, with every method's activity
    check, at the thresholds of the class's gate.json (NIGHTLY_TIME_THRESHOLD,
    NIGHTLY_ACCURACY_DROP, NIGHTLY_LOSS_THRESHOLD override them); then the run is added to
    the history (NIGHTLY_HISTORY, default <NIGHTLY_DIR>/history.jsonl) and `bench trend`
    fails on a change point in it. NIGHTLY_COMPARE_TIME=1 adds absolute times. NIGHTLY_DIR
    sets where results and the report go."""
    out = os.environ.get("NIGHTLY_DIR", ".nox/nightly")
    results, report = f"{out}/results", f"{out}/report"
    history = os.environ.get("NIGHTLY_HISTORY", f"{out}/history.jsonl")
    from suite.results.reference import missing_reference

    refusal = missing_reference(REFERENCE, gpus=int(NIGHTLY[NIGHTLY.index("--gpus") + 1]))
    if refusal:  # before minutes of runs that could be compared with nothing
        session.error(refusal)
    sweep_nightly(session, results)
    session.run("bench", "report", results, "-o", report)
    gate = thresholds(results)
    metrics = GATE_METRICS + (",time" if os.environ.get("NIGHTLY_COMPARE_TIME") else "")
    compare = ["bench", "compare", REFERENCE, results, "--metric", metrics,
               "--max-regression", gate["max_regression"],
               "--max-time-regression", gate["max_time_regression"],
               "--max-accuracy-drop", str(gate["max_accuracy_drop"]),
               "--max-loss-regression", gate["max_loss_regression"]]
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # the job summary gets the table
        with open(summary, "a") as page:
            subprocess.run([*compare, "--format", "markdown"], stdout=page)
    # both verdicts, whatever the first says: a failed gate still belongs in the history
    trend = ["bench", "trend", history, "--add", results, "--fail-on-last",
             "--max-time-regression", gate["max_time_regression"]]
    failed = [" ".join(cmd[:2]) for cmd in (compare, trend) if subprocess.run(cmd).returncode]
    if failed:
        session.error(f"the nightly gate failed: {', '.join(failed)}")


@nox.session(python=False)
def reference(session):
    """Record the nightly's reference for this machine's class into
    reference/<class>/ (after an intended change of numbers; commit the diff). Other
    classes' references are left as they are; the class's gate.json stays."""
    import tempfile

    from suite.results.reference import record_reference

    staging = tempfile.mkdtemp(prefix="reference-", dir="results")
    sweep_nightly(session, staging, "--force")
    session.log(f"recorded {record_reference(staging, REFERENCE)}")


@nox.session(python=False, name="gate-thresholds")
def gate_thresholds(session):
    """Measure this class's own thresholds: N nightlies (``-- N``, default 5) without the
    gate, then reference/<class>/gate.json from their spread around the reference
    (suite.results.reference.calibrate_gate). Record the reference first; commit both."""
    import tempfile

    from suite.results.reference import calibrate_gate

    repeats = int(session.posargs[0]) if session.posargs else 5
    folders = []
    for _ in range(repeats):
        folder = tempfile.mkdtemp(prefix="gate-", dir="results")
        sweep_nightly(session, folder)
        folders.append(folder)
    session.log(f"wrote {calibrate_gate(REFERENCE, folders)}")
