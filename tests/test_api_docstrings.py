"""Every public method of a class ``suite.api`` exports says why it is there: the API page
renders these docstrings, and a plugin author reads them in an editor, so a member without one
is a member its caller must guess at. Counted are the members (methods, properties,
classmethods, staticmethods, cached properties) the class or its bases inside ``suite``
define; what torch, ``nn.Module`` or the dataclass machinery adds is not the suite's to say."""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import suite.api as api


def documented_function(value: object):
    """The function whose docstring a class attribute shows, or None: not a method."""
    if isinstance(value, staticmethod | classmethod):
        return value.__func__
    if isinstance(value, property):
        return value
    if isinstance(value, functools.cached_property):
        return value.func
    return value if inspect.isfunction(value) else None


def undocumented(classes: dict[str, type], package: str = "suite") -> list[str]:
    """``Class.member (module)`` for each public member defined in a class or one of its
    bases from ``package`` that has no docstring of its own (an override counts by itself)."""
    found = []
    for shown, cls in sorted(classes.items()):
        seen = set()
        for base in cls.__mro__:
            if base.__module__.partition(".")[0] != package:
                continue
            for name, value in vars(base).items():
                if name.startswith("_") or name in seen:
                    continue
                seen.add(name)
                function = documented_function(value)
                if function is not None and not (function.__doc__ or "").strip():
                    found.append(f"{shown}.{name} ({base.__module__}.{base.__qualname__})")
    return found


def exported_classes() -> dict[str, type]:
    """The classes ``suite.api`` exports, and the registry class of its METHODS and WORKLOADS
    (exported as instances: their methods are the API all the same)."""
    classes = {name: getattr(api, name) for name in api.__all__
               if inspect.isclass(getattr(api, name))}
    return {**classes, "Registry": type(api.METHODS)}


def test_every_public_method_of_an_exported_class_has_a_docstring():
    classes = exported_classes()
    assert len(classes) >= 20, sorted(classes)  # the count below is over the real API
    missing = undocumented(classes)
    assert not missing, "add a docstring (Google style: why, what the caller relies on):\n" + (
        "\n".join(missing))


def test_the_count_sees_what_it_forbids():
    @dataclass
    class Base:
        def inherited(self): ...

        def said(self):
            """Why."""

    class Exported(Base, dict):
        @property
        def prop(self): ...

        @classmethod
        def made(cls): ...

        @staticmethod
        def helper(): ...

        @functools.cached_property
        def cached(self): ...

        def said(self): ...  # an override without its own docstring

        def _private(self): ...

    Base.__module__ = Exported.__module__ = "fake.module"
    here, base = f"fake.module.{Exported.__qualname__}", f"fake.module.{Base.__qualname__}"
    assert undocumented({"Exported": Exported}, package="fake") == [
        f"Exported.prop ({here})", f"Exported.made ({here})", f"Exported.helper ({here})",
        f"Exported.cached ({here})", f"Exported.said ({here})", f"Exported.inherited ({base})",
    ]
    assert undocumented({"Exported": Exported}, package="fak") == []  # a package, not a prefix
