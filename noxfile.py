"""nox sessions. They run in the current environment (python=False): the pinned torch
build is large, and a fresh virtualenv per session would reinstall it every time."""

import os

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
# a tenth of an epoch, evaluated once at the end: minutes on CPU, seconds on GPUs; rounds of 4
# local steps, so PruneX's masks settle and freeze within it (its evaluated consensus is only
# meaningful once they do)
NIGHTLY = ["--workload", "cnn-fmnist", "--gpus", "4", "--gpus-per-node", "2", "--epochs", "0.1",
           "--eval-every", "100000", "--local-steps", "4"]  # fmt: skip


@nox.session(python=False)
def nightly(session):
    """Every method on a tenth of an epoch of Fashion-MNIST (4 ranks, 2 per node; CUDA when
    there are 4 devices, else CPU), a report, and a regression check against the committed
    reference set. The reference was recorded on CPU ranks: timings compare only when
    NIGHTLY_COMPARE_TIME=1 (same kind of machine); accuracy and inter-node bytes always.
    NIGHTLY_DIR sets where results and the report go (default .nox/nightly)."""
    out = os.environ.get("NIGHTLY_DIR", ".nox/nightly")
    results, report = f"{out}/results", f"{out}/report"
    session.run("bench", "sweep", "--method", ALL_METHODS, *NIGHTLY, "--results-dir", results)
    session.run("bench", "report", results, "-o", report)
    metrics = "accuracy,bytes" + (",time" if os.environ.get("NIGHTLY_COMPARE_TIME") else "")
    session.run("bench", "compare", REFERENCE, results, "--max-regression", "5%",
                "--metric", metrics)  # fmt: skip


@nox.session(python=False)
def reference(session):
    """Re-record results/reference (after an intended change of numbers; commit the diff)."""
    session.run("bench", "sweep", "--method", ALL_METHODS, *NIGHTLY, "--results-dir", REFERENCE,
                "--force")  # fmt: skip
