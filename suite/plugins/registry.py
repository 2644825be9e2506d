"""Name -> factory registries for methods and workloads.

Every plugin, the built-ins included, is found through the entry-point groups
``prunex_bench.methods`` and ``prunex_bench.workloads`` (pyproject.toml names the built-in
packages there), so the registry imports no plugin by name. A method registers its settings
class with its factory (see ``suite.plugins.options``), so its options reach the command
line, sweeps and experiment files with no change to the suite, and its label, colour and
marker, so every report draws it alike.

Registration checks what it is given, so a plugin's mistake is one line at import, not a
wrong run later: option defaults against their declared type, then their own ranges and
choices; a flag ``bench run``/``bench sweep`` takes itself (``--seed``, ``--lr``); a flag
declared by two methods (they must declare it alike, or the second must pick another name);
``local_steps``/``local_epochs`` declared without ``RoundSettings`` (the schedule would not
know the round); the look's colour and marker; a name registered twice. A plugin that fails
to load (an ImportError, a refused registration) is skipped with one warning line naming it,
whatever it registered before it failed is taken back (entries, datasets, phases), and
everything else keeps working. A factory is called only for the method or workload a command
uses (``Registry.build``); one that raises is that command's one-line error, and where a
command builds several (``bench run --help`` shows every workload's recipe) it is skipped
with the same warning line. ``PRUNEX_STRICT_PLUGINS=1`` (``bench --strict-plugins``) makes
every skip fatal, as CI may want. The built-ins load first, so a plugin cannot shadow them.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from suite.config import flag_of, reserved_flags
from suite.environment import env_flag
from suite.errors import BenchError
from suite.plugins.options import Option, check_default, options_of
from suite.results import schema

__all__ = [
    "METHODS", "WORKLOADS", "BUILTIN_DISTRIBUTION", "Entry", "Look", "Registry",
    "quiet_plugin_warnings",
]

#: the distribution whose entry points are the built-in plugins
BUILTIN_DISTRIBUTION = "prunex-bench"
#: option names that only a RoundSettings subclass may declare: the schedule reads them there
ROUND_OPTIONS = ("local_steps", "local_epochs")
#: what makes a plugin's skip fatal
STRICT_HINT = "PRUNEX_STRICT_PLUGINS=1 makes this fatal"

_warnings = {"shown": True}


def quiet_plugin_warnings() -> None:
    """Skip broken plugins without a word in this process: a rank's launcher already said
    it, once (the ranks load the same plugins and skip the same ones)."""
    _warnings["shown"] = False


def strict() -> bool:
    return env_flag("PRUNEX_STRICT_PLUGINS")


def first_line(exc: BaseException) -> str:
    """``ExcType: first line`` of an exception (a BenchError: its message alone)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, BenchError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(frozen=True)
class Look:
    """How every report draws a method: its display name, a matplotlib colour and marker
    (checked when the method registers).

    Args:
        name: the method's name in figures and tables (``"PruneX (AR)"``).
        color: any colour matplotlib accepts (``"#D55E00"``, ``"tab:blue"``).
        marker: a matplotlib marker (``"o"``, ``"s"``, ``"^"``).

    Examples:
        ```python
        look=Look("EF-SignSGD", "#117733", "v")
        ```
    """

    name: str
    color: str
    marker: str

    def check(self, method: str) -> None:
        """Refuse a colour or marker matplotlib cannot draw when ``method`` registers, so the
        mistake is one line at import, not a failed figure in a later report.

        Raises:
            BenchError: naming ``method`` and the colour or marker.
        """
        # lazy: ~0.2 s to import; only this path needs it
        from matplotlib.colors import is_color_like
        from matplotlib.markers import MarkerStyle

        if not is_color_like(self.color):
            raise BenchError(f"method {method!r}: Look colour {self.color!r} is not a colour "
                             "matplotlib knows (e.g. '#D55E00', 'tab:blue')")
        try:
            MarkerStyle(self.marker)
        except (ValueError, TypeError):
            raise BenchError(f"method {method!r}: Look marker {self.marker!r} is not a "
                             "matplotlib marker (e.g. 'o', 's', '^', 'd')") from None


@dataclass(frozen=True)
class Entry:
    name: str
    description: str
    factory: Callable[..., Any]
    settings: type | None = None  # a dataclass of suite.plugins.options.option fields
    not_simulable: str | None = None  # why `bench sim` cannot replay it (None: it can)
    look: Look | None = None  # how reports draw it (None: its name, grey)
    #: what a finished run of it must have done (suite.gate.activity), or None
    activity: Callable[..., list[str]] | None = None
    #: the third-party entry point that registered it (``"'name' (module)"``; None: a
    #: built-in, or registered outside any entry point)
    plugin: str | None = None
    #: figures of its own ``bench report`` draws after the suite's (suite.report.kit)
    figures: tuple[Callable[..., Any], ...] = ()
    #: whether the nightly runs it (``Registry.nightly``)
    nightly: bool = False

    @property
    def options(self) -> list[Option]:
        return options_of(self.settings)

    @property
    def origin(self) -> str:
        """How an error names it: ``workload 'convmixer' of plugin 'extras' (extras.wl)``."""
        return f"{self.name!r}" + (f" of plugin {self.plugin}" if self.plugin else "")


def figure_reads(**tables: tuple[str, ...]):
    """Decorator on a method's figure (``figures=``): the columns of the run folders' tables
    it draws (``layers=(schema.R_INTRA, schema.RHO1)``), which ``bench report`` reads for it
    beside the suite's own (a report reads only the columns its figures draw).

    Args:
        **tables: table name (``iterations``, ``evals``, ``layers``) -> its columns.

    Returns:
        The decorator (it returns the figure unchanged, its ``reads`` set).
    """
    unknown = sorted(set(tables) - set(schema.TABLES))
    if unknown:
        raise BenchError(f"figure_reads: no table {', '.join(unknown)}; the tables are "
                         f"{', '.join(schema.TABLES)}")

    def decorate(draw):
        draw.reads = {name: tuple(columns) for name, columns in tables.items()}
        return draw

    return decorate


def figure_tuple(kind: str, name: str, figures) -> tuple:
    """``figures=`` as a tuple: one function, or a tuple or list of them.

    Raises:
        BenchError: anything else, in one line naming the entry.
    """
    if callable(figures):
        return (figures,)
    if isinstance(figures, (tuple, list)):
        return tuple(figures)
    raise BenchError(f"{kind} {name!r}: figures= takes functions fn(runs, out, kit, "
                     f"width=None), got {figures!r}")


class Registry:
    """Name -> entry registry of one kind of plugin (``METHODS``, ``WORKLOADS``), loaded from
    its entry-point group on first use.

    Args:
        kind: ``"method"`` or ``"workload"``, as errors name it.
        entry_point_group: where plugins are found (``prunex_bench.methods``).
    """

    def __init__(self, kind: str, entry_point_group: str):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, Entry] = {}
        #: prefix -> (description, factory of a name): ``timm:NAME`` for any NAME it knows
        self._families: dict[str, tuple[str, Callable[[str], Any]]] = {}
        self._made: dict[str, Entry] = {}  # the family entries asked for so far
        #: prefix -> ``names(pattern)``: the names a family accepts, for browsing
        self._family_names: dict[str, Callable[[str], list[str]]] = {}
        self._plugins_loaded = False
        self._loading: EntryPoint | None = None  # the entry point being imported
        #: the plugins (or entries whose factory failed) that were skipped, with the warning
        #: line each got
        self.skipped: dict[str, str] = {}

    def register(
        self,
        name: str,
        description: str,
        *,
        settings: type | None = None,
        not_simulable: str | None = None,
        look: Look | None = None,
        activity: Callable[..., list[str]] | None = None,
        figures: tuple[Callable[..., Any], ...] = (),
        nightly: bool = False,
    ):
        """Decorator on a factory: a method's ``factory(ctx: RunContext) -> Method``, a
        workload's ``factory() -> Workload``. Refuses, in one line, a name registered twice,
        an option default of another type than declared or outside its own check or
        choices, a flag of ``bench run``/``bench sweep`` or one another entry declares
        differently, ``local_steps``/``local_epochs`` outside ``RoundSettings``, a settings
        field without ``option()``, and a look matplotlib cannot draw.

        Args:
            name: the ``--method`` / ``--workload`` name.
            description: one line for ``bench list``.
            settings: the dataclass of the method's options (``option`` fields), built from
                the user's values and handed to the factory as ``ctx.settings``.
            not_simulable: why ``bench sim``'s one-process replay cannot run it, if it cannot.
            look: how every report draws it (default: its name, grey).
            activity: ``fn(run: RunView) -> [what it did not do]``, checked on every finished
                run by ``bench compare``.
            figures: figures of its own that ``bench report`` draws after the suite's, each
                ``fn(runs, out, kit, width=None) -> kit.Figure | kit.Skipped`` (drawn once
                however many methods declare it; ``kit`` is suite.report.kit: the report's
                figure, labels and style, which a plugin cannot import).
            nightly: the nightly runs it and judges it against the committed references
                (``nightly``; a method added here needs its reference recorded: ``nox -s
                reference``).

        Returns:
            The decorator (it returns the factory unchanged).

        Examples:
            ```python
            @METHODS.register("efsign", "sign compression with error feedback",
                              settings=EFSignSettings, look=Look("EF-SignSGD", "#117733", "v"),
                              activity=crosses_nodes_every_round)
            def make_efsign(ctx: RunContext) -> Method:
                return EFSign(ctx)
            ```
        """

        def decorate(factory):
            shown = figure_tuple(self.kind, name, figures)
            entry = Entry(name, description, factory, settings, not_simulable, look, activity,
                          plugin=third_party(self._loading), figures=shown, nightly=nightly)
            self._check_entry(entry)
            self._entries[name] = entry
            return factory

        return decorate

    def _check_entry(self, entry: Entry) -> None:
        """Refuse, in one line, what ``register`` refuses (its docstring lists it).

        Raises:
            BenchError: naming the entry and what is wrong with it.
        """
        name, factory = entry.name, entry.factory
        if name in self._entries and self._entries[name].factory is not factory:
            raise BenchError(f"{self.kind} {name!r} is registered twice "
                             f"({describe(self._entries[name].factory)} and "
                             f"{describe(factory)})")
        options = options_of(entry.settings)  # a malformed declaration fails at import
        for opt in options:
            self._check_option(name, opt)
        check_round_options(name, entry.settings, options)
        if entry.look is not None:
            entry.look.check(name)
        for figure in entry.figures:
            if not callable(figure):
                raise BenchError(f"{self.kind} {name!r}: figures= takes functions "
                                 f"fn(runs, out, kit, width=None), got {figure!r}")

    def register_family(self, prefix: str, description: str,
                        names: Callable[[str], list[str]] | None = None):
        """Decorator on a factory of names: entries ``PREFIX:NAME`` for any NAME the factory
        accepts (``factory(NAME)`` returns what a plain entry's factory returns, or raises
        BenchError naming what it knows), made when first asked for. timm's and
        torchvision's models by name are such families of workloads, so a model needs no
        plugin of its own.

        Args:
            prefix: what comes before the colon (``timm``).
            description: one line for ``bench list`` (``PREFIX:NAME`` is shown).
            names: ``names(pattern)``, the NAMEs the factory accepts that match a shell-style
                pattern (``*resnet*``, as ``timm.list_models`` takes it), for ``bench list
                --workloads``; None: the family cannot be browsed.

        Returns:
            The decorator (it returns the factory unchanged).

        Examples:
            ```python
            @WORKLOADS.register_family("timm", "any timm model, randomly initialized")
            def timm_model(name: str) -> Workload:
                return Workload(f"timm:{name}", ..., dataset="fmnist", build_model=...)
            ```
        """

        def decorate(factory):
            if prefix in self._families or not prefix.isidentifier():
                raise BenchError(f"{self.kind} family {prefix!r} is registered twice or is not "
                                 "a name")
            self._families[prefix] = (description, factory)
            if names is not None:
                self._family_names[prefix] = names
            return factory

        return decorate

    def families(self) -> dict[str, str]:
        """prefix -> description of every family."""
        self._load_plugins()
        return {prefix: description for prefix, (description, _) in self._families.items()}

    def family_names(self, prefix: str, pattern: str = "*") -> list[str]:
        """``PREFIX:NAME`` for every NAME of the family ``prefix`` that matches ``pattern``
        (shell-style), sorted.

        Raises:
            BenchError: no such family, or one that cannot be browsed; one line.
        """
        self._load_plugins()
        if prefix not in self._families:
            known = ", ".join(sorted(self._families)) or "none"
            raise BenchError(f"no {self.kind} family {prefix!r}; the families: {known}")
        if prefix not in self._family_names:
            raise BenchError(f"the {self.kind} family {prefix!r} cannot list its names; give "
                             f"{prefix}:NAME")
        return sorted(f"{prefix}:{name}" for name in self._family_names[prefix](pattern))

    def browsable_families(self) -> list[str]:
        """The prefixes of the families that list their names (``family_names``)."""
        self._load_plugins()
        return sorted(self._family_names)

    def _family_entry(self, name: str) -> Entry | None:
        """The entry ``PREFIX:NAME`` of a family, made once (None: no such family)."""
        prefix, colon, rest = name.partition(":")
        family = self._families.get(prefix) if colon and rest else None
        if family is None:
            return None
        if name not in self._made:
            description, factory = family
            self._made[name] = Entry(name, f"{description} ({rest})", lambda: factory(rest))
        return self._made[name]

    def _check_option(self, name: str, opt: Option) -> None:
        """An option's default has its declared type and passes its own checks; its flag is
        not one of ``bench run``/``bench sweep``'s own; a flag another entry declares is
        declared alike (the command line has one ``--flag``)."""
        where = f"{self.kind} {name!r}"
        check_default(opt, where)
        reserved = reserved_flags()
        for flag in filter(None, (opt.name, opt.off_flag and opt.off_flag.replace("-", "_"))):
            if flag in reserved:
                raise BenchError(
                    f"{where}: option {flag_of(flag)} is a flag of bench run and "
                    "bench sweep themselves; give the option another name"
                )
        for other in self._entries.values():
            for theirs in other.options:
                if theirs.name == opt.name and theirs.signature != opt.signature:
                    raise BenchError(
                        f"{where} declares {opt.flag} ({opt.describe()}), but "
                        f"{other.name!r} declares it as {theirs.describe()}; one flag has one "
                        "meaning: give yours another name"
                    )
                clash = set(opt.flags) & set(theirs.flags)
                if theirs.name != opt.name and clash:
                    raise BenchError(
                        f"{where}: {sorted(clash)[0]} is already a flag of {other.name!r} "
                        f"({theirs.declaration}); give yours another name"
                    )

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in sorted(entry_points(group=self.entry_point_group), key=builtins_first):
            taken = registrations()
            self._loading = ep
            try:
                ep.load()  # importing the plugin registers its entries
            except Exception as exc:  # a broken plugin must not break the suite
                taken.restore()  # nothing half-registered stays
                self._skip(ep.name, f"plugin {ep.name!r} ({ep.value}) failed to load: "
                           f"{first_line(exc)}", exc)
            finally:
                self._loading = None

    def _skip(self, key: str, line: str, exc: BaseException | None = None) -> None:
        """One warning line for a skipped plugin or entry, once per process (an error with
        ``PRUNEX_STRICT_PLUGINS=1``)."""
        if strict():
            raise BenchError(f"{line} (PRUNEX_STRICT_PLUGINS=1)") from exc
        if key in self.skipped:
            return
        self.skipped[key] = line
        if _warnings["shown"]:
            print(f"warning: {line}; skipped ({STRICT_HINT})", file=sys.stderr, flush=True)

    def names(self) -> list[str]:
        """Every registered name, sorted, the installed plugins' included (loaded first)."""
        self._load_plugins()
        return sorted(self._entries)

    def figures(self) -> list[Callable[..., Any]]:
        """The figures the registered entries declare (``figures=``), each once, in the order
        the entries registered (a method and its ablation may declare the same panels)."""
        self._load_plugins()
        found: dict[Callable[..., Any], None] = {}
        for entry in self._entries.values():
            found.update(dict.fromkeys(entry.figures))
        return list(found)

    def nightly(self) -> tuple[str, ...]:
        """The methods of the full nightly: those registered with ``nightly=True``, in the
        order they registered (the installed plugins' included, loaded first)."""
        self._load_plugins()
        return tuple(entry.name for entry in self._entries.values() if entry.nightly)

    def entries(self) -> list[Entry]:
        """Every registered entry, in ``names()`` order."""
        return [self._entries[n] for n in self.names()]

    def get(self, name: str) -> Entry:
        """The entry registered as ``name``.

        Raises:
            BenchError: no such name; the line lists the registered ones (or says how to
                install a plugin when there are none).
        """
        entry = self.find(name)
        if entry is None:
            known = ", ".join(self.names())
            if not known:
                raise BenchError(
                    f"unknown {self.kind} {name!r}: no {self.kind} is registered; install the "
                    "suite (pip install -e .) so its entry points are found"
                )
            raise BenchError(f"unknown {self.kind} {name!r}; known: {known}{self._hint(name)}")
        return entry

    def _hint(self, name: str) -> str:
        """What to check when a name is unknown: a close name, the plugins skipped in this
        process, and where a plugin's entries come from."""
        hints = []
        close = difflib.get_close_matches(name, self.names(), n=1)
        if close:
            hints.append(f"did you mean {close[0]!r}?")
        if self.skipped:
            hints.append(f"skipped in this process: {', '.join(self.skipped)} (see the "
                         "warning above; bench --strict-plugins makes it an error)")
        if not close:
            hints.append(f"a plugin's {self.kind} is registered once its distribution is "
                         f"installed here with an entry point in {self.entry_point_group!r} "
                         "(bench list shows what is registered)")
        return "; " + "; ".join(hints)

    def build(self, name: str, *args: Any) -> Any:
        """``name``'s factory called with ``args``: what a command that uses ``name`` does.
        A factory that raises is a one-line error naming the entry, its plugin and the
        cause (a BenchError it raises is passed on as it is)."""
        entry = self.get(name)
        try:
            return entry.factory(*args)
        except BenchError:
            raise
        except Exception as exc:
            raise BenchError(f"{self.kind} {entry.origin}: its factory failed: "
                             f"{first_line(exc)}") from exc

    def try_build(self, name: str) -> Any | None:
        """``name``'s factory called with no arguments, or None (with the one warning line
        of a skipped plugin) when it raises: for commands that build every entry (the
        recipes shown by ``bench run --help``), where a broken plugin must not stop them."""
        try:
            return self.build(name)
        except BenchError as exc:
            self._skip(f"{name} (factory)", str(exc), exc)
            return None

    def find(self, name: str) -> Entry | None:
        """The entry, or None when nothing of that name is registered (``PREFIX:NAME`` of a
        registered family is)."""
        self._load_plugins()
        return self._entries.get(name) or self._family_entry(name)

    def option_catalogue(
        self, *, builtin_only: bool = False
    ) -> dict[str, tuple[Option, list[str]]]:
        """Every option of every entry: name -> (its declaration, the entries that read it).
        Registration made sure that entries sharing a name declare it alike.
        ``builtin_only``: the built-in plugins' entries only (what the README documents)."""
        catalogue: dict[str, tuple[Option, list[str]]] = {}
        entries = self.builtin_entries() if builtin_only else self.entries()
        for entry in entries:
            for opt in entry.options:
                catalogue.setdefault(opt.name, (opt, []))[1].append(entry.name)
        return catalogue

    def builtin_entries(self) -> list[Entry]:
        """The entries the built-in plugins registered (``prunex-bench``'s entry points)."""
        builtin = [ep.value for ep in entry_points(group=self.entry_point_group)
                   if ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION]
        return [e for e in self.entries()
                if any(e.factory.__module__ == m or e.factory.__module__.startswith(f"{m}.")
                       for m in builtin)]

    def defaults(self, name: str) -> dict[str, Any] | None:
        """``name``'s options with their declared defaults (None: not registered here)."""
        entry = self.find(name)
        return None if entry is None else {o.name: o.default for o in entry.options}

    def readers(self, option_name: str) -> list[str]:
        """The entries that read ``option_name``."""
        return self.option_catalogue().get(option_name, (None, []))[1]


METHODS = Registry("method", "prunex_bench.methods")
"""The registered methods (entry-point group ``prunex_bench.methods``)."""
WORKLOADS = Registry("workload", "prunex_bench.workloads")
"""The registered workloads (entry-point group ``prunex_bench.workloads``)."""


def third_party(ep: EntryPoint | None) -> str | None:
    """How errors name the plugin an entry comes from (``'extras' (extras.methods)``); None
    for the built-ins and for entries registered outside any entry point."""
    if ep is None or (ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION):
        return None
    return f"{ep.name!r} ({ep.value})"


def builtins_first(ep: EntryPoint) -> tuple[bool, str]:
    """Load order: the built-in plugins, then the others by name."""
    return (ep.dist is None or ep.dist.name != BUILTIN_DISTRIBUTION, ep.name)


def describe(factory: Callable) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', factory)}"


def check_round_options(name: str, settings: type | None, options: list[Option]) -> None:
    """``local_steps``/``local_epochs`` are the round of ``RoundSettings``, which the schedule
    reads (budget, iterations, the dry run); declared on other settings, the run would take
    one step per iteration while the method takes H."""
    declared = [o.flag for o in options if o.name in ROUND_OPTIONS]
    if not declared:
        return
    # lazy: suite.plugins.method imports torch and the cluster layer; only this path needs it
    from suite.plugins.method import RoundSettings

    if not issubclass(settings, RoundSettings):
        raise BenchError(
            f"method {name!r}: {settings.__name__} declares {', '.join(declared)} but does not "
            "inherit suite.api.RoundSettings, so the schedule would count one local step per "
            "iteration; inherit RoundSettings (and set steps_per_iteration = "
            "ctx.local_steps_per_round()), or name the option otherwise"
        )


@dataclass
class Registrations:
    """What plugins have registered so far (entries, datasets, phases): a plugin that
    fails part-way through its import is rolled back to this."""

    entries: dict[Registry, dict[str, Entry]]
    datasets: dict
    phases: dict

    def restore(self) -> None:
        # lazy: the data and cluster layers import torch; only a failed plugin needs them
        from suite.cluster.phases import PHASES
        from suite.data.datasets import DATASETS

        for registry, entries in self.entries.items():
            registry._entries = entries
        DATASETS._datasets = self.datasets
        PHASES.clear()
        PHASES.update(self.phases)


def registrations() -> Registrations:
    # lazy: the data and cluster layers import torch; a snapshot is taken only while loading
    from suite.cluster.phases import PHASES
    from suite.data.datasets import DATASETS

    return Registrations({r: dict(r._entries) for r in (METHODS, WORKLOADS)},
                         dict(DATASETS._datasets), dict(PHASES))
