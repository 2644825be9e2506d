"""The full configuration of one run: what the CLI parsed, what every rank receives,
and what the manifest records.

A RunConfig is frozen: once ``bench run`` has resolved it (launcher, node size, device, run
id) into a plan (``suite.run.plan``), nothing completes it in place; a changed copy is made
with ``dataclasses.replace``. Its JSON form is the manifest's ``config`` (a contract: old runs'
manifests are read by ``bench rerun``, ``--resume``, ``--config`` and ``bench compare``)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from suite.errors import BenchError

#: the seeds torch's generators take: what ``bench run`` accepts and a manifest may record
MAX_SEED = 2**63 - 1
#: more ranks than any job: what ``--gpus`` accepts and a record's rank lists may hold
MAX_RANKS = 1 << 20

#: launcher -> the flags that only it reads (``bench run``)
LAUNCHER_FLAGS = {
    "slurm": (
        "slurm_partition",
        "slurm_account",
        "slurm_time",
        "slurm_cpus_per_task",
        "slurm_signal_lead",
    ),
    "sim": ("profile", "replay", "accuracy_from"),
}
#: flags of ``bench run``, ``bench sweep`` and ``bench sim`` that are not RunConfig fields
COMMAND_ONLY_FLAGS = (
    "config", "dry_run", "force", "list_profiles", "strict_plugins", "help",
    *(name for names in LAUNCHER_FLAGS.values() for name in names),
)


def flag_of(name: str) -> str:
    """``gpus_per_node`` -> ``--gpus-per-node``: the command-line flag of a configuration
    field or a method option, spelled the one way click spells it."""
    return "--" + name.replace("_", "-")


def reserved_flags() -> set[str]:
    """Names (``seed``, ``dry_run``) of every flag ``bench run``, ``bench sweep`` and ``bench
    sim`` take themselves: a method option may not be called like one."""
    run_fields = {f.name for f in dataclasses.fields(RunConfig) if f.name != "options"}
    return run_fields | set(COMMAND_ONLY_FLAGS)


@dataclass(frozen=True)
class RunConfig:
    method: str = "prunex"
    workload: str = "cnn-fmnist"
    dataset: str | None = None  # None: the workload's default
    data_dir: str | None = None
    download: bool = False
    gpus: int = 4
    gpus_per_node: int | None = None  # None: discovered (torchrun/SLURM) or local default
    launcher: str = "local"
    device: str = "auto"  # auto | cpu | cuda
    iterations: int | None = None
    epochs: float | None = None
    eval_every: int | None = None
    bn_recalibrate: int = 0  # training batches per rank that re-estimate BN stats before an eval
    target_accuracy: float | None = None
    tensorboard: bool = False  # rank 0 writes TensorBoard events to <run folder>/tensorboard
    deterministic: bool = False  # deterministic kernels (suite.run.determinism)
    seed: int = 0
    results_dir: str = "results"
    run_id: str | None = None
    tag: str | None = None
    # recipe overrides (None: the workload's recipe)
    batch_size: int | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    lr_schedule: str | None = None
    warmup_epochs: float | None = None
    synthetic_size: tuple[int, int] = (4096, 1024)
    # the side images are handed to the model at (None: the dataset's, or the smallest the
    # model takes where it does not take those: suite.data.input_size)
    image_size: int | None = None
    # loopback, or emulated nodes with rate-limited inter-node links (suite.cluster.netemu)
    network: str = "loopback"
    inter_bw: str | None = None
    # reliability: checkpoints, resume, restarts, how long a collective may wait
    checkpoint_every: int | None = None  # iterations between checkpoints
    checkpoint_minutes: float | None = None  # minutes between checkpoints (rank 0's clock)
    resume: bool = False  # continue the run folder from its latest complete checkpoint
    overwrite: bool = False  # empty an existing run folder of the same run id first
    max_restarts: int = 0  # torch elastic restarts of all ranks after a rank dies
    collective_timeout: float = 300.0  # seconds a collective waits for a peer
    # method options, keyed by option name (e.g. "channel_keep"); methods read what they use
    options: dict = field(default_factory=dict)

    @classmethod
    def from_flags(cls, flags: dict, options: dict, gpus: int) -> RunConfig:
        """The configuration of parsed ``bench run``/``sweep``/``sim`` flags (or an experiment
        file's values): ``flags`` holds RunConfig fields by name, ``options`` the method's
        options, ``gpus`` the rank count."""
        fields = dict(flags)
        fields["download"] = bool(fields.get("download"))
        fields["tensorboard"] = bool(fields.get("tensorboard"))
        fields["deterministic"] = bool(fields.get("deterministic"))
        if fields.get("synthetic_size") is None:
            fields.pop("synthetic_size", None)
        else:
            size = tuple(fields["synthetic_size"])
            if len(size) != 2:
                raise BenchError(
                    f"--synthetic-size takes TRAIN,TEST, got {','.join(map(str, size))}"
                )
            fields["synthetic_size"] = size
        return cls(options=options, gpus=gpus, **fields)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        data = json.loads(text)
        data["synthetic_size"] = tuple(data.get("synthetic_size", (4096, 1024)))
        return cls(**data)
