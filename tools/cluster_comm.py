"""PruneX's inter-node time per round against DDP's per step, on real hosts with shaped links
(issue 53, item 5): the question of benchmarks/emulated_comm.py asked of tools/cluster-up's
hosts instead of emulated nodes.

    sudo tools/cluster-up 2 --inter-bw 200mbit
    python tools/cluster_comm.py -o benchmarks/measured/cluster_comm.md
    sudo tools/cluster-down

Each method runs as a SLURM job over the two hosts (``--launcher slurm``, 2 ranks per host,
benchmarks/emulated_comm.py's schedules: PruneX in rounds of 8 local steps with masks frozen
from round 3, DDP 60 steps); the leaders' time in the collectives that cross hosts and the
inter-node bytes are read from the run folders by that benchmark's ``inter_node_row``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from emulated_comm import METHODS, inter_node_row  # noqa: E402


def run(method: str, results: Path, hosts: int, ranks: int) -> dict:
    extra, phases = METHODS[method]
    subprocess.run([sys.executable, "-m", "suite.cli", "run", "--launcher", "slurm",
                    "--method", method, "--gpus", str(hosts * ranks), "--gpus-per-node",
                    str(ranks), "--device", "cpu", "--slurm-cpus-per-task", str(ranks),
                    "--results-dir", str(results), "--run-id", method, *extra],
                   check=True, capture_output=True)
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
        time.sleep(1)
    summary = json.loads((results / method / "summary.json").read_text())
    if summary["status"] != "ok":
        raise SystemExit(f"{method}: {summary['status']}: {summary.get('error')}")
    row = inter_node_row(method, results / method, phases)
    row["wire_ratio"] = summary.get("wire_to_algorithmic_ratio")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host")
    parser.add_argument("-o", "--output", default="benchmarks/measured/cluster_comm.md")
    args = parser.parse_args()
    hosts_file = Path("/run/pxcluster/hosts")
    if not hosts_file.exists():
        raise SystemExit("no cluster here: sudo tools/cluster-up 2 --inter-bw 200mbit first")
    hosts = int(hosts_file.read_text())
    rate = subprocess.run(["tc", "qdisc", "show", "dev", "pxv1"], capture_output=True,
                          text=True).stdout.strip() or "unshaped"
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:
        rows = {m: run(m, Path(folder), hosts, args.ranks) for m in ("prunex", "ddp")}
    prunex, ddp = rows["prunex"], rows["ddp"]
    time_ratio = prunex["inter_ms_per_iteration"] / ddp["inter_ms_per_step"]
    byte_ratio = prunex["inter_MB_per_iteration"] / ddp["inter_MB_per_step"]
    lines = [
        "# PruneX's inter-node time per round against DDP's per step, on real hosts",
        "",
        f"`python tools/cluster_comm.py` on `tools/cluster-up {hosts} --inter-bw ...` "
        f"({hosts} hosts x {args.ranks} CPU ranks, gloo; link: `{rate}`), "
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}; "
        "schedules of benchmarks/emulated_comm.py (cnn-fmnist).",
        "",
        "| method | iterations | local steps | inter ms / iteration | inter MB / iteration "
        "| wire / recorded |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {r['method']} | {r['iterations']} | {r['local_steps']} | "
          f"{r['inter_ms_per_iteration']:.1f} | {r['inter_MB_per_iteration']:.3f} | "
          f"{r['wire_ratio']:.4f} |" for r in rows.values()],
        "",
        f"PruneX's time per round / DDP's per step: **{time_ratio:.3f}**; their inter-node "
        f"bytes: **{byte_ratio:.3f}**; time ratio / byte ratio: **{time_ratio / byte_ratio:.2f}**.",
        "",
    ]
    Path(args.output).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
