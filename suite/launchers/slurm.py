"""``bench run --launcher slurm``: the run submitted to SLURM with submitit.

One SLURM task per node. Each task runs ``NodeAgent`` (submitit pickles it): torch's
elastic agent for the node's ranks, the same launch as ``--launcher local``, with c10d
rendezvous on the allocation's first node at a port derived from the job id (two jobs on one
node never collide). The agent carries the run's plan whole, as the JSON the local launcher
hands its ranks (``RunPlan.to_json``: the resolved configuration and the plan's facts), so a
field added later reaches the ranks with nothing to update, and ``--dry-run`` prints that
JSON as the ranks receive it.

Preemption and time limits: SLURM sends SIGTERM ``--slurm-signal-lead`` seconds before the
limit (or on preemption) to every process of the job; the ranks stop after their iteration and
checkpoint (the agent gives them the lead, less a margin, before SIGKILL), node 0 marks the run
``interrupted`` and requeues the job, and its next start resumes the run folder.

submitit is used for what it does well (executor parameters, the sbatch file, the pickled
call, the logs); its own signal handling is not: it checkpoints in a signal handler on rank 0
alone and exits at once, while the suite's checkpoint is collective, taken by all ranks at an
agreed iteration.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from pathlib import Path

from suite.config import RunConfig
from suite.errors import BenchError, RunInterrupted
from suite.launchers.local import run_agent
from suite.results import schema
from suite.results.folder import RunFolder
from suite.run.checkpoint import latest_checkpoint
from suite.run.plan import RunPlan

DEFAULT_TIME_LIMIT = "02:00:00"
#: seconds before the time limit at which SLURM sends SIGTERM (``--slurm-signal-lead``)
SIGNAL_LEAD_SECONDS = 180
#: of the lead, the seconds kept for the agents to report and requeue after the ranks' exit
SHUTDOWN_MARGIN_SECONDS = 20
#: CPUs per GPU rank asked for when --slurm-cpus-per-task is not given (data and Python)
CPUS_PER_GPU_RANK = 8
#: where submitit keeps the job's pickles and logs, inside the run folder (kept by --overwrite)
JOB_FOLDER = "slurm-job"


def rendezvous_port(job_id: str) -> int:
    """A port in 20000-49999 from the job id: jobs sharing a node do not collide, and a
    requeued job (same id) finds its own again."""
    digits = re.sub(r"\D", "", str(job_id)) or "0"
    return 20000 + int(digits) % 30000


@dataclasses.dataclass
class SlurmRequest:
    """What is asked of SLURM (``--slurm-*`` flags)."""

    partition: str | None = None
    account: str | None = None
    time: str = DEFAULT_TIME_LIMIT
    cpus_per_task: int | None = None
    signal_lead: int = SIGNAL_LEAD_SECONDS

    def cpus(self, config: RunConfig) -> int:
        return self.cpus_per_task or config.gpus_per_node * (
            CPUS_PER_GPU_RANK if uses_cuda(config) else 1
        )

    def shutdown_seconds(self) -> int:
        return max(5, self.signal_lead - SHUTDOWN_MARGIN_SECONDS)


def uses_cuda(config: RunConfig) -> bool:
    """A cluster run uses GPUs unless ``--device cpu`` says otherwise."""
    return config.device != "cpu"


def executor_parameters(config: RunConfig, request: SlurmRequest) -> dict:
    """submitit's SlurmExecutor parameters for the run: one task per node, the node's CPUs
    given to srun too (Slurm 22.05-23.02's srun does not inherit them), GPUs only for CUDA
    ranks, SIGTERM at the lead, requeue allowed."""
    cpus = request.cpus(config)
    params = {
        "job_name": f"prunex-{config.method}-{config.gpus}g",
        "nodes": config.gpus // config.gpus_per_node,
        "ntasks_per_node": 1,
        "cpus_per_task": cpus,
        "srun_args": [f"--cpus-per-task={cpus}"],
        "stderr_to_stdout": True,
        "additional_parameters": {
            "time": request.time,
            "signal": f"TERM@{request.signal_lead}",
            "requeue": True,
            "open-mode": "append",
        },
    }
    if uses_cuda(config):
        params["gpus_per_node"] = config.gpus_per_node
    if request.partition:
        params["partition"] = request.partition
    if request.account:
        params["account"] = request.account
    return params


@dataclasses.dataclass
class NodeAgent:
    """One SLURM task: this node's torch elastic agent for its ranks (pickled by submitit)."""

    plan_json: str  # the run's plan, as every rank receives it (RunPlan.to_json)
    threads_per_rank: int
    shutdown_seconds: int
    resume: bool = False  # the first start continues the folder (bench run --resume)

    def __call__(self) -> None:
        # lazy: submitit costs ~0.1 s to import; only this path needs it
        import submitit


        job = submitit.JobEnvironment()
        try:
            plan = RunPlan.from_json(self.plan_json)
        except BenchError as exc:
            raise SystemExit(f"Error: {exc}") from None
        run_dir = Path(plan.config.results_dir) / plan.run_id
        try:
            resume, overwrite = start_mode(run_dir, plan.config.overwrite, self.resume)
        except BenchError as exc:
            raise SystemExit(f"Error: {exc}") from None
        plan = plan.restarted(resume=resume, overwrite=overwrite)
        os.environ["OMP_NUM_THREADS"] = str(self.threads_per_rank)
        head = job.hostnames[0]
        try:
            run_agent(
                plan,
                nodes=job.num_nodes,
                node=job.node,
                rendezvous=f"{head}:{rendezvous_port(job.job_id)}",
                job_id=str(job.job_id),
                shutdown_seconds=self.shutdown_seconds,
            )
        except RunInterrupted as exc:
            if job.node == 0 and has_checkpoint(run_dir) and requeue(str(job.job_id)):
                print(f"{exc}; job {job.job_id} requeued, its next start resumes", flush=True)
                return
            raise SystemExit(f"Error: {exc}") from None
        except BenchError as exc:
            print(f"Error: {exc}", flush=True)
            if job.node == 0:  # the run is over: no task waits on a lost host, no requeue
                cancel(str(job.job_id))
            raise SystemExit(1) from None


def cancel(job_id: str) -> None:
    """End the job of a failed run: its other tasks (on a host that was lost, srun waits for
    them until SLURM notices) and SLURM's requeue of a job whose node failed."""
    subprocess.run(["scancel", job_id], capture_output=True)


def start_mode(run_dir: Path, overwrite: bool, resume: bool) -> tuple[bool, bool]:
    """(resume, overwrite) for this start of the job: the first start as asked (--resume,
    --overwrite); a requeued start resumes the checkpoint an earlier start left, or starts
    over without one, unless that start failed (SLURM requeues a job whose host was lost):
    a failed run's rows and errors are kept, never started over."""
    if int(os.environ.get("SLURM_RESTART_COUNT", "0")) == 0:
        return resume, overwrite
    if has_checkpoint(run_dir):
        return True, False
    status = (RunFolder(run_dir).summary() or {}).get(schema.STATUS)
    if status == schema.Status.FAILED:
        raise BenchError(f"run {run_dir.name} failed at the job's previous start and has no "
                         "checkpoint to resume; its folder is kept as it ended (requeued job "
                         "not started)")
    return False, True


def has_checkpoint(run_dir: Path) -> bool:

    return latest_checkpoint(run_dir) is not None


def requeue(job_id: str) -> bool:
    """Put the job back in the queue (its next start resumes the checkpoint), unless it is
    no longer running: a job cancelled with scancel stays cancelled."""
    state = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                           text=True).stdout.strip()
    if state != "RUNNING":
        return False
    return subprocess.run(["scontrol", "requeue", job_id], capture_output=True).returncode == 0


def slurm_executor(folder: Path, *, preview: bool):
    """submitit's SlurmExecutor for ``folder``; ``preview``: one that skips submitit's check
    for ``srun``, so ``--dry-run`` prints the job on a machine without SLURM."""
    # lazy: submitit costs ~0.1 s to import; only this path needs it
    import submitit

    if preview:

        class Preview(submitit.SlurmExecutor):
            @classmethod
            def affinity(cls) -> int:
                return 2  # what submitit reports where srun exists

        return Preview(folder=folder, max_num_timeout=0)
    try:
        return submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
    except RuntimeError as exc:  # submitit: 'Could not detect "srun"...'
        raise BenchError(f"cannot submit to SLURM here ({exc}); use --dry-run to print the "
                         "job") from None


def submission(plan: RunPlan, request: SlurmRequest, *, preview: bool = False):
    """(submitit executor, the NodeAgent it will run) for the run."""
    config = plan.config
    job_folder = Path(config.results_dir).resolve() / plan.run_id / JOB_FOLDER
    executor = slurm_executor(job_folder, preview=preview)
    executor.update_parameters(**executor_parameters(config, request))
    agent = NodeAgent(
        plan_json=plan.to_json(),
        threads_per_rank=max(1, request.cpus(config) // config.gpus_per_node),
        shutdown_seconds=request.shutdown_seconds(),
        resume=config.resume,
    )
    return executor, agent


def describe_submission(plan: RunPlan, request: SlurmRequest) -> str:
    """``--dry-run``: the sbatch file submitit will submit and the plan every node's agent
    starts its ranks with (``suite.run.entry.rank_main`` of that JSON)."""
    # lazy: submitit.slurm.slurm costs ~0.1 s to import; only this path needs it
    from submitit.slurm.slurm import _make_sbatch_string

    config = plan.config
    executor, agent = submission(plan, request, preview=True)
    command = " ".join(executor._submitit_command_str.split())
    sbatch = _make_sbatch_string(command=command, folder=executor.folder, **executor.parameters)
    return "\n".join([
        sbatch.rstrip(),
        "",
        f"# each of the {config.gpus // config.gpus_per_node} tasks: a torch elastic agent for "
        f"{config.gpus_per_node} ranks ({agent.threads_per_rank} threads each), c10d "
        "rendezvous on the first node, port from the job id; every rank runs "
        "suite.run.entry.rank_main(PLAN) with PLAN (its config and the facts each rank "
        "checks):",
        "#   " + agent.plan_json,
        f"# SIGTERM {request.signal_lead} s before the time limit or on preemption: the ranks "
        f"get {agent.shutdown_seconds} s to checkpoint, then the job requeues and resumes.",
        "",
    ])


def slurm_config(config: RunConfig) -> RunConfig:
    """``config`` as a SLURM job runs it: its node size given, CUDA ranks unless ``--device
    cpu``."""

    if config.gpus_per_node is None:
        raise BenchError("--launcher slurm needs --gpus-per-node (ranks on each cluster node)")
    return dataclasses.replace(config, device="cuda" if config.device == "auto" else config.device)


#: sbatch's --time formats: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
#: days-hours:minutes, days-hours:minutes:seconds; or no limit
SLURM_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE",
                        re.IGNORECASE)


def check_slurm_time(text: str) -> str:
    """``text`` if sbatch takes it as --time, else one line with its formats."""
    if not SLURM_TIME.fullmatch(text.strip()):
        raise BenchError(f"--slurm-time {text!r} is not a SLURM time: minutes, MM:SS, HH:MM:SS, "
                         "D-HH, D-HH:MM or D-HH:MM:SS (e.g. 02:00:00)")
    return text.strip()


def slurm_request(
    slurm_partition: str | None = None,
    slurm_account: str | None = None,
    slurm_time: str | None = None,
    slurm_cpus_per_task: int | None = None,
    slurm_signal_lead: int | None = None,
) -> SlurmRequest:
    """The ``--slurm-*`` flags as a request, checked."""
    request = SlurmRequest(
        partition=slurm_partition,
        account=slurm_account,
        time=check_slurm_time(slurm_time) if slurm_time else DEFAULT_TIME_LIMIT,
        cpus_per_task=slurm_cpus_per_task,
        signal_lead=slurm_signal_lead or SIGNAL_LEAD_SECONDS,
    )
    if request.shutdown_seconds() >= request.signal_lead:
        raise BenchError("--slurm-signal-lead must leave the ranks time to checkpoint")
    return request


def submit_or_print(plan: RunPlan, request: SlurmRequest, *, dry_run: bool, echo) -> None:
    """``bench run --launcher slurm`` of a checked plan: print the job (``--dry-run``) or
    submit it."""
    if dry_run:
        echo(describe_submission(plan, request), nl=False)
        return
    if shutil.which("sbatch") is None:
        raise BenchError("sbatch not found on PATH (SLURM is not installed here); use --dry-run "
                         "to print the job")
    config = plan.config
    executor, agent = submission(plan, request)
    try:
        job = executor.submit(agent)
    except Exception as exc:  # submitit raises its own error types around sbatch's reply
        last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise BenchError(f"sbatch failed: {last}") from None
    echo(f"Submitted batch job {job.job_id}; results: {Path(config.results_dir) / config.run_id}")
