"""The ``bench`` command line: declarations that call into the modules doing the work.

Method options are not declared here: each method declares them (``suite.plugins.options``), and
they are attached to ``run``, ``sweep`` and ``sim`` from the registry when one of those
commands is invoked, so a plugin's options appear with no change to this file.

Exit codes: 0 ok; 1 a run (or a sweep cell, or a regression check) failed; 2 bad usage or
input.
"""

from __future__ import annotations

from suite import startup_signals

if __name__ == "__main__":  # python -m suite.cli; the bench script starts in suite.start
    startup_signals.deferring()  # before torch's imports: a Ctrl-C in them would abort the process

import os
import sys

import click
from click.core import ParameterSource

from suite.cluster.netemu import delete_namespaces, leftover_namespaces
from suite.commands.compare import run_compare
from suite.commands.execute import execute_run, execute_sweep, rerun_arguments, resume_arguments
from suite.commands.export import export_and_print
from suite.commands.flags import (
    BenchGroup,
    IntList,
    RecipeOption,
    config_option,
    fail,
    given_options,
    method_options,
    run_flags,
)
from suite.commands.listing import (
    entries_text,
    options_markdown,
    options_text,
    workload_names_text,
)
from suite.commands.trend import run_trend
from suite.compat import require_supported_torch
from suite.environment import check_environment
from suite.errors import BenchError, os_reason
from suite.gate.reference import moved_reference
from suite.gate.thresholds import flag_thresholds
from suite.results.recover import recover
from suite.sim.calibrate import calibrate_to_file


def result_set_path(ctx, param, value):
    """A result set's path as given, or, for the references' old place
    (``results/reference/...``), their new one, with a note."""
    moved = None if value is None else moved_reference(value)
    if moved is None:
        return value
    click.echo(f"note: reading {moved} ({value} moved there: the committed references live "
               "outside results/)", err=True)
    return str(moved)


@click.group(cls=BenchGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--strict-plugins", is_flag=True,
              help="a plugin that fails to load is an error, not a warning (for CI; also "
              "PRUNEX_STRICT_PLUGINS=1)")
def main(strict_plugins: bool) -> None:
    """prunex-bench: PruneX and its baselines on real distributed PyTorch.

    Exit codes: 0 ok, 1 a run or a regression check failed, 2 bad usage or input.
    """
    startup_signals.armed()  # the imports are done: a signal from here on interrupts at once
    require_supported_torch()
    try:  # a malformed variable is one line here, not a traceback inside a rank
        check_environment()
    except BenchError as exc:
        fail(exc)
    if strict_plugins:
        os.environ["PRUNEX_STRICT_PLUGINS"] = "1"  # the ranks read it too


@main.command("list")
@click.argument("names", nargs=-1)
@click.option("--options", "show_options", is_flag=True, help="each method's options")
@click.option("--markdown", is_flag=True, help="the options as the README's Markdown table")
@click.option("--workloads", "pattern", default=None, metavar="PATTERN",
              help="the workloads a pattern names, one a line: 'timm:*resnet*' (a family's "
              "names, as timm.list_models takes the pattern), 'torchvision:*', '*mixnet*'")
def list_cmd(names, show_options, markdown, pattern) -> None:
    """Registered methods and workloads; `bench list METHOD` or `--options` adds options;
    `--workloads 'timm:*resnet*'` browses the names a family of workloads takes."""

    try:
        if pattern is not None:
            click.echo(workload_names_text(pattern), nl=False)
        elif markdown:
            click.echo(options_markdown(), nl=False)
        elif names or show_options:
            click.echo(options_text(list(names)), nl=False)
        else:
            click.echo(entries_text(), nl=False)
    except BenchError as exc:
        fail(exc)


@method_options("single")
@main.command("run")
@config_option(list_keys=("gpus", "synthetic_size"))
@click.option("--method", default="prunex", show_default=True, help="registered method name")
@click.option("--workload", "--model", "workload", default="cnn-fmnist", show_default=True,
              help="workload name, or a model by name: timm:NAME, torchvision:NAME")
@click.option("--gpus", default="4", show_default=True, type=IntList(),
              help="number of ranks (--launcher sim: a list, e.g. 8,16,32,64)")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--run-id", default=None, help="name of the run folder (default: generated)")
@click.option("--resume", default=None, type=click.Path(exists=True, file_okay=False),
              metavar="RUN_DIR", help="continue an interrupted run from its latest checkpoint, "
              "into its own folder, with its recorded configuration")
@click.option(
    "--overwrite", is_flag=True, help="empty an existing run folder of the same --run-id first"
)
@click.option("--dry-run", is_flag=True,
              help="print what would run (slurm: the sbatch script) and start nothing")
@click.option("--slurm-partition", default=None, help="[slurm] #SBATCH --partition")
@click.option("--slurm-account", default=None, help="[slurm] #SBATCH --account")
@click.option("--slurm-time", default=None, help="[slurm] time limit (default: 02:00:00)")
@click.option("--slurm-cpus-per-task", type=click.IntRange(1), default=None,
              help="[slurm] CPUs of each node's task, shared by its ranks (default: 8 per "
              "GPU rank, 1 per CPU rank)")
@click.option("--slurm-signal-lead", type=click.IntRange(30), default=None,
              help="[slurm] seconds before the time limit at which the ranks get SIGTERM to "
              "checkpoint and the job requeues (default: 180)")
@click.option("--profile", default=None, help="[sim] hardware profile name or JSON file")
@click.option("--replay", type=int, default=None,
              help="[sim] iterations replayed, at least (10; more until the schedule repeats)")
@click.option("--accuracy-from", default=None, help="[sim] real run folder lending its accuracy")
@run_flags
def run_cmd(**kwargs) -> None:
    """Train one method on one workload and write results/<run_id>/.

    Method options are tagged with the methods that read them; an option the chosen method
    does not read is ignored with a warning.
    """

    try:
        if kwargs.get("resume"):
            context = click.get_current_context()
            given = {name for name in kwargs if context.get_parameter_source(name) in (
                ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
            kwargs = resume_arguments(kwargs, given)
        execute_run(kwargs, given_options(kwargs), echo=click.echo)
    except BenchError as exc:
        fail(exc)


@main.command("rerun")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--results-dir", default=None, help="default: the recorded run's results folder")
@click.option("--run-id", default=None, help="name of the new run folder (default: generated)")
@click.option("--dry-run", is_flag=True, help="print what would run and start nothing")
def rerun_cmd(run_dir, results_dir, run_id, dry_run) -> None:
    """Run a recorded run's configuration again (from its manifest.json) into a new folder."""

    try:
        kwargs = rerun_arguments(run_dir, results_dir=results_dir, run_id=run_id, dry_run=dry_run)
        execute_run(kwargs, given_options(kwargs), echo=click.echo)
    except BenchError as exc:
        fail(exc)


@method_options("lists")
@main.command("sweep")
@config_option(list_keys=("method", "workload", "gpus", "seed", "synthetic_size"))
@click.option("--method", default="prunex,prunex-flat,ddp,topk", show_default=True,
              help="comma list")
@click.option("--workload", "--model", "workload", default="cnn-fmnist", show_default=True,
              help="comma list of workloads or models by name (timm:NAME, torchvision:NAME)")
@click.option("--gpus", default="4,8", show_default=True, type=IntList())
@click.option("--seed", default="0", show_default=True, type=IntList(0), help="seeds (repeats)")
@click.option("--dry-run", is_flag=True, help="list the cells and exit")
@click.option("--force", is_flag=True,
              help="run every cell again, replacing the folders of finished ones")
@run_flags
def sweep_cmd(**kwargs) -> None:
    """Run a grid of (workload x method x GPUs x seed x method-option values) into one
    results directory; re-running it skips the cells already done. Exits 1 if a cell
    failed. An option fans out only the methods that read it."""

    try:
        failed = execute_sweep(kwargs, given_options(kwargs), echo=click.echo)
    except BenchError as exc:
        fail(exc)
    sys.exit(1 if failed else 0)


@main.command("compare")
@click.argument("baseline", callback=result_set_path)
@click.argument("new", callback=result_set_path)
@click.option("--max-regression", default=None,
              help="allowed worsening of bytes (and what has no threshold of its own), "
              "relative (5% or 0.05; default: the class's gate.json against a reference, "
              "else 5%)")
@click.option("--max-accuracy-drop", type=float, default=None,
              help="allowed accuracy drop in points (default: the class's gate.json against a "
              "reference, else 1.0)")
@click.option("--max-time-regression", default=None,
              help="allowed worsening of time metrics, relative (default: the class's "
              "gate.json against a reference, else 5%); times are noisier than bytes")
@click.option("--max-loss-regression", default=None,
              help="allowed rise of the final training loss, relative (default: the class's "
              "gate.json against a reference, else 5%)")
@click.option("--metric", multiple=True,
              help="metrics to compare (repeat or comma list): final_accuracy (accuracy), "
              "final_train_loss (train-loss: mean training loss of the last half of the "
              "iterations), time_ratio (time-ratio: seconds per local step over DDP's in the "
              "same set), "
              "iteration_seconds (time), time_to_target_seconds (time-to-target), "
              "inter_node_bytes_per_iteration (bytes); default: the gate's (accuracy, "
              "train-loss, bytes, time-ratio) against a reference, else all")
@click.option("--format", "fmt", type=click.Choice(["text", "json", "markdown"]),
              default="text", show_default=True,
              help="markdown: for a CI job summary; json: for scripts")
@click.option("--wide", is_flag=True,
              help="text: every column in full (machine class, workload, options); default: "
              "120 columns, long options elided, what every row shares said once above")
@click.option("--allow-unmatched", is_flag=True,
              help="a method both sides ran under different settings is listed as unmatched "
              "instead of failing (a hand compare of sweeps that overlap in part)")
def compare_cmd(
    baseline, new, max_regression, max_accuracy_drop, max_time_regression, max_loss_regression,
    metric, fmt, wide, allow_unmatched,
) -> None:
    """Compare two sets of runs like with like; exit 1 on a regression, 2 on bad input.

    Runs are matched by machine class (cpu-gloo-amd25-avx512-t1, cuda-nccl-h100-sm90), method,
    workload, dataset, ranks, options (resolved: a default spelled out or left out is the same
    run), setting (real, emulated, simulated) and recipe (batch, lr, epochs);
    repeats are reduced to their mean and 95 % interval, and with repeats on both sides a
    change counts only when the intervals do not overlap. A BASELINE of per-class folders
    (reference/<class>/) is read for the NEW runs' class; a class it lacks fails in
    one line. Against a reference the class's gate.json sets the thresholds and metrics (as
    the nightly's), flags override them, and the last line says which judged; times measured
    on a busy runner are "not judged". Every finished NEW run must also pass its method's
    activity check, and a method both sides ran must match its baseline's settings (a
    changed default fails, naming what differs, unless --allow-unmatched)."""

    try:
        given = flag_thresholds(max_regression=max_regression,
                                max_accuracy_drop=max_accuracy_drop,
                                max_time_regression=max_time_regression,
                                max_loss_regression=max_loss_regression)
        code = run_compare(baseline, new, given, metric, fmt, echo=click.echo, wide=wide,
                           allow_unmatched=allow_unmatched)
    except BenchError as exc:
        fail(exc)
    sys.exit(code)


@main.command("trend")
@click.argument("history")
@click.option("--add", "add", default=None, metavar="RESULTS_DIR", callback=result_set_path,
              help="first append this result set (a nightly's) to the history")
@click.option("--against", default=None, metavar="REFERENCE", callback=result_set_path,
              help="judge the added set against this reference as bench compare does, and "
              "keep each metric's verdict, reference value and threshold band in the history "
              "(what bench dashboard draws); steps are then judged at its class's thresholds")
@click.option("--max-regression", default=None,
              help="smallest relative step of bytes (and times, losses without their own) "
              "that counts (default: the reference class's gate.json with --against, else 5%)")
@click.option("--max-accuracy-drop", type=float, default=None,
              help="smallest accuracy step, in points, that counts (default: as above, else 1)")
@click.option("--max-time-regression", default=None,
              help="smallest relative step of times (default: as above, else 5%)")
@click.option("--fail-on-last", is_flag=True,
              help="exit 1 when a series' last run starts a worse segment")
def trend_cmd(
    history, add, against, max_regression, max_accuracy_drop, max_time_regression,
    fail_on_last,
) -> None:
    """Change points over a nightly history (JSON lines), per machine class, run key and
    metric (accuracy, training loss, bytes, time ratio, time), with the commit where each
    began."""

    try:
        given = flag_thresholds(max_regression=max_regression,
                                max_accuracy_drop=max_accuracy_drop,
                                max_time_regression=max_time_regression)
        code = run_trend(history, add, given, fail_on_last, echo=click.echo, against=against)
    except BenchError as exc:
        fail(exc)
    sys.exit(code)


@main.command("dashboard")
@click.argument("history")
@click.option("-o", "--output", default="reports/dashboard", show_default=True,
              type=click.Path(file_okay=False), help="site folder")
def dashboard_cmd(history, output) -> None:
    """The nightly history (bench trend --add --against) as a static site: a page per machine
    class (per method: final training loss, accuracy, inter-node bytes and time ratio over the
    nightlies, the reference and its threshold band, change points marked, the last night's
    failures first) and an index. Needs no server or network: open DIR/index.html."""
    # lazy: suite.gate.dashboard imports plotly (~1 s); only this path needs it
    from suite.gate.dashboard import write_dashboard

    try:
        path = write_dashboard(history, output)
    except BenchError as exc:
        fail(exc)
    except OSError as exc:  # the site folder: under a file, read-only, full
        fail(BenchError(f"bench dashboard: could not write {exc.filename or output} "
                        f"({os_reason(exc)}); the history is untouched"))
    click.echo(f"dashboard: {path}")


@main.command("report")
@click.argument("results_dir", callback=result_set_path)
@click.option("-o", "--output", default="reports/latest", show_default=True,
              type=click.Path(file_okay=False), help="report folder")
@click.option("--width", type=click.Choice(["one", "two"]), default=None,
              help="size every figure for one paper column (3.25 in) or the two-column page "
              "(6.75 in); default: one column for single panels, else two")
def report_cmd(results_dir, output, width) -> None:
    """Figures (PDF, SVG, PNG), the summary as CSV, LaTeX and Markdown tables, report.md and a
    self-contained report.html from run folders."""
    # lazy: suite.report.render costs ~0.4 s to import; only this path needs it
    from suite.report.render import render

    try:
        path = render(results_dir, output, echo=click.echo, width=width)
    except BenchError as exc:
        fail(exc)
    except OSError as exc:  # the output folder: read-only, full
        fail(BenchError(f"bench report: could not write {exc.filename or output} "
                        f"({os_reason(exc)}); the run folders are untouched"))
    click.echo(f"report: {path}")


@main.command("inspect")
@click.option("--workload", "--model", "workload", default="cnn-fmnist", show_default=True,
              help="a workload, or a model by name: timm:NAME, torchvision:NAME")
@click.option("--dataset", default=None,
              help="the images the model is built for (default: the workload's)")
@click.option("--filter-keep", type=float, default=None, help="fraction of filters kept")
@click.option("--channel-keep", type=float, default=None,
              help="fraction of input channels kept (0.5 when no keep is given)")
@click.option("--shape-keep", type=float, default=None, help="fraction of kernel positions kept")
@click.option("--head-keep", type=float, default=None, help="fraction of attention heads kept")
@click.option("--mlp-keep", type=float, default=None, help="fraction of MLP neurons kept")
@click.option("--image-size", type=click.IntRange(8, 1024), default=None,
              help="build and check the model for the dataset's images at this size (a model "
              "that needs larger ones than 28x28)")
@click.option("--time-limit", type=click.FloatRange(min=1), default=60.0, show_default=True,
              help="seconds Torch-Pruning may take to group the model")
@click.option("--json", "as_json", is_flag=True,
              help="one JSON object (status ok or refused, reason, counts, shares, advice)")
def inspect_cmd(workload, dataset, filter_keep, channel_keep, shape_keep, head_keep, mlp_keep,
                image_size, time_limit, as_json) -> None:
    """Whether PruneX's structured path works on a model, and what its keeps reach: groups,
    liveness, packing and the export checked in float64 on a random batch with realistic BN
    statistics, in seconds on the CPU, without training. Exit 0: it works; 2: refused (one
    line saying where and why)."""
    # lazy: the structured path imports Torch-Pruning; only this command needs it here
    from suite.commands.inspection import inspect_workload, print_inspection

    keeps = {"filter_keep": filter_keep, "channel_keep": channel_keep,
             "shape_keep": shape_keep, "head_keep": head_keep, "mlp_keep": mlp_keep}
    try:
        found = inspect_workload(workload, dataset, keeps, trace_seconds=time_limit,
                                 image_size=image_size)
        code = print_inspection(found, echo=click.echo, as_json=as_json)
    except BenchError as exc:
        fail(exc)
    sys.exit(code)


@main.command("export")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("-o", "--output", default=None, help="model file (default: RUN_DIR/exported.pt)")
@click.option("--data-dir", default=None, help="dataset folder (default: the run's)")
@click.option("--repeats", type=click.IntRange(3), default=20, show_default=True,
              help="timed forward passes per latency (at most 10 s each)")
def export_cmd(run_dir, output, data_dir, repeats) -> None:
    """Remove a pruning run's pruned and dead channels physically (Torch-Pruning) and save the
    smaller model; check it against the masked dense model, and write parameters, FLOPs,
    CPU latency and test accuracy (dense and exported) to RUN_DIR/export.json."""

    try:
        export_and_print(run_dir, output, data_dir=data_dir, repeats=repeats, echo=click.echo)
    except BenchError as exc:
        fail(exc)
    except OSError as exc:  # the model or export.json: a read-only or full disk
        fail(BenchError(f"bench export: could not write {exc.filename or run_dir} "
                        f"({os_reason(exc)})"))


@main.command("recover")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--force",
    is_flag=True,
    help="even if processes on other hosts cannot be checked (or still live here)",
)
def recover_cmd(run_dirs, force) -> None:
    """Finalize run folders whose processes were killed without a word (SIGKILL, a lost
    node): merge the rows their ranks streamed and mark them failed."""

    try:
        for run_dir in run_dirs:
            done, unreadable = recover(run_dir, force=force)
            click.echo(done)
            for line in unreadable:
                click.echo(f"skipped unreadable {line}", err=True)
    except BenchError as exc:
        fail(exc)


@main.command("net-cleanup")
@click.option("--all", "everything", is_flag=True, help="also those of runs still alive")
def net_cleanup_cmd(everything) -> None:
    """Delete network namespaces left by an emulated run whose parent was killed (SIGKILL
    cannot be caught; every other ending cleans up by itself). Namespaces of live runs are
    kept unless --all."""

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
@click.option("--sync-blocks", type=IntList(), default="1,2,4,8,16,32", show_default=True,
              help="local steps between the barriers of the timed compute blocks")
@click.option("--block-repeats", type=int, default=5, show_default=True, help="blocks per size")
@click.option("--data-dir", default=None, help="where the workloads' datasets are (as for run)")
@click.option(
    "--compute-only",
    is_flag=True,
    help="measure compute only, links from --links-from (re-time compute by a run)",
)
@click.option("--name", default=None, help="profile name (default: derived from the host)")
@click.option("--description", default=None)
@click.option("-o", "--output", default=None, help="profile file (default: profiles/NAME.json)")
@click.option(
    "--links-from",
    default=None,
    help="profile whose links to use where this layout cannot measure them",
)
@click.option("--network", type=click.Choice(["loopback", "emulated"]), default="loopback")
@click.option("--inter-bw", default=None, help="[emulated] inter-node link rate, e.g. 1gbit")
@click.option("--launcher", type=click.Choice(["local", "torchrun", "slurm"]), default="local",
              show_default=True,
              help="local: ranks on this machine; torchrun: this process is a rank of a job "
              "(under torchrun or srun); slurm: a SLURM job across hosts, one task a rank, "
              "links between hosts measured")
@click.option("--slurm-cpus-per-task", type=click.IntRange(1), default=None,
              help="[slurm] CPUs per rank (default 1)")
def calibrate_cmd(**kwargs) -> None:
    """Measure compute per step, link latency/bandwidth and memory bandwidth here, and write a
    hardware profile for `bench sim --profile FILE`."""

    given = click.get_current_context().get_parameter_source("gpus")
    kwargs["gpus_given"] = given is ParameterSource.COMMANDLINE
    try:
        calibrate_to_file(kwargs, echo=click.echo)
    except BenchError as exc:
        fail(exc)


@method_options("single")
@main.command("sim")
@click.option("--method", default="prunex,ddp,topk", show_default=True, help="comma list")
@click.option("--workload", default="resnet152-cifar10", show_default=True)
@click.option("--dataset", default=None, help="fmnist | cifar10 | synthetic (sizes the epoch)")
@click.option("--gpus", default="8,16,32,64", show_default=True, type=IntList())
@click.option("--gpus-per-node", type=int, default=None, help="default: the profile's")
@click.option("--profile", default="v100-ib100", show_default=True, help="name or JSON file")
@click.option("--iterations", type=int, default=None, help="iterations (rounds) to simulate")
@click.option("--epochs", type=float, default=None, help="epochs to simulate", cls=RecipeOption)
@click.option("--replay", type=int, default=None,
              help="iterations replayed for real, at least (10; more until the schedule repeats)")
@click.option("--accuracy-from", default=None, help="real run folder whose accuracy to carry")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--results-dir", default="results", show_default=True)
@click.option("--tag", default=None)
@click.option("--batch-size", type=int, default=None, help="per-rank batch", cls=RecipeOption)
@click.option("--dry-run", is_flag=True, help="list the simulations and start nothing")
@click.option("--list-profiles", is_flag=True, help="list the shipped profiles and exit")
def sim_cmd(**kwargs) -> None:
    """Simulate methods at several GPU counts on a hardware profile; no training.

    Each (method, GPU count) replays the method's own step code with collectives priced by
    alpha-beta models of the profile's links and compute from its calibration, and writes an
    ordinary run folder marked simulated (every time in it is simulated). Same as
    `bench run --launcher sim`. Method options apply to the methods that read them.
    """
    # lazy: suite.commands.simulate costs ~0.1 s to import; only this path needs it
    from suite.commands.simulate import execute_sim

    try:
        execute_sim(kwargs, given_options(kwargs), echo=click.echo)
    except BenchError as exc:
        fail(exc)


if __name__ == "__main__":
    main()
