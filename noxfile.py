"""nox sessions. They run in the current environment (python=False): the pinned torch
build is large, and a fresh virtualenv per session would reinstall it every time."""

import nox

nox.options.sessions = ["tests"]


@nox.session(python=False)
def tests(session):
    """The fast CPU test suite (real gloo processes)."""
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session(python=False)
def lint(session):
    session.run("ruff", "check", ".")


@nox.session(python=False)
def smoke(session):
    """A tiny end-to-end run on synthetic data."""
    tmp = session.create_tmp()
    session.run(
        "bench",
        "run",
        "--method",
        "ddp",
        "--workload",
        "cnn-fmnist",
        "--dataset",
        "synthetic",
        "--gpus",
        "4",
        "--gpus-per-node",
        "2",
        "--iterations",
        "4",
        "--results-dir",
        tmp,
    )
