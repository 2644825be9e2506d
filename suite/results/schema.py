"""Every key a run folder's results hold, and the words of their statuses and verdicts, in one
list (as MLCommons' mllog keeps its log keys): writers and readers use these names, never a
bare string, so a typo fails at import and a key is renamed everywhere at once.

Sections: ``summary.json`` (the run's identity, then its numbers), ``iterations.parquet`` (one
row per iteration and rank), ``evals.parquet`` (one row per evaluation), ``layers.parquet``
(PruneX: per round and ADMM block), and the verdicts of ``bench compare``.
"""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    """``summary.json``'s ``status``: ``running`` from before the ranks start, then how the
    run ended."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


#: statuses of a run that ended
ENDED = (Status.OK, Status.FAILED, Status.INTERRUPTED)

# -- summary.json: identity (written before any rank starts) ----------------------------------
RUN_ID = "run_id"
STATUS = "status"
ERROR = "error"
METHOD = "method"
WORKLOAD = "workload"
DATASET = "dataset"
GPUS = "gpus"
NODES = "nodes"
GPUS_PER_NODE = "gpus_per_node"
OPTIONS = "options"
#: method options every label and table shows wherever a run resolved them, given or not: the
#: structured keeps (suite.structured.masks.StructuredKeepSettings), without which a pruning
#: run at its default keep would not say what it pruned
ALWAYS_SHOWN_OPTIONS = ("filter_keep", "channel_keep", "shape_keep", "head_keep", "mlp_keep")
SEED = "seed"
LAUNCHER = "launcher"
STARTED = "started"
ENDED_AT = "ended"
PROCESSES = "processes"
#: ``bench run --launcher slurm``: the hosts the ranks ran on
HOSTS = "hosts"

# -- summary.json: what the run did ------------------------------------------------------------
ITERATIONS = "iterations"
ITERATIONS_RECORDED = "iterations_recorded"
STEPS_PER_ITERATION = "steps_per_iteration"
#: local steps between a method's exchanges: {EXCHANGE_INTRA: n, EXCHANGE_INTER: m}, where
#: ``inter_node`` counts any exchange that crosses nodes (a flat ring included)
EXCHANGE_EVERY = "exchange_every"
EXCHANGE_INTRA = "intra_node"
EXCHANGE_INTER = "inter_node"
EPOCHS = "epochs"
SAMPLES_PER_RANK = "samples_per_rank"
FINAL_ACCURACY = "final_accuracy"
#: the mean training loss (ranks averaged) over the last half of the iterations: what a short
#: run resolves (a kernel change moves it by ~0.1 %, a seed by up to ~8 %, accuracy by points)
FINAL_TRAIN_LOSS = "final_train_loss"
BEST_ACCURACY = "best_accuracy"
TARGET_ACCURACY = "target_accuracy"
TIME_TO_TARGET_SECONDS = "time_to_target_seconds"
CONVERGED = "converged"
SIMULATED = "simulated"
INTER_NODE_BYTES_TOTAL = "inter_node_bytes_total"
INTRA_NODE_BYTES_TOTAL = "intra_node_bytes_total"
INTER_NODE_BYTES_PER_ITERATION = "inter_node_bytes_per_iteration"
WIRE_INTER_BYTES_TOTAL = "wire_inter_bytes_total"
WIRE_TO_ALGORITHMIC_RATIO = "wire_to_algorithmic_ratio"
WALL_SECONDS = "wall_seconds"
TRAIN_SECONDS = "train_seconds"
ITERATION_SECONDS = "iteration_seconds"
PHASE_SECONDS = "phase_seconds"
SETUP_SECONDS = "setup_seconds"
CONNECT_SECONDS = "connect_seconds"
WARMUP_SECONDS = "warmup_seconds"
FIRST_ITERATION_SECONDS = "first_iteration_seconds"
EVALUATION_SECONDS = "evaluation_seconds"
SAMPLES_PER_SECOND_PER_RANK = "samples_per_second_per_rank"
WARNINGS = "warnings"
RESTARTS = "restarts"
RESUMED_AT_ITERATION = "resumed_at_iteration"
CHECKPOINTS_WRITTEN = "checkpoints_written"
CHECKPOINT_SECONDS_MEAN = "checkpoint_seconds_mean"
CHECKPOINT_BYTES = "checkpoint_bytes"

#: the keys every finished run's summary has (``error`` is None unless it failed)
SUMMARY_KEYS = (
    RUN_ID, STATUS, ERROR, METHOD, WORKLOAD, DATASET, GPUS, NODES, GPUS_PER_NODE, ITERATIONS,
    EPOCHS, FINAL_ACCURACY, BEST_ACCURACY, INTER_NODE_BYTES_TOTAL, INTRA_NODE_BYTES_TOTAL,
    INTER_NODE_BYTES_PER_ITERATION, WALL_SECONDS, TRAIN_SECONDS, ITERATION_SECONDS,
    TIME_TO_TARGET_SECONDS, TARGET_ACCURACY, PHASE_SECONDS, OPTIONS, SIMULATED,
)

# -- iterations.parquet: one row per (iteration, rank) -----------------------------------------
ITERATION = "iteration"
RANK = "rank"
T_ITERATION = "t_iteration"
LOSS = "loss"
SAMPLES = "samples"
EPOCH = "epoch"
LR = "lr"
DENSITY = "density"
#: density of the tensors the keeps can prune (what a keep is judged against; suite.structured)
PRUNABLE_DENSITY = "prunable_density"
#: the links bytes are attributed to
LINKS = ("intra", "inter")
BYTES_INTRA = "bytes_intra"
BYTES_INTER = "bytes_inter"
#: True where the iteration's time holds a one-off cost of its attempt (its first iteration,
#: DDP's bucket rebuild, PowerSGD's first compressed step: Method.one_off_iterations); the
#: summary's means leave these rows out
ONE_OFF = "one_off"
#: a phase's seconds are the column ``t_<phase>`` (suite.cluster.phases names them)
PHASE_PREFIX = "t_"


def exchange_text(schedule: dict | None, separator: str = " / ") -> str:
    """A run's ``exchange_every`` as a table shows it: local steps between exchanges inside
    a node and across nodes, ``4 / 32``; ``-`` for a run recorded before it was."""
    if not isinstance(schedule, dict) or EXCHANGE_INTER not in schedule:
        return "-"
    return f"{schedule.get(EXCHANGE_INTRA, '-')}{separator}{schedule[EXCHANGE_INTER]}"


def phase_column(phase: str) -> str:
    """``local_compute`` -> ``t_local_compute``."""
    return f"{PHASE_PREFIX}{phase}"


def bytes_column(link: str) -> str:
    """``inter`` -> ``bytes_inter``."""
    return f"bytes_{link}"


def phase_columns(columns) -> list[str]:
    """The phase columns among ``columns`` (``t_iteration`` is the whole, not a phase)."""
    return [c for c in columns if c.startswith(PHASE_PREFIX) and c != T_ITERATION]


# -- evals.parquet: one row per evaluation -------------------------------------------------------
ACCURACY = "accuracy"
TEST_LOSS = "test_loss"
TRAIN_LOSS = "train_loss"
INTER_NODE_BYTES = "inter_node_bytes"  # cumulative, summed over ranks
INTRA_NODE_BYTES = "intra_node_bytes"


class Verdict(StrEnum):
    """What ``bench compare`` says of one metric of one configuration; the value is the word
    its tables print (a regression's reason follows it after a colon)."""

    OK = "ok"
    WITHIN_INTERVALS = "ok (within the repeats' intervals)"
    IMPROVED = "improved"
    REGRESSION = "REGRESSION"
    NOT_APPLICABLE = "n/a"

    def text(self, finding: str | None = None) -> str:
        """The verdict as the tables print it: ``REGRESSION: prunex did not prune``."""
        return f"{self.value}: {finding}" if finding else self.value
