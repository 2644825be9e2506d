"""The ``bench`` command line."""

from __future__ import annotations

import sys

import click

from suite.config import RunConfig
from suite.errors import BenchError

# Method options: CLI name -> (type, help, valid values or None). Stored in
# RunConfig.options under the underscored name; a method reads the ones it understands.
# The ranges are checked before any rank starts.
FRACTION = (lambda v: 0 < v <= 1, "in (0, 1]")
POSITIVE = (lambda v: v > 0, "positive")
AT_LEAST_1 = (lambda v: v >= 1, "at least 1")
DDP_FAMILY = "[ddp, ddp-bf16, ddp-fp16, powersgd]"
ROUNDS = "[prunex, prunex-flat, localsgd-hier]"
METHOD_OPTIONS: dict[str, tuple[object, str, tuple | None]] = {
    "--bucket-cap-mb": (float, f"{DDP_FAMILY} DDP bucket size in MiB (torch's 25)", POSITIVE),
    "--local-steps": (int, f"{ROUNDS} local SGD steps per round H", AT_LEAST_1),
    "--local-epochs": (float, f"{ROUNDS} local epochs per round E (paper: 5-10)", POSITIVE),
    "--filter-keep": (float, "[prunex*] fraction of output filters kept per conv", FRACTION),
    "--channel-keep": (float, "[prunex*] fraction of input channels kept (0.5)", FRACTION),
    "--shape-keep": (float, "[prunex*] fraction of kernel positions kept per conv", FRACTION),
    "--rho1": (float, "[prunex*] initial intra-node penalty (1.5e-3)", POSITIVE),
    "--rho2": (float, "[prunex] initial inter-node penalty (1.5e-4)", POSITIVE),
    "--rho-max": (float, "[prunex*] cap on adaptive penalties (10)", POSITIVE),
    "--freeze-round": (int, "[prunex*] freeze masks after this round", AT_LEAST_1),
    "--freeze-patience": (int, "[prunex*] freeze after N unchanged rounds (3)", AT_LEAST_1),
    "--bucket-mb": (float, "[prunex] inter-node packing bucket size in MiB (32)", POSITIVE),
    "--eps-abs": (float, "[prunex*] stop once Boyd's residual tests pass (never)", POSITIVE),
    "--eps-rel": (float, "[prunex*] relative residual tolerance (1e-3)", POSITIVE),
    "--adaptive-rho/--fixed-rho": (bool, "[prunex*] residual balancing of rho1, rho2", None),
    "--leader-mode": (
        click.Choice(["single", "sharded"]),
        "[prunex] single: one leader per node carries the inter-node all-reduce; sharded: "
        "every local rank all-reduces 1/P of the packed buffer with its peers (Horovod-style)",
        None,
    ),
    "--wire-dtype": (
        click.Choice(["fp32", "bf16"]),
        "[prunex] dtype of the packed inter-node buffers (fp32 math on both ends)",
        None,
    ),
    "--topk-ratio": (float, "[topk, topk-hier] fraction of entries sent (0.01)", FRACTION),
    "--powersgd-rank": (int, "[powersgd] matrix approximation rank (2)", AT_LEAST_1),
    "--start-powersgd-iter": (
        int,
        "[powersgd] vanilla all-reduce before this iteration (10; at least 2)",
        (lambda v: v >= 2, "at least 2"),
    ),
    "--intra-average-period": (
        int,
        "[localsgd-hier] average inside each node every N local steps (4)",
        AT_LEAST_1,
    ),
}


def option_key(flag: str) -> str:
    return flag.split("/")[0].lstrip("-").replace("-", "_")


def fail(exc: BenchError) -> None:
    click.echo(f"Error: {exc}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """prunex-bench: PruneX and its baselines on real distributed PyTorch."""


@main.command("list")
def list_cmd() -> None:
    """Registered methods and workloads, with what each one is."""
    from suite.registry import METHODS, WORKLOADS, load_builtins

    try:
        load_builtins()
        for title, registry in (("Methods", METHODS), ("Workloads", WORKLOADS)):
            click.echo(f"{title}:")
            entries = registry.entries()
            width = max((len(e.name) for e in entries), default=0)
            for entry in entries:
                click.echo(f"  {entry.name:<{width}}  {entry.description}")
    except BenchError as exc:
        fail(exc)


def add_method_options(func):
    for flag, (kind, help_text, _) in reversed(METHOD_OPTIONS.items()):
        if kind is bool:
            func = click.option(flag, option_key(flag), default=None, help=help_text)(func)
        else:
            func = click.option(flag, option_key(flag), type=kind, default=None, help=help_text)(
                func
            )
    return func


@main.command("run")
@click.option("--method", default="prunex", show_default=True, help="registered method name")
@click.option("--workload", default="cnn-fmnist", show_default=True, help="workload name")
@click.option("--dataset", default=None, help="fmnist | cifar10 | synthetic (default: workload's)")
@click.option("--data-dir", default=None, help="dataset directory (default: the dataset's own)")
@click.option("--download", is_flag=True, help="download the dataset if missing (needs network)")
@click.option("--gpus", default=4, show_default=True, type=int, help="number of ranks")
@click.option(
    "--gpus-per-node",
    default=None,
    type=int,
    help="ranks per (emulated) node; default: discovered in a job, else 4 (gpus/2 below 8)",
)
@click.option(
    "--launcher",
    type=click.Choice(["auto", "local", "torchrun"]),
    default="auto",
    show_default=True,
    help="auto: torchrun inside a torchrun/SLURM job, else local",
)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
@click.option("--iterations", type=int, default=None, help="iterations (PruneX: rounds) to run")
@click.option("--epochs", type=float, default=None, help="data epochs to run (default: recipe)")
@click.option("--eval-every", type=int, default=None, help="evaluate every N iterations")
@click.option("--target-accuracy", type=float, default=None, help="for time-to-target, e.g. 0.85")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--results-dir", default="results", show_default=True)
@click.option("--run-id", default=None, help="name of the run folder (default: generated)")
@click.option("--tag", default=None, help="free-form label stored in the manifest")
@click.option("--batch-size", type=int, default=None, help="per-rank batch (default 128)")
@click.option("--lr", type=float, default=None, help="learning rate (default 1e-3)")
@click.option("--momentum", type=float, default=None, help="SGD momentum (default 0.9)")
@click.option("--weight-decay", type=float, default=None, help="weight decay (default 1e-4)")
@add_method_options
def run_cmd(**kwargs) -> None:
    """Train one method on one workload and write results/<run_id>/.

    Method options are tagged with the methods that read them; [prunex*] means prunex and
    prunex-flat.
    """
    from suite.launch import default_local_gpus_per_node, launch_in_job, launch_local

    options = {option_key(flag): kwargs.pop(option_key(flag)) for flag in METHOD_OPTIONS}
    config = RunConfig(options={k: v for k, v in options.items() if v is not None}, **kwargs)
    try:
        launcher = config.launcher
        if launcher == "auto":
            from suite.launch import adopt_slurm_environment

            launcher = "torchrun" if adopt_slurm_environment() else "local"
        config.launcher = launcher
        if launcher == "local" and config.gpus_per_node is None:
            config.gpus_per_node = default_local_gpus_per_node(config.gpus)
        validate(config)
        if launcher == "local":
            path = launch_local(config)
            click.echo(f"results: {path}")
        else:
            launch_in_job(config)
    except BenchError as exc:
        fail(exc)


def validate(config: RunConfig) -> None:
    """Catch bad input here, in one line, before any rank is spawned."""
    from suite.registry import METHODS, WORKLOADS, load_builtins
    from suite.topology import check_layout
    from workloads.datasets import load_data

    load_builtins()
    METHODS.get(config.method)
    workload = WORKLOADS.get(config.workload).factory()
    if config.gpus_per_node is not None:
        check_layout(config.gpus, config.gpus_per_node)
    for flag, (_, _, valid) in METHOD_OPTIONS.items():
        value = config.options.get(option_key(flag))
        if valid is not None and value is not None and not valid[0](value):
            raise BenchError(f"{flag.split('/')[0]} must be {valid[1]}, got {value}")
    for name in ("iterations", "epochs", "eval_every", "batch_size"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise BenchError(f"--{name.replace('_', '-')} must be positive, got {value}")
    load_data(
        config.dataset or workload.dataset,
        data_dir=config.data_dir,
        download=config.download,
        seed=config.seed,
        synthetic_size=config.synthetic_size,
    )


if __name__ == "__main__":
    main()
