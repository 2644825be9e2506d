"""PruneX split by idea (issue 56, item 1: the round in method.py, the freeze policy in
freeze.py, the residual math in hsadmm.py) does what it did before, bit for bit.

``data/prunex_before/`` holds what the code before the split did, recorded by ``record`` on
that revision (its docstring has the command):

* ``run.json``: a 2 x 2 ``bench run`` of prunex on cnn-fmnist (synthetic data) that crosses
  ADMM rounds with rho balancing, the oscillation warning, a freeze by epoch that picks where
  the sgd rounds start, and sgd rounds: SHA-256 of every tensor of its model and masks, the
  deterministic columns of its tables (no times), its summary facts and settings;
* ``rounds.json``: rounds of prunex and prunex-flat driven on 4 gloo ranks over the paths the
  run does not take (ADMM after the freeze, node averaging, Boyd's stopping test, a freeze by
  share or patience, a start from the consensus, masks that never froze): per rank, the rows,
  layer rows, facts, and the fingerprint of ``state_dict()`` (its key tree, which checkpoints
  rely on, with a hash per tensor), of the evaluated model and of the masks.

Floats are compared by their bits (``float.hex``), NaN and -0.0 included. Bits hold on the
kernels they were recorded with: on a machine of another class (``machine_class``: CPU
vendor, family and torch's CPU capability) the tests skip, as a nightly is compared only with
a reference of its own class.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from methods.prunex.method import PruneX
from suite.results.machine import machine_class
from tests.support.distributed import run_each
from tests.support.helpers import make_context
from tests.support.runs import finish, start

BEFORE = Path(__file__).parent / "data" / "prunex_before"
RUN_ID = "prunex"
#: 8 rounds of 2 steps, 4 epochs of a rank's 64 samples: ADMM until the freeze at epoch 2
#: (end of round 4), then sgd rounds from the better of z and the ranks
RUN = ["--method", "prunex", "--workload", "cnn-fmnist", "--gpus", "4", "--gpus-per-node", "2",
       "--dataset", "synthetic", "--synthetic-size", "256,64", "--batch-size", "16",
       "--local-steps", "2", "--iterations", "8", "--freeze-epoch", "2", "--freeze-share", "1"]
#: the tables' columns that vary from run to run (times), left out
VARYING_COLUMNS = ("train_seconds", "wall_seconds")
VARYING_SUMMARY = ("processes", "run_id")
#: the driven rounds: (method, options, rounds, local-step budget or None, checkpoint round)
KEEP = {"channel_keep": 0.5}
JOBS = {
    # flat, Algorithm 1 after a freeze by share, node averaging every step, stopping test
    "flat-admm": ("prunex-flat", {**KEEP, "local_steps": 3, "freeze_share": 0.5,
                                  "after_freeze": "admm", "eps_abs": 1e-9,
                                  "intra_average_period": 1}, 6, 18, 3),
    # hierarchical, the same paths, a freeze by round; sharded leaders
    "hier-admm": ("prunex", {**KEEP, "local_steps": 3, "freeze_round": 3, "after_freeze": "admm",
                             "eps_abs": 1e-9, "intra_average_period": 1,
                             "leader_mode": "sharded"}, 6, None, 4),
    # hierarchical, frozen by patience, the sgd rounds from the consensus
    "hier-patience": ("prunex", {**KEEP, "local_steps": 8, "freeze_patience": 2,
                                 "freeze_share": 1.0, "freeze_start": "consensus"}, 8, None, 5),
    # masks that never froze: the untrained-support warning; fixed penalties
    "never-froze": ("prunex", {**KEEP, "local_steps": 2, "freeze_share": 1.0,
                               "freeze_patience": 99, "adaptive_rho": False}, 3, 6, 1),
}


# ---------------------------------------------------------------------- fingerprints
def digest(tensor: torch.Tensor) -> str:
    """A tensor's dtype, shape and the SHA-256 of its bytes (64 bits of it: equality only)."""
    raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    kind = str(tensor.dtype).removeprefix("torch.")
    shape = "x".join(map(str, tensor.shape))
    return f"{kind}[{shape}] {hashlib.sha256(raw).hexdigest()[:16]}"


def fingerprint(value):
    """``value`` (nested dicts, lists, tensors, plain values) with every tensor replaced by its
    digest: its key tree and types, and a hash per tensor."""
    if isinstance(value, dict):
        return {str(key): fingerprint(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [fingerprint(item) for item in value]
    if isinstance(value, torch.Tensor):
        return digest(value)
    return value


def keys(value):
    """The key tree of a fingerprint (lists by length), without its values."""
    if isinstance(value, dict):
        return {key: keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [keys(item) for item in value]
    return type(value).__name__


def bits(value):
    """Floats as ``float.hex`` (NaN equals NaN, -0.0 differs from 0.0), through containers."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, dict):
        return {key: bits(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [bits(item) for item in value]
    return value


def plain(value):
    """Tensors and numpy scalars of a row as Python values (what JSON stores)."""
    if isinstance(value, torch.Tensor):
        return value.item()
    if hasattr(value, "item") and not isinstance(value, list | dict | str):
        return value.item()
    return value


# ---------------------------------------------------------------------- the bench run
def table(path: Path, drop=()) -> dict[str, list]:
    """A parquet table's columns but times, rows in (iteration, rank) order."""
    frame = pd.read_parquet(path)
    order = [c for c in ("iteration", "rank") if c in frame]
    frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
    return {c: frame[c].tolist() for c in frame.columns
            if not c.startswith("t_") and c not in drop}


def run_facts(folder: Path) -> dict:
    """What a finished run folder says that does not depend on the clock."""
    summary = json.loads((folder / "summary.json").read_text())
    manifest = json.loads((folder / "manifest.json").read_text())
    return {
        "model": fingerprint(torch.load(folder / "model.pt", weights_only=True)),
        "masks": fingerprint(torch.load(folder / "masks.pt", weights_only=True)),
        "iterations": table(folder / "iterations.parquet"),
        "layers": table(folder / "layers.parquet"),
        "evals": table(folder / "evals.parquet", drop=VARYING_COLUMNS),
        "summary": {k: v for k, v in summary.items()
                    if "second" not in k and k not in VARYING_SUMMARY},
        "method_settings": manifest["method_settings"],
        "exchange_every": manifest["exchange_every"],
        "machine_class": machine_class(manifest),
    }


# ---------------------------------------------------------------------- the driven rounds
def rounds(method: PruneX, ctx, first: int, last: int) -> list[dict]:
    """Rounds ``first`` .. ``last - 1`` as the loop runs them; their rows without times."""
    rows = []
    for it in range(first, last):
        ctx.recorder.begin_iteration(it)
        done = method.step(it)
        row = ctx.recorder.end_iteration(loss=float(done.loss))
        rows.append({k: plain(v) for k, v in row.items() if not k.startswith("t_")}
                    | {"converged": bool(done.converged), "one_off": bool(done.one_off)})
    return rows


def driven(rank: int, name: str) -> dict:
    """One job of ``JOBS`` on this rank, and its continuation from a checkpoint taken before
    round ``at`` into a fresh method (``resumed``: the state it ends with)."""
    method_name, options, count, budget, at = JOBS[name]

    def build():
        ctx = make_context(rank, gpus_per_node=2, method=method_name, options=options, bn=True,
                           budget_steps=budget)
        return ctx, PruneX(ctx, hierarchical=method_name == "prunex")

    ctx, method = build()
    rows = rounds(method, ctx, 0, at)
    saved = copy.deepcopy({"method": method.state_dict(), "loader": ctx.loader.state_dict()})
    rows += rounds(method, ctx, at, count)
    out = {
        "rows": rows,
        "layers": [{k: plain(v) for k, v in row.items()} for row in ctx.recorder.layers],
        "state": fingerprint(method.state_dict()),
        "facts": {"summary": method.summary_facts(), "warnings": list(method.warnings),
                  "resolved": method.resolved_settings(), "density": method.density(),
                  "exchange_every": method.exchange_every()},
        "eval": fingerprint(method.eval_model().state_dict()),
        "artifacts": fingerprint(method.artifacts()),
    }
    ctx, method = build()
    method.load_state_dict(saved["method"])
    ctx.loader.load_state_dict(saved["loader"])
    rounds(method, ctx, at, count)
    out["resumed"] = fingerprint(method.state_dict())
    return out


def driven_jobs(rank: int) -> dict:
    """Every job of ``JOBS`` on this rank, one after another (one set of ranks for all)."""
    return {name: driven(rank, name) for name in JOBS}


def observe(results: Path) -> dict:
    """The bench run (its ranks start while this process's ranks drive the rounds) and the
    driven rounds, as the fixtures hold them."""
    proc = start(results, RUN_ID, *RUN)
    try:
        per_rank = run_each(4, {"rounds": (driven_jobs, ())})["rounds"]
    finally:
        code, err = finish(proc, timeout=300)
    assert code == 0, err
    resumed = {name: [o[name].pop("resumed") for o in per_rank] for name in JOBS}
    return {
        "run": run_facts(results / RUN_ID),
        "rounds": {name: [o[name] for o in per_rank] for name in JOBS},
        "resumed": resumed,
    }


def record(results: Path) -> None:
    """Write ``data/prunex_before/`` from this revision's code. Run from a checkout of the
    revision before the split (here ``git archive HEAD | tar -x -C /tmp/head``)::

        cd /tmp/head && PYTHONPATH=/tmp/head PRUNEX_PROGRESS=0 CUDA_VISIBLE_DEVICES= \\
            python -c "from tests.methods.test_prunex_split import record; \\
                       record(__import__('pathlib').Path('/tmp/prunex-before'))"

    and copy /tmp/head/tests/methods/data/prunex_before/ over."""
    now = observe(results)
    for name, states in now.pop("resumed").items():
        assert states == [o["state"] for o in now["rounds"][name]], name
    BEFORE.mkdir(parents=True, exist_ok=True)
    for part, value in now.items():
        (BEFORE / f"{part}.json").write_text(json.dumps(value, indent=1, sort_keys=True) + "\n")


# ---------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def now(tmp_path_factory):
    """This revision's runs, on kernels that can repeat the recorded bits."""
    observed = observe(tmp_path_factory.mktemp("prunex-split"))
    recorded, here = before("run")["machine_class"], observed["run"]["machine_class"]
    if here != recorded:
        pytest.skip(f"the fixtures were recorded on {recorded}, this machine is {here}: "
                    "other kernels, other bits (re-record with ``record`` on this class)")
    return observed


def before(part: str) -> dict:
    return json.loads((BEFORE / f"{part}.json").read_text())


def test_the_2x2_run_repeats_bit_for_bit(now):
    """Model, masks, tables, summary facts and settings of the bench run, as recorded."""
    run, recorded = now["run"], before("run")
    assert set(run) == set(recorded)
    for part in recorded:
        if part in ("iterations", "layers", "evals", "summary"):  # columns or keys added since
            got = {k: run[part].get(k) for k in recorded[part]}
        else:
            got = run[part]
        assert bits(got) == bits(recorded[part]), part


@pytest.mark.parametrize("job", list(JOBS))
def test_the_driven_rounds_repeat_bit_for_bit(now, job):
    """Each rank's rows, layer rows, facts, state, evaluated model and masks, as recorded."""
    recorded = before("rounds")[job]
    for rank, (got, want) in enumerate(zip(now["rounds"][job], recorded, strict=True)):
        assert keys(got["state"]) == keys(want["state"]), (job, rank)  # checkpoints still load
        for part in want:
            assert bits(got[part]) == bits(want[part]), (job, rank, part)


@pytest.mark.parametrize("job", list(JOBS))
def test_a_checkpoint_continues_bit_for_bit(now, job):
    """A fresh method loaded from a mid-run ``state_dict()`` ends where the run itself did."""
    assert now["resumed"][job] == [o["state"] for o in now["rounds"][job]]

