"""The flags of the ``bench`` commands, as click machinery: integer lists, experiment files
(``--config``), the shared flags of ``run`` and ``sweep``, and the method options attached
from the registry when a command that takes them is invoked (so a plugin's options appear
with no change to the CLI); the workloads' recipes shown in ``--help`` only (the one place
every workload's factory is called, each one that fails skipped with a warning line); and
the one-line error exit."""

from __future__ import annotations

import os
import sys

import click

from suite import startup_signals
from suite.commands.experiment import apply_to_command, read_experiment
from suite.errors import BenchError, RunFailed, one_line
from suite.plugins.registry import METHODS, WORKLOADS
from suite.results.records import DamagedFile


class IntList(click.ParamType):
    """``8`` or ``8,16,32,64``: a list of integers of at least ``minimum``."""

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


class Fraction(click.ParamType):
    """``0.85`` or ``85%``: a fraction (what the run records), given either way."""

    name = "FRACTION"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            return value
        text = str(value).strip()
        try:
            return float(text[:-1]) / 100 if text.endswith("%") else float(text)
        except ValueError:
            self.fail(f"{value!r} is not a fraction (0.85) or a percentage (85%)", param, ctx)


def fail(exc: BenchError) -> None:
    """``exc`` as ``bench``'s one line on stderr (bounded: a value it quotes may be huge), and
    its exit code."""
    click.echo(f"Error: {one_line(exc)}", err=True)
    sys.exit(1 if isinstance(exc, RunFailed) else 2)


class OneLineUsageError(click.ClickException):
    """A usage error (a bad flag value, an unknown flag) as one line, exit 2, with where the
    usage is, instead of click's usage block around it."""

    exit_code = 2


class BenchGroup(click.Group):
    """Attaches the registry's method options, and the workloads' true recipe defaults in
    the help, to the commands that take them, when such a command is invoked; prints a usage
    error in one line."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except startup_signals.Interrupted as exc:  # before a launcher took the signals over
            click.echo(f"Error: interrupted by {exc.name} before any rank started: "
                       f"{startup_signals.kept()}", err=True)
            sys.exit(startup_signals.INTERRUPTED_EXIT)
        except DamagedFile as exc:  # a file read back (a summary, a manifest, a profile)
            fail(BenchError(str(exc)))  # is input: one line, whichever command read it
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx is not None else "bench"
            raise OneLineUsageError(
                f"{one_line(exc.format_message())} (see {where} --help)") from None

    def get_command(self, ctx, name):
        if ctx.params.get("strict_plugins"):  # parsed already; the registry loads next
            os.environ["PRUNEX_STRICT_PLUGINS"] = "1"
        command = super().get_command(ctx, name)
        mode = getattr(command, "method_options", None)
        if mode and not getattr(command, "attached", False):
            try:
                attach_registry_params(command, lists=mode == "lists")
            except BenchError as exc:
                fail(exc)
            command.attached = True
        return command


def attach_registry_params(command: click.Command, *, lists: bool) -> None:
    """The registry's method options as the command's flags (registration made sure that
    none is called like a flag of the command's own)."""
    taken = {p.name for p in command.params}
    for name, (opt, readers) in METHODS.option_catalogue().items():
        if name in taken:  # registration refuses these; a registry filled by hand may not
            raise BenchError(f"method option {opt.flag} of {readers[0]} is a flag of bench "
                             f"{command.name} itself")
        defaults = {
            o.default_text for r in readers for o in METHODS.get(r).options if o.name == name
        }
        default = opt.default_text if len(defaults) == 1 else "per method, see bench list"
        help_text = f"[{', '.join(readers)}] {opt.help} (default: {default})"
        if opt.kind is bool:
            param = click.Option([opt.declaration, name], default=None, help=help_text)
        else:
            metavar = opt.type_text + ("[,...]" if lists else "")
            param = click.Option(
                [opt.flag, name], default=None, metavar=metavar,
                help=help_text + (" (comma list)" if lists else ""),
            )
        command.params.append(param)


class RecipeOption(click.Option):
    """A recipe flag (``--lr``) whose help ends with every workload's own default, worked
    out only when the help is shown: that is the one command that builds every workload."""

    def get_help_record(self, ctx):
        if not getattr(self, "recipe_shown", False):
            self.help = f"{self.help} (default: the workload's: {recipe_defaults(self.name)})"
            self.recipe_shown = True
        return super().get_help_record(ctx)


def recipe_defaults(field: str) -> str:
    """``0.05 (cnn-fmnist, resnet18-fmnist); 0.001 (resnet18-cifar10, ...)``; a workload
    whose factory fails is left out, with one warning line."""

    by_value: dict = {}
    for entry in WORKLOADS.entries():
        workload = WORKLOADS.try_build(entry.name)
        if workload is not None:
            by_value.setdefault(getattr(workload.recipe, field), []).append(entry.name)
    return "; ".join(
        f"{v:{'' if isinstance(v, str) else 'g'}} ({', '.join(names)})"
        for v, names in by_value.items()
    )


def method_options(mode: str):
    """Mark a command as taking the registry's method options (``single`` or ``lists``)."""

    def mark(command):
        command.method_options = mode
        return command

    return mark


def config_option(list_keys: tuple[str, ...]):
    """``--config FILE``: an experiment file whose values become the command's defaults."""

    def load(ctx, param, value):
        if value is None:
            return None

        keys = list_keys
        if getattr(ctx.command, "method_options", None) == "lists":  # every option is an axis
            keys = (*keys, *METHODS.option_catalogue())
        try:
            apply_to_command(ctx, read_experiment(value), keys, source=f"--config {value}")
        except BenchError as exc:
            fail(exc)
        return value

    return click.option(
        "--config", type=click.Path(), default=None, is_eager=True, expose_value=False,
        callback=load, help="experiment file (YAML, or a run's manifest.json); flags override it",
    )


def given_options(kwargs: dict) -> dict:
    """Pop the method options out of a command's keyword arguments; keep the given ones."""

    names = METHODS.option_catalogue()
    return {k: v for k in list(kwargs) if k in names and (v := kwargs.pop(k)) is not None}


def run_flags(func):
    """Flags ``bench run`` and ``bench sweep`` share (a manifest's ``config`` keys)."""
    flags = [
        click.option("--dataset", default=None,
                     help="fmnist | cifar10 | synthetic (default: the workload's)"),
        click.option("--data-dir", default=None, help="dataset directory (default: its own)"),
        click.option("--download", is_flag=True, default=None,
                     help="download the dataset if missing (needs a network)"),
        click.option("--synthetic-size", type=IntList(), default=None, metavar="TRAIN,TEST",
                     help="samples of the synthetic dataset (default: 4096,1024)"),
        click.option("--image-size", type=click.IntRange(8, 1024), default=None, metavar="PX",
                     help="hand the model its images at PX x PX (resized per batch; default: "
                     "the dataset's, or the smallest size the model takes where it does not "
                     "take those)"),
        click.option("--gpus-per-node", default=None, type=int,
                     help="ranks per (emulated) node; default: discovered in a job, else 4 "
                     "(gpus/2 below 8)"),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                     show_default=True),
        click.option("--iterations", type=int, default=None,
                     help="iterations to run (PruneX, local SGD: rounds)"),
        click.option("--epochs", type=float, default=None, help="data epochs to run",
                     cls=RecipeOption),
        click.option("--eval-every", type=int, default=None,
                     help="evaluate every N iterations and at the end (default: 10 evenly "
                     "spread evaluations, at most every third iteration)"),
        click.option("--bn-recalibrate", type=int, default=0, show_default=True, metavar="N",
                     help="before each evaluation, recompute the evaluated model's BatchNorm "
                     "statistics on N training batches per rank (0: use the method's)"),
        click.option("--target-accuracy", type=Fraction(), default=None,
                     help="record time_to_target_seconds, e.g. 0.85 or 85%"),
        click.option("--tensorboard", is_flag=True, default=None,
                     help="live logs: TensorBoard events in the run folder's tensorboard/ "
                     "(loss, accuracy, lr, phase seconds, bytes per link, density, rho)"),
        click.option("--deterministic", is_flag=True, default=None,
                     help="deterministic kernels (torch.use_deterministic_algorithms, warn only; "
                     "cuDNN deterministic, no benchmark; cuBLAS's fixed workspace): GPU runs "
                     "repeat bit for bit, slower"),
        click.option("--results-dir", default="results", show_default=True),
        click.option("--tag", default=None, help="free-form label stored in the manifest"),
        click.option("--batch-size", type=int, default=None, help="per-rank batch",
                     cls=RecipeOption),
        click.option("--lr", type=float, default=None, help="learning rate", cls=RecipeOption),
        click.option("--momentum", type=float, default=None, help="SGD momentum",
                     cls=RecipeOption),
        click.option("--weight-decay", type=float, default=None, help="weight decay",
                     cls=RecipeOption),
        click.option("--lr-schedule", type=click.Choice(["constant", "cosine", "step"]),
                     default=None, help="lr over the run's samples, the same for every method",
                     cls=RecipeOption),
        click.option("--warmup-epochs", type=float, default=None,
                     help="linear lr warmup, in epochs of a rank's shard", cls=RecipeOption),
        click.option("--network", type=click.Choice(["loopback", "emulated"]),
                     default="loopback", show_default=True,
                     help="emulated: each node in its own network namespace, inter-node links "
                     "rate-limited to --inter-bw with tc (Linux, root, iproute2)"),
        click.option("--inter-bw", default=None,
                     help="[emulated] inter-node link rate, e.g. 1gbit"),
        click.option("--checkpoint-every", type=int, default=None,
                     help="write a checkpoint every N iterations (bench run --resume continues "
                     "from the latest; a finished run removes them)"),
        click.option("--checkpoint-minutes", type=float, default=None,
                     help="write a checkpoint every M minutes (rank 0's clock)"),
        click.option("--max-restarts", type=int, default=0, show_default=True,
                     help="when a rank dies, restart all ranks from the latest checkpoint up "
                     "to K times (torch elastic; local launcher)"),
        click.option("--collective-timeout", type=float, default=300.0, show_default=True,
                     help="seconds a collective waits for a stalled or dead peer before the "
                     "run fails"),
        click.option("--launcher", default="auto", show_default=True,
                     type=click.Choice(["auto", "local", "torchrun", "slurm", "sim"]),
                     help="auto: torchrun inside a torchrun/SLURM job, else local; slurm: write "
                     "and sbatch a job script; sim: the calibrated simulator (see bench sim)"),
    ]
    for flag in reversed(flags):
        func = flag(func)
    return func
