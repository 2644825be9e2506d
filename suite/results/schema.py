"""Every key a run folder's files hold, and the words of their statuses and verdicts, in one
list (as MLCommons' mllog keeps its log keys): writers and readers use these names, never a
bare string, so a typo fails at import and a key is renamed everywhere at once
(tests/results/test_schema.py fails on a key spelled out elsewhere in ``suite/``).

Sections: the format's version (``FORMAT_VERSION``, written into every ``summary.json`` and
``manifest.json``; older folders are read through ``suite.results.upgrade``), ``summary.json``
(the run's identity, then its numbers), ``manifest.json`` (what ran, where, with what; its
sections' keys below it), ``iterations.parquet`` (one row per iteration and rank),
``evals.parquet`` (one row per evaluation), ``layers.parquet`` (PruneX: per round and ADMM
block), and the verdicts of ``bench compare``. The tuples ``SUMMARY_FILE_KEYS``,
``MANIFEST_FILE_KEYS``, ``ITERATION_COLUMNS``, ``EVAL_COLUMNS`` and ``LAYER_COLUMNS`` list
each file's keys; a method may add columns of its own to its rows (``StepResult`` values).
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

# -- the format's version ------------------------------------------------------------------------
#: the run-folder format this code writes: 1, the folders before versions were written (no
#: ``format_version``; the committed references); 2, every key below declared, the version in
#: summary and manifest, the runner's load over the run in the manifest
FORMAT_VERSION = 2
#: where summary.json and manifest.json say which format wrote them (absent: 1)
FORMAT_VERSION_KEY = "format_version"

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
#: the run's rank processes of its latest attempt, ``[host, pid, start time]`` each (the kernel's
#: start time, ``suite.processes.identity``; folders before it hold ``[host, pid]``): cleared
#: when an attempt opens the folder, and nothing is signalled whose identity differs
PROCESSES = "processes"
#: a token per attempt that opened the folder (a start, a resume), the latest last: the rows a
#: rank streams into ``parts/`` carry its attempt's, and rows of another are refused at merge
ATTEMPTS = "attempts"
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
#: input bytes of collectives a method issued past ctx.comm during its steps, summed over
#: ranks, on groups that span nodes / inside one node (None: torch could not tell)
HIDDEN_INTER_NODE_BYTES = "hidden_inter_node_bytes"
HIDDEN_INTRA_NODE_BYTES = "hidden_intra_node_bytes"
WIRE_INTER_BYTES_TOTAL = "wire_inter_bytes_total"
WIRE_TO_ALGORITHMIC_RATIO = "wire_to_algorithmic_ratio"
#: the same with each frame's headers taken off the wire's bytes (``WIRE_FRAME_HEADER_BYTES``
#: per frame sent, pure acknowledgements included): the payload the sockets carried, which
#: the communicator's algorithmic count must match whatever the size of the messages (many
#: ranks split a buffer into small ones, whose framing the raw ratio counts)
WIRE_PAYLOAD_TO_ALGORITHMIC_RATIO = "wire_payload_to_algorithmic_ratio"
#: an Ethernet (14), IPv4 (20) and TCP header with timestamps (32): what a frame adds
WIRE_FRAME_HEADER_BYTES = 66
WALL_SECONDS = "wall_seconds"
TRAIN_SECONDS = "train_seconds"
ITERATION_SECONDS = "iteration_seconds"
PHASE_SECONDS = "phase_seconds"
#: phase -> seconds the run's one-off iterations took in it beyond a steady iteration (mean
#: over ranks, summed over those iterations): costs paid once, such as PruneX's freeze
#: decision or DDP's bucket rebuild, which ``phase_seconds`` (steady means) leaves out
ONE_OFF_SECONDS = "one_off_seconds"
SETUP_SECONDS = "setup_seconds"
CONNECT_SECONDS = "connect_seconds"
WARMUP_SECONDS = "warmup_seconds"
FIRST_ITERATION_SECONDS = "first_iteration_seconds"
EVALUATION_SECONDS = "evaluation_seconds"
SAMPLES_PER_SECOND_PER_RANK = "samples_per_second_per_rank"
WARNINGS = "warnings"
#: ``--deterministic`` runs: the ops (rank 0's) that have no deterministic kernel and warned,
#: [] where none did: the run's bits can repeat only where this is empty
NONDETERMINISTIC_OPS = "nondeterministic_ops"
RESTARTS = "restarts"
RESUMED_AT_ITERATION = "resumed_at_iteration"
CHECKPOINTS_WRITTEN = "checkpoints_written"
CHECKPOINT_SECONDS_MEAN = "checkpoint_seconds_mean"
CHECKPOINT_BYTES = "checkpoint_bytes"
#: PruneX: where its masks froze ({iteration, samples_per_rank}; absent: never)
MASKS_FROZEN_AT = "masks_frozen_at"
#: a simulated run's accuracy came from this real run (``--accuracy-from``)
ACCURACY_FROM = "accuracy_from"

#: the keys every finished run's summary has (``error`` is None unless it failed)
SUMMARY_KEYS = (
    RUN_ID, STATUS, ERROR, METHOD, WORKLOAD, DATASET, GPUS, NODES, GPUS_PER_NODE, ITERATIONS,
    EPOCHS, FINAL_ACCURACY, BEST_ACCURACY, INTER_NODE_BYTES_TOTAL, INTRA_NODE_BYTES_TOTAL,
    INTER_NODE_BYTES_PER_ITERATION, WALL_SECONDS, TRAIN_SECONDS, ITERATION_SECONDS,
    TIME_TO_TARGET_SECONDS, TARGET_ACCURACY, PHASE_SECONDS, OPTIONS, SIMULATED,
)

#: every key summary.json may hold
SUMMARY_FILE_KEYS = (
    FORMAT_VERSION_KEY, RUN_ID, STATUS, ERROR, METHOD, WORKLOAD, DATASET, GPUS, NODES,
    GPUS_PER_NODE, OPTIONS, SEED, LAUNCHER, STARTED, ENDED_AT, PROCESSES, ATTEMPTS, HOSTS,
    ITERATIONS,
    ITERATIONS_RECORDED, STEPS_PER_ITERATION, EXCHANGE_EVERY, EPOCHS, SAMPLES_PER_RANK,
    FINAL_ACCURACY, FINAL_TRAIN_LOSS, BEST_ACCURACY, TARGET_ACCURACY, TIME_TO_TARGET_SECONDS,
    CONVERGED, SIMULATED, INTER_NODE_BYTES_TOTAL, INTRA_NODE_BYTES_TOTAL, HIDDEN_INTER_NODE_BYTES,
    HIDDEN_INTRA_NODE_BYTES,
    INTER_NODE_BYTES_PER_ITERATION, WIRE_INTER_BYTES_TOTAL, WIRE_TO_ALGORITHMIC_RATIO,
    WIRE_PAYLOAD_TO_ALGORITHMIC_RATIO,
    WALL_SECONDS, TRAIN_SECONDS, ITERATION_SECONDS, PHASE_SECONDS, ONE_OFF_SECONDS,
    SETUP_SECONDS, CONNECT_SECONDS, WARMUP_SECONDS, FIRST_ITERATION_SECONDS, EVALUATION_SECONDS,
    SAMPLES_PER_SECOND_PER_RANK, WARNINGS, NONDETERMINISTIC_OPS, RESTARTS, RESUMED_AT_ITERATION,
    CHECKPOINTS_WRITTEN,
    CHECKPOINT_SECONDS_MEAN, CHECKPOINT_BYTES, MASKS_FROZEN_AT, ACCURACY_FROM,
)
#: the launcher's entry of the summary (``bench recover`` checks its process), with its kernel
#: start time (absent in older folders), so a recycled pid is not taken for it
LAUNCHER_HOST = "host"
LAUNCHER_PID = "pid"
LAUNCHER_STARTED = "started"

# -- manifest.json: what ran, where, with what (written before the first iteration) ------------
#: the resolved RunConfig, as an experiment file holds it (suite.config; its fields' names)
CONFIG = "config"
#: every method option with its default filled in, and what the method derived
METHOD_SETTINGS = "method_settings"
#: the frozen run plan every rank resolved (suite.run.plan.RunPlan.facts) and its digest
PLAN = "plan"
PLAN_DIGEST = "digest"
#: the plan's facts besides the run's own names: the method's plugin (None: built in), its
#: resolved settings, the dataset's spec, the layout (gpus, gpus_per_node, nodes), the schedule
PLAN_PLUGIN = "plugin"
PLAN_SETTINGS = "settings"
PLAN_SPEC = "spec"
PLAN_LAYOUT = "layout"
PLAN_SCHEDULE = "schedule"
#: the plan's input size (suite.data.input_size.InputSize): the side the dataset's images
#: are stored at, the side the model takes them at (resized per batch), how it was chosen
#: (dataset, given: --image-size, found: the smallest the model takes)
PLAN_INPUT_SIZE = "input_size"
INPUT_DATASET_SIDE = "dataset_side"
INPUT_MODEL_SIDE = "model_side"
INPUT_CHOSEN = "chosen"
RECIPE = "recipe"
PLANNED_ITERATIONS = "planned_iterations"
BUDGET = "budget"
#: phases that ran during local_compute (DDP's comm hooks)
OVERLAPPED_PHASES = "overlapped_phases"
STEPS_PER_EPOCH = "steps_per_epoch"
TRAIN_SAMPLES = "train_samples"
TEST_SAMPLES = "test_samples"
PARAMETERS = "parameters"
MODEL = "model"
VERSIONS = "versions"
GIT_REVISION = "git_revision"
DEVICE = "device"
BACKEND = "backend"
TOPOLOGY = "topology"
NUMERICS = "numerics"
GROUP_BACKENDS = "group_backends"
GPU_SHARING = "gpu_sharing"
# manifest.json's ``gpu_sharing`` (suite.cluster.ranks.gpu_sharing), on CUDA ranks
LOCAL_RANKS = "local_ranks"
RANKS_PER_GPU = "ranks_per_gpu"
TIMINGS_REPRESENTATIVE = "timings_representative"
LIVE_LOGS = "live_logs"
HARDWARE = "hardware"
NETWORK = "network"
SIMULATION = "simulation"
#: how busy the runner was over the run (suite.results.runner): time is judged only on a quiet
#: runner
RUNNER_LOAD = "runner_load"
#: every key manifest.json may hold (and RUN_ID, STEPS_PER_ITERATION, EXCHANGE_EVERY,
#: SIMULATED, STARTED of the summary's names)
#: manifest.json: the hosts of each start of the run (a resumed or requeued run adds one)
HOSTS_PER_ATTEMPT = "hosts_per_attempt"
MANIFEST_FILE_KEYS = (
    FORMAT_VERSION_KEY, RUN_ID, CONFIG, PLAN, METHOD_SETTINGS, RECIPE, PLANNED_ITERATIONS, BUDGET,
    STEPS_PER_ITERATION, EXCHANGE_EVERY, OVERLAPPED_PHASES, STEPS_PER_EPOCH, TRAIN_SAMPLES,
    TEST_SAMPLES, PARAMETERS, MODEL, VERSIONS, GIT_REVISION, DEVICE, BACKEND, TOPOLOGY,
    NUMERICS, GROUP_BACKENDS, GPU_SHARING, LIVE_LOGS, HARDWARE, SIMULATED, NETWORK, SIMULATION,
    RUNNER_LOAD, STARTED, HOSTS_PER_ATTEMPT,
)

# manifest.json's ``recipe`` (suite.data.workload.Recipe's fields) and ``budget``
BATCH_SIZE = "batch_size"
MOMENTUM = "momentum"
WEIGHT_DECAY = "weight_decay"
LR_SCHEDULE = "lr_schedule"
WARMUP_EPOCHS = "warmup_epochs"
#: local steps every rank takes, whatever the method's iteration size
LOCAL_STEPS_PER_RANK = "local_steps_per_rank"

# manifest.json's ``hardware`` (suite.results.folder.hardware)
PLATFORM = "platform"
PROCESSOR = "processor"
CPU_COUNT = "cpu_count"
CPU_VENDOR = "cpu_vendor"
CPU_FAMILY = "cpu_family"
CPU_MODEL_NAME = "cpu_model_name"
#: torch's CPU kernels (``avx512``, ``avx2``, ``default`` under ATEN_CPU_CAPABILITY=default)
CPU_CAPABILITY = "cpu_capability"
THREADS_PER_RANK = "threads_per_rank"
CUDA_DEVICES = "cuda_devices"

# manifest.json's ``numerics`` (suite.results.folder.numerics; and DEVICE)
DETERMINISTIC_ALGORITHMS = "deterministic_algorithms"
#: the mode, not an event: True where an op without a deterministic kernel would warn and
#: run anyway (``--deterministic``), False where it would end the run (strict, or off); the
#: ops that did warn are the summary's NONDETERMINISTIC_OPS
DETERMINISTIC_WARN_ONLY = "deterministic_warn_only"
FLOAT32_MATMUL_PRECISION = "float32_matmul_precision"
TF32_MATMUL = "tf32_matmul"
TF32_CUDNN = "tf32_cudnn"
CUDNN_DETERMINISTIC = "cudnn_deterministic"
CUDNN_BENCHMARK = "cudnn_benchmark"
DEVICE_NAME = "device_name"
DEVICE_MEMORY_BYTES = "device_memory_bytes"
COMPUTE_CAPABILITY = "compute_capability"

# manifest.json's ``topology`` (suite.cluster.topology.Topology.describe; and GPUS_PER_NODE,
# HOSTS)
WORLD_SIZE = "world_size"
NUM_NODES = "num_nodes"
EMULATED_NODES = "emulated_nodes"
NODE_RANKS = "node_ranks"
LEADERS = "leaders"
HOSTNAMES = "hostnames"
RANKS_PER_HOST = "ranks_per_host"
GPUS_PER_NODE_MATCHES_HOSTS = "gpus_per_node_matches_hosts"

# manifest.json's ``network`` (``mode``: loopback, emulated, or hosts: a job over several real
# hosts, with the ``interface`` rank 0's host reached the others on and the number of
# ``hosts``; an emulated link's rate) and ``simulation`` (the profile a simulated run was
# priced on, by its ``name``)
NETWORK_MODE = "mode"
NETWORK_HOSTS = "hosts"
NETWORK_INTERFACE = "interface"
INTER_BW = "inter_bw"
PROFILE = "profile"
PROFILE_NAME = "name"
STEP_SECONDS = "step_seconds"
STEP_SECONDS_SOURCE = "step_seconds_source"
HOST_MEMORY_BANDWIDTH = "host_memory_bandwidth_Bps"
REPLAYED_ITERATIONS = "replayed_iterations"
STATIONARY_AFTER_REPLAY = "stationary_after_replay"

# manifest.json's ``versions`` (suite.results.folder.versions)
PYTHON_VERSION = "python"
TORCH_VERSION = "torch"
TORCHVISION_VERSION = "torchvision"
TIMM_VERSION = "timm"
PANDAS_VERSION = "pandas"
CUDA_VERSION = "cuda"
#: the NVIDIA driver (nvidia-smi's ``driver_version``; None without one)
CUDA_DRIVER_VERSION = "cuda_driver"
CUDNN_VERSION = "cudnn"
NCCL_VERSION = "nccl"
TORCH_FALLBACKS = "torch_fallbacks"

# manifest.json's ``runner_load`` (suite.results.runner): over the run, on the host of rank 0
#: the cores this host has
CORES = "cores"
#: /proc/loadavg's 1-, 5- and 15-minute load averages at the start and at the end of the run
LOAD_AVERAGE_START = "load_average_start"
LOAD_AVERAGE_END = "load_average_end"
#: CPU seconds per second of the run that processes outside the run took (all cores)
OTHERS_CORES = "others_cores"
#: CPU seconds per second of the run stolen by the hypervisor (/proc/stat's steal)
STEAL_CORES = "steal_cores"
#: CPU seconds per second of the run its own processes on this host took
OWN_CORES = "own_cores"
#: the load outside the run, in cores: others plus steal (what the time verdict is judged on)
OUTSIDE_LOAD = "outside_load"
#: seconds the sample spans
SPAN_SECONDS = "span_seconds"

# -- the tables: <name>.parquet ----------------------------------------------------------------
ITERATIONS_TABLE = "iterations"
EVALS_TABLE = "evals"
LAYERS_TABLE = "layers"
TABLES = (ITERATIONS_TABLE, EVALS_TABLE, LAYERS_TABLE)

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
#: DDP's bucket rebuild, PowerSGD's first compressed step: Method.one_off_iterations; PruneX's
#: freeze: StepResult.one_off); the summary's means leave these rows out
ONE_OFF = "one_off"
#: a phase's seconds are the column ``t_<phase>`` (suite.cluster.phases names them)
PHASE_PREFIX = "t_"
#: operations the rank sent to the job's store during the iteration (heartbeats: one a
#: second, whatever the world's size; suite.cluster.watchdog.StoreTally)
STORE_OPS = "store_ops"
#: emulated links: the bytes the leader's interface sent and received in the iteration
WIRE_TX_BYTES = "wire_tx_bytes"
WIRE_RX_BYTES = "wire_rx_bytes"
#: and the frames it sent (each one packet: the links count one frame per packet)
WIRE_TX_FRAMES = "wire_tx_frames"
#: PruneX's and the structured baselines' own scalars (a method may add others of its own)
FROZEN = "frozen"
MASK_DRIFT = "mask_drift"
MASK_DRIFT_FRACTION = "mask_drift_fraction"
PACKED_BYTES = "packed_bytes"
RHO1_MEAN = "rho1_mean"
RHO2_MEAN = "rho2_mean"
#: iterations.parquet's columns (and a ``t_<phase>`` column per phase)
ITERATION_COLUMNS = (
    ITERATION, RANK, T_ITERATION, LOSS, SAMPLES, EPOCH, LR, DENSITY, PRUNABLE_DENSITY,
    BYTES_INTRA, BYTES_INTER, ONE_OFF, STORE_OPS, WIRE_TX_BYTES, WIRE_RX_BYTES,
    WIRE_TX_FRAMES, FROZEN, MASK_DRIFT,
    MASK_DRIFT_FRACTION, PACKED_BYTES, RHO1_MEAN, RHO2_MEAN,
)


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
#: evals.parquet's columns (and ITERATION, EPOCH, WALL_SECONDS, TRAIN_SECONDS)
EVAL_COLUMNS = (ITERATION, EPOCH, ACCURACY, TEST_LOSS, TRAIN_LOSS, INTER_NODE_BYTES,
                INTRA_NODE_BYTES, WALL_SECONDS, TRAIN_SECONDS)

# -- layers.parquet: PruneX, one row per (round, ADMM block) -------------------------------------
LAYER = "layer"
#: whether the block is under the structured constraint (pruned), or only averaged
CONSTRAINED = "constrained"
#: primal residuals inside a node and between nodes, and the dual residuals
R_INTRA = "r_intra"
R_INTER = "r_inter"
S_INTRA = "s_intra"
S_INTER = "s_inter"
#: the block's penalties (rho1: intra-node, rho2: inter-node)
RHO1 = "rho1"
RHO2 = "rho2"
#: layers.parquet's columns (and ITERATION, DENSITY)
LAYER_COLUMNS = (ITERATION, LAYER, CONSTRAINED, DENSITY, R_INTRA, R_INTER, S_INTRA, S_INTER,
                 RHO1, RHO2)


class Verdict(StrEnum):
    """What ``bench compare`` says of one metric of one configuration; the value is the word
    its tables print (a regression's reason follows it after a colon)."""

    OK = "ok"
    WITHIN_INTERVALS = "ok (within the repeats' intervals)"
    IMPROVED = "improved"
    REGRESSION = "REGRESSION"
    NOT_APPLICABLE = "n/a"
    #: a time metric of a run on a busy runner (suite.results.runner): not judged
    NOT_JUDGED = "not judged"

    def text(self, finding: str | None = None) -> str:
        """The verdict as the tables print it: ``REGRESSION: prunex did not prune``."""
        return f"{self.value}: {finding}" if finding else self.value
