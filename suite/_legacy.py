"""Old import paths (before the sub-packages) kept for one release: same objects, and a
DeprecationWarning naming the new home."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import warnings

#: flat modules of the layout before the sub-packages -> where their contents live now
#: (suite.options, suite.method and suite.registry keep shim files of their own;
#: suite.structured and suite.results are packages now and forward their old names)
MOVED_MODULES = {
    f"suite.{old}": f"suite.{new}"
    for old, new in {
        "comm": "cluster.comm", "netemu": "cluster.netemu", "processes": "cluster.processes",
        "ranks": "cluster.ranks", "recorder": "cluster.recorder",
        "topology": "cluster.topology", "wire": "cluster.wire",
        "execute": "commands.execute", "experiment": "commands.experiment",
        "listing": "commands.listing", "plan": "commands.preflight", "sweep": "commands.sweep",
        "launch": "launchers.local", "slurm": "launchers.slurm",
        "compare": "results.compare", "recover": "results.recover", "stats": "results.stats",
        "summary": "results.summary", "context": "run.build", "checkpoint": "run.checkpoint",
        "config": "run.config", "livelog": "run.livelog", "schedule": "run.schedule",
        "stopping": "run.stopping", "export": "structured.export",
        "dependency": "structured.groups", "liveness": "structured.liveness",
        "packing": "structured.packing",
    }.items()
}  # fmt: skip


def warn_moved(old: str, new: str) -> None:
    warnings.warn(
        f"{old} moved to {new}; import it from suite.api (plugins) or {new}. "
        f"The old path goes in the next release.",
        DeprecationWarning,
        stacklevel=3,
    )


def forwarding_getattr(package: str, new: str):
    """A package ``__getattr__`` (PEP 562) that hands out ``new``'s names under the
    package's old flat-module path, with a warning."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        module = importlib.import_module(new)
        try:
            value = getattr(module, name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        warnings.warn(
            f"{package}.{name} moved to {new}.{name}; import it from suite.api (plugins) or "
            f"{new}. The old path goes in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import suite.comm`` (an old flat path) gives the module that holds its contents now,
    with a warning. Last on ``sys.meta_path``: only names no file answers reach it."""

    def find_spec(self, fullname, path, target=None):
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = MOVED_MODULES[spec.name]
        warn_moved(spec.name, new)
        return importlib.import_module(new)

    def exec_module(self, module) -> None:
        """The module is already loaded under its new name."""
