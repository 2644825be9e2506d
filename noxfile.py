"""nox sessions. They run in the current environment (python=False): the pinned torch
build is large, and a fresh virtualenv per session would reinstall it every time."""

import os
import subprocess

import nox

nox.options.sessions = ["tests"]


@nox.session(python=False)
def tests(session):
    """The fast CPU test suite (real gloo processes)."""
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session(python=False)
def gpu(session):
    """Everything that needs a GPU, in one command for a lent or nightly GPU machine: the
    tests marked ``gpu`` (every method on CUDA, NCCL, event timing, Top-K replicas, resume,
    a GPU folder read without CUDA), then a short measurement of every method written to
    benchmarks/measured/gpu_steps_<device>.md (GPU_OUT overrides)."""
    import torch

    if not torch.cuda.is_available():
        session.error("nox -s gpu needs a CUDA device")
    device = torch.cuda.get_device_name(0).lower().replace(" ", "-")
    out = os.environ.get("GPU_OUT", f"benchmarks/measured/gpu_steps_{device}.md")
    env = {"PRUNEX_GPU_TESTS": "1"}
    session.run("python", "-m", "pytest", "-q", "-m", "gpu", "-rs", *session.posargs, env=env)
    session.run("python", "benchmarks/gpu_steps.py", "-o", out, env=env)


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
                    results)  # fmt: skip
    session.run("bench", "report", results, "-o", report)


ALL_METHODS = (
    "prunex,prunex-flat,ddp,ddp-bf16,ddp-fp16,powersgd,topk,topk-hier,localsgd-hier,"
    "gmp-hier,prune-retrain"
)
REFERENCE = "results/reference"
#: the time-ratio threshold of the nightly, above the run-to-run spread of 5 repeated nightlies
#: on the 2-core CPU VM that recorded cpu-gloo (std 2.5-5.2 %, at most 9.8 % from a reference
#: recorded after them; see benchmarks/measured/nightly_gate.md). A runner sets
#: NIGHTLY_TIME_THRESHOLD from its own.
TIME_THRESHOLD = "15%"
# a tenth of an epoch, evaluated once at the end: minutes on CPU, seconds on GPUs; rounds of 4
# local steps, so PruneX's masks settle and freeze within it (its evaluated consensus is only
# meaningful once they do)
NIGHTLY = ["--workload", "cnn-fmnist", "--gpus", "4", "--gpus-per-node", "2", "--epochs", "0.1",
           "--eval-every", "100000", "--local-steps", "4"]  # fmt: skip


def nightly_seeds() -> str:
    """Repeats: one seed where runs are deterministic (CPU ranks on gloo: the same seed gives
    the same bits, so the gate is exact); three on CUDA, where cuDNN and TF32 are not, so the
    gate compares distributions. NIGHTLY_SEEDS overrides."""
    import torch

    default = "0,1,2" if torch.cuda.device_count() >= 4 else "0"
    return os.environ.get("NIGHTLY_SEEDS", default)


@nox.session(python=False)
def nightly(session):
    """Every method on a tenth of an epoch of Fashion-MNIST (4 ranks, 2 per node; CUDA when
    there are 4 devices, else CPU), a report, and the regression gate: `bench compare`
    against the reference of this machine's class (results/reference/<class>/; none is a
    one-line failure naming `nox -s reference`) on accuracy, inter-node bytes and time as a
    ratio to DDP's, with every method's activity check; then the run is added to the history
    (NIGHTLY_HISTORY, default <NIGHTLY_DIR>/history.jsonl) and `bench trend` fails on a change
    point in it. Absolute times are compared only with NIGHTLY_COMPARE_TIME=1 (the class does
    not name the CPU model). NIGHTLY_DIR sets where results and the report go."""
    out = os.environ.get("NIGHTLY_DIR", ".nox/nightly")
    results, report = f"{out}/results", f"{out}/report"
    history = os.environ.get("NIGHTLY_HISTORY", f"{out}/history.jsonl")
    # a failed cell fails the gate below (compare counts it), with its report and history
    session.run("bench", "sweep", "--method", ALL_METHODS, *NIGHTLY, "--seed", nightly_seeds(),
                "--results-dir", results, success_codes=[0, 1])  # fmt: skip
    session.run("bench", "report", results, "-o", report)
    metrics = "accuracy,bytes,time-ratio" + (
        ",time" if os.environ.get("NIGHTLY_COMPARE_TIME") else ""
    )
    compare = ["bench", "compare", REFERENCE, results, "--max-regression", "5%",
               "--max-time-regression", os.environ.get("NIGHTLY_TIME_THRESHOLD", TIME_THRESHOLD),
               "--metric", metrics]  # fmt: skip
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # the job summary gets the table
        with open(summary, "a") as page:
            subprocess.run([*compare, "--format", "markdown"], stdout=page)
    # both verdicts, whatever the first says: a failed gate still belongs in the history
    time_threshold = os.environ.get("NIGHTLY_TIME_THRESHOLD", TIME_THRESHOLD)
    trend = ["bench", "trend", history, "--add", results, "--fail-on-last",
             "--max-time-regression", time_threshold]  # fmt: skip
    failed = [" ".join(cmd[:2]) for cmd in (compare, trend) if subprocess.run(cmd).returncode]
    if failed:
        session.error(f"the nightly gate failed: {', '.join(failed)}")


@nox.session(python=False)
def reference(session):
    """Record the nightly's reference for this machine's class into
    results/reference/<class>/ (after an intended change of numbers; commit the diff). Other
    classes' references are left as they are."""
    import tempfile

    from suite.results.machine import record_reference

    staging = tempfile.mkdtemp(prefix="reference-", dir="results")
    session.run("bench", "sweep", "--method", ALL_METHODS, *NIGHTLY, "--seed", nightly_seeds(),
                "--results-dir", staging, "--force")  # fmt: skip
    session.log(f"recorded {record_reference(staging, REFERENCE)}")
