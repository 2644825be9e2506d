"""``bench calibrate``: measure this hardware on the ranks a real run would have (same
launcher, same placement; ``suite.sim.measure``), fit a profile (``suite.sim.fit``)
and write it for the simulator."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from suite.cluster.netemu import emulated_cluster, parse_rate, run_module_in_cluster
from suite.cluster.ranks import elastic_launch_config
from suite.cluster.topology import check_layout
from suite.config import flag_of
from suite.environment import env_int
from suite.errors import BenchError
from suite.launchers.local import adopt_slurm_environment, quiet_launcher_logs
from suite.plugins.registry import WORKLOADS
from suite.results.machine import ranks_on_cuda
from suite.sim.fit import build_profile, world_check
from suite.sim.measure import DEFAULT_BLOCK_STEPS, DEFAULT_SIZES, calibration_rank
from suite.sim.profile import load_profile


def calibration_plan(
    *,
    workloads: list[str],
    batch_size: int,
    gpus: int,
    gpus_per_node: int,
    device: str,
    sizes: list[int] | None = None,
    steps: int = 20,
    warmup: int = 3,
    repeats: int = 5,
    block_steps: list[int] | None = None,
    block_repeats: int = 5,
    compute_only: bool = False,
    data_dir: str | None = None,
) -> dict:
    return {
        "workloads": workloads,
        "batch_size": batch_size,
        "gpus": gpus,
        "gpus_per_node": gpus_per_node,
        "device": device,
        "sizes": list(sizes or DEFAULT_SIZES),
        "steps": steps,
        "warmup": warmup,
        "repeats": repeats,
        "block_steps": list(block_steps or DEFAULT_BLOCK_STEPS),
        "block_repeats": block_repeats,
        "compute_only": compute_only,
        "data_dir": data_dir,
    }


def run_local(plan: dict, out_path: Path) -> None:
    """Run the calibration ranks on this machine through torch's elastic launcher."""
    # lazy: torch.distributed.launcher.api costs ~0.1 s to import; only this path needs it
    from torch.distributed.launcher.api import elastic_launch


    if plan["device"] == "cpu":
        os.environ["OMP_NUM_THREADS"] = "1"
    quiet_launcher_logs()
    with tempfile.TemporaryDirectory(prefix="prunex-launch-") as logs:
        launch = elastic_launch_config(plan["gpus"], f"calibrate-{os.getpid()}", log_dir=logs)
        elastic_launch(launch, calibration_rank)(json.dumps(plan), str(out_path))


def run_emulated(plan: dict, out_path: Path, inter_bw: str | None) -> None:
    """Run the calibration ranks in emulated nodes whose links are shaped to ``inter_bw``."""

    if inter_bw is None:
        raise BenchError("--network emulated needs --inter-bw, e.g. 1gbit or 200mbit")
    if plan["device"] != "cpu":
        raise BenchError("--network emulated calibrates CPU ranks (gloo); use --device cpu")
    rate = parse_rate(inter_bw)
    nodes = plan["gpus"] // plan["gpus_per_node"]
    plan_file = out_path.with_suffix(".plan.json")
    with emulated_cluster(nodes, rate, f"calibrate-{out_path.name}") as cluster:
        plan["network"] = {**cluster.describe(), "inter_bw": inter_bw}
        plan_file.write_text(json.dumps(plan))
        code = run_module_in_cluster(
            cluster, plan["gpus_per_node"], "suite.sim.measure", [str(plan_file), str(out_path)],
            out_path.parent / "calibrate-logs",
        )
    plan_file.unlink()
    if code or not out_path.exists():
        raise BenchError(f"calibration ranks failed; see {out_path.parent / 'calibrate-logs'}")


def in_job_layout(flags: dict) -> tuple[int, int]:
    """(ranks, ranks per node) of the job this process is a rank of (``--launcher
    torchrun``): the job's world, and its node size unless ``--gpus-per-node`` says.

    Raises:
        BenchError: not inside a job, or ``--gpus`` disagrees with the job's world.
    """
    if not adopt_slurm_environment():
        raise BenchError("--launcher torchrun calibrates inside a job: run it under torchrun "
                         "or srun (one task per rank), or use --launcher slurm")
    world = env_int("WORLD_SIZE", 1, minimum=1)
    if flags.get("gpus_given") and flags["gpus"] != world:
        raise BenchError(f"--gpus {flags['gpus']} but the job has {world} ranks")
    return world, flags["gpus_per_node"] or env_int("LOCAL_WORLD_SIZE", 1, minimum=1)


def run_in_job(plan: dict, out_path: Path) -> bool:
    """This rank's part of the calibration (the job's other ranks run theirs); True on the
    rank that holds the measurements (rank 0), which fits the profile."""
    if plan["device"] == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    calibration_rank(json.dumps(plan), str(out_path))
    return env_int("RANK", 0, minimum=0) == 0


def run_slurm(flags: dict, gpus: int, gpus_per_node: int, output: Path, *, echo) -> None:
    """The calibration as a SLURM job across hosts: an sbatch script whose srun starts one
    ``bench calibrate --launcher torchrun`` per rank with this command's flags, rendezvous on
    the allocation's first host; waits for the job (``sbatch --wait``).

    Raises:
        BenchError: sbatch is missing or the job failed (its log named).
    """
    if shutil.which("sbatch") is None:
        raise BenchError("--launcher slurm needs SLURM's sbatch here")
    folder = output.resolve().parent
    log = folder / f"{output.stem}-calibrate-%j.out"
    cpus = flags.get("slurm_cpus_per_task") or 1
    script = folder / f"{output.stem}.calibrate.sbatch"
    script.write_text("\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name=prunex-calibrate-{gpus}g",
        f"#SBATCH --nodes={gpus // gpus_per_node}",
        f"#SBATCH --ntasks-per-node={gpus_per_node}",
        f"#SBATCH --cpus-per-task={cpus}",
        f"#SBATCH --output={log}",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -1)',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 30000))",
        shlex.join(["srun", sys.executable, "-m", "suite.cli", "calibrate", "--launcher",
                    "torchrun", "-o", str(output.resolve()), *job_arguments(flags)]),
        "",
    ]))
    echo(f"calibrating on SLURM: {gpus // gpus_per_node} node(s) x {gpus_per_node} ranks "
         f"({script})")
    job = subprocess.run(["sbatch", "--wait", "--parsable", str(script)], capture_output=True,
                         text=True)
    if job.returncode != 0 or not output.exists():
        said = (job.stderr.strip().splitlines() or [f"exit {job.returncode}"])[-1]
        job_log = Path(str(log).replace("%j", job.stdout.strip().split(";")[0]))
        raise BenchError(f"the calibration job failed ({said}){rank_error(job_log)}; see "
                         f"{job_log if job_log.exists() else folder} for its log")


def rank_error(job_log: Path) -> str:
    """': <the first rank's one-line error>' from a failed job's log, '' where it has none:
    the reason belongs in the message the user reads, not only in a file on the cluster."""
    try:
        lines = job_log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if line.strip().startswith("Error:")]
    return f": {errors[0]}" if errors else ""


#: calibrate's flags a rank of the job is not given (the job decides them, or they are the
#: submitting command's own)
NOT_FOR_THE_JOB = ("launcher", "output", "gpus_given", "slurm_cpus_per_task")


def job_arguments(flags: dict) -> list[str]:
    """``bench calibrate``'s flags as its job's ranks are given them."""
    args: list[str] = []
    for name, value in flags.items():
        if name in NOT_FOR_THE_JOB or value is None or value is False:
            continue
        if value is True:
            args.append(flag_of(name))
        elif isinstance(value, (list, tuple)):
            args += [flag_of(name), ",".join(map(str, value))]
        else:
            args += [flag_of(name), str(value)]
    return args


def calibrate_to_file(flags: dict, *, echo) -> Path | None:
    """``bench calibrate``: plan, measure (here, on emulated links, inside a job or as a
    SLURM job across hosts), write the profile and print its headline numbers; returns the
    profile's path (None on a job's rank that does not hold the measurements)."""

    workloads = [w for w in flags["workload"].split(",") if w]
    for w in workloads:
        WORKLOADS.get(w)
    batch = flags["batch_size"] or WORKLOADS.build(workloads[0]).recipe.batch_size
    launcher = flags.get("launcher") or "local"
    if launcher != "local" and flags["network"] == "emulated":
        raise BenchError("--network emulated calibrates with --launcher local")
    gpus = flags["gpus"]
    gpus_per_node = flags["gpus_per_node"] or max(1, gpus // 2)
    if launcher == "torchrun":
        gpus, gpus_per_node = in_job_layout(flags)
    check_layout(gpus, gpus_per_node)
    device = flags["device"]
    if device == "auto":
        device = "cuda" if ranks_on_cuda(device, gpus) else "cpu"
    name = (
        flags["name"] or f"{socket.gethostname()}-{device}-{gpus // gpus_per_node}x{gpus_per_node}"
    )
    if flags["compute_only"] and not flags["links_from"]:
        raise BenchError("--compute-only takes the links from --links-from PROFILE; give it")
    plan = calibration_plan(
        workloads=workloads,
        batch_size=batch,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        device=device,
        sizes=flags["sizes"],
        steps=flags["steps"],
        repeats=flags["repeats"],
        block_steps=flags["sync_blocks"],
        block_repeats=flags["block_repeats"],
        compute_only=flags["compute_only"],
        data_dir=flags["data_dir"],
    )
    links_from = load_profile(flags["links_from"]).raw if flags["links_from"] else None
    output = Path(flags["output"] or f"profiles/{name}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    raw_path = output.with_suffix(".raw.json")
    if launcher == "slurm":
        run_slurm(flags, gpus, gpus_per_node, output, echo=echo)
        _echo_headline(json.loads(output.read_text()), gpus, echo=echo)
        echo(f"profile: {output}")
        return output
    if launcher == "torchrun":
        if not run_in_job(plan, raw_path):
            return None
    elif flags["network"] == "emulated":
        run_emulated(plan, raw_path, flags["inter_bw"])
    else:
        run_local(plan, raw_path)
    raw = json.loads(raw_path.read_text())
    profile = build_profile(
        raw,
        plan,
        name=name,
        description=flags["description"] or f"bench calibrate on {raw['hostname']}",
        command=shlex.join(["bench", *sys.argv[1:]]),
        links_from=links_from,
    )
    output.write_text(json.dumps(profile, indent=2) + "\n")
    raw_path.unlink()
    _echo_headline(profile, gpus, echo=echo)
    echo(f"profile: {output}")
    return output


def _echo_headline(profile: dict, gpus: int, *, echo) -> None:
    """Print a fitted profile's headline numbers (links, step times, memory bandwidth and the
    world all-reduce measured against the model), so a calibration's result can be judged
    at a glance before the profile is used.

    Args:
        profile: the profile JSON just written.
        gpus: the world size the world all-reduce was measured over.
        echo: where each line goes.
    """
    for link in ("intra", "inter"):
        entry = profile["links"][link]
        echo(
            f"{link:<6} alpha {entry['alpha_s'] * 1e6:9.1f} us   "
            f"bandwidth {entry['bandwidth_Bps'] * 8 / 1e9:8.3f} Gbit/s"
        )
    for key, entry in profile["compute"]["steps"].items():
        echo(f"step   {key:<28} {entry['seconds'] * 1e3:9.2f} ms")
    echo(f"memory {profile['memory_bandwidth']['bandwidth_Bps'] / 1e9:9.2f} GB/s")
    for size, measured, predicted in world_check(profile, gpus):
        echo(
            f"world all-reduce {size:>9} B: measured {measured * 1e3:8.2f} ms, "
            f"model {predicted * 1e3:8.2f} ms"
        )
