"""``bench run --launcher slurm``: an sbatch script that runs the same ``bench run`` on a
cluster: N/G nodes, one task per node, each task a torchrun agent for G ranks with c10d
rendezvous on the allocation's first node. Inside the job every rank is ``bench run
--launcher torchrun``; nodes are discovered from the hostnames, not emulated."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from suite.errors import BenchError
from suite.run.config import RunConfig

RDZV_PORT = 29500
DEFAULT_TIME_LIMIT = "02:00:00"
# RunConfig field -> bench run flag, for the fields a rank must see again
FLAGS = {
    "method": "--method",
    "workload": "--workload",
    "dataset": "--dataset",
    "data_dir": "--data-dir",
    "gpus": "--gpus",
    "device": "--device",
    "iterations": "--iterations",
    "epochs": "--epochs",
    "eval_every": "--eval-every",
    "target_accuracy": "--target-accuracy",
    "seed": "--seed",
    "results_dir": "--results-dir",
    "run_id": "--run-id",
    "tag": "--tag",
    "batch_size": "--batch-size",
    "lr": "--lr",
    "momentum": "--momentum",
    "weight_decay": "--weight-decay",
    "checkpoint_every": "--checkpoint-every",
    "checkpoint_minutes": "--checkpoint-minutes",
    "collective_timeout": "--collective-timeout",
}
#: seconds before the time limit at which SLURM sends SIGTERM to the ranks: they stop at the
#: next iteration, checkpoint, and the job requeues itself to resume
SIGNAL_LEAD_SECONDS = 180


def rank_arguments(config: RunConfig) -> list[str]:
    """``bench run`` arguments that recreate ``config`` on every rank of the job."""
    from suite.plugins.registry import METHODS

    declared = {o.name: o for o in METHODS.get(config.method).options}
    args = ["run", "--launcher", "torchrun"]
    for field, flag in FLAGS.items():
        value = getattr(config, field)
        if value is not None:
            args += [flag, str(Path(value).resolve()) if field == "results_dir" else str(value)]
    if config.download:
        args.append("--download")
    if config.dataset == "synthetic":
        args += ["--synthetic-size", ",".join(map(str, config.synthetic_size))]
    for key, value in sorted(config.options.items()):
        opt = declared[key]
        if opt.kind is bool:
            args.append(opt.flag if value else f"--{opt.off_flag}")
        else:
            args += [opt.flag, str(value)]
    return args


def sbatch_script(
    config: RunConfig,
    *,
    partition: str | None = None,
    account: str | None = None,
    time_limit: str = DEFAULT_TIME_LIMIT,
    cpus_per_task: int | None = None,
) -> str:
    gpn = config.gpus_per_node
    nodes = config.gpus // gpn
    run_dir = Path(config.results_dir).resolve() / str(config.run_id)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=prunex-{config.method}-{config.gpus}g",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={gpn}",
        f"#SBATCH --cpus-per-task={cpus_per_task or 8 * gpn}",
        f"#SBATCH --time={time_limit}",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        f"#SBATCH --signal=TERM@{SIGNAL_LEAD_SECONDS}",
    ]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    bench = shlex.join(["-m", "suite.cli", *rank_arguments(config)])
    threads = max(1, (cpus_per_task or 8 * gpn) // gpn)
    lines += [
        "",
        f"# {config.gpus} ranks: {nodes} nodes x {gpn} GPUs, one torchrun agent per node.",
        f"# {SIGNAL_LEAD_SECONDS} s before the time limit the ranks get SIGTERM, stop after their",
        "# iteration and checkpoint (with --checkpoint-every/--checkpoint-minutes); the job then",
        "# requeues itself and the next start resumes the run folder.",
        "set -uo pipefail",
        f"run_dir={shlex.quote(str(run_dir))}",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{threads}}}",
        'if [ -f "$run_dir/checkpoints/latest.json" ]; then',
        '  bench_args=(-m suite.cli run --launcher torchrun --resume "$run_dir")',
        'elif [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ]; then',
        f"  bench_args=({bench} --overwrite)",
        "else",
        f"  bench_args=({bench})",
        "fi",
        "srun --kill-on-bad-exit=1 python -m torch.distributed.run \\",
        f'  --nnodes "$SLURM_NNODES" --nproc-per-node {gpn} \\',
        f"  --max-restarts {config.max_restarts} \\",
        f'  --rdzv-backend c10d --rdzv-endpoint "$head_node:{RDZV_PORT}" \\',
        '  --rdzv-id "$SLURM_JOB_ID" \\',
        '  "${bench_args[@]}"',
        "code=$?",
        'if [ "$code" -ne 0 ] && [ -f "$run_dir/checkpoints/latest.json" ] \\',
        '   && grep -q \'"status": "interrupted"\' "$run_dir/summary.json"; then',
        '  scontrol requeue "$SLURM_JOB_ID"',
        "fi",
        'exit "$code"',
        "",
    ]
    return "\n".join(lines)


def submit(script: str, run_dir: Path) -> str:
    """Write the script beside the run and hand it to sbatch; returns sbatch's reply."""
    if shutil.which("sbatch") is None:
        raise BenchError("sbatch not found on PATH; use --dry-run to print the script")
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "job.sbatch"
    path.write_text(script)
    proc = subprocess.run(["sbatch", str(path)], capture_output=True, text=True)
    if proc.returncode:
        raise BenchError(f"sbatch {path} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def submit_or_print(
    config: RunConfig,
    *,
    dry_run: bool,
    echo,
    slurm_partition: str | None = None,
    slurm_account: str | None = None,
    slurm_time: str | None = None,
) -> None:
    """``bench run --launcher slurm``: check the run, then print (--dry-run) or sbatch its
    job script."""
    from suite.commands.preflight import validate
    from suite.results.folder import make_run_id

    if config.gpus_per_node is None:
        raise BenchError("--launcher slurm needs --gpus-per-node (GPUs on each cluster node)")
    config.run_id = config.run_id or make_run_id(config.method, config.workload, config.gpus)
    validate(config, check_data=False)
    script = sbatch_script(
        config,
        partition=slurm_partition,
        account=slurm_account,
        time_limit=slurm_time or DEFAULT_TIME_LIMIT,
    )
    if dry_run:
        echo(script, nl=False)
    else:
        echo(submit(script, Path(config.results_dir) / config.run_id))
