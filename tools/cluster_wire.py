"""Inter-node bytes a run records against the bytes its hosts' links carried, on the cluster of
tools/cluster-up (issue 53): every method through both launch paths, a Markdown table.

    sudo tools/cluster-up 3
    python tools/cluster_wire.py -o benchmarks/measured/cluster_wire.md
    sudo tools/cluster-down

Per run: ``--launcher slurm`` (submitit, one agent per host, ``--gpus-per-node 2``) or an
sbatch script whose ``srun`` starts one ``bench run --launcher torchrun`` per rank (no
``--gpus-per-node``: the topology comes from the hostnames). The wire side is the kernel's:
each host's eth0 counters read by its local rank 0 around every iteration's step (the
summary's ``wire_inter_bytes_total``), and, for the whole job (set-up, evaluation,
control traffic included), the bridge ends' counters read here before and after.
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

METHODS = ("ddp", "topk", "powersgd", "localsgd-hier", "prunex")
#: each method's own flags: PowerSGD compressing from its third step (its earliest), the round-based
#: methods exchanging every 2 local steps (so 3 iterations stay short)
EXTRA = {"powersgd": ["--start-powersgd-iter", "2"], "localsgd-hier": ["--local-steps", "2"],
         "prunex": ["--local-steps", "2"]}
SRUN_JOB = """#!/bin/bash
#SBATCH --nodes={hosts}
#SBATCH --ntasks-per-node={ranks}
#SBATCH --cpus-per-task=1
#SBATCH --output={folder}/srun-%j.out
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)
export MASTER_PORT={port}
srun {python} -m suite.cli run --launcher torchrun {flags}
"""


def link_bytes(hosts: int) -> int:
    """Bytes every host sent onto the bridge (its veth's far end received them)."""
    return sum(int(Path(f"/sys/class/net/pxv{i}/statistics/rx_bytes").read_text())
               for i in range(1, hosts + 1))


def wait_for_jobs() -> None:
    while subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout.strip():
        time.sleep(1)


def run_once(method: str, path: str, args, results: Path, n: int) -> dict:
    run_id = f"{method}-{path}"
    flags = ["--method", method, "--gpus", str(args.hosts * args.ranks), "--device", "cpu",
             "--workload", args.workload, "--iterations", str(args.iterations),
             "--results-dir", str(results), "--run-id", run_id, *EXTRA.get(method, [])]
    before = link_bytes(args.hosts)
    if path == "slurm":
        submitted = subprocess.run([sys.executable, "-m", "suite.cli", "run", "--launcher",
                                    "slurm", "--gpus-per-node", str(args.ranks),
                                    "--slurm-cpus-per-task", str(args.ranks), *flags],
                                   capture_output=True, text=True)
        if submitted.returncode:
            raise SystemExit(f"{method}: {submitted.stderr.strip()}")
    else:
        script = results / f"{run_id}.sbatch"
        script.write_text(SRUN_JOB.format(hosts=args.hosts, ranks=args.ranks, folder=results,
                                          port=29700 + n, python=sys.executable,
                                          flags=" ".join(flags)))
        subprocess.run(["sbatch", str(script)], check=True, capture_output=True)
    wait_for_jobs()
    job_bytes = link_bytes(args.hosts) - before
    found = results / run_id / "summary.json"
    if not found.exists():
        logs = sorted(results.glob(f"{run_id}/slurm-job/*.out")) + sorted(results.glob("*.out"))
        tail = logs[-1].read_text()[-600:] if logs else "no log"
        raise SystemExit(f"{method} ({path}): no summary.json; log: {tail}")
    summary = json.loads(found.read_text())
    if summary["status"] != "ok":
        raise SystemExit(f"{method} ({path}): {summary['status']}: {summary.get('error')}")
    topology = json.loads((results / run_id / "manifest.json").read_text())["topology"]
    recorded = summary["inter_node_bytes_total"]
    wire = summary.get("wire_inter_bytes_total")
    return {"method": method, "path": path, "status": summary["status"],
            "hosts": ",".join(topology["hosts"]), "leaders": topology["leaders"],
            "recorded": recorded, "wire": wire, "ratio": wire / recorded if recorded else None,
            "payload": summary.get("wire_payload_to_algorithmic_ratio"), "job": job_bytes}


def table(rows: list[dict], args) -> str:
    lines = [
        "# Recorded inter-node bytes against the hosts' links (tools/cluster-up)",
        "",
        f"`python tools/cluster_wire.py --workload {args.workload} --iterations "
        f"{args.iterations}` on `tools/cluster-up {args.hosts}` ({args.hosts} hosts x "
        f"{args.ranks} CPU ranks, gloo, unshaped veth links, MTU 9000), "
        f"{time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}.",
        "",
        "recorded: the run's `inter_node_bytes_total` (its communicator's count of what "
        "crossed nodes); wire: the kernel's counters of each host's eth0, read by the host's "
        "local rank 0 around each iteration's step, summed over hosts "
        "(`wire_inter_bytes_total`); whole job: what the hosts sent onto the bridge "
        "from submission to the end (set-up broadcast, warm-up, evaluation, store and SLURM "
        "traffic too); wire payload: the wire's bytes less 66 per frame sent (Ethernet, IPv4 "
        "and TCP headers; acknowledgements are frames without payload), what the sockets "
        "carried (`wire_payload_to_algorithmic_ratio`).",
        "",
        "| method | launch | status | hosts | leaders | recorded MB | wire MB | wire / "
        "recorded | wire payload / recorded | whole job MB |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        payload = f"{r['payload']:.4f}" if r.get("payload") is not None else "-"
        lines.append(f"| {r['method']} | {r['path']} | {r['status']} | {r['hosts']} | "
                     f"{r['leaders']} | {r['recorded'] / 1e6:.3f} | "
                     f"{(r['wire'] or 0) / 1e6:.3f} | {r['ratio']:.4f} | {payload} | "
                     f"{r['job'] / 1e6:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2, help="ranks per host")
    parser.add_argument("--workload", default="resnet18-fmnist")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--paths", default="slurm,srun")
    parser.add_argument("-o", "--output", default="benchmarks/measured/cluster_wire.md")
    parser.add_argument("--work", help="where the run folders go (kept; default: a new "
                        "folder under /tmp)")
    args = parser.parse_args()
    if not Path("/sys/class/net/pxbr0").exists():
        raise SystemExit("no cluster here: sudo tools/cluster-up 3 first")
    rows = []
    folder = Path(args.work or tempfile.mkdtemp(dir="/tmp", prefix="cluster-wire-"))
    folder.mkdir(parents=True, exist_ok=True)
    for path in args.paths.split(","):
        for n, method in enumerate(args.methods.split(",")):
            rows.append(run_once(method, path, args, folder, n))
            print(rows[-1], flush=True)
    print(f"run folders: {folder}")
    Path(args.output).write_text(table(rows, args))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
