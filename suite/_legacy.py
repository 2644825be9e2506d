"""Old import paths (before the sub-packages) kept for one release: same objects, and a
DeprecationWarning naming the new home."""

from __future__ import annotations

import importlib
import warnings


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
