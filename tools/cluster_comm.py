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
    row["phases"] = phase_split(results / method, phases)
    row["later_ms"] = later_leader_ms(results / method, phases)
    return row


def later_leader_ms(folder: Path, phases: tuple[str, ...]) -> float:
    """Per iteration the inter-node time of the leader that arrived last (the shorter span:
    the other one also waited for it), in ms, the mean over steady iterations: the link's
    part of the time without the hosts' arrival skew."""
    import pandas as pd

    manifest = json.loads((folder / "manifest.json").read_text())
    rows = pd.read_parquet(folder / "iterations.parquet")
    steady = rows[rows.frozen.astype(bool)] if "frozen" in rows else rows[rows.iteration > 0]
    leaders = steady[steady["rank"].isin(manifest["topology"]["leaders"])]
    spans = leaders[[f"t_{p}" for p in phases if f"t_{p}" in leaders]].fillna(0.0).sum(axis=1)
    return 1e3 * spans.groupby(leaders.iteration).min().mean()


def phase_split(folder: Path, phases: tuple[str, ...]) -> str:
    """The leaders' ms per iteration in each inter-node phase (steady iterations, as
    ``inter_node_row`` reads them): where the time of the collectives that cross hosts goes."""
    import pandas as pd

    manifest = json.loads((folder / "manifest.json").read_text())
    rows = pd.read_parquet(folder / "iterations.parquet")
    steady = rows[rows.frozen.astype(bool)] if "frozen" in rows else rows[rows.iteration > 0]
    leaders = steady[steady["rank"].isin(manifest["topology"]["leaders"])]
    per_iteration = {p: leaders[f"t_{p}"].fillna(0.0).groupby(leaders.iteration).mean()
                     for p in phases if f"t_{p}" in leaders}
    return ", ".join(f"{p} {1e3 * seconds.mean():.1f}" for p, seconds in per_iteration.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host")
    parser.add_argument("-o", "--output", default="benchmarks/measured/cluster_comm.md")
    parser.add_argument("--work", help="where the run folders go (kept; default: a new "
                        "folder under /tmp)")
    args = parser.parse_args()
    hosts_file = Path("/run/pxcluster/hosts")
    if not hosts_file.exists():
        raise SystemExit("no cluster here: sudo tools/cluster-up 2 --inter-bw 200mbit first")
    hosts = int(hosts_file.read_text())
    rate = subprocess.run(["tc", "qdisc", "show", "dev", "pxv1"], capture_output=True,
                          text=True).stdout.strip() or "unshaped"
    folder = Path(args.work or tempfile.mkdtemp(dir="/tmp", prefix="cluster-comm-"))
    rows = {m: run(m, folder, hosts, args.ranks) for m in ("prunex", "ddp")}
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
        "| wire / recorded | ms per phase |",
        "|---|---:|---:|---:|---:|---:|---|",
        *[f"| {r['method']} | {r['iterations']} | {r['local_steps']} | "
          f"{r['inter_ms_per_iteration']:.1f} | {r['inter_MB_per_iteration']:.3f} | "
          f"{r['wire_ratio']:.4f} | {r['phases']} |" for r in rows.values()],
        "",
        f"PruneX's time per round / DDP's per step: **{time_ratio:.3f}**; their inter-node "
        f"bytes: **{byte_ratio:.3f}**; time ratio / byte ratio: **{time_ratio / byte_ratio:.2f}**.",
        "",
        f"The leader that arrived last (its span holds no wait for the other host): PruneX "
        f"{prunex['later_ms']:.1f} ms per round, DDP {ddp['later_ms']:.1f} ms per step, "
        f"ratio **{prunex['later_ms'] / ddp['later_ms']:.3f}**.",
        "",
    ]
    Path(args.output).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
