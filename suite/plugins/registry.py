"""Name -> factory registries for methods and workloads.

Every plugin, the built-ins included, is found through the entry-point groups
``prunex_bench.methods`` and ``prunex_bench.workloads`` (pyproject.toml names the built-in
packages there), so the registry imports no plugin by name. A method registers its settings
class with its factory (see ``suite.plugins.options``), so its options reach the command
line, sweeps and experiment files with no change to the suite, and its label, colour and
marker, so every report draws it alike.

Registration checks what it is given, so a plugin's mistake is one line at import, not a
wrong run later: option defaults against their own ranges and choices, a flag declared by two
methods (they must declare it alike, or the second must pick another name), the look's colour
and marker, a name registered twice. A plugin that fails to load (an ImportError, a refused
registration) is skipped with one warning line naming it, and everything else keeps working;
``PRUNEX_STRICT_PLUGINS=1`` (``bench --strict-plugins``) makes that fatal, as CI may want.
The built-ins load first, so a plugin cannot shadow them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from suite.errors import BenchError
from suite.plugins.options import Option, check_value, options_of

__all__ = ["METHODS", "WORKLOADS", "BUILTIN_DISTRIBUTION", "Entry", "Look", "Registry"]

#: the distribution whose entry points are the built-in plugins
BUILTIN_DISTRIBUTION = "prunex-bench"


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
    #: what a finished run of it must have done (suite.results.activity), or None
    activity: Callable[..., list[str]] | None = None

    @property
    def options(self) -> list[Option]:
        return options_of(self.settings)


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
        self._plugins_loaded = False
        #: the plugins that failed to load, with the warning line each got
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
    ):
        """Decorator on a factory: a method's ``factory(ctx: RunContext) -> Method``, a
        workload's ``factory() -> Workload``. Refuses, in one line, a name registered twice,
        an option default outside its own check or choices, a flag another entry declares
        differently, a settings field without ``option()``, and a look matplotlib cannot draw.

        Args:
            name: the ``--method`` / ``--workload`` name.
            description: one line for ``bench list``.
            settings: the dataclass of the method's options (``option`` fields), built from
                the user's values and handed to the factory as ``ctx.settings``.
            not_simulable: why ``bench sim``'s one-process replay cannot run it, if it cannot.
            look: how every report draws it (default: its name, grey).
            activity: ``fn(run: RunView) -> [what it did not do]``, checked on every finished
                run by ``bench compare``.

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
            if name in self._entries and self._entries[name].factory is not factory:
                raise BenchError(f"{self.kind} {name!r} is registered twice "
                                 f"({describe(self._entries[name].factory)} and "
                                 f"{describe(factory)})")
            options = options_of(settings)  # a malformed declaration fails at import
            for opt in options:
                self._check_option(name, opt)
            if look is not None:
                look.check(name)
            self._entries[name] = Entry(
                name, description, factory, settings, not_simulable, look, activity
            )
            return factory

        return decorate

    def _check_option(self, name: str, opt: Option) -> None:
        """An option's default passes its own checks, and a flag another entry declares is
        declared alike (the command line has one ``--flag``)."""
        if opt.default is not None:
            try:
                opt.convert(opt.default)
            except BenchError as exc:
                raise BenchError(f"{self.kind} {name!r}: the default of {opt.flag} is invalid "
                                 f"({exc})") from None
            check_value(opt.flag, opt.default, opt.check)
        for other in self._entries.values():
            theirs = next((o for o in other.options if o.name == opt.name), None)
            if theirs is not None and theirs.signature != opt.signature:
                raise BenchError(
                    f"{self.kind} {name!r} declares {opt.flag} ({opt.describe()}), but "
                    f"{other.name!r} declares it as {theirs.describe()}; one flag has one "
                    "meaning: give yours another name"
                )

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        strict = os.environ.get("PRUNEX_STRICT_PLUGINS") == "1"
        for ep in sorted(entry_points(group=self.entry_point_group), key=builtins_first):
            before = dict(self._entries)
            try:
                ep.load()  # importing the plugin registers its entries
            except Exception as exc:  # a broken plugin must not break the suite
                self._entries = before  # nothing half-registered stays
                why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                line = f"plugin {ep.name!r} ({ep.value}) failed to load: {why}"
                if strict:
                    raise BenchError(f"{line} (PRUNEX_STRICT_PLUGINS=1)") from exc
                self.skipped[ep.name] = line
                print(f"warning: {line}; skipped (PRUNEX_STRICT_PLUGINS=1 makes this fatal)",
                      file=sys.stderr)

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(self._entries)

    def entries(self) -> list[Entry]:
        return [self._entries[n] for n in self.names()]

    def get(self, name: str) -> Entry:
        entry = self.find(name)
        if entry is None:
            known = ", ".join(self.names())
            if not known:
                raise BenchError(
                    f"unknown {self.kind} {name!r}: no {self.kind} is registered; install the "
                    "suite (pip install -e .) so its entry points are found"
                )
            raise BenchError(f"unknown {self.kind} {name!r}; known: {known}")
        return entry

    def find(self, name: str) -> Entry | None:
        """The entry, or None when nothing of that name is registered."""
        self._load_plugins()
        return self._entries.get(name)

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


def builtins_first(ep: EntryPoint) -> tuple[bool, str]:
    """Load order: the built-in plugins, then the others by name."""
    return (ep.dist is None or ep.dist.name != BUILTIN_DISTRIBUTION, ep.name)


def describe(factory: Callable) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', factory)}"
