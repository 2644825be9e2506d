"""The ``bench`` command line."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

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
    "--masks-from": (
        click.Path(exists=True),
        "[prunex*] start from the masks of a PruneX run folder (or masks.pt), frozen",
        None,
    ),
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


class IntList(click.ParamType):
    """``8`` or ``8,16,32,64``: a list of positive integers."""

    name = "N[,N...]"

    def __init__(self, minimum: int = 1):
        self.minimum = minimum

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        try:
            numbers = [int(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"{value!r} is not a comma-separated list of integers", param, ctx)
        if not numbers or min(numbers) < self.minimum:
            self.fail(f"{value!r}: give integers of at least {self.minimum}", param, ctx)
        return numbers


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
@click.option(
    "--gpus",
    default="4",
    show_default=True,
    type=IntList(),
    help="number of ranks (--launcher sim: a list, e.g. 8,16,32,64)",
)
@click.option(
    "--gpus-per-node",
    default=None,
    type=int,
    help="ranks per (emulated) node; default: discovered in a job, else 4 (gpus/2 below 8)",
)
@click.option(
    "--launcher",
    type=click.Choice(["auto", "local", "torchrun", "slurm", "sim"]),
    default="auto",
    show_default=True,
    help="auto: torchrun inside a torchrun/SLURM job, else local; slurm: write and sbatch a "
    "job script; sim: the calibrated simulator (no training, see `bench sim`)",
)
@click.option("--dry-run", is_flag=True, help="[slurm] print the sbatch script, submit nothing")
@click.option("--slurm-partition", default=None, help="[slurm] #SBATCH --partition")
@click.option("--slurm-account", default=None, help="[slurm] #SBATCH --account")
@click.option("--slurm-time", default="02:00:00", show_default=True, help="[slurm] time limit")
@click.option(
    "--network",
    type=click.Choice(["loopback", "emulated"]),
    default="loopback",
    show_default=True,
    help="emulated: each node in its own network namespace, inter-node links rate-limited "
    "to --inter-bw with tc (Linux, root, iproute2)",
)
@click.option("--inter-bw", default=None, help="[emulated] inter-node link rate, e.g. 1gbit")
@click.option("--profile", default=None, help="[sim] hardware profile name or JSON file")
@click.option("--replay", type=int, default=None, help="[sim] iterations replayed (10)")
@click.option("--accuracy-from", default=None, help="[sim] real run folder lending its accuracy")
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
    from suite.launch import (
        default_local_gpus_per_node,
        launch_emulated,
        launch_in_job,
        launch_local,
    )

    options = {option_key(flag): kwargs.pop(option_key(flag)) for flag in METHOD_OPTIONS}
    sim = {k: kwargs.pop(k) for k in ("profile", "replay", "accuracy_from")}
    slurm = {
        k: kwargs.pop(k) for k in ("dry_run", "slurm_partition", "slurm_account", "slurm_time")
    }
    gpus = kwargs.pop("gpus")
    options = {k: v for k, v in options.items() if v is not None}
    if kwargs["launcher"] == "sim":
        run_simulations([kwargs.pop("method")], gpus, kwargs, options, **sim)
        return
    if len(gpus) > 1:
        fail(BenchError("--gpus takes one number except with --launcher sim; see `bench sweep`"))
    if any(v is not None for v in sim.values()):
        fail(BenchError("--profile, --replay and --accuracy-from need --launcher sim"))
    config = RunConfig(options=options, gpus=gpus[0], **kwargs)
    try:
        launcher = config.launcher
        if launcher == "slurm":
            submit_slurm(config, **slurm)
            return
        if launcher == "auto":
            from suite.launch import adopt_slurm_environment

            launcher = "torchrun" if adopt_slurm_environment() else "local"
        config.launcher = launcher
        if launcher == "local" and config.gpus_per_node is None:
            config.gpus_per_node = default_local_gpus_per_node(config.gpus)
        validate(config)
        if config.network == "emulated":
            if launcher != "local":
                raise BenchError("--network emulated runs with --launcher local")
            path = launch_emulated(config)
            click.echo(f"results: {path}")
        elif launcher == "local":
            path = launch_local(config)
            click.echo(f"results: {path}")
        else:
            launch_in_job(config)
    except BenchError as exc:
        fail(exc)


def validate(config: RunConfig, *, check_data: bool = True) -> None:
    """Catch bad input here, in one line, before any rank is spawned."""
    from suite.registry import METHODS, WORKLOADS, load_builtins
    from suite.topology import check_layout
    from workloads.datasets import load_data

    load_builtins()
    METHODS.get(config.method)
    workload = WORKLOADS.get(config.workload).factory()
    if config.gpus_per_node is not None:
        check_layout(config.gpus, config.gpus_per_node)
    if config.inter_bw is not None and config.network != "emulated":
        raise BenchError("--inter-bw needs --network emulated")
    if config.network == "emulated":
        from suite.netemu import check_privileges, parse_rate

        if config.inter_bw is None:
            raise BenchError("--network emulated needs --inter-bw, e.g. 1gbit or 200mbit")
        parse_rate(config.inter_bw)
        if config.gpus_per_node is None or config.gpus // config.gpus_per_node < 2:
            raise BenchError("--network emulated needs at least two nodes (--gpus-per-node)")
        check_privileges()
    for flag, (_, _, valid) in METHOD_OPTIONS.items():
        value = config.options.get(option_key(flag))
        if valid is not None and value is not None and not valid[0](value):
            raise BenchError(f"{flag.split('/')[0]} must be {valid[1]}, got {value}")
    for name in ("iterations", "epochs", "eval_every", "batch_size"):
        value = getattr(config, name)
        if value is not None and value <= 0:
            raise BenchError(f"--{name.replace('_', '-')} must be positive, got {value}")
    if not check_data:  # the simulator reads no data
        return
    load_data(
        config.dataset or workload.dataset,
        data_dir=config.data_dir,
        download=config.download,
        seed=config.seed,
        synthetic_size=config.synthetic_size,
    )


def submit_slurm(config: RunConfig, *, dry_run, slurm_partition, slurm_account, slurm_time):
    """Generate the job script for ``config``; print it (--dry-run) or sbatch it."""
    from suite.slurm import sbatch_script, submit

    if config.gpus_per_node is None:
        raise BenchError("--launcher slurm needs --gpus-per-node (GPUs on each cluster node)")
    config.run_id = config.run_id or make_id(config)
    validate(config, check_data=False)
    flags = {option_key(flag): flag for flag in METHOD_OPTIONS}
    script = sbatch_script(
        config, flags, partition=slurm_partition, account=slurm_account, time_limit=slurm_time
    )
    if dry_run:
        click.echo(script, nl=False)
    else:
        click.echo(submit(script, Path(config.results_dir) / config.run_id))


def make_id(config: RunConfig) -> str:
    from suite.results import make_run_id

    return make_run_id(config.method, config.workload, config.gpus)


def list_option(kind, flag: str):
    """Parse ``a,b,c`` into a list of ``kind`` values (for sweep grids)."""

    def convert(ctx, param, value):
        if value is None:
            return None
        items = [v.strip() for v in str(value).split(",") if v.strip()]
        try:
            if isinstance(kind, click.ParamType):
                return [kind.convert(v, param, ctx) for v in items]
            return [kind(v) for v in items]
        except (ValueError, click.BadParameter) as exc:
            raise click.BadParameter(f"{value!r}: {exc}") from None

    return convert


def add_sweep_options(func):
    for flag, (kind, help_text, _) in reversed(METHOD_OPTIONS.items()):
        key = option_key(flag)
        if kind is bool:
            func = click.option(flag, key, default=None, help=help_text)(func)
        else:
            func = click.option(
                flag, key, default=None, callback=list_option(kind, flag),
                help=help_text + " (comma list)",
            )(func)  # fmt: skip
    return func


@main.command("sweep")
@click.option("--method", default="prunex,prunex-flat,ddp,topk", show_default=True,
              help="comma list")  # fmt: skip
@click.option("--workload", default="cnn-fmnist", show_default=True)
@click.option("--dataset", default=None)
@click.option("--data-dir", default=None)
@click.option("--gpus", default="4,8", show_default=True, type=IntList())
@click.option("--gpus-per-node", type=int, default=None, help="default: as bench run")
@click.option("--seed", default="0", show_default=True, type=IntList(0), help="seeds (repeats)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
@click.option("--iterations", type=int, default=None)
@click.option("--epochs", type=float, default=None)
@click.option("--eval-every", type=int, default=None)
@click.option("--target-accuracy", type=float, default=None)
@click.option("--batch-size", type=int, default=None)
@click.option("--lr", type=float, default=None)
@click.option("--network", type=click.Choice(["loopback", "emulated"]), default="loopback")
@click.option("--inter-bw", default=None, help="[emulated] inter-node link rate")
@click.option("--results-dir", default="results", show_default=True)
@click.option("--dry-run", is_flag=True, help="list the cells and exit")
@add_sweep_options
def sweep_cmd(**kwargs) -> None:
    """Run a grid of (method x GPUs x seed x method-option values) into one results
    directory; re-running it skips the cells already done. Exits 1 if a cell failed."""
    from suite.launch import default_local_gpus_per_node, launch_emulated, launch_local
    from suite.sweep import expand, run_cells, summary_lines

    lists = {option_key(f): kwargs.pop(option_key(f)) for f in METHOD_OPTIONS}
    fixed = {k: v for k, v in lists.items() if v is not None and not isinstance(v, list)}
    grid = {k: v for k, v in lists.items() if isinstance(v, list)}
    methods = [m for m in kwargs.pop("method").split(",") if m]
    gpus, seeds = kwargs.pop("gpus"), kwargs.pop("seed")
    dry_run = kwargs.pop("dry_run")
    base = RunConfig(options=fixed, launcher="local", **kwargs)
    help_text = {option_key(f): h for f, (_, h, _) in METHOD_OPTIONS.items()}
    cells = expand(base, methods, gpus, seeds, grid, help_text)
    try:
        for cell in cells:
            config = cell.config
            config.gpus_per_node = config.gpus_per_node or default_local_gpus_per_node(config.gpus)
            validate(config)
    except BenchError as exc:
        fail(exc)
    if dry_run:
        for cell in cells:
            click.echo(f"{cell.run_id}  {cell.config.options}")
        return
    launch = launch_emulated if base.network == "emulated" else launch_local
    run_cells(cells, Path(base.results_dir), launch)
    for line in summary_lines(cells):
        click.echo(line)
    if any(cell.status == "failed" for cell in cells):
        sys.exit(1)


@main.command("compare")
@click.argument("baseline")
@click.argument("new")
@click.option("--max-regression", default="5%", show_default=True,
              help="allowed worsening per metric, relative (5% or 0.05)")  # fmt: skip
@click.option("--metric", multiple=True,
              help="metrics to compare (repeat or comma list): final_accuracy (accuracy), "
              "iteration_seconds (time), time_to_target_seconds (time-to-target), "
              "inter_node_bytes_per_iteration (bytes); default: all")  # fmt: skip
def compare_cmd(baseline, new, max_regression, metric) -> None:
    """Compare two sets of runs; exit 1 on a regression beyond --max-regression, 2 on bad
    input. Runs are matched by (method, workload, gpus, options)."""
    from suite.compare import compare, format_table, load_summaries, parse_metrics, parse_threshold

    try:
        threshold = parse_threshold(max_regression)
        metrics = parse_metrics(metric)
        base, warn_base = load_summaries(baseline)
        new_runs, warn_new = load_summaries(new)
    except BenchError as exc:
        fail(exc)
    for line in warn_base + warn_new:
        click.echo(f"warning: {line}", err=True)
    table, unmatched = compare(base, new_runs, metrics, threshold)
    click.echo(format_table(table))
    for side, keys in unmatched.items():
        for key in keys:
            click.echo(f"unmatched ({side}): {key}")
    regressions = table[table.verdict.str.startswith("REGRESSION")] if len(table) else table
    click.echo(f"{len(regressions)} regression(s) beyond {threshold:.1%}")
    sys.exit(1 if len(regressions) else 0)


@main.command("report")
@click.argument("results_dir")
@click.option("-o", "--output", default="reports/latest", show_default=True, help="report folder")
def report_cmd(results_dir, output) -> None:
    """Figures (PNG + SVG), report.md and a self-contained report.html from run folders."""
    from suite.report.render import render

    try:
        path = render(results_dir, output, echo=click.echo)
    except BenchError as exc:
        fail(exc)
    click.echo(f"report: {path}")


@main.command("net-cleanup")
@click.option("--all", "everything", is_flag=True, help="also those of runs still alive")
def net_cleanup_cmd(everything) -> None:
    """Delete network namespaces left by an emulated run whose parent was killed (SIGKILL
    cannot be caught; every other ending cleans up by itself). Namespaces of live runs are
    kept unless --all."""
    from suite.netemu import delete_namespaces, leftover_namespaces

    left = leftover_namespaces(dead_owner_only=not everything)
    delete_namespaces(left)
    click.echo(f"removed {len(left)} namespace(s)" + (f": {' '.join(left)}" if left else ""))


@main.command("calibrate")
@click.option("--workload", default="cnn-fmnist", show_default=True, help="comma list")
@click.option("--batch-size", type=int, default=None, help="per-rank batch (default: recipe's)")
@click.option("--gpus", type=int, default=4, show_default=True, help="ranks to measure with")
@click.option("--gpus-per-node", type=int, default=None, help="default: gpus/2 (two nodes)")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto")
@click.option("--sizes", type=IntList(), default=None, help="all-reduce sizes in bytes")
@click.option("--steps", type=int, default=20, show_default=True, help="timed steps")
@click.option("--repeats", type=int, default=5, show_default=True, help="timed collectives")
@click.option(
    "--sync-blocks",
    type=IntList(),
    default="1,2,4,8,16,32",
    show_default=True,
    help="local steps between the barriers of the timed compute blocks",
)
@click.option("--block-repeats", type=int, default=5, show_default=True, help="blocks per size")
@click.option("--data-dir", default=None, help="where the workloads' datasets are (as for run)")
@click.option(
    "--compute-only",
    is_flag=True,
    help="measure compute only; links from --links-from (re-time compute next to a run)",
)
@click.option("--name", default=None, help="profile name (default: derived from the host)")
@click.option("--description", default=None)
@click.option("-o", "--output", default=None, help="profile file (default: profiles/NAME.json)")
@click.option(
    "--links-from",
    default=None,
    help="profile whose links to use where this layout cannot measure them (one GPU here)",
)
@click.option("--network", type=click.Choice(["loopback", "emulated"]), default="loopback")
@click.option("--inter-bw", default=None, help="[emulated] inter-node link rate, e.g. 1gbit")
def calibrate_cmd(**kwargs) -> None:
    """Measure compute per step, link latency/bandwidth and memory bandwidth here, and write a
    hardware profile for `bench sim --profile FILE`."""
    import socket

    import torch

    from suite.calibrate import (
        build_profile,
        calibration_plan,
        run_emulated,
        run_local,
        world_check,
    )
    from suite.registry import WORKLOADS, load_builtins
    from suite.sim.profile import load_profile
    from suite.topology import check_layout

    try:
        load_builtins()
        workloads = [w for w in kwargs["workload"].split(",") if w]
        batch = kwargs["batch_size"] or WORKLOADS.get(workloads[0]).factory().recipe.batch_size
        for w in workloads:
            WORKLOADS.get(w)
        gpus = kwargs["gpus"]
        gpn = kwargs["gpus_per_node"] or max(1, gpus // 2)
        check_layout(gpus, gpn)
        device = kwargs["device"]
        if device == "auto":
            device = "cuda" if torch.cuda.device_count() >= gpus else "cpu"
        name = kwargs["name"] or f"{socket.gethostname()}-{device}-{gpus // gpn}x{gpn}"
        plan = calibration_plan(
            workloads=workloads,
            batch_size=batch,
            gpus=gpus,
            gpus_per_node=gpn,
            device=device,
            sizes=kwargs["sizes"],
            steps=kwargs["steps"],
            repeats=kwargs["repeats"],
            block_steps=kwargs["sync_blocks"],
            block_repeats=kwargs["block_repeats"],
            compute_only=kwargs["compute_only"],
            data_dir=kwargs["data_dir"],
        )
        if kwargs["compute_only"] and not kwargs["links_from"]:
            raise BenchError("--compute-only takes the links from --links-from PROFILE; give it")
        links_from = load_profile(kwargs["links_from"]).raw if kwargs["links_from"] else None
        output = Path(kwargs["output"] or f"profiles/{name}.json")
        output.parent.mkdir(parents=True, exist_ok=True)
        raw_path = output.with_suffix(".raw.json")
        if kwargs["network"] == "emulated":
            run_emulated(plan, raw_path, kwargs["inter_bw"])
        else:
            run_local(plan, raw_path)
        raw = json.loads(raw_path.read_text())
        profile = build_profile(
            raw,
            plan,
            name=name,
            description=kwargs["description"] or f"bench calibrate on {raw['hostname']}",
            command=shlex.join(["bench", *sys.argv[1:]]),
            links_from=links_from,
        )
        output.write_text(json.dumps(profile, indent=2) + "\n")
        raw_path.unlink()
    except BenchError as exc:
        fail(exc)
    for link in ("intra", "inter"):
        entry = profile["links"][link]
        click.echo(
            f"{link:<6} alpha {entry['alpha_s'] * 1e6:9.1f} us   "
            f"bandwidth {entry['bandwidth_Bps'] * 8 / 1e9:8.3f} Gbit/s"
        )
    for key, entry in profile["compute"]["steps"].items():
        click.echo(f"step   {key:<28} {entry['seconds'] * 1e3:9.2f} ms")
    click.echo(f"memory {profile['memory_bandwidth']['bandwidth_Bps'] / 1e9:9.2f} GB/s")
    for size, measured, predicted in world_check(profile, gpus):
        click.echo(
            f"world all-reduce {size:>9} B: measured {measured * 1e3:8.2f} ms, "
            f"model {predicted * 1e3:8.2f} ms"
        )
    click.echo(f"profile: {output}")


@main.command("sim")
@click.option("--method", default="prunex,ddp,topk", show_default=True, help="comma list")
@click.option("--workload", default="resnet152-cifar10", show_default=True)
@click.option("--dataset", default=None, help="fmnist | cifar10 | synthetic (sizes the epoch)")
@click.option("--gpus", default="8,16,32,64", show_default=True, type=IntList())
@click.option("--gpus-per-node", type=int, default=None, help="default: the profile's")
@click.option("--profile", default="v100-ib100", show_default=True, help="name or JSON file")
@click.option("--iterations", type=int, default=None, help="iterations (rounds) to simulate")
@click.option("--epochs", type=float, default=None, help="epochs to simulate (default: recipe)")
@click.option("--replay", type=int, default=None, help="iterations replayed for real (10)")
@click.option("--accuracy-from", default=None, help="real run folder whose accuracy to carry")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--results-dir", default="results", show_default=True)
@click.option("--tag", default=None)
@click.option("--batch-size", type=int, default=None, help="per-rank batch (default: recipe)")
@click.option("--list-profiles", is_flag=True, help="list the shipped profiles and exit")
@add_method_options
def sim_cmd(**kwargs) -> None:
    """Simulate methods at several GPU counts on a hardware profile; no training.

    Each (method, GPU count) replays the method's own step code with collectives priced by
    alpha-beta models of the profile's links and compute from its calibration, and writes an
    ordinary run folder marked simulated (every time in it is simulated). Same as
    `bench run --launcher sim`.
    """
    from suite.sim.profile import load_profile, shipped_profiles

    if kwargs.pop("list_profiles"):
        for name in shipped_profiles():
            click.echo(f"{name:<16} {load_profile(name).description}")
        return
    options = {option_key(flag): kwargs.pop(option_key(flag)) for flag in METHOD_OPTIONS}
    methods = [m for m in kwargs.pop("method").split(",") if m]
    gpus = kwargs.pop("gpus")
    sim = {k: kwargs.pop(k) for k in ("profile", "replay", "accuracy_from")}
    kwargs["launcher"] = "sim"
    run_simulations(methods, gpus, kwargs, {k: v for k, v in options.items() if v}, **sim)


def run_simulations(
    methods: list[str],
    gpus: list[int],
    run_kwargs: dict,
    options: dict,
    *,
    profile: str | None,
    replay: int | None,
    accuracy_from: str | None,
) -> None:
    """One simulated run folder per (method, GPU count)."""
    from suite.sim.profile import load_profile
    from suite.sim.replay import DEFAULT_REPLAY, borrowed_accuracy, simulate_run

    try:
        loaded = load_profile(profile or "v100-ib100")
        accuracy = borrowed_accuracy(accuracy_from)
        if replay is not None and replay < 1:
            raise BenchError(f"--replay must be at least 1, got {replay}")
        configs = []
        for method in methods:
            for n in gpus:
                config = RunConfig(
                    **{**run_kwargs, "method": method, "gpus": n, "options": dict(options)}
                )
                config.gpus_per_node = config.gpus_per_node or loaded.gpus_per_node
                if len(methods) * len(gpus) > 1:
                    config.run_id = None
                validate(config, check_data=False)
                configs.append(config)
        for config in configs:
            path = simulate_run(config, loaded, replay=replay or DEFAULT_REPLAY, accuracy=accuracy)
            summary = json.loads((path / "summary.json").read_text())
            click.echo(
                f"{config.method:<12} {config.gpus:>4} GPUs  "
                f"{summary['iteration_seconds'] * 1e3:9.1f} ms/iteration  "
                f"{summary['inter_node_bytes_per_iteration'] / 1e6:9.2f} MB inter/iteration  "
                f"-> {path}"
            )
    except BenchError as exc:
        fail(exc)


if __name__ == "__main__":
    main()
