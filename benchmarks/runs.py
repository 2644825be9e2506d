"""What the benchmark scripts share: run a `bench` command quietly, run a `bench sweep` whose
failed cells are reported but not fatal, find the run folder a command wrote (each cell
gets its own results directory, so there is exactly one), read the runs that finished, and
the smallest real configuration every script's ``--smoke`` runs.

The scripts import nothing of the project but ``suite.api``; everything else they learn from
``bench`` commands and the run folders those write. Run alone, this file prints the table of
the finished runs under a results folder:

    python benchmarks/runs.py results/fair_comparison/best
    python benchmarks/runs.py --smoke               # one tiny run into a temporary folder
    python benchmarks/runs.py --smoke DIR           # DIR's runs; one tiny run there if none
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from suite.api import flag_of, schema

#: the smallest real data of a ``--smoke`` run: synthetic, a few samples, small batches
SMOKE_DATA = ["--dataset", "synthetic", "--synthetic-size", "256,64", "--batch-size", "16"]
#: the smallest hierarchical layout: 2 emulated nodes of 1 rank
SMOKE_RANKS = ["--gpus", "2", "--gpus-per-node", "1"]
#: ``bench report``'s mean +- 95 % interval sign
PM = "\u00b1"


def bench(*args: str, ok: tuple[int, ...] = (0,), env: dict | None = None) -> int:
    """``bench ARGS`` in this interpreter, without progress bars; exits with its stderr if it
    ends with a code not in ``ok``. ``env``: variables added to this process's. Returns the
    exit code."""
    env = {**os.environ, "PRUNEX_PROGRESS": "0", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "suite.cli", *args], env=env, text=True,
                          capture_output=True)
    if proc.returncode not in ok:
        raise SystemExit(f"bench {' '.join(args)} failed:\n{proc.stderr}")
    return proc.returncode


def sweep(*args: str, timeout: float | None = None) -> int:
    """``bench sweep ARGS`` with its progress shown; returns its exit code: a failed cell
    (1) is listed by the sweep and the measurement goes on (its caller judges it), anything
    else stops it. Past ``timeout`` seconds the sweep is stopped (its cells' folders keep
    what they recorded) and 124 returned."""
    try:
        proc = subprocess.run([sys.executable, "-m", "suite.cli", "sweep", *args], text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124
    if proc.returncode not in (0, 1):
        sys.exit(proc.returncode)
    return proc.returncode


def only_run(directory: Path) -> Path:
    (folder,) = [p for p in directory.iterdir() if p.is_dir()]
    return folder


def finished_runs(root: Path, method: str | None = None):
    """(folder, summary, manifest) of every run under ``root`` that ended ok."""
    for path in sorted(root.rglob("summary.json")):
        summary = json.loads(path.read_text())
        ok = summary.get(schema.STATUS) == schema.Status.OK
        if not ok or method not in (None, summary[schema.METHOD]):
            continue
        yield path.parent, summary, json.loads((path.parent / "manifest.json").read_text())


def mean_pm(mean: float, half: float, decimals: int) -> str:
    """``81.82 ± 0.51`` as ``bench report``'s tables write a mean and its 95 % half-width; the
    mean alone for one repeat (no interval), ``-`` for none."""
    if mean is None or math.isnan(mean):
        return "-"
    if half is None or math.isnan(half):
        return f"{mean:.{decimals}f}"
    return f"{mean:.{decimals}f} {PM} {half:.{decimals}f}"


def output_folder(given: str | None, default: str, smoke: bool, name: str) -> Path:
    """Where a script writes: the folder given, else a new temporary folder for ``--smoke``
    (never the measurement's own results), else ``default``."""
    if given is not None:
        return Path(given)
    if smoke:
        folder = Path(tempfile.mkdtemp(prefix=f"{name}-smoke-"))
        print(f"--smoke: writing into {folder}", file=sys.stderr, flush=True)
        return folder
    return Path(default)


def children() -> dict[int, list[int]]:
    """Parent pid -> its children's pids, from /proc (the scale benchmarks find a run's ranks
    and what they leave with it; a benchmark imports the suite's plugin API only)."""
    found: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            found.setdefault(parent, []).append(int(name))
    return found


def smoke_defaults(args: argparse.Namespace, values: dict, argv: list[str] | None = None
                   ) -> None:
    """``--smoke``'s values for the options not given on the command line (``argv``, default
    ``sys.argv[1:]``; ``gpus_per_node`` is ``--gpus-per-node``)."""
    given = {a.split("=")[0] for a in (sys.argv[1:] if argv is None else argv)}
    for key, value in values.items():
        if flag_of(key) not in given:
            setattr(args, key, value)


#: the run's own keys where a column holds one (``accuracy`` is the final accuracy in %)
RUN_COLUMNS = [schema.METHOD, schema.SEED, schema.LR, "run", "accuracy", schema.EPOCHS,
               "inter_MB_per_epoch", schema.SAMPLES_PER_RANK, "frozen_at_round", "exchange"]


def exchange_words(schedule: dict | None) -> str:
    """A manifest's ``exchange_every`` as ``4 / 32`` (local steps between exchanges inside a
    node / across nodes); ``-`` for a run recorded before it was."""
    if not isinstance(schedule, dict):
        return "-"
    links = (schema.EXCHANGE_INTRA, schema.EXCHANGE_INTER)
    return " / ".join(f"{schedule.get(link, '-')}" for link in links)


def run_table(root: Path) -> pd.DataFrame:
    """One row per finished run under ``root``: its lr, final accuracy in %, inter-node MB per
    epoch, (PruneX) the round its masks froze at, and its exchange schedule (local steps
    between exchanges inside a node / across nodes). A cell run twice (e.g. after its identity
    changed) counts once."""
    rows = [
        {schema.METHOD: s[schema.METHOD], schema.SEED: s[schema.SEED],
         schema.LR: m[schema.RECIPE][schema.LR], "run": str(folder),
         "accuracy": 100 * s[schema.FINAL_ACCURACY], schema.EPOCHS: s[schema.EPOCHS],
         "inter_MB_per_epoch": s[schema.INTER_NODE_BYTES_TOTAL] / 1e6 / s[schema.EPOCHS],
         schema.SAMPLES_PER_RANK: s.get(schema.SAMPLES_PER_RANK),
         "frozen_at_round": (s.get(schema.MASKS_FROZEN_AT) or {}).get("round"),
         "exchange": exchange_words(m.get(schema.EXCHANGE_EVERY))}
        for folder, s, m in finished_runs(root)
    ]
    return pd.DataFrame(rows, columns=RUN_COLUMNS).drop_duplicates(
        [schema.METHOD, schema.SEED, schema.LR])


def main() -> None:
    parser = argparse.ArgumentParser(description="The finished runs under a results folder.")
    parser.add_argument("results", nargs="?", default=None, help="a results folder")
    parser.add_argument("--smoke", action="store_true",
                        help="where the folder (default: a temporary one) holds no finished "
                        "run, first one tiny run (synthetic data, 1 rank) into it")
    args = parser.parse_args()
    if args.results is None and not args.smoke:
        parser.error("give a results folder (or --smoke)")
    root = output_folder(args.results, "", args.smoke, "runs")
    if args.smoke and not any(finished_runs(root)):
        bench("run", "--method", "ddp", *SMOKE_DATA, "--gpus", "1", "--iterations", "2",
              "--eval-every", "100000", "--results-dir", str(root / "runs-smoke"))
    table = run_table(root).drop(columns="run")
    print(f"finished runs under {root}:\n")
    print(table.to_markdown(index=False, floatfmt=".4g"))


if __name__ == "__main__":
    main()
