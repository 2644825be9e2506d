"""Name -> factory registries for methods and workloads.

Built-ins register themselves when their package is imported; third-party plugins are found
through the entry-point groups ``prunex_bench.methods`` and ``prunex_bench.workloads``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from suite.errors import BenchError


@dataclass(frozen=True)
class Entry:
    name: str
    description: str
    factory: Callable[..., Any]


class Registry:
    def __init__(self, kind: str, entry_point_group: str):
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._entries: dict[str, Entry] = {}
        self._plugins_loaded = False

    def register(self, name: str, description: str):
        """Decorator: ``@METHODS.register("ddp", "Dense DDP ...")`` on a factory."""

        def decorate(factory):
            if name in self._entries and self._entries[name].factory is not factory:
                raise BenchError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = Entry(name, description, factory)
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
        self._load_plugins()
        if name not in self._entries:
            known = ", ".join(self.names()) or "(none)"
            raise BenchError(f"unknown {self.kind} {name!r}; known: {known}")
        return self._entries[name]


METHODS = Registry("method", "prunex_bench.methods")
WORKLOADS = Registry("workload", "prunex_bench.workloads")


def load_builtins() -> None:
    """Import the built-in packages so their registrations run."""
    import baselines  # noqa: F401
    import methods  # noqa: F401
    import workloads  # noqa: F401
