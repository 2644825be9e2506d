"""Simulator vs emulated cluster: predicted and measured time per iteration and per phase.

For each layout (2 nodes x 2 ranks, 4 nodes x 1 rank) and link rate (200 Mbit, 1 Gbit):
calibrate a CPU profile on the emulated cluster (`bench calibrate --network emulated`), run
prunex, prunex-flat, ddp and topk on it for real (`bench run --network emulated`), simulate
the same runs with the profile (`bench sim`), and print predicted vs measured seconds per
iteration (slowest rank, first iteration dropped: DDP rebuilds its buckets there) and per
phase (mean over ranks). Needs root and iproute2; takes ~15 minutes on 2 cores. Run it alone:
anything else on the CPU changes the measured times.

    python benchmarks/validate_sim.py --out benchmarks/results/validation
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

LAYOUTS = {"2x2": (4, 2), "4x1": (4, 1)}
RATES = ("200mbit", "1gbit")
METHODS = {
    "prunex": ["--local-steps", "8", "--iterations", "5"],
    "prunex-flat": ["--local-steps", "8", "--iterations", "5"],
    "ddp": ["--iterations", "30"],
    "topk": ["--iterations", "30"],
}
PHASES = ("local_compute", "allreduce", "intra_allreduce", "inter_allreduce", "broadcast",
          "allgather", "compress")  # fmt: skip


def bench(*args: str) -> None:
    env = {**os.environ, "PRUNEX_PROGRESS": "0"}
    proc = subprocess.run([sys.executable, "-m", "suite.cli", *args], env=env, text=True,
                          capture_output=True)  # fmt: skip
    if proc.returncode:
        raise SystemExit(f"bench {' '.join(args)} failed:\n{proc.stderr}")


def only_run(directory: Path) -> Path:
    (folder,) = [p for p in directory.iterdir() if p.is_dir()]
    return folder


def timings(folder: Path) -> dict[str, float]:
    rows = pd.read_parquet(folder / "iterations.parquet")
    rows = rows[rows.iteration > 0]
    out = {"iteration": float(rows.groupby("iteration")["t_iteration"].max().mean())}
    for phase in PHASES:
        if f"t_{phase}" in rows:
            out[phase] = float(rows[f"t_{phase}"].fillna(0.0).mean())
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/validation")
    args = parser.parse_args()
    out = Path(args.out)
    records = []
    for rate in RATES:
        for layout, (gpus, per_node) in LAYOUTS.items():
            profile = out / "profiles" / f"cpu-{layout}-{rate}.json"
            calibrate = ["calibrate", "--network", "emulated", "--inter-bw", rate,
                         "--gpus", str(gpus), "--gpus-per-node", str(per_node),
                         "--name", profile.stem, "-o", str(profile),
                         "--sizes", "65536,1048576,4194304,16777216", "--steps", "40"]  # fmt: skip
            if per_node == 1:  # no intra-node link to measure: take the 2x2 one
                calibrate += ["--links-from", str(out / "profiles" / f"cpu-2x2-{rate}.json")]
            bench(*calibrate)
            for method, extra in METHODS.items():
                cell = out / "runs" / f"{layout}-{rate}" / method
                common = ["--method", method, "--workload", "cnn-fmnist", "--gpus", str(gpus),
                          "--gpus-per-node", str(per_node), *extra]  # fmt: skip
                if not (cell / "real").exists():  # measured once; the prediction every time
                    bench("run", *common, "--network", "emulated", "--inter-bw", rate,
                          "--eval-every", "1000", "--results-dir", str(cell / "real"))  # fmt: skip
                shutil.rmtree(cell / "sim", ignore_errors=True)
                bench("sim", *common, "--profile", str(profile), "--replay", "1000",
                      "--results-dir", str(cell / "sim"))  # fmt: skip
                measured = timings(only_run(cell / "real"))
                predicted = timings(only_run(cell / "sim"))
                for phase in measured:
                    records.append(
                        {
                            "layout": layout,
                            "rate": rate,
                            "method": method,
                            "phase": phase,
                            "measured_ms": 1e3 * measured[phase],
                            "predicted_ms": 1e3 * predicted.get(phase, 0.0),
                        }
                    )
                print(f"{layout} {rate} {method}: measured {measured['iteration']:.3f} s, "
                      f"predicted {predicted['iteration']:.3f} s", flush=True)  # fmt: skip
    table = pd.DataFrame(records)
    table["error_%"] = 100 * (table.predicted_ms - table.measured_ms) / table.measured_ms
    table.to_csv(out / "validation.csv", index=False)
    per_iteration = table[table.phase == "iteration"].drop(columns="phase")
    text = ["## Time per iteration", per_iteration.to_markdown(index=False, floatfmt=".1f"),
            "", "## Per phase", table[table.phase != "iteration"].to_markdown(
                index=False, floatfmt=".1f")]  # fmt: skip
    (out / "validation.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))
    worst = per_iteration["error_%"].abs().max()
    print(json.dumps({"worst_iteration_error_%": round(float(worst), 1)}))


if __name__ == "__main__":
    main()
