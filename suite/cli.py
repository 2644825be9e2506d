"""The ``bench`` command line."""

from __future__ import annotations

import sys

import click

from suite.config import RunConfig
from suite.errors import BenchError

# Method options: CLI name -> (type, help). Stored in RunConfig.options under the
# underscored name; a method reads the ones it understands.
METHOD_OPTIONS: dict[str, tuple[object, str]] = {
    "--bucket-cap-mb": (float, "[ddp] DDP gradient bucket size in MiB (default: torch's 25)"),
    "--local-steps": (int, "[prunex] local SGD steps per round H (default: one local epoch)"),
    "--local-epochs": (float, "[prunex] local epochs per round E (paper: 5-10)"),
    "--filter-keep": (float, "[prunex] fraction of output filters kept per conv layer"),
    "--channel-keep": (float, "[prunex] fraction of input channels kept (default 0.5)"),
    "--shape-keep": (float, "[prunex] fraction of kernel positions kept per conv layer"),
    "--rho1": (float, "[prunex] initial intra-node penalty (default 1.5e-3)"),
    "--rho2": (float, "[prunex] initial inter-node penalty (default 1.5e-4)"),
    "--rho-max": (float, "[prunex] cap on adaptive penalties (default 10)"),
    "--freeze-round": (int, "[prunex] freeze masks after this round (default: never by round)"),
    "--freeze-patience": (int, "[prunex] freeze once global masks are unchanged this many rounds"),
    "--bucket-mb": (float, "[prunex] inter-node packing bucket size in MiB (default 32)"),
    "--eps-abs": (
        float,
        "[prunex] stop once Boyd's residual tests pass with this eps_abs (default: never)",
    ),
    "--eps-rel": (float, "[prunex] relative residual tolerance (Boyd; default 1e-3)"),
    "--adaptive-rho/--fixed-rho": (bool, "[prunex] layer-wise residual balancing of rho1, rho2"),
    "--leader-mode": (
        click.Choice(["single", "sharded"]),
        "[prunex] single: one leader per node carries the inter-node all-reduce; sharded: "
        "every local rank all-reduces 1/P of the packed buffer with its peers (Horovod-style)",
    ),
    "--wire-dtype": (
        click.Choice(["fp32", "bf16"]),
        "[prunex] dtype of the packed inter-node buffers (fp32 math on both ends)",
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
    for flag, (kind, help_text) in reversed(METHOD_OPTIONS.items()):
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
    """Train one method on one workload and write results/<run_id>/."""
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
