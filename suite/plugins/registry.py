"""Name -> factory registries for methods and workloads.

Every plugin, the built-ins included, is found through the entry-point groups
``prunex_bench.methods`` and ``prunex_bench.workloads`` (pyproject.toml names the built-in
packages there), so the registry imports no plugin by name. A method registers its settings
class with its factory (see :mod:`suite.plugins.options`), so its options reach the command
line, sweeps and experiment files with no change to the suite, and its label, colour and
marker, so every report draws it alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from suite.errors import BenchError
from suite.plugins.options import Option, options_of

__all__ = ["METHODS", "WORKLOADS", "Entry", "Look", "Registry"]


@dataclass(frozen=True)
class Look:
    """How every report draws a method: its display name, colour and matplotlib marker."""

    name: str
    color: str
    marker: str


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
    def __init__(self, kind: str, entry_point_group: str):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, Entry] = {}
        self._plugins_loaded = False

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
        """Decorator on a factory: ``@METHODS.register("topk", "...", settings=TopKSettings)``.

        ``settings``: the dataclass of the method's options, built by the runner from the
        user's values and handed to the factory as ``ctx.settings``; ``not_simulable``: the
        reason the simulator's one-process replay cannot run this method, if it cannot;
        ``look``: how reports draw it; ``activity``: ``fn(run: RunView) -> [what it did not
        do]``, checked on every finished run by ``bench compare`` (suite.results.activity).
        """

        def decorate(factory):
            if name in self._entries and self._entries[name].factory is not factory:
                raise BenchError(f"{self.kind} {name!r} is registered twice")
            options_of(settings)  # a malformed declaration fails at import, not at run time
            self._entries[name] = Entry(
                name, description, factory, settings, not_simulable, look, activity
            )
            return factory

        return decorate

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.entry_point_group):
            try:
                ep.load()  # importing the plugin registers its entries
            except Exception as exc:  # a broken plugin must not break the suite
                raise BenchError(f"plugin {ep.name!r} ({ep.value}) failed to load: {exc}") from exc

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

    def option_catalogue(self) -> dict[str, tuple[Option, list[str]]]:
        """Every option of every entry: name -> (its declaration, the entries that read it).

        One name is one flag, so entries sharing a name must agree on its type and choices;
        the first declaration's help and default stand for the flag.
        """
        catalogue: dict[str, tuple[Option, list[str]]] = {}
        for entry in self.entries():
            for opt in entry.options:
                if opt.name not in catalogue:
                    catalogue[opt.name] = (opt, [entry.name])
                    continue
                first, readers = catalogue[opt.name]
                if (first.kind, first.choices, first.off_flag) != (
                    opt.kind, opt.choices, opt.off_flag,
                ):  # fmt: skip
                    raise BenchError(
                        f"{self.kind} {entry.name!r} declares {opt.flag} as {opt.type_text}, "
                        f"but {readers[0]!r} declares it as {first.type_text}"
                    )
                readers.append(entry.name)
        return catalogue

    def readers(self, option_name: str) -> list[str]:
        """The entries that read ``option_name``."""
        return self.option_catalogue().get(option_name, (None, []))[1]


METHODS = Registry("method", "prunex_bench.methods")
WORKLOADS = Registry("workload", "prunex_bench.workloads")
