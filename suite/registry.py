"""Deprecated path of :mod:`suite.plugins.registry`, kept for one release (plugins import
suite.api)."""

from suite._legacy import warn_moved
from suite.plugins.registry import *  # noqa: F403
from suite.plugins.registry import __all__  # noqa: F401

warn_moved("suite.registry", "suite.plugins.registry")


def load_builtins() -> None:
    """Deprecated no-op: the registry finds the built-ins through their entry points."""
    import warnings

    warnings.warn(
        "suite.registry.load_builtins is not needed any more (the registry loads every plugin "
        "through its entry points) and goes in the next release",
        DeprecationWarning,
        stacklevel=2,
    )
